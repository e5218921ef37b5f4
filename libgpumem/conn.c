/* The connection to gpumemd: sending, the reader hand-over between calling
 * threads and the service thread, dispatch through the handlers table
 * (conn.h), and the thread's calling errors. `lock` guards the fields of the
 * client below it; read_lock is held by the one thread reading the socket. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "hotmsg.h"
#include "ipc.h"
#include "msg.h"

/* The calling thread's last failure, tagged with the client it concerns. */
static __thread const gpumem_client *tls_error_client;
static __thread char tls_error[2048];

int gm_conn_set_error(const gpumem_client *c, int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
        va_end(ap);
        tls_error_client = c;
        return err;
}

const char *gm_conn_last_error(const gpumem_client *c) {
        return tls_error_client == c ? tls_error : ""; /* NULL: the thread's last failed connect */
}

bool gm_conn_error_is_for(const gpumem_client *c) {
        return tls_error_client == c;
}

void gm_conn_error_forget(void) {
        tls_error_client = NULL;
}

/* Sends env in the fixed layout; -EOPNOTSUPP for a message it does not carry. */
static int send_fixed(int fd, const Gpumem__Envelope *env) {
        uint8_t buf[GM_HOTMSG_MAX_SIZE];
        size_t len;
        int r = gm_hotmsg_encode(env, buf, sizeof(buf), &len);
        return r < 0 ? r : gm_ipc_send(fd, buf, len, NULL, 0);
}

int gm_conn_send(gpumem_client *c, const Gpumem__Envelope *env) {
        pthread_rwlock_rdlock(&c->fd_lock);
        int r = atomic_load_explicit(&c->fixed_codec, memory_order_relaxed) ? send_fixed(c->fd, env) : -EOPNOTSUPP;
        if (r == -EOPNOTSUPP)
                r = gm_msg_send(c->fd, env, NULL, 0, c->max_packet);
        pthread_rwlock_unlock(&c->fd_lock);
        return r;
}

/* ---- the service thread ---- */

void gm_conn_wake(gpumem_client *c) {
        uint64_t one = 1;
        if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                /* The counter is full: the service thread is awake anyway. */
        }
}

static waiter_t *waiter_find(gpumem_client *c, uint64_t request_id) {
        for (waiter_t *w = c->waiters; w; w = w->next)
                if (w->request_id == request_id)
                        return w;
        return NULL;
}

static const gm_conn_push_t *push_for(const gpumem_client *c, Gpumem__Envelope__BodyCase body_case) {
        for (size_t i = 0; i < c->handlers->n_pushes; i++)
                if (c->handlers->pushes[i].body_case == body_case)
                        return &c->handlers->pushes[i];
        return NULL;
}

/* Handles one packet from the daemon: its handler (push_for()), or as the
 * reply of its waiter (which gets its first fd). Caller holds lock. */
static void dispatch(gpumem_client *c, const gm_conn_push_t *push, Gpumem__Envelope *env, int *fds, size_t n_fds) {
        waiter_t *w = env->request_id ? waiter_find(c, env->request_id) : NULL;
        if (push && push->handle(c, env, w, fds, n_fds))
                return;
        if (!push) {
                if (w && w->fd < 0 && n_fds > 0) {
                        w->fd = fds[0];
                        fds++;
                        n_fds--;
                }
                gm_close_fds(fds, n_fds);
        }
        if (!w) {
                if (env->body_case == GPUMEM__ENVELOPE__BODY_ERROR)
                        snprintf(c->async_error, sizeof(c->async_error), "%s", env->error->message);
                gm_msg_free(env);
                return;
        }
        w->reply = env;
        w->done = true;
        pthread_cond_signal(&w->cond);
}

/* Pending stream events are polled after EVENT_POLL_MIN_MS, backing off to
 * EVENT_POLL_MAX_MS while they stay pending; a new stream-ordered free starts
 * from the minimum again. */
#define EVENT_POLL_MIN_MS 1
#define EVENT_POLL_MAX_MS 64

int gm_conn_fit_rx(gpumem_client *c) {
        size_t cap = GM_IPC_MAX_PACKET_DEFAULT > c->max_packet ? GM_IPC_MAX_PACKET_DEFAULT : c->max_packet;
        if (cap <= c->rx_cap)
                return 0;
        uint8_t *buf = realloc(c->rx_buf, cap);
        if (!buf)
                return -ENOMEM;
        c->rx_buf = buf;
        c->rx_cap = cap;
        return 0;
}

/* Reads one packet and dispatches it. Caller holds read_lock. Returns 0, or
 * the negative errno of a connection that ended or spoke nonsense (the
 * service thread deals with that). With `mine`, *ret_mine_done tells
 * whether that waiter has its reply now. */
