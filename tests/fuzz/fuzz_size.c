/* Size parsing (common/size.c), used for --capacity, quotas and config keys.
 * Properties: only -EINVAL or -ERANGE on failure; a plain decimal parses to
 * exactly its value; a suffixed integer is that value shifted; formatting any
 * accepted size stays inside its buffer and is NUL-terminated. */
#include <errno.h>
#include <ctype.h>

#include "fuzz.h"
#include "size.h"

static bool all_digits(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (!isdigit((unsigned char) *s))
                        return false;
        return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 64)
                return 0;
        char *s = fuzz_cstring(data, size);
        uint64_t v = 0;
        int r = gm_parse_size(s, &v);
        FUZZ_ASSERT(r == 0 || r == -EINVAL || r == -ERANGE);
        if (r == 0) {
                if (all_digits(s)) {
                        errno = 0;
                        unsigned long long want = strtoull(s, NULL, 10);
                        FUZZ_ASSERT(errno == 0 && want == v);
                }
                char buf[32];
                memset(buf, 'x', sizeof(buf));
                gm_format_size(v, buf, sizeof(buf));
                FUZZ_ASSERT(memchr(buf, '\0', sizeof(buf)) != NULL);

                /* "<digits>K" is exactly 1024 times "<digits>". */
                size_t n = strlen(s);
                if (n >= 2 && (s[n - 1] == 'K' || s[n - 1] == 'k')) {
                        s[n - 1] = '\0';
                        uint64_t base;
                        if (all_digits(s) && gm_parse_size(s, &base) == 0)
                                FUZZ_ASSERT(base <= UINT64_MAX / 1024 && v == base * 1024);
                }
        }
        free(s);
        return 0;
}
