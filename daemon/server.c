/* The listener and the connections: accept, read packets, dispatch, send,
 * close. The only file that does socket I/O. Closing a connection (a failed
 * send, a hang-up, a protocol violation) only stops its I/O; its state (broker
 * session, local heap, snapshot asks) is torn down and freed in its poll
 * handle's close callback, which libuv runs from the loop, never from inside
 * a handler: so no handler or callback on the stack ever sees that state
 * freed, whatever it sent. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "debug.h"
#include "daemon.h"
#include "diag.h"
#include "hotmsg.h"
#include "log.h"
#include "metrics.h"
#include "msg.h"
#include "requests.h"
#include "sd.h"
#include "local.h"
#include "req_central.h"
#include "req_snapshot.h"
#include "text.h"

/* Packets handled per readable event before yielding to other connections. */
#define PACKETS_PER_WAKEUP 64

/* Connections of uid, and a change of that count by delta (+1 or -1). */
static uint32_t conns_of_uid(const gm_daemon_t *d, uid_t uid) {
        return (uint32_t) (uintptr_t) gm_u64map_get(&d->conns_per_uid, (uint64_t) uid + 1);
}

static int count_conn_of_uid(gm_daemon_t *d, uid_t uid, int delta) {
        uint32_t n = conns_of_uid(d, uid) + (uint32_t) delta;
        if (n == 0) {
                gm_u64map_remove(&d->conns_per_uid, (uint64_t) uid + 1);
                return 0;
        }
        return gm_u64map_put(&d->conns_per_uid, (uint64_t) uid + 1, (void *) (uintptr_t) n);
}

/* Ends a closed connection's state: its session releases all its memory at
 * once. Runs with no handler of it on the stack (close callback, or stop). */
static void conn_end(gm_conn_t *c) {
        gm_daemon_t *d = c->daemon;
        gm_session_t *s = c->req.session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        gm_local_end(&c->req);
        gm_req_snapshot_conn_end(&c->req);
        gm_session_end(s);
        if (c->prev)
                c->prev->next = c->next;
        else
                d->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        d->n_conns--;
        count_conn_of_uid(d, sv.uid, -1);
        gm_session_free(s);
        c->req.session = NULL;
}

static void on_conn_closed(uv_handle_t *handle) {
        gm_conn_t *c = handle->data;
        if (c->req.session) {
                conn_end(c);
                gm_daemon_debug_check(c->daemon, "a connection's end");
        }
        free(c);
}

static void outgoing_free(gm_outgoing_t *o) {
        gm_close_fds(o->fds, o->n_fds);
        free(o);
}

static void conn_drop_queue(gm_conn_t *c) {
        while (c->out_head) {
                gm_outgoing_t *o = c->out_head;
                c->out_head = o->next;
                outgoing_free(o);
        }
        c->out_tail = NULL;
        c->out_packets = c->out_fds = 0;
        c->out_bytes = 0;
}

/* Closes a connection: nothing more is read or sent. Its state stays valid
 * for whoever is on the stack; conn_end() follows from the loop. */
static void conn_close(gm_conn_t *c, const char *why) {
        if (c->req.closed)
                return;
        gm_session_t *s = c->req.session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        c->req.closed = true;
        log_info("session %llu (pid %d, tenant '%s') closed: %s", (unsigned long long) sv.id, (int) sv.pid,
                 sv.tenant ? sv.tenant->name : "-", why);
        uv_poll_stop(&c->poll);
        conn_drop_queue(c);
        close(c->fd);
        c->fd = -1;
        uv_close((uv_handle_t *) &c->poll, on_conn_closed);
}

static void on_conn_event(uv_poll_t *handle, int status, int events);

/* Watches for input (nothing queued) or for room to send (something queued:
 * no request is read until the client has read what it was sent). */
static void conn_watch(gm_conn_t *c) {
        uv_poll_start(&c->poll, (c->out_head ? UV_WRITABLE : UV_READABLE) | UV_DISCONNECT, on_conn_event);
}

