/* The listener and the sessions' transport: accept, read packets, dispatch,
 * send, close. A session is freed only in its poll handle's close callback. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "msg.h"

/* Packets handled per readable event before yielding to other sessions. */
#define PACKETS_PER_WAKEUP 64

uint64_t gm_now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static void on_session_closed(uv_handle_t *handle) {
        gm_session_t *s = handle->data;
        free(s);
}

void gm_session_close(gm_session_t *s, const char *why) {
        if (s->closing)
                return;
        gm_daemon_t *d = s->daemon;
        s->closing = true;
        log_info("session %llu (pid %d, tenant '%s') closed: %s", (unsigned long long) s->id, (int) s->cred.pid,
                 s->tenant ? s->tenant->name : "-", why);
        gm_session_release_all(s);
        if (s->tenant)
                s->tenant->sessions--;
        if (s->prev)
                s->prev->next = s->next;
        else
                d->sessions = s->next;
        if (s->next)
                s->next->prev = s->prev;
        d->n_sessions--;
        uv_poll_stop(&s->poll);
        close(s->fd);
        s->fd = -1;
        uv_close((uv_handle_t *) &s->poll, on_session_closed);
}

int gm_session_send(gm_session_t *s, const Gpumem__Envelope *env, const int *fds, size_t n_fds) {
        if (s->closing)
                return -ECONNRESET;
        int r = gm_msg_send(s->fd, env, fds, n_fds, s->daemon->opts.limits.max_packet);
        if (r < 0) {
                /* A client that does not read its replies (-EAGAIN: socket buffer
                 * full) or is gone loses its session. */
                char why[128];
                snprintf(why, sizeof(why), "send failed: %s", strerror(-r));
                gm_session_close(s, why);
        }
        return r;
}

int gm_session_send_error(gm_session_t *s, uint64_t request_id, int err, const char *fmt, ...) {
        char message[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof(message), fmt, ap);
        va_end(ap);
        Gpumem__Error error = GPUMEM__ERROR__INIT;
        error.code = err < 0 ? -err : err;
        error.message = message;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_ERROR;
        env.error = &error;
        return gm_session_send(s, &env, NULL, 0);
}

/* Reads and handles queued packets; returns after PACKETS_PER_WAKEUP so that one
 * busy client cannot starve the others. */
static void on_session_readable(uv_poll_t *handle, int status, int events) {
        gm_session_t *s = handle->data;
        gm_daemon_t *d = s->daemon;
        if (status < 0) {
                gm_session_close(s, uv_strerror(status));
                return;
        }
        size_t max_packet = d->opts.limits.max_packet;
        uint8_t *buf = d->rx_buf; /* one loop thread: one receive buffer for every session */
        for (int i = 0; i < PACKETS_PER_WAKEUP && !s->closing; i++) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len = 0, n_fds = 0;
                int r = gm_ipc_recv(s->fd, buf, max_packet, fds, d->opts.limits.max_fds, &len, &n_fds);
                if (r == -EAGAIN)
                        break;
                if (r == -ECONNRESET) {
                        gm_session_close(s, "client disconnected");
                        break;
                }
                if (r < 0) {
                        gm_session_send_error(s, 0, r, "packet refused: %s (limits: %u bytes, %u fds)", strerror(-r),
                                              d->opts.limits.max_packet, d->opts.limits.max_fds);
                        gm_session_close(s, "oversized or malformed packet");
                        break;
                }
                Gpumem__Envelope *env = NULL;
                r = gm_msg_unpack(buf, len, &env);
                if (r < 0) {
                        gm_close_fds(fds, n_fds);
                        gm_session_send_error(s, 0, EBADMSG, "packet is not a gpumem envelope");
                        gm_session_close(s, "garbage packet");
                        break;
                }
                s->last_active_ms = gm_now_ms();
                s->requests++;
                uint64_t t0 = gm_metrics_now_ns();
                r = gm_session_handle(s, env, fds, n_fds);
                gm_metrics_observe_request(d->metrics, gm_metrics_request_op(env->body_case), gm_metrics_now_ns() - t0);
                gm_msg_free(env);
                if (r < 0) {
                        gm_session_close(s, "protocol violation");
                        break;
                }
                gm_session_flush_releases(s);
        }
}

/* Admin rights: uid 0, the daemon's own uid, or the configured admin group. */
static bool is_admin(const gm_daemon_t *d, const gm_identity_t *id) {
        if (id->uid == 0 || id->uid == getuid())
                return true;
        if (!d->opts.has_admin_group)
                return false;
        if (id->gid == d->opts.admin_group)
                return true;
        for (size_t i = 0; i < id->n_groups; i++)
                if (id->groups[i] == d->opts.admin_group)
                        return true;
        return false;
}

