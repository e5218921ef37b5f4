/* sd-daemon glue over libsystemd: see sd.h. */
#include "sd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

enum fd_kind { KIND_CONTROL, KIND_METRICS, KIND_SEGMENT, KIND_UNKNOWN };

bool gm_sd_notify_available(void) {
        const char *e = getenv("NOTIFY_SOCKET");
        return e && *e;
}

static int is_control_socket(int fd) {
        return sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0);
}

static int is_metrics_socket(int fd) {
        return sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1);
}

/* Claims a listening socket passed under an explicit name for `kind`. */
static int claim_named(int fd, enum fd_kind kind, bool *have) {
        int r = kind == KIND_CONTROL ? is_control_socket(fd) : is_metrics_socket(fd);
        if (r < 0)
                return r;
        if (r == 0)
                return -EPROTOTYPE;
        if (*have)
                return -EEXIST;
        *have = true;
        return 0;
}

static void strv_free(char **v) {
        for (size_t i = 0; v && v[i]; i++)
                free(v[i]);
        free(v);
}

/* The loop accepts until EAGAIN, but systemd passes sockets in blocking mode
 * (unless NonBlocking=yes). */
static int set_nonblock(int fd) {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0)
                return -errno;
        if (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
                return -errno;
        return 0;
}

/* Assigns a kind to each of the n passed fds; explicit names first, so that a
 * socket named "control" wins over an unnamed one of the same type. */
static int classify(int n, char **names, enum fd_kind *kinds) {
        bool have_control = false, have_metrics = false;
        int r;

        for (int i = 0; i < n; i++) {
                if (strcmp(names[i], "control") == 0)
                        kinds[i] = KIND_CONTROL;
                else if (strcmp(names[i], "metrics") == 0)
                        kinds[i] = KIND_METRICS;
                else if (strncmp(names[i], GM_SD_SEGMENT_PREFIX, strlen(GM_SD_SEGMENT_PREFIX)) == 0)
                        kinds[i] = KIND_SEGMENT;
                else
                        kinds[i] = KIND_UNKNOWN;
                if (kinds[i] == KIND_CONTROL || kinds[i] == KIND_METRICS) {
                        r = claim_named(SD_LISTEN_FDS_START + i, kinds[i],
                                        kinds[i] == KIND_CONTROL ? &have_control : &have_metrics);
                        if (r < 0)
                                return r;
                }
        }
        for (int i = 0; i < n; i++) {
                int fd = SD_LISTEN_FDS_START + i;
                if (kinds[i] != KIND_UNKNOWN)
                        continue;
                if (!have_control) {
                        r = is_control_socket(fd);
                        if (r < 0)
                                return r;
                        if (r > 0) {
                                kinds[i] = KIND_CONTROL;
                                have_control = true;
                                continue;
                        }
                }
                if (!have_metrics) {
                        r = is_metrics_socket(fd);
                        if (r < 0)
                                return r;
                        if (r > 0) {
                                kinds[i] = KIND_METRICS;
                                have_metrics = true;
                        }
                }
        }
        return 0;
}

int gm_sd_listen_fds(gm_sd_fds_t *ret) {
        gm_sd_fds_t f = {.control_fd = -1, .metrics_fd = -1};
        enum fd_kind *kinds = NULL;
        char **names = NULL;
        size_t n_seg = 0, n_unk = 0;

        /* Learn the count before the names: should LISTEN_FDNAMES be
         * malformed, the fds must still be closed. */
        int n = sd_listen_fds(0);
        if (n <= 0) {
                n = sd_listen_fds(1); /* unsets variables meant for another process */
                if (n == 0)
                        *ret = f;
                return n;
        }
        int r = sd_listen_fds_with_names(1, &names);
        if (r < 0)
                goto fail;
        kinds = calloc((size_t) n, sizeof(*kinds));
        if (!kinds) {
                r = -ENOMEM;
                goto fail;
        }
        r = classify(n, names, kinds);
        if (r < 0)
                goto fail;
        for (int i = 0; i < n; i++) {
                n_seg += kinds[i] == KIND_SEGMENT;
                n_unk += kinds[i] == KIND_UNKNOWN;
                if (kinds[i] == KIND_CONTROL || kinds[i] == KIND_METRICS) {
                        r = set_nonblock(SD_LISTEN_FDS_START + i);
                        if (r < 0)
                                goto fail;
                }
        }
        f.segments = n_seg ? calloc(n_seg, sizeof(*f.segments)) : NULL;
        f.unknown = n_unk ? calloc(n_unk, sizeof(*f.unknown)) : NULL;
        if ((n_seg && !f.segments) || (n_unk && !f.unknown)) {
                r = -ENOMEM;
                goto fail;
        }
        for (int i = 0; i < n; i++) {
                int fd = SD_LISTEN_FDS_START + i;
                gm_sd_named_fd_t *e = NULL;
                switch (kinds[i]) {
                case KIND_CONTROL:
                        f.control_fd = fd;
                        break;
                case KIND_METRICS:
                        f.metrics_fd = fd;
                        break;
                case KIND_SEGMENT:
                        e = &f.segments[f.n_segments++];
                        break;
                case KIND_UNKNOWN:
                        e = &f.unknown[f.n_unknown++];
                        break;
                }
                if (e) {
                        e->fd = fd;
                        snprintf(e->name, sizeof(e->name), "%s", names[i]);
                }
        }
        free(kinds);
        strv_free(names);
        *ret = f;
        return n;

fail:
        for (int i = 0; i < n; i++)
                close(SD_LISTEN_FDS_START + i);
        free(f.segments);
        free(f.unknown);
        free(kinds);
        strv_free(names);
        return r;
}

