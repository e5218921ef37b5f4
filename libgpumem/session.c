/* A session with gpumemd: the Hello exchange, re-attach after a daemon
 * restart (reporting what this client holds), reconnecting with backoff,
 * closing, and a fork()ed child's own session. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cuda_loader.h"
#include "hotmsg.h"
#include "ipc.h"
#include "mapping.h"
#include "msg.h"
#include "peer_check.h"
#include "session.h"

/* The Hello heap mode for the application's choice (and $GPUMEM_HEAP). */
static int hello_heap_mode(const gpumem_client *c, Gpumem__HeapMode *ret_mode) {
        gpumem_heap_mode choice = c->heap_choice;
        const char *env = getenv("GPUMEM_HEAP");
        if (choice == GPUMEM_HEAP_DEFAULT && env && *env) {
                if (strcmp(env, "local") == 0)
                        choice = GPUMEM_HEAP_LOCAL;
                else if (strcmp(env, "central") == 0)
                        choice = GPUMEM_HEAP_CENTRAL;
                else
                        return gm_conn_set_error(c, -EINVAL, "gpumem: GPUMEM_HEAP='%s': expected 'local' or 'central'",
                                                 env);
        }
        *ret_mode = choice == GPUMEM_HEAP_LOCAL     ? GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL
                    : choice == GPUMEM_HEAP_CENTRAL ? GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL
                                                    : GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED;
        return 0;
}

/* Hello (fresh, or resuming the session `resume_token` names) on `fd`;
 * takes the daemon's limits and the session token from the reply. A local
 * session's statistics page comes back in *ret_page_fd (-1 otherwise). */
static int hello_exchange(gpumem_client *c, int fd, const char *resume_token, Gpumem__Envelope **ret_reply,
                          int *ret_page_fd) {
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        int r = hello_heap_mode(c, &hello.heap_mode);
        if (r < 0)
                return r;
        char name[64];
        snprintf(name, sizeof(name), "libgpumem pid %d", (int) getpid());
        hello.client_name = name;
        hello.resume_token = (char *) (resume_token ? resume_token : "");
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = ++c->next_request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        r = gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT);
        Gpumem__Envelope *reply = NULL;
        int page_fd = -1;
        if (r == 0 || r == -EPIPE) /* a daemon that refused us at once left its reason to read */
                r = gm_conn_recv(c, fd, &reply, &page_fd);
        if (r < 0)
                return gm_conn_set_error(c, gm_conn_lost(r) ? -ECONNRESET : r,
                                         "gpumem: no hello from gpumemd at '%s': %s", c->socket_path, strerror(-r));
        bool local = reply->body_case == GPUMEM__ENVELOPE__BODY_HELLO_REPLY &&
                     reply->hello_reply->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL;
        if (page_fd >= 0 && !local) {
                close(page_fd);
                page_fd = -1;
        }
        if (reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                r = -(int) reply->error->code;
                gm_conn_set_error(c, r ? r : -EPROTO, "%s", reply->error->message);
                gm_msg_free(reply);
                return r ? r : -EPROTO;
        }
        if (reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY || (local && page_fd < 0)) {
                if (page_fd >= 0)
                        close(page_fd);
                gm_msg_free(reply);
                return gm_conn_set_error(c, -EPROTO, "gpumem: unexpected hello reply");
        }
        const Gpumem__HelloReply *hr = reply->hello_reply;
        c->max_packet = hr->max_packet ? hr->max_packet : GM_IPC_MAX_PACKET_DEFAULT;
        c->max_fds = hr->max_fds && hr->max_fds <= GM_IPC_MAX_FDS_LIMIT ? hr->max_fds : GM_IPC_MAX_FDS_LIMIT;
        c->max_grant_pieces = hr->grant_runs ? c->max_fds : 1;
        c->return_intents = hr->return_intents;
        snprintf(c->token, sizeof(c->token), "%s", hr->session_token ? hr->session_token : "");
        snprintf(c->tenant, sizeof(c->tenant), "%s", hr->tenant ? hr->tenant : "");
        c->device = hr->device;
        c->session_id = hr->session_id;
        *ret_reply = reply;
        *ret_page_fd = page_fd;
        return 0;
}

