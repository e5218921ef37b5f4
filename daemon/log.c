#include "log.h"

#include <stdio.h>
#include <string.h>

int gm_log_max_level = LOG_INFO;

static void log_line(int level, const char *suffix, const char *fmt, va_list ap) {
        char line[2048];
        int n = vsnprintf(line, sizeof(line), fmt, ap);
        if (n < 0)
                return;
        /* One fprintf keeps concurrent writers (there are none today) line-atomic. */
        fprintf(stderr, "<%d>%s%s\n", level, line, suffix ? suffix : "");
}

void gm_log(int level, const char *fmt, ...) {
        if (level > gm_log_max_level)
                return;
        va_list ap;
        va_start(ap, fmt);
        log_line(level, NULL, fmt, ap);
        va_end(ap);
}

int gm_log_errno(int level, int err, const char *fmt, ...) {
        if (level > gm_log_max_level)
                return err;
        char suffix[160];
        snprintf(suffix, sizeof(suffix), ": %s", strerror(err < 0 ? -err : err));
        va_list ap;
        va_start(ap, fmt);
        log_line(level, suffix, fmt, ap);
        va_end(ap);
        return err;
}
