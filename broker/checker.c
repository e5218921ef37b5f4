/* The integrity checker's record of violations, for gm_broker_check() and
 * the floors whose books it verifies. Calls nothing in the broker. */
#include <stdarg.h>
#include <stdio.h>

#include "books.h"

void gm_check_violation(gm_checker_t *c, const char *fmt, ...) {
        if (c->violations++ == 0 && c->why && c->why_len) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(c->why, c->why_len, fmt, ap);
                va_end(ap);
        }
}