static void conn_close_send_failed(gm_conn_t *c, int err) {
        char why[128];
        snprintf(why, sizeof(why), "send failed: %s", strerror(-err));
        conn_close(c, why);
}

/* conn_queue() without the closing: -ENOBUFS past the limits. */
static int conn_enqueue(gm_conn_t *c, const uint8_t *packed, size_t len, const int *fds, size_t n_fds) {
        if (c->out_packets + 1 > GM_CONN_MAX_QUEUED_PACKETS || c->out_bytes + len > GM_CONN_MAX_QUEUED_BYTES ||
            c->out_fds + n_fds > GM_CONN_MAX_QUEUED_FDS)
                return -ENOBUFS;
        gm_outgoing_t *o = malloc(sizeof(*o) + n_fds * sizeof(int) + len);
        if (!o)
                return -ENOMEM;
        o->next = NULL;
        o->len = len;
        o->n_fds = 0;
        o->fds = (int *) (o + 1);
        o->data = (uint8_t *) (o->fds + n_fds);
        memcpy(o->data, packed, len);
        for (size_t i = 0; i < n_fds; i++) {
                int dup = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
                if (dup < 0) {
                        int r = -errno;
                        outgoing_free(o);
                        return r;
                }
                o->fds[o->n_fds++] = dup;
        }
        if (c->out_tail)
                c->out_tail->next = o;
        else
                c->out_head = o;
        c->out_tail = o;
        c->out_packets++;
        c->out_fds += (uint32_t) n_fds;
        c->out_bytes += len;
        return 0;
}

/* Queues `len` packed bytes with duplicates of their fds behind what is
 * queued. On failure (past the connection's limits: -ENOBUFS) the connection
 * is closed. */
static int conn_queue(gm_conn_t *c, const uint8_t *packed, size_t len, const int *fds, size_t n_fds) {
        int r = conn_enqueue(c, packed, len, fds, n_fds);
        if (r < 0) {
                char why[160];
                if (r == -ENOBUFS)
                        snprintf(why, sizeof(why),
                                 "the client does not read what it is sent (limits: %u packets, %u bytes, %u fds "
                                 "queued)",
                                 GM_CONN_MAX_QUEUED_PACKETS, GM_CONN_MAX_QUEUED_BYTES, GM_CONN_MAX_QUEUED_FDS);
                else
                        snprintf(why, sizeof(why), "cannot queue a reply: %s", strerror(-r));
                conn_close(c, why);
        }
        return r;
}

/* Sends what is queued while the socket takes it; once all of it is sent,
 * reading resumes. On a send error the connection is closed. */
static void conn_flush(gm_conn_t *c) {
        while (c->out_head && !c->req.closed) {
                gm_outgoing_t *o = c->out_head;
                int r = gm_ipc_send(c->fd, o->data, o->len, o->fds, o->n_fds);
                if (r == -EAGAIN)
                        return;
                if (r < 0) {
                        conn_close_send_failed(c, r);
                        return;
                }
                c->out_head = o->next;
                if (!c->out_head)
                        c->out_tail = NULL;
                c->out_packets--;
                c->out_fds -= (uint32_t) o->n_fds;
                c->out_bytes -= o->len;
                outgoing_free(o);
        }
        if (!c->req.closed)
                conn_watch(c);
}

/* Sends an envelope (with fds, still the caller's) carrying `request_id`, or
 * queues it while the client's socket is full; on failure (the client gone,
 * or too much unread) the connection is closed and a negative errno returned. */