static int read_packet(gpumem_client *c, bool *ret_pending, const waiter_t *mine, bool *ret_mine_done) {
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t len = 0, n_fds = 0;
        pthread_rwlock_rdlock(&c->fd_lock);
        int r = gm_ipc_recv(c->fd, c->rx_buf, c->rx_cap, fds, c->max_fds, &len, &n_fds);
        pthread_rwlock_unlock(&c->fd_lock);
        if (r < 0)
                return r;
        Gpumem__Envelope *env = NULL;
        if (gm_msg_unpack(c->rx_buf, len, &env) < 0) {
                gm_close_fds(fds, n_fds);
                return -EPROTO;
        }
        const gm_conn_push_t *push = push_for(c, env->body_case);
        if (push && push->before)
                push->before(c, env);
        pthread_mutex_lock(&c->lock);
        dispatch(c, push, env, fds, n_fds);
        bool pending = c->handlers->poll(c);
        if (mine)
                *ret_mine_done = mine->done;
        pthread_mutex_unlock(&c->lock);
        if (ret_pending)
                *ret_pending = pending;
        return 0;
}

/* How long calling threads have the socket to themselves: while calls are
 * in flight (and for GM_CONN_CALLER_GRACE_MS after the last) they read their own
 * replies and whatever comes before them; the service thread, off the
 * socket, is not woken by every reply. 0: the socket is the service
 * thread's (no recent calls, or a caller's read failed). */

static void reader_done(gpumem_client *c);

uint64_t gm_conn_idle_ms(const gpumem_client *c) {
        if (atomic_load_explicit(&c->callers, memory_order_relaxed) > 0)
                return 0;
        uint64_t last = atomic_load_explicit(&c->last_call_ms, memory_order_relaxed);
        if (!last)
                return UINT64_MAX;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u - last;
}

static int socket_left_to_callers(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool lost = c->reader_lost || c->dead;
        pthread_mutex_unlock(&c->lock);
        if (lost)
                return 0;
        uint64_t idle = gm_conn_idle_ms(c);
        return idle < GM_CONN_CALLER_GRACE_MS ? (int) (GM_CONN_CALLER_GRACE_MS - idle) : 0;
}

static void *service_main(void *arg) {
        gpumem_client *c = arg;
        bool pending = false;
        int poll_ms = EVENT_POLL_MIN_MS;
        for (;;) {
                bool reclaiming = c->handlers->serve(c);
                int timeout = pending || reclaiming ? poll_ms : -1;
                int off_ms = socket_left_to_callers(c);
                if (off_ms > 0 && (timeout < 0 || off_ms < timeout))
                        timeout = off_ms;
                struct pollfd pfd[2] = {{.fd = off_ms > 0 ? -1 : c->fd, .events = POLLIN},
                                        {.fd = c->wake_fd, .events = POLLIN}};
                int n = poll(pfd, 2, timeout);
                if (n < 0 && errno != EINTR)
                        break;
                if (n == 0 && poll_ms < EVENT_POLL_MAX_MS)
                        poll_ms *= 2;
                if (pfd[1].revents & POLLIN) {
                        poll_ms = EVENT_POLL_MIN_MS;
                        uint64_t v;
                        if (read(c->wake_fd, &v, sizeof(v)) < 0) {
                        }
                        pthread_mutex_lock(&c->lock);
                        bool closing = c->closing;
                        pthread_mutex_unlock(&c->lock);
                        if (closing) /* gpumem_disconnect(): it unmaps, then closes the socket */
                                break;
                }
                if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) {
                        pthread_mutex_lock(&c->lock);
                        pending = c->handlers->poll(c);
                        pthread_mutex_unlock(&c->lock);
                        continue;
                }
                /* A calling thread may be reading its own reply; once it is done,
                 * see whether anything is left. */
                pthread_mutex_lock(&c->read_lock);
                struct pollfd again = {.fd = c->fd, .events = POLLIN};
                int r = poll(&again, 1, 0) > 0 ? read_packet(c, &pending, NULL, NULL) : 0;
                pthread_mutex_unlock(&c->read_lock);
                reader_done(c);
                if (r == 0 || r == -EINTR || r == -EAGAIN)
                        continue;
                if (r == -ECONNRESET && c->handlers->reconnect(c)) {
                        /* The daemon restarted and the session is back; its limits may differ. */
                        pthread_mutex_lock(&c->read_lock);
                        r = gm_conn_fit_rx(c);
                        pthread_mutex_unlock(&c->read_lock);
                        pthread_mutex_lock(&c->lock);
                        c->reader_lost = false;
                        pthread_mutex_unlock(&c->lock);
                        reader_done(c);
                        if (r == 0)
                                continue;
                }
                pthread_mutex_lock(&c->lock);
                /* The daemon is gone (or spoke nonsense): fail every waiter. */
                c->dead = true;
                for (waiter_t *w = c->waiters; w; w = w->next) {
                        w->error = -ECONNRESET;
                        w->done = true;
                        pthread_cond_signal(&w->cond);
                }
                pthread_mutex_unlock(&c->lock);
                break;
        }
        return NULL;
}

