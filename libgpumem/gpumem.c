/* libgpumem's public API (gpumem/gpumem.h) and the internal calls the admin
 * API builds on (client-internal.h), on top of the library's floors:
 *
 *   gpumem.c          this file: the API; fills the floors' callback tables
 *   central.c         the central heap: Alloc/Free round trips, fences
 *   sleep.c           sleep and wake of a local session, below its heap
 *   local_session.c   the local heap's provider, chores and snapshots
 *   local_heap.c      the local heap: allocator/ behind a provider
 *   frees.c           stream-ordered frees, for both heaps
 *   session.c         Hello, re-attach, reconnect, close, fork
 *   mapping.c         the segment table, mapped through mapper.h
 *   conn.c            the connection, its service thread and dispatch
 *
 * Heap modes: in a local session the session's allocator runs here and only
 * Grant/ReturnPieces/ReclaimAck go to the daemon; in a central one every
 * allocation is an Alloc round trip. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "central.h"
#include "client-internal.h"
#include "debug.h"
#include "frees.h"
#include "gpumem/gpumem.h"
#include "local_heap.h"
#include "local_session.h"
#include "mapping.h"
#include "msg.h"
#include "peer_check.h"
#include "session.h"
#include "sleep.h"

const char *gpumem_last_error(gpumem_client *c) {
        return gm_conn_last_error(c);
}

const char *gpumem_strerror(int err) {
        switch (err) {
        case 0:
                return "success";
        case -ENOMEM:
                return "out of device memory";
        case -EDQUOT:
                return "tenant quota exceeded";
        case -EPERM:
                return "operation not permitted";
        case -EINVAL:
                return "invalid argument";
        case -ECONNRESET:
                return "the gpumemd daemon is gone";
        case -ENOENT:
                return "not found (no gpumemd socket, statistic or object of that name)";
        case -ENOBUFS:
                return "session limit reached";
        case -EPROTONOSUPPORT:
                return "gpumemd speaks another protocol version";
        default:
                return err < 0 ? strerror(-err) : "unknown error";
        }
}

/* ---- the floors' callback tables ---- */

static const gm_conn_push_t pushes[] = {
        {GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST, gm_mapping_release_streams, gm_mapping_on_release},
        {GPUMEM__ENVELOPE__BODY_MAP_SEGMENTS, NULL, gm_mapping_on_map_segments},
        {GPUMEM__ENVELOPE__BODY_ALLOC_REPLY, NULL, gm_mapping_on_alloc_reply},
        {GPUMEM__ENVELOPE__BODY_GRANT_REPLY, NULL, gm_mapping_on_grant_reply},
        {GPUMEM__ENVELOPE__BODY_CLAIM_REPLY, NULL, gm_mapping_on_claim_reply},
        {GPUMEM__ENVELOPE__BODY_SNAPSHOT_QUERY, NULL, gm_local_session_on_ask},
        {GPUMEM__ENVELOPE__BODY_HISTORY_PUSH, NULL, gm_local_session_on_ask},
        {GPUMEM__ENVELOPE__BODY_ALLOC_CONF_UPDATE, NULL, gm_local_session_on_alloc_conf},
        {GPUMEM__ENVELOPE__BODY_RECLAIM, NULL, gm_local_session_on_reclaim},
};

/* The service thread's turn under lock: a central session's carried frees
 * go (at most one caller grace after the call they followed), then the
 * stream-ordered frees are polled. */
static bool conn_poll(gpumem_client *c) {
        gm_central_send_carried(c);
        return gm_frees_poll(c);
}

/* The service thread's chores: the releases held during a capture (either
 * heap), a local session's. */
static bool conn_serve(gpumem_client *c) {
        return gm_mapping_serve_held_releases(c) | gm_local_session_serve(c);
}

static const gm_conn_handlers_t conn_handlers = {
        .pushes = pushes,
        .n_pushes = sizeof(pushes) / sizeof(pushes[0]),
        .poll = conn_poll,
        .serve = conn_serve,
        .reconnect = gm_session_reconnect,
        .before_send = gm_central_before_send,
};