static int conn_send(gm_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds) {
        if (c->req.closed)
                return -ECONNRESET;
        env->request_id = request_id;
        /* Packed once: sent now, or (the socket full, or replies before it
         * still queued) queued as these bytes. */
        uint8_t stack_buf[GM_MSG_STACK_PACK_MAX];
        uint8_t *buf = stack_buf;
        size_t len;
        int r = c->fixed_codec ? gm_hotmsg_encode(env, stack_buf, sizeof(stack_buf), &len) : -EOPNOTSUPP;
        if (r == -EOPNOTSUPP)
                r = gm_msg_pack(env, c->daemon->opts.limits.max_packet, stack_buf, sizeof(stack_buf), &buf, &len);
        if (r < 0) {
                conn_close_send_failed(c, r);
                return r;
        }
        bool was_blocked = c->out_head != NULL;
        r = was_blocked ? -EAGAIN : gm_ipc_send(c->fd, buf, len, fds, n_fds);
        if (r == -EAGAIN) {
                r = conn_queue(c, buf, len, fds, n_fds);
                if (r == 0 && !was_blocked)
                        conn_watch(c);
        } else if (r < 0) {
                conn_close_send_failed(c, r);
        }
        if (buf != stack_buf)
                free(buf);
        return r;
}

/* The connection that embeds a request conn (every session's userdata). */
static gm_conn_t *conn_of(gm_request_conn_t *rc) {
        return (gm_conn_t *) ((char *) rc - offsetof(gm_conn_t, req));
}

/* The request handlers' one sender. */
static int request_send(void *userdata, gm_request_conn_t *rc, uint64_t request_id, Gpumem__Envelope *env,
                        const int *fds, size_t n_fds) {
        return conn_send(conn_of(rc), request_id, env, fds, n_fds);
}

static void request_observe(void *userdata, unsigned op, uint64_t ns) {
        gm_daemon_t *d = userdata;
        gm_metrics_observe_request(d->metrics, op, ns);
}

/* Work the request handlers run off the loop (snapshots), on libuv's pool. */
typedef struct queued_work {
        uv_work_t req;
        void (*work)(void *arg);
        void (*done)(void *arg);
        void *arg;
} queued_work_t;

static void queued_work_run(uv_work_t *req) {
        queued_work_t *w = req->data;
        w->work(w->arg);
}

static void queued_work_done(uv_work_t *req, int status) {
        queued_work_t *w = req->data;
        w->done(w->arg);
        free(w);
}

static int request_queue_work(void *userdata, void (*work)(void *arg), void (*done)(void *arg), void *arg) {
        gm_daemon_t *d = userdata;
        queued_work_t *w = malloc(sizeof(*w));
        if (!w)
                return -ENOMEM;
        *w = (queued_work_t){.work = work, .done = done, .arg = arg};
        w->req.data = w;
        int r = uv_queue_work(d->loop, &w->req, queued_work_run, queued_work_done);
        if (r < 0)
                free(w);
        return r < 0 ? -EIO : 0;
}

void gm_server_sync_requests(gm_daemon_t *d) {
        d->request_config = (gm_request_config_t){
                .max_packet = d->opts.limits.max_packet,
                .max_fds = d->opts.limits.max_fds,
                .state_dir = d->opts.state_dir,
                .file = d->config,
        };
        d->requests = (gm_requests_t){
                .broker = d->broker,
                .config = &d->request_config,
                .local = &d->local_totals,
                .send = request_send,
                .observe = request_observe,
                .snapjobs = &d->snapjobs,
                .queue_work = request_queue_work,
                .userdata = d,
        };
}

/* Reads and handles queued packets; returns after PACKETS_PER_WAKEUP so that one
 * busy client cannot starve the others, or as soon as a reply had to be
 * queued (back-pressure: the client reads first). */
