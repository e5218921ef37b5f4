/* The peer identity's unit from /proc/PID/cgroup (daemon/config.c), text a
 * client's own service manager shapes. Properties: the unit is "" or a
 * systemd leaf unit name (.service or .scope, systemd's characters, at most
 * GM_UNIT_NAME_MAX), never a slice; a user unit needs a user manager (user@UID.service) in the text. */
#include <ctype.h>

#include "config.h"
#include "fuzz.h"

static bool ends_with(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);
        return n > k && strcmp(s + n - k, suffix) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 16 * 1024)
                return 0;
        char *text = fuzz_cstring(data, size);
        char unit[GM_UNIT_NAME_MAX + 1];
        memset(unit, 'x', sizeof(unit));
        bool user = true;
        gm_cgroup_parse_unit(text, unit, &user);
        size_t n = strnlen(unit, sizeof(unit));
        FUZZ_ASSERT(n <= GM_UNIT_NAME_MAX);
        if (n == 0) {
                FUZZ_ASSERT(!user);
        } else {
                FUZZ_ASSERT(ends_with(unit, ".service") || ends_with(unit, ".scope"));
                for (size_t i = 0; i < n; i++)
                        FUZZ_ASSERT(isalnum((unsigned char) unit[i]) || strchr(":_.\\@-", unit[i]));
                FUZZ_ASSERT(strstr(text, unit) != NULL); /* taken from the input, not made up */
                /* Only a unit below a user's own manager is a user unit; the
                 * manager itself (user@UID.service) is not. */
                if (!strstr(text, "user@"))
                        FUZZ_ASSERT(!user);
        }
        free(text);
        return 0;
}
