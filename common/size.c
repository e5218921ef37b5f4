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

const char *gm_format_size_as(uint64_t bytes, gm_size_style_t style, char *buf, size_t buf_len) {
        static const char *const long_units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
        static const char *const short_units[] = {"B", "K", "M", "G", "T", "P", "E"};
        bool pytorch = style == GM_SIZE_PYTORCH, compact = style == GM_SIZE_COMPACT;
        size_t max_unit = pytorch ? 3 : 6, u = 0;
        double v = (double) bytes;
        while (u < max_unit && (pytorch ? v > 1024 : v >= 1024)) {
                v /= 1024;
                u++;
        }
        if (u == 0)
                snprintf(buf, buf_len, compact ? "%llu%s" : "%llu %s", (unsigned long long) bytes,
                         compact ? short_units[0] : long_units[0]);
        else
                snprintf(buf, buf_len, compact ? "%.1f%s" : "%.2f %s", v, compact ? short_units[u] : long_units[u]);
        return buf;
}

const char *gm_format_size(uint64_t bytes, char *buf, size_t buf_len) {
        return gm_format_size_as(bytes, GM_SIZE_LONG, buf, buf_len);
}
