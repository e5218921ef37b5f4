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

typedef enum gm_size_style {
        GM_SIZE_LONG,    /* "1023 bytes", "1.50 GiB": two decimals, up to EiB */
        GM_SIZE_PYTORCH, /* PyTorch's format_size(): inclusive bounds (1 MiB is "1024.00 KiB"), up to GiB */
        GM_SIZE_COMPACT, /* "512B", "20.0M", "7.5G": for 80-column tables */
} gm_size_style_t;

/* Formats `bytes` in `style` into buf; returns buf. */
const char *gm_format_size_as(uint64_t bytes, gm_size_style_t style, char *buf, size_t buf_len);
/* The GM_SIZE_LONG form. */
const char *gm_format_size(uint64_t bytes, char *buf, size_t buf_len);