int gm_conn_start_service(gpumem_client *c) {
        return -pthread_create(&c->service, NULL, service_main, c);
}

/* ---- requests ---- */

int gm_conn_post_locked(gpumem_client *c, Gpumem__Envelope *env) {
        if (c->dead)
                return gm_conn_set_error(c, -ECONNRESET, "gpumem: the connection to gpumemd is closed");
        if (c->handlers->before_send)
                c->handlers->before_send(c, env);
        env->request_id = ++c->next_request_id;
        int r = gm_conn_send(c, env);
        /* A free lost with the connection is carried by the re-attach ledger. */
        if (r < 0 && gm_conn_lost(r) && c->token[0] && c->reconnect_timeout_ms)
                return 0;
        return r < 0 ? gm_conn_set_error(c, gm_conn_lost(r) ? -ECONNRESET : r, "gpumem: cannot send to gpumemd") : 0;
}

/* The thread that read the socket (holding read_lock) let it go: every
 * waiter still without its reply tries to read next. Caller holds lock. */
static void reader_done_locked(gpumem_client *c) {
        c->reader_generation++;
        for (waiter_t *w = c->waiters; w; w = w->next)
                if (!w->done)
                        pthread_cond_signal(&w->cond);
}

static void reader_done(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        reader_done_locked(c);
        pthread_mutex_unlock(&c->lock);
}

/* Holding read_lock (released here): reads until w's reply is in,
 * dispatching whatever comes first: no thread wake-up between the reply and
 * its caller. A failed read is the service thread's to judge. Returns true
 * when w has its reply; the caller then owes reader_done_locked() (done in
 * the critical section it takes next anyway). */
static bool read_own_reply(gpumem_client *c, waiter_t *w) {
        pthread_mutex_lock(&c->lock);
        bool done = w->done;
        pthread_mutex_unlock(&c->lock);
        int r = 0;
        while (!done && (r = read_packet(c, NULL, w, &done)) == 0) {
        }
        pthread_mutex_unlock(&c->read_lock);
        if (done)
                return true;
        if (r < 0) {
                pthread_mutex_lock(&c->lock);
                c->reader_lost = true;
                pthread_mutex_unlock(&c->lock);
                gm_conn_wake(c);
        }
        reader_done(c);
        return false;
}

/* Calls in flight, and when the last one ended: while callers read their own
 * replies the service thread keeps off the socket. */
static void calls_begin(gpumem_client *c) {
        atomic_fetch_add_explicit(&c->callers, 1, memory_order_relaxed);
}

static void calls_end(gpumem_client *c) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        atomic_store_explicit(&c->last_call_ms, (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u,
                              memory_order_relaxed);
        atomic_fetch_sub_explicit(&c->callers, 1, memory_order_relaxed);
}

static int call_fd_inner(gpumem_client *c, Gpumem__Envelope *env, const gm_conn_request_ops_t *ops,
                         Gpumem__Envelope **ret_reply, int *ret_fd);

int gm_conn_call_fd(gpumem_client *c, Gpumem__Envelope *env, const gm_conn_request_ops_t *ops,
                    Gpumem__Envelope **ret_reply, int *ret_fd) {
        calls_begin(c);
        int r = call_fd_inner(c, env, ops, ret_reply, ret_fd);
        calls_end(c);
        return r;
}

