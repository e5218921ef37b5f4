/* Byte sizes as users write them: "4096", "512M", "1G", "1.5GiB". */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Parses a size with an optional binary suffix (K, M, G, T, P, with optional
 * "i" and "B"; case-insensitive). -EINVAL for anything else, -ERANGE on
 * overflow. */
int gm_parse_size(const char *s, uint64_t *ret_size);

/* Parses a whole decimal number (digits only: no sign, space or base
 * prefix) from min to max. -EINVAL for anything else, -ERANGE outside the
 * range (wrapping never happens: "4294967296" is not 0, "-5" is refused). */
int gm_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret_value);

/* Formats `bytes` as "<value> <unit>" with two decimals ("1.50 GiB") into buf. */
const char *gm_format_size(uint64_t bytes, char *buf, size_t buf_len);