void gm_sd_fds_done(gm_sd_fds_t *fds) {
        if (!fds)
                return;
        if (fds->control_fd >= 0)
                close(fds->control_fd);
        if (fds->metrics_fd >= 0)
                close(fds->metrics_fd);
        for (size_t i = 0; i < fds->n_segments; i++)
                if (fds->segments[i].fd >= 0)
                        close(fds->segments[i].fd);
        for (size_t i = 0; i < fds->n_unknown; i++)
                if (fds->unknown[i].fd >= 0)
                        close(fds->unknown[i].fd);
        free(fds->segments);
        free(fds->unknown);
        *fds = (gm_sd_fds_t){.control_fd = -1, .metrics_fd = -1};
}

/* ---- notifications: never blocking, queued with a bound ---- */

/* One notification the service manager's socket had no room for: its text
 * and the daemon's own duplicate of the fd it carries (-1 none). */
typedef struct queued_note {
        struct queued_note *next;
        int fd;
        uint64_t queued_ms;
        char state[]; /* NUL-terminated */
} queued_note_t;

/* The one queue (loop thread only, like every caller): in order, behind
 * whatever is queued, nothing overtakes (an FDSTOREREMOVE never passes its
 * FDSTORE). */
static struct {
        queued_note_t *head, *tail;
        size_t queued;
        uint64_t dropped;
} notes;

/* NOTIFY_SOCKET's address ("/path" or "@abstract"); -EAFNOSUPPORT for any
 * other kind (vsock), which only libsystemd's blocking sender speaks. */
static int notify_address(const char *e, struct sockaddr_un *sa, socklen_t *ret_len) {
        size_t n = strlen(e);
        if ((e[0] != '/' && e[0] != '@') || n < 2)
                return -EAFNOSUPPORT;
        if (n >= sizeof(sa->sun_path))
                return -EINVAL;
        *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
        memcpy(sa->sun_path, e, n);
        if (e[0] == '@')
                sa->sun_path[0] = '\0';
        *ret_len = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + n + (e[0] == '/'));
        return 0;
}

/* One datagram to the service manager without waiting: 0 sent (or nobody
 * listens for notifications), -EAGAIN its socket is full, or the error. */