/* A new session's heaps: the central fences, and a local session's heap. */
static int session_opened(gpumem_client *c, const Gpumem__HelloReply *hr, int page_fd) {
        gm_central_open(c, hr);
        return page_fd >= 0 ? gm_local_session_open(c, hr, page_fd) : 0;
}

/* A closing session's frees, fences, heap and blocks. */
static void session_forget(gpumem_client *c, bool owner) {
        gm_sleep_forget(c);
        gm_frees_forget(c, owner);
        gm_central_forget(c, owner);
        gm_local_session_forget(c, owner);
        for (size_t i = 0; i < c->blocks.cap; i++) {
                block_t *b = c->blocks.values[i];
                if (b && b->captured && owner) /* a fork child's record holds none */
                        gm_capture_unnote_block(b->stream);
                gm_client_block_free(b);
        }
        gm_u64map_done(&c->blocks);
}

static const gm_session_hooks_t session_hooks = {
        .opened = session_opened,
        .page_replaced = gm_local_session_page_replace,
        .forget = session_forget,
};

/* ---- connecting ---- */

int gpumem_connect(const char *socket_path, gpumem_client **ret) {
        return gpumem_connect_heap(socket_path, GPUMEM_HEAP_DEFAULT, ret);
}

gpumem_heap_mode gpumem_heap(gpumem_client *c) {
        return c && c->local ? GPUMEM_HEAP_LOCAL : GPUMEM_HEAP_CENTRAL;
}

int gpumem_connect_heap(const char *socket_path, gpumem_heap_mode mode, gpumem_client **ret) {
        if (!ret || (mode != GPUMEM_HEAP_DEFAULT && mode != GPUMEM_HEAP_LOCAL && mode != GPUMEM_HEAP_CENTRAL))
                return -EINVAL;
        gpumem_client *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->fd = -1;
        c->wake_fd = -1;
        c->page_fd_pending = -1;
        c->pid = getpid();
        c->fork_generation = gm_session_watch_fork();
        c->handlers = &conn_handlers;
        c->session_hooks = &session_hooks;
        c->heap_choice = mode;
        gm_pool_names_init(&c->pools);
        pthread_mutex_init(&c->lock, NULL);
        gm_heap_lock_init(&c->heap_lock);
        pthread_mutex_init(&c->read_lock, NULL);
        pthread_rwlock_init(&c->fd_lock, NULL);
        const char *timeout = getenv("GPUMEM_RECONNECT_TIMEOUT_MS");
        c->reconnect_timeout_ms = timeout && *timeout ? (uint32_t) strtoul(timeout, NULL, 10) : 60000;
        int r = 0;
        if (socket_path) {
                if (strlen(socket_path) >= sizeof(c->socket_path))
                        r = -ENAMETOOLONG;
                else
                        snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path);
        } else {
                r = gm_peer_default_socket(0, true, c->socket_path, sizeof(c->socket_path));
        }
        if (r == 0)
                r = gm_session_open(c);
        if (r < 0) {
                /* Keep the message readable on this thread after c is gone. */
                gm_session_close(c, true);
                gm_pool_names_done(&c->pools);
                pthread_mutex_destroy(&c->lock);
                pthread_mutex_destroy(&c->read_lock);
                pthread_rwlock_destroy(&c->fd_lock);
                free(c->rx_buf);
                free(c);
                gm_conn_error_forget();
                return r;
        }
        *ret = c;
        return 0;
}

void gpumem_disconnect(gpumem_client *c) {
        if (!c)
                return;
        gm_session_close(c, c->pid == getpid());
        gm_pool_names_done(&c->pools);
        pthread_mutex_destroy(&c->lock);
        pthread_mutex_destroy(&c->read_lock);
        pthread_rwlock_destroy(&c->fd_lock);
        free(c->rx_buf);
        free(c);
}

/* ---- allocation ---- */

