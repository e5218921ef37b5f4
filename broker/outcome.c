/* Outcomes: what a broker call that answers a request comes to (REPLY,
 * PARK or REFUSE). Calls nothing in the broker. */
#include <stdarg.h>
#include <stdio.h>

#include "books.h"

void gm_outcome_init(gm_outcome_t *out) {
        out->kind = GM_OUTCOME_REPLY;
        out->error = 0;
        out->message[0] = '\0';
        out->alloc = (gm_alloc_result_t){0};
        out->oom = false;
        out->oom_reason = 0;
        out->oom_size = 0;
        out->n_pieces = 0;
        out->new_pieces = NULL;
        out->moves = NULL;
        out->n_moves = 0;
        out->n_marks = 0;
}

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
