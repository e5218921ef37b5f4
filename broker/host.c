/* What the broker asks of its host (the daemon's gm_broker_ops_t) at every
 * floor: log lines. Calls nothing in the broker. */
#include <stdarg.h>
#include <stdio.h>

#include "books.h"

void gm_host_log(const gm_broker_t *b, int priority, const char *fmt, ...) {
        if (!b->ops.log)
                return;
        char message[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof(message), fmt, ap);
        va_end(ap);
        b->ops.log(b->ops.userdata, priority, message);
}