/* Both public entry points' body, inlined into each (an exported function
 * calling another pays a call and cannot inline it: it may be interposed). */
static inline __attribute__((always_inline)) int alloc_frames(gpumem_client *c, size_t size, uint64_t stream,
                                                              const gpumem_frame *frames, size_t n_frames,
                                                              void **ret_ptr) {
        if (!c || !ret_ptr || (n_frames && !frames))
                return -EINVAL;
        if (size == 0)
                return gm_conn_set_error(c, -EINVAL, "gpumem: allocation of size 0");
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        if (!c->local)
                return gm_central_alloc(c, size, stream, frames, n_frames, ret_ptr);
        if (n_frames)
                return gm_local_session_alloc_frames(c, size, stream, frames, n_frames, ret_ptr);
        return gm_local_session_alloc(c, size, stream, NULL, 0, ret_ptr);
}

int gpumem_alloc(gpumem_client *c, size_t size, uint64_t stream, void **ret_ptr) {
        return alloc_frames(c, size, stream, NULL, 0, ret_ptr);
}

int gpumem_alloc_frames(gpumem_client *c, size_t size, uint64_t stream, const gpumem_frame *frames, size_t n_frames,
                        void **ret_ptr) {
        return alloc_frames(c, size, stream, frames, n_frames, ret_ptr);
}

static int free_block_on_streams(gpumem_client *c, void *ptr, block_t *b, bool on_stream, uint64_t stream);

/* Frees the block at ptr once the work on `stream` (if it is not the
 * allocation stream, whose order already protects reuse) and on every
 * recorded stream is done. */
static int free_block(gpumem_client *c, void *ptr, bool on_stream, uint64_t stream) {
        if (!c)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        gm_client_blocks_take(c);
        block_t *b = ptr ? gm_u64map_remove(&c->blocks, (uint64_t) (uintptr_t) ptr) : NULL;
        if (b && c->local && __builtin_expect(c->sleep != NULL, 0))
                gm_sleep_drop_kept(c, (uint64_t) (uintptr_t) ptr); /* asleep: its kept data goes */
        if (b && c->local && !b->n_stream_uses && (!on_stream || stream == b->stream))
                return gm_local_session_free(c, b, NULL); /* no stream work to wait for */
        if (!b || !c->local)
                gm_client_blocks_drop(c);
        if (!b)
                return gm_conn_set_error(c, -EINVAL,
                                         "gpumem: free of %p: not a live allocation of this client "
                                         "(unknown pointer or double free)",
                                         ptr);
        return free_block_on_streams(c, ptr, b, on_stream, stream);
}

/* free_block() past the table: b is out of it (in local mode heap_lock is
 * still held). */
static __attribute__((noinline)) int free_block_on_streams(gpumem_client *c, void *ptr, block_t *b, bool on_stream,
                                                           uint64_t stream) {
        int r;
        uint64_t streams[MAX_STREAM_USES + 1];
        size_t n = 0;
        for (size_t i = 0; i < b->n_stream_uses; i++)
                streams[n++] = b->stream_uses[i];
        if (on_stream && stream != b->stream) {
                bool seen = false;
                for (size_t i = 0; i < n && !seen; i++)
                        seen = streams[i] == stream;
                if (!seen)
                        streams[n++] = stream;
        }
        pending_free_t *p = NULL;
        if (n > 0 && c->mapper->ops->caps->device_streams) {
                p = calloc(1, sizeof(*p));
                r = p ? gm_frees_record_events(c, p, streams, n) : -ENOMEM;
                if (r < 0) {
                        free(p);
                        if (!c->local)
                                pthread_mutex_lock(&c->lock);
                        gm_u64map_put(&c->blocks, (uint64_t) (uintptr_t) ptr, b); /* still live */
                        gm_client_blocks_drop(c);
                        return gm_conn_set_error(c, r, "gpumem: free of %p: cannot record stream events: %s", ptr,
                                                 strerror(-r));
                }
                p->block_id = b->id;
                p->block = *b;
                p->block.stream_uses = NULL;
                p->block.n_stream_uses = 0;
        }
        if (c->local)
                return gm_local_session_free(c, b, p);
        return gm_central_free(c, b, p);
}