static int send_now(const char *state, int fd) {
        const char *e = getenv("NOTIFY_SOCKET");
        if (!e || !*e)
                return 0;
        struct sockaddr_un sa;
        socklen_t sa_len;
        int r = notify_address(e, &sa, &sa_len);
        if (r == -EAFNOSUPPORT) {
                r = fd >= 0 ? sd_pid_notify_with_fds(0, 0, state, &fd, 1) : sd_notify(0, state);
                return r < 0 ? r : 0;
        }
        if (r < 0)
                return r;
        int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s < 0)
                return -errno;
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int))];
        } control;
        struct iovec iov = {.iov_base = (void *) state, .iov_len = strlen(state)};
        struct msghdr msg = {.msg_name = &sa, .msg_namelen = sa_len, .msg_iov = &iov, .msg_iovlen = 1};
        if (fd >= 0) {
                memset(&control, 0, sizeof(control));
                msg.msg_control = &control;
                msg.msg_controllen = sizeof(control);
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        r = sendmsg(s, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -errno : 0;
        close(s);
        return r == -EWOULDBLOCK ? -EAGAIN : r;
}

static void note_free(queued_note_t *n) {
        if (n->fd >= 0)
                close(n->fd);
        free(n);
}

/* Queues state (and a duplicate of fd) behind the queue; past
 * GM_SD_NOTIFY_QUEUE_MAX it is dropped and counted. */
static int enqueue(const char *state, int fd) {
        if (notes.queued >= GM_SD_NOTIFY_QUEUE_MAX) {
                notes.dropped++;
                return -ENOBUFS;
        }
        size_t len = strlen(state) + 1;
        queued_note_t *n = malloc(sizeof(*n) + len);
        if (!n) {
                notes.dropped++;
                return -ENOMEM;
        }
        memcpy(n->state, state, len);
        n->next = NULL;
        n->queued_ms = gm_now_ms();
        n->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;
        if (fd >= 0 && n->fd < 0) {
                int r = -errno;
                free(n);
                notes.dropped++;
                return r;
        }
        if (notes.tail)
                notes.tail->next = n;
        else
                notes.head = n;
        notes.tail = n;
        notes.queued++;
        return 0;
}

size_t gm_sd_notify_flush(void) {
        while (notes.head) {
                queued_note_t *n = notes.head;
                int r = send_now(n->state, n->fd);
                if (r == -EAGAIN)
                        break;
                if (r < 0)
                        notes.dropped++; /* the manager went away: nothing will take it */
                notes.head = n->next;
                if (!notes.head)
                        notes.tail = NULL;
                notes.queued--;
                note_free(n);
        }
        return notes.queued;
}

void gm_sd_notify_backlog(gm_sd_backlog_t *ret) {
        *ret = (gm_sd_backlog_t){
                .queued = notes.queued,
                .dropped = notes.dropped,
                .oldest_ms = notes.head ? notes.head->queued_ms : 0,
        };
}

/* Sends state (with fd, still the caller's) now, or queues it while the
 * manager's socket is full or older notifications wait. */
static int notify_fd(const char *state, int fd) {
        if (notes.head && gm_sd_notify_flush() > 0)
                return enqueue(state, fd) == -ENOBUFS ? -ENOBUFS : 0;
        int r = send_now(state, fd);
        if (r == -EAGAIN)
                return enqueue(state, fd) == -ENOBUFS ? -ENOBUFS : 0;
        return r;
}

static int notify(const char *state) {
        return notify_fd(state, -1);
}

int gm_sd_notify_ready(void) {
        return notify("READY=1");
}

int gm_sd_notify_status(const char *fmt, ...) {
        char *text;
        va_list ap;

        if (!gm_sd_notify_available())
                return 0;
        va_start(ap, fmt);
        int n = vasprintf(&text, fmt, ap);
        va_end(ap);
        if (n < 0)
                return -ENOMEM;
        /* One line: a newline would start another assignment ("READY=1"). */
        for (char *p = text; *p; p++)
                if (*p == '\n')
                        *p = ' ';
        char *state;
        n = asprintf(&state, "STATUS=%s", text);
        free(text);
        if (n < 0)
                return -ENOMEM;
        int r = notify(state);
        free(state);
        return r;
}

int gm_sd_notify_stopping(void) {
        return notify("STOPPING=1");
}

int gm_sd_notify_reloading(void) {
        char state[64];

        snprintf(state, sizeof(state), "RELOADING=1\nMONOTONIC_USEC=%llu", (unsigned long long) (gm_now_ns() / 1000u));
        return notify(state);
}

int gm_sd_watchdog_interval_usec(uint64_t *ret_usec) {
        uint64_t usec = 0;
        int r = sd_watchdog_enabled(0, &usec);
        if (r < 0)
                return r;
        *ret_usec = r > 0 ? usec : 0;
        return r > 0;
}

int gm_sd_watchdog_ping(void) {
        return notify("WATCHDOG=1");
}

/* What systemd accepts as FDNAME= (fdname_is_valid()), minus the empty name,
 * which it would replace with "stored" and we could not remove again. */
static int check_fdname(const char *name) {
        size_t len = 0;
        if (!name)
                return -EINVAL;
        for (const char *p = name; *p; p++, len++)
                if (*p == ':' || *p < ' ' || *p > '~')
                        return -EINVAL;
        if (len == 0)
                return -EINVAL;
        return len > GM_SD_FDSTORE_NAME_MAX ? -ENAMETOOLONG : 0;
}

int gm_sd_fdstore_add(int fd, const char *name) {
        char state[sizeof("FDSTORE=1\nFDPOLL=0\nFDNAME=") + GM_SD_FDSTORE_NAME_MAX];

        if (fd < 0)
                return -EBADF;
        int r = check_fdname(name);
        if (r < 0)
                return r;
        snprintf(state, sizeof(state), "FDSTORE=1\nFDPOLL=0\nFDNAME=%s", name);
        return notify_fd(state, fd);
}

int gm_sd_fdstore_remove(const char *name) {
        char state[sizeof("FDSTOREREMOVE=1\nFDNAME=") + GM_SD_FDSTORE_NAME_MAX];

        int r = check_fdname(name);
        if (r < 0)
                return r;
        snprintf(state, sizeof(state), "FDSTOREREMOVE=1\nFDNAME=%s", name);
        return notify(state);
}
