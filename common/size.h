/* Byte sizes as users write them: "4096", "512M", "1G", "1.5GiB". */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Parses a size with an optional binary suffix (K, M, G, T, P, with optional
 * "i" and "B"; case-insensitive). -EINVAL for anything else, -ERANGE on
 * overflow. */
int gm_parse_size(const char *s, uint64_t *ret_size);

/* Formats `bytes` as "<value> <unit>" with two decimals ("1.50 GiB") into buf. */
const char *gm_format_size(uint64_t bytes, char *buf, size_t buf_len);