static void conn_read(gm_conn_t *c) {
        gm_daemon_t *d = c->daemon;
        size_t max_packet = d->opts.limits.max_packet;
        uint8_t *buf = d->rx_buf; /* one loop thread: one receive buffer for every connection */
        for (int i = 0; i < PACKETS_PER_WAKEUP && !c->req.closed && !c->out_head; i++) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len = 0, n_fds = 0;
                int r = gm_ipc_recv(c->fd, buf, max_packet, fds, d->opts.limits.max_fds, &len, &n_fds);
                if (r == -EAGAIN)
                        break;
                if (r == -ECONNRESET) {
                        conn_close(c, "client disconnected");
                        break;
                }
                if (r < 0) {
                        gm_request_error(&c->req, 0, r, "packet refused: %s (limits: %u bytes, %u fds)", strerror(-r),
                                         d->opts.limits.max_packet, d->opts.limits.max_fds);
                        conn_close(c, "oversized or malformed packet");
                        break;
                }
                /* A fixed-layout packet is decoded onto the stack; it tells
                 * that this client reads hot replies in that layout too. */
                Gpumem__Envelope *env = NULL, hot_env;
                gm_hotmsg_body_t hot_body;
                bool hot = gm_hotmsg_is(buf, len);
                r = hot ? gm_hotmsg_decode(buf, len, &hot_env, &hot_body) : gm_msg_unpack(buf, len, &env);
                if (r == 0 && hot) {
                        env = &hot_env;
                        c->fixed_codec = true;
                }
                if (r < 0) {
                        gm_close_fds(fds, n_fds);
                        gm_request_error(&c->req, 0, EBADMSG, "packet is not a gpumem envelope");
                        conn_close(c, "garbage packet");
                        break;
                }
                c->req.requests++;
                r = gm_requests_dispatch(&c->req, env, fds, n_fds);
                if (!hot)
                        gm_msg_free(env);
                if (r < 0) {
                        conn_close(c, "protocol violation");
                        break;
                }
                gm_session_flush_releases(c->req.session);
                gm_daemon_debug_check(d, "a request");
        }
}

static void on_conn_event(uv_poll_t *handle, int status, int events) {
        gm_conn_t *c = handle->data;
        if (status < 0) {
                conn_close(c, uv_strerror(status));
                return;
        }
        if (c->out_head) {
                /* Writable, or the peer hung up (then the send fails). */
                conn_flush(c);
                return;
        }
        conn_read(c);
}

