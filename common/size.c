#include "size.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int gm_parse_size(const char *s, uint64_t *ret_size) {
        if (!s || !*s || *s == '-' || isspace((unsigned char) *s))
                return -EINVAL;
        errno = 0;
        char *end;
        unsigned long long whole = strtoull(s, &end, 10);
        if (errno == ERANGE)
                return -ERANGE;
        if (end == s)
                return -EINVAL;
        /* The fraction is decimal digits only (no exponent, "inf" or hex, as
         * strtod would take): it stays in [0, 1), so its share of a unit fits. */
        double fraction = 0, scale = 1;
        if (*end == '.') {
                if (!isdigit((unsigned char) end[1]))
                        return -EINVAL;
                for (end++; isdigit((unsigned char) *end); end++)
                        if (scale < 1e18) {
                                scale *= 10;
                                fraction += (*end - '0') / scale;
                        }
        }
        static const char units[] = "KMGTP";
        unsigned shift = 0;
        if (*end) {
                const char *u = strchr(units, toupper((unsigned char) *end));
                if (!u)
                        return -EINVAL;
                shift = 10u * (unsigned) (u - units + 1);
                end++;
                if (*end == 'i' || *end == 'I')
                        end++;
                if (*end == 'b' || *end == 'B')
                        end++;
        } else if (fraction != 0) {
                return -EINVAL; /* fractional bytes */
        }
        if (*end)
                return -EINVAL;
        if (shift && whole > (UINT64_MAX >> shift))
                return -ERANGE;
        uint64_t size = (uint64_t) whole << shift;
        uint64_t extra = (uint64_t) (fraction * (double) (1ull << shift));
        if (size + extra < size)
                return -ERANGE;
        *ret_size = size + extra;
        return 0;
}

int gm_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret_value) {
        if (!s || !isdigit((unsigned char) *s))
                return -EINVAL;
        uint64_t v = 0;
        bool overflow = false;
        for (; *s; s++) {
                if (!isdigit((unsigned char) *s))
                        return -EINVAL;
                unsigned digit = (unsigned) (*s - '0');
                if (v > (UINT64_MAX - digit) / 10)
                        overflow = true;
                else
                        v = v * 10 + digit;
        }
        if (overflow || v < min || v > max)
                return -ERANGE;
        *ret_value = v;
        return 0;
}

const char *gm_format_size(uint64_t bytes, char *buf, size_t buf_len) {
        static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
        if (bytes < 1024) {
                snprintf(buf, buf_len, "%llu bytes", (unsigned long long) bytes);
                return buf;
        }
        double v = (double) bytes;
        size_t u = 0;
        while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
                v /= 1024;
                u++;
        }
        snprintf(buf, buf_len, "%.2f %s", v, units[u]);
        return buf;
}