int gpumem_free(gpumem_client *c, void *ptr) {
        return free_block(c, ptr, false, 0);
}

int gpumem_free_async(gpumem_client *c, void *ptr, uint64_t stream) {
        return free_block(c, ptr, true, stream);
}

int gpumem_record_stream(gpumem_client *c, void *ptr, uint64_t stream) {
        if (!c)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        gm_client_blocks_take(c);
        block_t *b = ptr ? gm_u64map_get(&c->blocks, (uint64_t) (uintptr_t) ptr) : NULL;
        r = b ? 0 : -EINVAL;
        bool known = !b || stream == b->stream;
        for (size_t i = 0; b && i < b->n_stream_uses && !known; i++)
                known = b->stream_uses[i] == stream;
        if (!known) {
                uint64_t *uses = b->n_stream_uses < MAX_STREAM_USES
                                         ? realloc(b->stream_uses, (b->n_stream_uses + 1) * sizeof(*uses))
                                         : NULL;
                if (uses) {
                        b->stream_uses = uses;
                        uses[b->n_stream_uses++] = stream;
                } else {
                        r = -ENOSPC;
                }
        }
        gm_client_blocks_drop(c);
        if (r == -EINVAL)
                return gm_conn_set_error(c, r, "gpumem: record_stream on %p: not a live allocation", ptr);
        if (r == -ENOSPC)
                return gm_conn_set_error(c, r, "gpumem: record_stream on %p: more than %d streams", ptr,
                                         MAX_STREAM_USES);
        return 0;
}

/* -EBUSY for `what` (trim, sleep), whose synchronize and unmaps would
 * invalidate a CUDA graph capture in progress in the process. */
static int busy_in_capture(gpumem_client *c, const char *what) {
        return gm_conn_set_error(c, -EBUSY,
                                 "gpumem: %s refused: a CUDA graph capture is in progress in this process "
                                 "(releasing memory would synchronize the device and invalidate it); "
                                 "%s once the capture has ended",
                                 what, what);
}

int gpumem_trim(gpumem_client *c, uint64_t *ret_released_bytes) {
        if (!c)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        /* Its synchronize (here, or the service thread's for the daemon's
         * release requests) would invalidate a capture of another thread. */
        if (!gm_capture_release_begin(gm_mapping_capture_query(c), c))
                return busy_in_capture(c, "trim");
        if (c->local) {
                gm_heap_lock_take(&c->heap_lock);
                uint64_t released = gm_local_session_release_cached(c);
                gm_heap_lock_drop(&c->heap_lock);
                gm_capture_release_end();
                if (ret_released_bytes)
                        *ret_released_bytes = released;
                return 0;
        }
        r = gm_central_trim(c, ret_released_bytes);
        gm_capture_release_end();
        return r;
}

/* ---- captures the application declares ---- */

int gpumem_capture_begin(void) {
        int r = gm_capture_begin();
        if (GM_DEBUG)
                gm_capture_check();
        return r;
}

int gpumem_capture_end(void) {
        int r = gm_capture_end();
        if (GM_DEBUG)
                gm_capture_check();
        return r;
}

/* ---- sleep and wake ---- */

/* A local session of this process, or the error with its message. */
static int sleep_session(gpumem_client *c, const char *what) {
        if (!c)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        if (!c->local)
                return gm_conn_set_error(c, -EOPNOTSUPP, "gpumem: %s needs a local session (the heap in this process)",
                                         what);
        return 0;
}