void gm_daemon_debug_check(const gm_daemon_t *d, const char *after) {
        if (!GM_DEBUG)
                return;
        char why[512];
        int n = gm_broker_check(d->broker, why, sizeof(why));
        if (n) {
                log_error("BUG: %d broker invariants broken after %s: %s", n, after, why);
                abort();
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

/* A new connection's session from the peer's kernel-verified identity. */
static int conn_new(gm_daemon_t *d, int fd, gm_conn_t **ret_conn) {
        gm_identity_t id;
        int r = gm_identity_read(fd, 0, &id);
        if (r < 0)
                return r;
        gm_conn_t *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        gm_session_params_t params = {
                .pid = id.pid,
                .uid = id.uid,
                .unit = id.user_unit ? "" : id.unit,
                .admin = is_admin(d, &id),
                .userdata = &c->req,
        };
        r = gm_session_new(d->broker, &params, &c->req.session);
        if (r < 0) {
                free(c);
                return r;
        }
        char fallback[64];
        snprintf(c->req.tenant_name, sizeof(c->req.tenant_name), "%s",
                 gm_config_tenant_for(d->config, &id, fallback, sizeof(fallback)));
        gm_text_escape(id.comm, c->req.command, sizeof(c->req.command));
        c->daemon = d;
        c->fd = fd;
        c->req.rq = &d->requests;
        *ret_conn = c;
        return 0;
}

/* The most connections one uid may hold. */
static uint32_t per_uid_limit(const gm_daemon_t *d) {
        const gm_limits_t *l = &d->opts.limits;
        uint32_t n = l->max_sessions_per_uid ? l->max_sessions_per_uid : l->max_sessions / 4;
        return n == 0 ? 1 : n < l->max_sessions ? n : l->max_sessions;
}

/* Tells a connection why it is refused (best effort: one packet into its
 * socket buffer, which the client reads after its Hello) and closes it. */
static void refuse_conn(int fd, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse_conn(int fd, int err, const char *fmt, ...) {
        char message[256];
        va_list ap;
        va_start(ap, fmt);
        gm_request_format_message(message, sizeof(message), fmt, ap);
        va_end(ap);
        Gpumem__Error error;
        Gpumem__Envelope env;
        gm_request_error_envelope(&env, &error, err, message);
        gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT);
        close(fd);
}

/* Whether a new connection from fd's peer fits the limits; refuses it if not. */
static bool admit_conn(gm_daemon_t *d, int fd) {
        const gm_limits_t *l = &d->opts.limits;
        if (d->shutting_down) {
                refuse_conn(fd, ESHUTDOWN, "shutting down");
                return false;
        }
        if (d->n_conns >= l->max_sessions) {
                log_warning("refusing connection: too many sessions (limit %u)", l->max_sessions);
                refuse_conn(fd, EUSERS, "session limit reached (%u sessions); try again later", l->max_sessions);
                return false;
        }
        gm_peer_cred_t cred;
        if (gm_ipc_peer_cred(fd, &cred) < 0) {
                close(fd);
                return false;
        }
        uint32_t limit = per_uid_limit(d);
        if (conns_of_uid(d, cred.uid) >= limit) {
                log_warning("refusing connection from pid %d: session limit for uid %u reached (%u)", (int) cred.pid,
                            (unsigned) cred.uid, limit);
                refuse_conn(fd, EUSERS,
                            "session limit for uid %u reached (%u sessions); close some, or raise "
                            "max_sessions_per_uid",
                            (unsigned) cred.uid, limit);
                return false;
        }
        return true;
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
                if (!admit_conn(d, fd))
                        continue;
                gm_conn_t *c = NULL;
                r = conn_new(d, fd, &c);
                gm_session_view_t sv = {0};
                if (r == 0)
                        gm_session_view(c->req.session, &sv);
                if (r == 0 && count_conn_of_uid(d, sv.uid, +1) < 0) {
                        gm_session_free(c->req.session);
                        free(c);
                        r = -ENOMEM;
                }
                if (r == 0 && uv_poll_init(d->loop, &c->poll, fd) < 0) {
                        count_conn_of_uid(d, sv.uid, -1);
                        gm_session_free(c->req.session);
                        free(c);
                        r = -EIO;
                }
                if (r < 0) {
                        log_warning_errno(r, "cannot set up a new session, dropping it");
                        close(fd);
                        continue;
                }
                c->poll.data = c;
                c->accepted_ms = gm_now_ms();
                c->next = d->conns;
                if (d->conns)
                        d->conns->prev = c;
                d->conns = c;
                d->n_conns++;
                conn_watch(c);
                log_debug("session %llu: connection from pid %d uid %u", (unsigned long long) sv.id, (int) sv.pid,
                          (unsigned) sv.uid);
        }
}

/* Closes the connections that have not said Hello in time: an idle
 * connection holds a session slot, and a few of them must not lock out the
 * rest. */
static void expire_silent_conns(gm_daemon_t *d, uint64_t now_ms) {
        uint32_t timeout = d->opts.limits.hello_timeout_ms;
        for (gm_conn_t *c = d->conns, *next; c; c = next) {
                next = c->next;
                if (c->req.hello_done || c->req.closed || now_ms - c->accepted_ms < timeout)
                        continue;
                gm_request_error(&c->req, 0, ETIMEDOUT, "no Hello within %u ms", timeout);
                conn_close(c, "no hello in time");
        }
}

/* A service manager whose socket stays full this long is reported stuck. */
#define NOTIFY_STUCK_MS 5000u

/* Gets queued notifications out; a manager that stopped reading shows in
 * the log (once, and again when it reads) and in the metrics, and never
 * stops the loop. */
static void watch_notify_backlog(gm_daemon_t *d, uint64_t now_ms) {
        static bool reported_stuck; /* the notification queue is one per process, like this */
        gm_sd_notify_flush();
        gm_sd_backlog_t b;
        gm_sd_notify_backlog(&b);
        uint64_t waited = b.oldest_ms && now_ms > b.oldest_ms ? now_ms - b.oldest_ms : 0;
        gm_metrics_set_notify_backlog(d->metrics, b.queued, b.dropped, waited);
        if (waited >= NOTIFY_STUCK_MS && !reported_stuck) {
                log_warning("the service manager has read no notification for %llu s: %zu queued (at most %u, "
                            "%llu dropped); serving on",
                            (unsigned long long) (waited / 1000u), b.queued, GM_SD_NOTIFY_QUEUE_MAX,
                            (unsigned long long) b.dropped);
                reported_stuck = true;
        } else if (b.queued == 0 && reported_stuck) {
                log_notice("the service manager reads notifications again (%llu dropped meanwhile)",
                           (unsigned long long) b.dropped);
                reported_stuck = false;
        }
}

static void on_tick(uv_timer_t *t) {
        gm_daemon_t *d = t->data;
        uint64_t now = gm_now_ms();
        watch_notify_backlog(d, now);
        expire_silent_conns(d, now);
        gm_broker_tick(d->broker, now);
        gm_localstats_tick(&d->requests);
        gm_req_snapshot_tick(&d->requests, now);
        gm_diag_tick(&d->requests, now);
        gm_daemon_debug_check(d, "a tick");
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
        while (d->conns) {
                gm_conn_t *c = d->conns;
                conn_close(c, "daemon stopping");
                conn_end(c);
        }
        gm_u64map_done(&d->conns_per_uid);
        gm_localstats_free_all(&d->requests);
        gm_req_snapshot_free_all(&d->requests);
        free(d->rx_buf);
        d->rx_buf = NULL;
}

/* ---- the broker's host ---- */

static int send_release(void *userdata, gm_session_t *s, uint64_t release_id, const gm_release_range_t *ranges,
                        size_t n) {
        gm_conn_t *c = conn_of(gm_session_userdata(s));
        Gpumem__Range *rs = calloc(n ? n : 1, sizeof(*rs));
        Gpumem__Range **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
        if (!rs || !ptrs) {
                free(rs);
                free(ptrs);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                gpumem__range__init(&rs[i]);
                rs[i].segment_id = ranges[i].segment_id;
                rs[i].offset = ranges[i].offset;
                rs[i].length = ranges[i].length;
                rs[i].whole_segment = ranges[i].whole_segment;
                ptrs[i] = &rs[i];
        }
        Gpumem__ReleaseRequest req = GPUMEM__RELEASE_REQUEST__INIT;
        req.release_id = release_id;
        req.n_ranges = n;
        req.ranges = ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST;
        env.release_request = &req;
        int r = conn_send(c, 0, &env, NULL, 0);
        free(rs);
        free(ptrs);
        return r;
}

static void alloc_done(void *userdata, gm_session_t *s, uint64_t request_id, const gm_outcome_t *out) {
        gm_req_central_answer_alloc(gm_session_userdata(s), request_id, out);
}

static int store_add(void *userdata, int fd, const char *name) {
        return gm_sd_fdstore_add(fd, name);
}

static void store_remove(void *userdata, const char *name) {
        gm_sd_fdstore_remove(name);
}

static void broker_log(void *userdata, int priority, const char *message) {
        gm_log(priority, "%s", message);
}

static void count_reclaim(void *userdata, gm_reclaim_outcome_t outcome) {
        gm_daemon_t *d = userdata;
        gm_metrics_count_reclaim(d->metrics, outcome);
}

static void count_refusal(void *userdata, const char *tenant, gm_oom_reason_t reason) {
        gm_daemon_t *d = userdata;
        gm_metrics_count_refusal(d->metrics, tenant, reason);
}

static void parked_done(void *userdata, uint64_t waited_ms) {
        gm_daemon_t *d = userdata;
        gm_metrics_observe_reclaim_wait(d->metrics, waited_ms * 1000000u);
}

gm_broker_ops_t gm_server_broker_ops(gm_daemon_t *d) {
        return (gm_broker_ops_t){
                .send_release = send_release,
                .send_reclaim = gm_local_send_reclaim,
                .alloc_conf_changed = gm_local_push_alloc_conf,
                .client_view = gm_localstats_client_view,
                .alloc_done = alloc_done,
                .store_add = store_add,
                .store_remove = store_remove,
                .log = broker_log,
                .count_reclaim = count_reclaim,
                .count_refusal = count_refusal,
                .parked_done = parked_done,
                .userdata = d,
        };
}