int gm_session_open(gpumem_client *c) {
        char why[512];
        int r = gm_peer_connect(c->socket_path, &c->fd, why, sizeof(why));
        if (r < 0)
                return gm_conn_set_error(c, r, "gpumem: %s", why);
        Gpumem__Envelope *reply = NULL;
        int page_fd = -1;
        r = hello_exchange(c, c->fd, NULL, &reply, &page_fd);
        if (r < 0)
                return r;
        const Gpumem__HelloReply *hr = reply->hello_reply;
        snprintf(c->backend, sizeof(c->backend), "%s", hr->backend);
        c->capacity = hr->capacity;
        r = gm_mapper_open(hr->backend,
                           &(gm_mapper_params_t){.device = hr->device,
                                                 .device_uuid = hr->device_uuid,
                                                 .granularity = hr->granularity},
                           &c->mapper);
        if (r == 0 && hr->caps && hr->caps->device_streams != c->mapper->ops->caps->device_streams)
                r = -EPROTO; /* the daemon's kind of that name is not this library's */
        if (r < 0) {
                gm_msg_free(reply);
                if (page_fd >= 0)
                        close(page_fd);
                return gm_conn_set_error(c, r, "gpumem: cannot map %s memory in this process: %s%s%s%s", c->backend,
                                         strerror(-r), gm_cuda_last_error()[0] ? " (" : "", gm_cuda_last_error(),
                                         gm_cuda_last_error()[0] ? ")" : "");
        }
        r = c->session_hooks->opened(c, hr, page_fd);
        if (page_fd >= 0)
                close(page_fd);
        gm_msg_free(reply);
        if (r < 0)
                return r;
        c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wake_fd < 0)
                return gm_conn_set_error(c, -errno, "gpumem: eventfd: %s", strerror(errno));
        if (gm_conn_fit_rx(c) < 0)
                return gm_conn_set_error(c, -ENOMEM, "gpumem: out of memory");
        r = gm_conn_start_service(c);
        if (r < 0)
                return gm_conn_set_error(c, r, "gpumem: cannot start the service thread");
        c->service_started = true;
        return 0;
}

/* ---- re-attach after a daemon restart ---- */

/* Budget of one Reattach packet, well inside max_packet. */
static size_t reattach_budget(const gpumem_client *c) {
        return c->max_packet / 2;
}

typedef struct reattach_builder {
        Gpumem__ReattachSegment *segs;
        Gpumem__ReattachSegment **seg_ptrs;
        Gpumem__Range *ranges;
        Gpumem__Range **range_ptrs;
        Gpumem__ReattachBlock *blocks;
        Gpumem__ReattachBlock **block_ptrs;
        Gpumem__ReattachShared *shared;
        Gpumem__ReattachShared **shared_ptrs;
        size_t n_segs, n_ranges, n_blocks, n_shared, bytes;
} reattach_builder_t;