int gpumem_sleep(gpumem_client *c, const char *const *tags, const char *const *keep_tags,
                 uint64_t *ret_released_bytes) {
        int r = sleep_session(c, "gpumem_sleep");
        if (r == 0)
                r = gm_sleep_check_tags(c, tags, keep_tags);
        if (r < 0)
                return r;
        /* Its synchronize would invalidate a capture of another thread. */
        if (!gm_capture_release_begin(gm_mapping_capture_query(c), c))
                return busy_in_capture(c, "sleep");
        uint64_t released = 0;
        gm_heap_lock_take(&c->heap_lock);
        r = gm_sleep_enter(c, tags, keep_tags, &released);
        gm_heap_lock_drop(&c->heap_lock);
        gm_capture_release_end();
        if (r == 0 && ret_released_bytes)
                *ret_released_bytes = released;
        return r;
}

int gpumem_wake(gpumem_client *c, uint32_t timeout_ms) {
        int r = sleep_session(c, "gpumem_wake");
        if (r < 0)
                return r;
        gm_heap_lock_take(&c->heap_lock);
        r = gm_sleep_wake(c, timeout_ms);
        gm_heap_lock_drop(&c->heap_lock);
        return r;
}

uint64_t gpumem_sleeping_bytes(gpumem_client *c) {
        if (!c || gm_session_ensure_own(c) < 0 || !c->local)
                return 0;
        gm_heap_lock_take(&c->heap_lock);
        uint64_t bytes = gm_sleep_bytes(c);
        gm_heap_lock_drop(&c->heap_lock);
        return bytes;
}

uint64_t gpumem_sleeping_pinned_bytes(gpumem_client *c) {
        if (!c || gm_session_ensure_own(c) < 0 || !c->local)
                return 0;
        gm_heap_lock_take(&c->heap_lock);
        uint64_t bytes = gm_sleep_pinned_bytes(c);
        gm_heap_lock_drop(&c->heap_lock);
        return bytes;
}

int gm_client_local_stats(gpumem_client *c, gm_stats_t *ret_stats, int *ret_device, uint64_t *ret_capacity) {
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        if (!c->local)
                return -EOPNOTSUPP;
        gm_heap_lock_take(&c->heap_lock);
        *ret_stats = *gm_local_heap_stats(c->heap);
        gm_heap_lock_drop(&c->heap_lock);
        *ret_device = c->device;
        *ret_capacity = c->capacity;
        return 0;
}

int gm_client_local_snapshot(gpumem_client *c, bool json, char **ret_buf, size_t *ret_len) {
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        if (!c->local)
                return -EOPNOTSUPP;
        gm_local_heap_owner_t owner = {
                .device = c->device, .pid = (uint32_t) getpid(), .tenant = c->tenant, .session_id = c->session_id};
        gm_heap_lock_take(&c->heap_lock);
        r = gm_local_heap_snapshot(c->heap, &owner, json, ret_buf, ret_len);
        gm_heap_lock_drop(&c->heap_lock);
        return r < 0 ? gm_conn_set_error(c, r, "gpumem: cannot write the local heap's snapshot: %s", strerror(-r)) : 0;
}

int gm_client_local_history(gpumem_client *c, bool enabled, uint64_t max_entries) {
        if (gm_session_ensure_own(c) < 0 || !c->local)
                return 0;
        gm_heap_lock_take(&c->heap_lock);
        int r = gm_local_heap_history(c->heap, enabled, max_entries, (uint32_t) getpid());
        gm_heap_lock_drop(&c->heap_lock);
        return r < 0 ? gm_conn_set_error(c, r, "gpumem: cannot set up the local heap's memory history: %s",
                                         strerror(-r))
                     : 0;
}

void gm_client_reset_local_stats(gpumem_client *c, bool peak, bool accumulated) {
        if (gm_session_ensure_own(c) < 0 || !c->local)
                return;
        gm_heap_lock_take(&c->heap_lock);
        gm_local_heap_reset_stats(c->heap, peak, accumulated);
        gm_heap_lock_drop(&c->heap_lock);
}