static void on_listener_readable(uv_poll_t *handle, int status, int events) {
        gm_daemon_t *d = handle->data;
        for (;;) {
                int fd;
                int r = gm_ipc_accept(d->listen_fd, &fd);
                if (r == -EAGAIN || r == -EINTR)
                        return;
                if (r < 0) {
                        /* EMFILE and friends: keep serving the sessions we have. */
                        log_warning_errno(r, "accept failed, ignoring");
                        return;
                }
                if (d->n_sessions >= d->opts.limits.max_sessions || d->shutting_down) {
                        log_warning("refusing connection: %s (limit %u sessions)",
                                    d->shutting_down ? "shutting down" : "too many sessions",
                                    d->opts.limits.max_sessions);
                        close(fd);
                        continue;
                }
                gm_session_t *s = calloc(1, sizeof(*s));
                if (!s) {
                        close(fd);
                        continue;
                }
                s->daemon = d;
                s->fd = fd;
                s->id = ++d->next_session_id;
                s->next_release_id = 1;
                s->last_active_ms = gm_now_ms();
                gm_identity_t id;
                r = gm_identity_read(fd, 0, &id);
                if (r == 0) {
                        s->cred = (gm_peer_cred_t){.pid = id.pid, .uid = id.uid, .gid = id.gid};
                        if (!id.user_unit)
                                snprintf(s->unit, sizeof(s->unit), "%s", id.unit);
                        char fallback[64];
                        snprintf(s->tenant_name, sizeof(s->tenant_name), "%s",
                                 gm_config_tenant_for(d->config, &id, fallback, sizeof(fallback)));
                        s->admin = is_admin(d, &id);
                }
                if (r < 0 || uv_poll_init(d->loop, &s->poll, fd) < 0) {
                        log_warning_errno(r < 0 ? r : -EIO, "cannot set up a new session, dropping it");
                        close(fd);
                        free(s);
                        continue;
                }
                s->poll.data = s;
                s->next = d->sessions;
                if (d->sessions)
                        d->sessions->prev = s;
                d->sessions = s;
                d->n_sessions++;
                uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, on_session_readable);
                log_debug("session %llu: connection from pid %d uid %u", (unsigned long long) s->id,
                          (int) s->cred.pid, (unsigned) s->cred.uid);
        }
}

static void on_tick(uv_timer_t *t) {
        gm_daemon_tick(t->data);
}

int gm_server_start(gm_daemon_t *d) {
        d->rx_buf = malloc(d->opts.limits.max_packet);
        if (!d->rx_buf)
                return log_error_errno(-ENOMEM, "Failed to allocate the receive buffer");
        int r = 0;
        if (d->listen_fd < 0)
                r = gm_ipc_listen(d->opts.socket_path, d->opts.socket_mode, 128, &d->listen_fd);
        if (r < 0)
                return log_error_errno(r, "Failed to listen on '%s'", d->opts.socket_path);
        if (!d->listen_fd_inherited && d->opts.has_socket_group &&
            chown(d->opts.socket_path, (uid_t) -1, d->opts.socket_group) < 0)
                log_warning_errno(-errno, "Failed to give '%s' to group %u, ignoring", d->opts.socket_path,
                                  (unsigned) d->opts.socket_group);
        r = uv_poll_init(d->loop, &d->listener, d->listen_fd);
        if (r < 0)
                return log_error("Failed to watch the listening socket: %s", uv_strerror(r)), -EIO;
        d->listener.data = d;
        uv_poll_start(&d->listener, UV_READABLE, on_listener_readable);
        uv_timer_init(d->loop, &d->tick);
        d->tick.data = d;
        uv_timer_start(&d->tick, on_tick, 100, 100);
        return 0;
}

void gm_server_stop(gm_daemon_t *d) {
        if (d->listen_fd >= 0) {
                uv_poll_stop(&d->listener);
                uv_close((uv_handle_t *) &d->listener, NULL);
                close(d->listen_fd);
                d->listen_fd = -1;
                if (!d->listen_fd_inherited)
                        unlink(d->opts.socket_path);
        }
        uv_timer_stop(&d->tick);
        uv_close((uv_handle_t *) &d->tick, NULL);
        while (d->sessions)
                gm_session_close(d->sessions, "daemon stopping");
        free(d->rx_buf);
        d->rx_buf = NULL;
}
