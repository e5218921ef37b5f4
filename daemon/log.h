/* Daemon logging: one line per message on stderr, prefixed with the syslog
 * level in sd-daemon(3) form ("<3>"), so journald keeps the levels. */
#pragma once

#include <stdarg.h>
#include <syslog.h>

/* Messages above this level (LOG_ERR=3 ... LOG_DEBUG=7) are dropped; -v raises it. */
extern int gm_log_max_level;

void gm_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs with ": <strerror(-err)>" appended and returns err (negative errno). */
int gm_log_errno(int level, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_debug(...) gm_log(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) gm_log(LOG_INFO, __VA_ARGS__)
#define log_notice(...) gm_log(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) gm_log(LOG_WARNING, __VA_ARGS__)
#define log_error(...) gm_log(LOG_ERR, __VA_ARGS__)
#define log_error_errno(err, ...) gm_log_errno(LOG_ERR, (err), __VA_ARGS__)
#define log_warning_errno(err, ...) gm_log_errno(LOG_WARNING, (err), __VA_ARGS__)