int gpumem_stat(gpumem_client *c, const char *pytorch_stat_name, int64_t *ret_value) {
        if (!c || !pytorch_stat_name || !ret_value)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        if (c->local) {
                int64_t v = 0;
                gm_heap_lock_take(&c->heap_lock);
                r = gm_local_heap_stat(c->heap, pytorch_stat_name, &v);
                gm_heap_lock_drop(&c->heap_lock);
                if (r < 0)
                        return gm_conn_set_error(c, -ENOENT, "gpumem: no statistic named '%s'", pytorch_stat_name);
                *ret_value = v;
                return 0;
        }
        return gm_central_stat(c, NULL, pytorch_stat_name, ret_value);
}

/* ---- tagged pools ---- */

int gpumem_pool_begin(gpumem_client *c, const char *tag) {
        if (!c || !tag)
                return -EINVAL;
        int r = gm_pool_begin(&c->pools, tag);
        switch (r) {
        case -EINVAL:
                return gm_conn_set_error(c, r, "gpumem: malformed pool tag '%.40s' (want [A-Za-z0-9_.-]{1,31})", tag);
        case -E2BIG:
                return gm_conn_set_error(c, r, "gpumem: pool '%s': more than %d nested scopes or %d tags", tag,
                                         GM_POOL_MAX_DEPTH, GM_POOL_MAX_TAGS);
        case -ENOBUFS:
                return gm_conn_set_error(c, r, "gpumem: this thread has pool scopes open on too many clients");
        default:
                return r;
        }
}

int gpumem_pool_end(gpumem_client *c) {
        if (!c)
                return -EINVAL;
        int r = gm_pool_end(&c->pools);
        return r < 0 ? gm_conn_set_error(c, r, "gpumem: no pool scope is open on this thread") : 0;
}

const char *gpumem_pool_current(gpumem_client *c) {
        return c ? gm_pool_name(&c->pools, gm_pool_current(&c->pools)) : "";
}

int gpumem_stat_tag(gpumem_client *c, const char *tag, const char *pytorch_stat_name, int64_t *ret_value) {
        if (!c || !tag || !pytorch_stat_name || !ret_value)
                return -EINVAL;
        unsigned id;
        int r = gm_pool_find(&c->pools, tag, &id);
        if (r == -EINVAL)
                return gm_conn_set_error(c, r, "gpumem: malformed pool tag '%.40s'", tag);
        bool used = r == 0; /* a tag no scope used yet has no figures: 0 */
        if ((r = gm_session_ensure_own(c)) < 0)
                return r;
        if (!c->local) /* the daemon's heap keeps the pool's figures (under the name: its ids are its own) */
                return gm_central_stat(c, tag, pytorch_stat_name, ret_value);
        int64_t v = 0;
        gm_heap_lock_take(&c->heap_lock);
        r = gm_local_heap_tag_stat(c->heap, used ? id : 0, pytorch_stat_name, &v);
        gm_heap_lock_drop(&c->heap_lock);
        if (r < 0)
                return gm_conn_set_error(c, -ENOENT, "gpumem: no statistic named '%s'", pytorch_stat_name);
        *ret_value = used ? v : 0;
        return 0;
}

/* ---- for the library's other files (client-internal.h) ---- */

int gm_client_set_error(const gpumem_client *c, int err, const char *fmt, ...) {
        char msg[2048]; /* the size of the thread's message */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        return gm_conn_set_error(c, err, "%s", msg);
}

int gm_client_call(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                   Gpumem__Envelope **ret_reply, int *ret_fd) {
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        Gpumem__Envelope *reply = NULL;
        int fd = -1;
        if ((r = gm_conn_call_fd(c, env, NULL, &reply, ret_fd ? &fd : NULL)) < 0)
                return r;
        if (reply->body_case != want) {
                if (fd >= 0)
                        close(fd);
                gm_msg_free(reply);
                return gm_conn_set_error(c, -EPROTO, "gpumem: unexpected reply from gpumemd");
        }
        if (ret_fd)
                *ret_fd = fd;
        *ret_reply = reply;
        return 0;
}

const char *gm_client_socket_path(const gpumem_client *c) {
        return c->socket_path;
}
