/* Outcomes: what a broker call that answers a request comes to (REPLY,
 * PARK or REFUSE). Calls nothing in the broker. */
#include <stdarg.h>
#include <stdio.h>

#include "books.h"

int gm_outcome_refuse(gm_outcome_t *out, int err, const char *fmt, ...) {
        out->kind = GM_OUTCOME_REFUSE;
        out->error = err < 0 ? err : -err;
        out->oom = false;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(out->message, sizeof(out->message), fmt, ap);
        va_end(ap);
        return 0;
}
