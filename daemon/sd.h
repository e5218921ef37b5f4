/* systemd integration (sd-daemon): socket activation, the notification
 * protocol (readiness, status, stopping, reloading, watchdog) and the
 * file-descriptor store that keeps segment handles across restarts.
 *
 * Outside systemd (NOTIFY_SOCKET unset, no LISTEN_FDS) every function is a
 * no-op returning 0, so call sites need no checks. Errors are negative errno;
 * nothing here logs. Loop thread only. Notifications never wait on the
 * service manager: each is sent without blocking, or, while its socket is
 * full, queued in order (at most GM_SD_NOTIFY_QUEUE_MAX, then dropped and
 * counted) until gm_sd_notify_flush() gets it out. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* systemd's limit on FDNAME= (and FileDescriptorName=) length. */
#define GM_SD_FDNAME_MAX 255
/* Names under which segment handles are kept in the fd store start with this. */
#define GM_SD_SEGMENT_PREFIX "seg-"
/* At the next start systemd passes every stored fd's name in one environment
 * string, LISTEN_FDNAMES=name:name:..., and execve() refuses a string over
 * 128 KiB (E2BIG: the service cannot start at all). A full store of
 * GM_SD_FDSTORE_MAX names of at most GM_SD_FDSTORE_NAME_MAX characters (e.g.
 * "seg-" + 10 hex digits), plus the sockets' names, stays below that. Keep
 * FileDescriptorStoreMax= in gpumemd@.service equal to GM_SD_FDSTORE_MAX. */
#define GM_SD_FDSTORE_NAME_MAX 14
#define GM_SD_FDSTORE_MAX 8192

/* Notifications kept while the service manager does not read, at most; each
 * FDSTORE one holds its own duplicate of the fd meanwhile. */
#define GM_SD_NOTIFY_QUEUE_MAX 1024

/* The notifications the service manager has not taken yet. */
typedef struct gm_sd_backlog {
        size_t queued;      /* waiting for room in its socket */
        uint64_t dropped;   /* since start: past the bound, or its socket gone before they were sent */
        uint64_t oldest_ms; /* gm_now_ms() when the oldest waiting one was queued; 0 none */
} gm_sd_backlog_t;

typedef struct gm_sd_named_fd {
        int fd; /* owned by the gm_sd_fds_t until the caller sets it to -1 */
        char name[GM_SD_FDNAME_MAX + 1];
} gm_sd_named_fd_t;

/* The fds systemd passed at start, classified. The caller takes an fd by
 * copying it and setting the field to -1; gm_sd_fds_done() closes the rest. */
typedef struct gm_sd_fds {
        int control_fd;             /* listening AF_UNIX SOCK_SEQPACKET socket, O_NONBLOCK, or -1 */
        int metrics_fd;             /* listening SOCK_STREAM socket (any family), O_NONBLOCK, or -1 */
        gm_sd_named_fd_t *segments; /* fds whose name starts with GM_SD_SEGMENT_PREFIX, in passing order */
        size_t n_segments;
        gm_sd_named_fd_t *unknown; /* any other fd: the caller logs, FDSTOREREMOVEs or closes it */
        size_t n_unknown;
} gm_sd_fds_t;

/* True when a service manager listens for notifications (NOTIFY_SOCKET is
 * set), i.e. when segments handed to the fd store can survive a restart. */
bool gm_sd_notify_available(void);

/* Collects the fds passed with LISTEN_FDS/LISTEN_PID/LISTEN_FDNAMES (unsetting
 * those variables) and sorts them by name: "control", "metrics", "seg-*".
 * Other names (systemd's default is the socket unit's name,
 * systemd-socket-activate's "unknown") are sorted by type: the first listening
 * SOCK_SEQPACKET AF_UNIX socket is the control socket, the first listening
 * SOCK_STREAM socket the metrics socket, anything else goes to `unknown`.
 * Every fd has FD_CLOEXEC (libsystemd sets it). Returns the number of fds
 * received (0 when not socket-activated) and fills *ret; on failure every
 * passed fd is closed, *ret is untouched and the error is -EPROTOTYPE
 * ("control"/"metrics" is not a listening socket of the right kind), -EEXIST
 * (two fds claim "control" or "metrics"), -ENOMEM, or libsystemd's error
 * (-EINVAL for malformed LISTEN_* variables). Call it once, before any thread
 * starts (libcuda's): unsetenv() is not thread-safe. */
int gm_sd_listen_fds(gm_sd_fds_t *ret);
/* Closes every fd still held by fds and frees its arrays; fds may be NULL. */
void gm_sd_fds_done(gm_sd_fds_t *fds);

/* READY=1: start-up (or a reload) is complete. */
int gm_sd_notify_ready(void);
/* STATUS=<text>: a one-line human-readable state shown by systemctl status. */
int gm_sd_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* STOPPING=1: shutdown has begun. */
int gm_sd_notify_stopping(void);
/* RELOADING=1 with MONOTONIC_USEC= (CLOCK_MONOTONIC now, as systemd >= 253
 * requires for Type=notify-reload); finish the reload with gm_sd_notify_ready(). */
int gm_sd_notify_reloading(void);

/* Returns 1 and sets *ret_usec to WatchdogSec= when systemd expects
 * keep-alive pings from this process (ping at least every half of it), 0 and
 * *ret_usec = 0 when not, or a negative errno for a malformed WATCHDOG_USEC. */
int gm_sd_watchdog_interval_usec(uint64_t *ret_usec);
/* WATCHDOG=1: the loop is alive. */
int gm_sd_watchdog_ping(void);

/* Hands a duplicate of fd to systemd's fd store under `name` (FDSTORE=1,
 * FDNAME=, and FDPOLL=0 so that systemd never drops it on its own); the
 * caller keeps fd. After a restart it comes back through gm_sd_listen_fds();
 * systemd ignores a file it already holds, so re-adding the fds received at
 * start is harmless. The store survives a crash, Restart= and systemctl
 * restart, but not a stop followed by a start. -EINVAL for a name systemd
 * would reject (empty, ':' or a byte outside printable ASCII),
 * -ENAMETOOLONG over GM_SD_FDSTORE_NAME_MAX, -EBADF for fd < 0, -ENOBUFS
 * when the queue of unsent notifications is full (not stored). systemd does
 * not answer: past FileDescriptorStoreMax= it drops the fd and logs. */
int gm_sd_fdstore_add(int fd, const char *name);
/* Drops every fd stored under `name` from systemd's fd store (FDSTOREREMOVE=1). */
int gm_sd_fdstore_remove(const char *name);

/* Sends what is queued while the manager's socket takes it, in order;
 * returns how many still wait. */
size_t gm_sd_notify_flush(void);
/* The backlog now. */
void gm_sd_notify_backlog(gm_sd_backlog_t *ret);