static int call_fd_inner(gpumem_client *c, Gpumem__Envelope *env, const gm_conn_request_ops_t *ops,
                         Gpumem__Envelope **ret_reply, int *ret_fd) {
        waiter_t w = {.cond = PTHREAD_COND_INITIALIZER, .fd = -1};
        pthread_mutex_lock(&c->lock);
        if (c->dead) {
                pthread_mutex_unlock(&c->lock);
                return gm_conn_set_error(c, -ECONNRESET, "gpumem: the connection to gpumemd is closed");
        }
        if (c->handlers->before_send)
                c->handlers->before_send(c, env);
        w.request_id = ++c->next_request_id;
        w.next = c->waiters;
        c->waiters = &w;
        pthread_mutex_unlock(&c->lock);

        int r;
        for (;;) {
                env->request_id = w.request_id;
                r = ops && ops->send ? ops->send(c, env) : gm_conn_send(c, env);
                if (r < 0 && gm_conn_lost(r))
                        r = 0; /* the service thread tells us: resend or lost */
                bool read_it = false;
                while (r == 0) {
                        pthread_mutex_lock(&c->lock);
                        uint64_t generation = c->reader_generation;
                        bool wait_only = w.done || c->reader_lost;
                        pthread_mutex_unlock(&c->lock);
                        if (wait_only)
                                break;
                        if (pthread_mutex_trylock(&c->read_lock) == 0) {
                                if ((read_it = read_own_reply(c, &w)))
                                        break;
                                continue;
                        }
                        /* Another thread reads: it hands over when it is done. */
                        pthread_mutex_lock(&c->lock);
                        if (!w.done && c->reader_generation == generation)
                                pthread_cond_wait(&w.cond, &c->lock);
                        pthread_mutex_unlock(&c->lock);
                }
                pthread_mutex_lock(&c->lock);
                if (read_it)
                        reader_done_locked(c);
                /* A call the service thread makes (a Reclaim's give-back)
                 * cannot wait for itself to reconnect. */
                if (r == 0 && !w.done && c->reader_lost && pthread_equal(pthread_self(), c->service))
                        r = -ECONNRESET;
                while (r == 0 && !w.done)
                        pthread_cond_wait(&w.cond, &c->lock);
                if (r < 0 || !w.resend)
                        break;
                w.resend = false;
                w.done = false;
                pthread_mutex_unlock(&c->lock);
        }
        for (waiter_t **wp = &c->waiters; *wp; wp = &(*wp)->next)
                if (*wp == &w) {
                        *wp = w.next;
                        break;
                }
        pthread_mutex_unlock(&c->lock);
        pthread_cond_destroy(&w.cond);
        if (w.fd >= 0 &&
            (!ret_fd || r < 0 || w.error < 0 || !w.reply || w.reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR)) {
                close(w.fd);
                w.fd = -1;
        }

        if (r < 0)
                return gm_conn_set_error(c, r == -EPIPE ? -ECONNRESET : r, "gpumem: cannot send to gpumemd: %s",
                                         strerror(-r));
        Gpumem__Envelope *reply = w.reply;
        if (reply && reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                int err = -(int) reply->error->code;
                gm_conn_set_error(c, err ? err : -EPROTO, "%s", reply->error->message ? reply->error->message : "");
                gm_msg_free(reply);
                return err ? err : -EPROTO;
        }
        if (w.error < 0 && reply && ops && ops->unmapped)
                ops->unmapped(c, reply);
        if (w.error < 0) {
                gm_msg_free(reply);
                return w.error == -ECONNRESET
                               ? gm_conn_set_error(c, -ECONNRESET, "gpumem: gpumemd closed the connection")
                               : gm_conn_set_error(c, w.error, "gpumem: mapping memory from gpumemd failed: %s%s%s",
                                                   strerror(-w.error), w.detail[0] ? ": " : "", w.detail);
        }
        *ret_reply = reply;
        if (ret_fd)
                *ret_fd = w.fd;
        return 0;
}

int gm_conn_call_expect(gpumem_client *c, Gpumem__Envelope *env, const gm_conn_request_ops_t *ops,
                        Gpumem__Envelope__BodyCase want, Gpumem__Envelope **ret_reply) {
        Gpumem__Envelope *reply = NULL;
        int r = gm_conn_call_fd(c, env, ops, &reply, NULL);
        if (r < 0)
                return r;
        if (reply->body_case != want) {
                gm_msg_free(reply);
                return gm_conn_set_error(c, -EPROTO, "gpumem: unexpected reply from gpumemd");
        }
        *ret_reply = reply;
        return 0;
}

int gm_conn_post(gpumem_client *c, Gpumem__Envelope *env) {
        pthread_mutex_lock(&c->lock);
        int r = gm_conn_post_locked(c, env);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- session lifetime ---- */

int gm_conn_recv(gpumem_client *c, int fd, Gpumem__Envelope **ret_env, int *ret_fd) {
        size_t cap = c->max_packet ? c->max_packet : GM_IPC_MAX_PACKET_DEFAULT;
        uint8_t *buf = malloc(cap);
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t len = 0, n_fds = 0, kept = 0;
        int r = buf ? gm_ipc_recv(fd, buf, cap, fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds) : -ENOMEM;
        if (r == 0) {
                kept = ret_fd && n_fds > 0 ? 1 : 0;
                gm_close_fds(fds + kept, n_fds - kept);
                r = gm_msg_unpack(buf, len, ret_env);
                if (r < 0 && kept)
                        close(fds[0]);
                else if (ret_fd)
                        *ret_fd = kept ? fds[0] : -1;
        }
        free(buf);
        return r;
}

int gm_conn_answer(gpumem_client *c, Gpumem__Envelope *env) {
        pthread_mutex_lock(&c->lock);
        if (c->handlers->before_send)
                c->handlers->before_send(c, env);
        env->request_id = ++c->next_request_id;
        pthread_mutex_unlock(&c->lock);
        return gm_conn_send(c, env);
}