static int reattach_flush(gpumem_client *c, int fd, reattach_builder_t *rb, bool last) {
        Gpumem__Reattach ra = GPUMEM__REATTACH__INIT;
        ra.n_segments = rb->n_segs;
        ra.segments = rb->seg_ptrs;
        ra.n_blocks = rb->n_blocks;
        ra.blocks = rb->block_ptrs;
        ra.n_shared = rb->n_shared;
        ra.shared = rb->shared_ptrs;
        ra.last = last;
        if (last) { /* what the new daemon cannot read from its ledger: the sleep and the claim */
                ra.sleeping_bytes = c->reattach_sleeping_bytes;
                ra.claim_bytes = c->claim_bytes;
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = ++c->next_request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_REATTACH;
        env.reattach = &ra;
        int r = gm_msg_send(fd, &env, NULL, 0, c->max_packet);
        rb->n_segs = rb->n_ranges = rb->n_blocks = rb->n_shared = rb->bytes = 0;
        return r;
}

/* A shared object this process still maps (the new daemon counts it as a
 * mapper again). */
static int reattach_shared(gpumem_client *c, int fd, reattach_builder_t *rb, const gm_shared_held_t *h) {
        enum { SHARED_BYTES = 48 + sizeof(h->name) };
        if (rb->bytes + SHARED_BYTES > reattach_budget(c)) {
                int r = reattach_flush(c, fd, rb, false);
                if (r < 0)
                        return r;
        }
        Gpumem__ReattachShared *rs = &rb->shared[rb->n_shared];
        gpumem__reattach_shared__init(rs);
        rs->object_id = h->object_id;
        rs->name = (char *) h->name;
        rs->version = h->version;
        rs->size = h->size;
        rb->shared_ptrs[rb->n_shared++] = rs;
        rb->bytes += SHARED_BYTES;
        return 0;
}

static int reattach_block(gpumem_client *c, int fd, reattach_builder_t *rb, const block_t *b, bool pending) {
        if (rb->bytes + 64 > reattach_budget(c)) {
                int r = reattach_flush(c, fd, rb, false);
                if (r < 0)
                        return r;
        }
        Gpumem__ReattachBlock *rbk = &rb->blocks[rb->n_blocks];
        gpumem__reattach_block__init(rbk);
        rbk->block_id = b->id;
        rbk->segment_id = b->segment_id;
        rbk->offset = b->offset;
        rbk->size = b->size;
        rbk->requested_size = b->requested;
        rbk->pending_free = pending;
        rb->block_ptrs[rb->n_blocks++] = rbk;
        rb->bytes += 64;
        return 0;
}

/* Tells the daemon on `fd` everything this client holds: segments with their
 * mapped pieces, live blocks, frees waiting for streams, shared objects
 * it maps. Caller holds lock. */
static int reattach_send(gpumem_client *c, int fd) {
        size_t max_items = reattach_budget(c) / 16 + 1;
        reattach_builder_t rb = {
                .segs = calloc(max_items, sizeof(*rb.segs)),
                .seg_ptrs = calloc(max_items, sizeof(*rb.seg_ptrs)),
                .ranges = calloc(max_items, sizeof(*rb.ranges)),
                .range_ptrs = calloc(max_items, sizeof(*rb.range_ptrs)),
                .blocks = calloc(max_items, sizeof(*rb.blocks)),
                .block_ptrs = calloc(max_items, sizeof(*rb.block_ptrs)),
                .shared = calloc(max_items, sizeof(*rb.shared)),
                .shared_ptrs = calloc(max_items, sizeof(*rb.shared_ptrs)),
        };
        int r = rb.segs && rb.seg_ptrs && rb.ranges && rb.range_ptrs && rb.blocks && rb.block_ptrs && rb.shared &&
                                rb.shared_ptrs
                        ? 0
                        : -ENOMEM;
        for (size_t i = 0; i < c->segments.cap && r == 0; i++) {
                const segment_t *seg = c->segments.values[i];
                if (!seg || seg->n_pieces == 0)
                        continue;
                size_t need = 48 + 24 * seg->n_pieces;
                if (need > reattach_budget(c)) {
                        r = -E2BIG; /* more mapped pieces than one packet describes */
                        break;
                }
                if (rb.bytes + need > reattach_budget(c) && (r = reattach_flush(c, fd, &rb, false)) < 0)
                        break;
                Gpumem__ReattachSegment *rs = &rb.segs[rb.n_segs];
                gpumem__reattach_segment__init(rs);
                rs->segment_id = seg->id;
                rs->va_size = seg->va_size;
                rs->stream = seg->stream;
                rs->n_mapped = seg->n_pieces;
                rs->mapped = rb.range_ptrs + rb.n_ranges;
                for (size_t k = 0; k < seg->n_pieces; k++) {
                        Gpumem__Range *range = &rb.ranges[rb.n_ranges];
                        gpumem__range__init(range);
                        range->segment_id = seg->id;
                        range->offset = seg->pieces[k];
                        range->length = seg->piece_size;
                        rb.range_ptrs[rb.n_ranges++] = range;
                }
                rb.seg_ptrs[rb.n_segs++] = rs;
                rb.bytes += need;
        }
        /* A local heap keeps its blocks to itself: segments and pieces only. */
        for (size_t i = 0; i < c->blocks.cap && r == 0 && !c->local; i++)
                if (c->blocks.values[i])
                        r = reattach_block(c, fd, &rb, c->blocks.values[i], false);
        for (pending_free_t *p = c->pending_frees; p && r == 0 && !c->local; p = p->next)
                r = reattach_block(c, fd, &rb, &p->block, true);
        for (const gm_shared_held_t *h = c->shared_held; h && r == 0; h = h->next)
                r = reattach_shared(c, fd, &rb, h);
        if (r == 0)
                r = reattach_flush(c, fd, &rb, true);
        free(rb.segs);
        free(rb.seg_ptrs);
        free(rb.ranges);
        free(rb.range_ptrs);
        free(rb.blocks);
        free(rb.block_ptrs);
        free(rb.shared);
        free(rb.shared_ptrs);
        return r;
}

/* One attempt: connect, resume the session, report the ledger, and on Ok
 * make the new connection current. Returns 0, -EAGAIN to try again later,
 * or another negative errno when the session cannot come back. */
static int reattach_once(gpumem_client *c) {
        int fd;
        char why[512];
        int r = gm_peer_connect(c->socket_path, &fd, why, sizeof(why));
        if (r < 0)
                return -EAGAIN;
        Gpumem__Envelope *reply = NULL;
        pthread_mutex_lock(&c->lock); /* no free may slip between the report and the switch */
        int page_fd = -1;
        r = hello_exchange(c, fd, c->token, &reply, &page_fd);
        if (r == 0 && page_fd >= 0)
                r = c->session_hooks->page_replaced(c, page_fd);
        if (r == 0) {
                c->carries_frees = c->carries_frees && reply->hello_reply->carried_frees;
                if (reply->hello_reply->fixed_codec != GM_HOTMSG_VERSION) /* an older daemon now */
                        atomic_store_explicit(&c->fixed_codec, false, memory_order_relaxed);
                gm_msg_free(reply);
                reply = NULL;
                r = reattach_send(c, fd);
        }
        bool claim = c->claim_bytes != 0; /* answered with what the new daemon set aside again */
        if (r == 0)
                r = gm_conn_recv(c, fd, &reply, NULL);
        if (r == 0 && reply->body_case == (claim ? GPUMEM__ENVELOPE__BODY_CLAIM_REPLY : GPUMEM__ENVELOPE__BODY_OK))
                c->claim_bytes = claim ? reply->claim_reply->claimed : 0;
        else if (r == 0)
                r = reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR && reply->error->code ? -(int) reply->error->code
                                                                                           : -EPROTO;
        gm_msg_free(reply);
        if (r < 0) {
                pthread_mutex_unlock(&c->lock);
                close(fd);
                return gm_conn_lost(r) ? -EAGAIN : r;
        }
        pthread_rwlock_wrlock(&c->fd_lock);
        int old = c->fd;
        c->fd = fd;
        pthread_rwlock_unlock(&c->fd_lock);
        close(old);
        c->reconnecting = false;
        gm_fences_clear(&c->fences, true); /* the new daemon's fence numbers start over */
        atomic_store_explicit(&c->fences_pending, false, memory_order_relaxed);
        atomic_store_explicit(&c->fences_freed, false, memory_order_relaxed);
        gm_mapping_drop_held_releases(c); /* the old daemon's release ids; the report says what is mapped */
        c->n_carried_frees = 0;           /* not in the report: the new daemon never knew those blocks */
        atomic_store_explicit(&c->frees_carried, false, memory_order_relaxed);
        for (waiter_t *w = c->waiters; w; w = w->next)
                if (!w->done) { /* sent to the old daemon, never answered */
                        w->resend = true;
                        w->done = true;
                        pthread_cond_signal(&w->cond);
                }
        pthread_mutex_unlock(&c->lock);
        return 0;
}

bool gm_session_reconnect(gpumem_client *c) {
        pthread_mutex_lock(&c->lock);
        bool give_up = c->closing || !c->token[0] || c->reconnect_timeout_ms == 0;
        c->reconnecting = !give_up;
        pthread_mutex_unlock(&c->lock);
        if (give_up)
                return false;
        struct timespec start;
        clock_gettime(CLOCK_MONOTONIC, &start);
        int backoff_ms = 10;
        for (;;) {
                struct pollfd pfd = {.fd = c->wake_fd, .events = POLLIN};
                poll(&pfd, 1, backoff_ms); /* gpumem_disconnect() wakes it */
                pthread_mutex_lock(&c->lock);
                bool closing = c->closing;
                pthread_mutex_unlock(&c->lock);
                if (closing)
                        break;
                int r = reattach_once(c);
                if (r == 0)
                        return true;
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                uint64_t elapsed = (uint64_t) (now.tv_sec - start.tv_sec) * 1000u +
                                   (uint64_t) ((now.tv_nsec - start.tv_nsec) / 1000000);
                if (r != -EAGAIN || elapsed >= c->reconnect_timeout_ms)
                        break;
                backoff_ms = backoff_ms < 500 ? backoff_ms * 2 : 1000;
        }
        pthread_mutex_lock(&c->lock);
        c->reconnecting = false;
        pthread_mutex_unlock(&c->lock);
        return false;
}

static void close_and_forget(int *fd) {
        if (*fd >= 0)
                close(*fd);
        *fd = -1;
}

void gm_session_close(gpumem_client *c, bool owner) {
        pthread_mutex_lock(&c->lock);
        c->closing = true;
        pthread_mutex_unlock(&c->lock);
        if (c->wake_fd >= 0 && owner) {
                uint64_t one = 1;
                if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                        /* full counter: the thread is awake anyway */
                }
        }
        if (c->service_started && owner)
                pthread_join(c->service, NULL); /* woken by wake_fd, it sees `closing` */
        c->service_started = false;
        /* The memory goes before the connection does: a mapping still there
         * when the daemon sees the session end is one its process kept, and
         * the daemon keeps it charged until it is gone. */
        c->session_hooks->forget(c, owner);
        gm_mapping_forget(c, owner);
        close_and_forget(&c->fd);
        close_and_forget(&c->wake_fd);
        if (c->mapper)
                c->mapper->ops->destroy(c->mapper);
        c->mapper = NULL;
}

_Atomic unsigned gm_session_fork_generation;
static pthread_once_t fork_hook_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
        atomic_fetch_add_explicit(&gm_session_fork_generation, 1, memory_order_relaxed);
}

static void install_fork_hook(void) {
        pthread_atfork(NULL, NULL, on_fork_child);
}

unsigned gm_session_watch_fork(void) {
        pthread_once(&fork_hook_once, install_fork_hook);
        return atomic_load_explicit(&gm_session_fork_generation, memory_order_relaxed);
}

int gm_session_after_fork(gpumem_client *c, unsigned generation) {
        c->fork_generation = generation;
        if (c->pid == getpid())
                return 0;
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->read_lock, NULL);
        gm_heap_lock_init(&c->heap_lock);
        pthread_rwlock_init(&c->fd_lock, NULL);
        gm_session_close(c, false);
        c->waiters = NULL;
        c->dead = false;
        c->closing = false;
        c->reconnecting = false;
        c->token[0] = '\0';
        c->claim_bytes = 0; /* the parent's claim stays the parent's */
        c->pid = getpid();
        int r = gm_session_open(c);
        if (r < 0) {
                c->dead = true;
                return r;
        }
        return 0;
}
