/* JSON string literals. */
#pragma once

#include <stdio.h>

/* The escape JSON needs for byte c ("\\\"", "\\n", "\\u0001"), written into
 * buf, or NULL when c stands for itself. */
const char *gm_json_escape_byte(unsigned char c, char buf[8]);
/* Writes s to f as a quoted, escaped JSON string. */
void gm_json_print_string(FILE *f, const char *s);
