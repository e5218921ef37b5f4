/* Request handling for one session, and the session's side of the allocator:
 * physical memory comes from the backend and goes back only after the client
 * acknowledged unmapping it (or is gone). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "msg.h"
#include "oom.h"
#include "size.h"

/* ---- pieces: the allocator's provider ---- */

void gm_piece_release(gm_session_t *s, gm_piece_t *p) {
        gm_daemon_t *d = s->daemon;
        if (s->tenant)
                s->tenant->charged_bytes -= p->phys.size;
        if (!d->keep_stored) /* stopping under systemd: the fd store keeps it for the next daemon */
                gm_piece_unstore(s, p);
        if (p->phys.fd < 0)
                d->backend->in_use -= p->phys.size; /* re-registered by its client; no handle here */
        else
                gm_backend_release(d->backend, &p->phys);
        free(p);
}

static int provider_create(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                           uint64_t size, uint64_t *ret_handle) {
        gm_session_t *s = userdata;
        gm_tenant_t *t = s->tenant;
        if (t->quota && t->charged_bytes + size > t->quota)
                return -EDQUOT;
        gm_piece_t *p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        int r = gm_backend_create(s->daemon->backend, size, &p->phys);
        if (r < 0) {
                free(p);
                return r;
        }
        p->segment_id = segment_id;
        p->segment_va_size = segment_va_size;
        p->offset = offset;
        t->charged_bytes += size;
        gm_piece_store(s, p);
        p->next = s->new_pieces;
        s->new_pieces = p;
        *ret_handle = (uint64_t) (uintptr_t) p;
        return 0;
}

static void provider_release(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                             bool whole_segment) {
        gm_session_t *s = userdata;
        gm_piece_t *p = (gm_piece_t *) (uintptr_t) handle;
        /* A piece created during the current request that never reached the
         * client is not mapped anywhere: unlink it from new_pieces. */
        for (gm_piece_t **pp = &s->new_pieces; *pp; pp = &(*pp)->next)
                if (*pp == p) {
                        *pp = p->next;
                        break;
                }
        if (s->closing || !p->client_mapped) {
                gm_piece_release(s, p);
                return;
        }
        p->whole_segment = whole_segment;
        p->next = s->to_release;
        s->to_release = p;
}

static uint64_t now_us(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

/* Records allocator events in the device's memory history while it is on. */
static void provider_trace(void *userdata, int action, uint64_t addr, uint64_t size, uint64_t stream) {
        gm_session_t *s = userdata;
        gm_daemon_t *d = s->daemon;
        if (!d->history)
                return;
        gm_history_entry_t e = {
                .action = action,
                .addr = addr,
                .size = size,
                .stream = stream,
                .time_us = now_us(),
                .pid = (uint32_t) s->cred.pid,
        };
        if (action == GM_TRACE_OOM) {
                uint64_t free_bytes = 0, total = 0;
                if (d->backend->ops->mem_info(d->backend, &free_bytes, &total) == 0)
                        e.addr = free_bytes; /* PyTorch's device_free */
        }
        bool with_frames = action == GM_TRACE_ALLOC || action == GM_TRACE_OOM;
        /* A failed record only loses this entry; allocation goes on. */
        gm_history_record(d->history, &e, with_frames ? s->cur_frames : NULL, with_frames ? s->n_cur_frames : 0);
}

int gm_session_heap(gm_session_t *s, gm_heap_t **ret_heap) {
        if (s->heap) {
                *ret_heap = s->heap;
                return 0;
        }
        gm_daemon_t *d = s->daemon;
        gm_provider_t provider = {
                .create = provider_create,
                .release = provider_release,
                .trace = provider_trace,
                .userdata = s,
        };
        gm_heap_params_t params = {
                .capacity = d->backend->capacity,
                .va_cursor = &d->va_cursor,
                .extra_sinks = {&s->tenant->stats, &d->device_stats, NULL},
        };
        int r = gm_heap_new(&d->alloc_config, &provider, &params, &s->heap);
        if (r < 0)
                return r;
        *ret_heap = s->heap;
        return 0;
}

/* ---- releases: ask the client, wait for the ack ---- */

static int release_send(gm_session_t *s, gm_release_t *rel) {
        size_t n = 0;
        for (gm_piece_t *p = rel->pieces; p; p = p->next)
                n++;
        Gpumem__Range *ranges = calloc(n, sizeof(*ranges));
        Gpumem__Range **range_ptrs = calloc(n, sizeof(*range_ptrs));
        if (!ranges || !range_ptrs) {
                free(ranges);
                free(range_ptrs);
                return -ENOMEM;
        }
        size_t i = 0;
        for (gm_piece_t *p = rel->pieces; p; p = p->next, i++) {
                gpumem__range__init(&ranges[i]);
                ranges[i].segment_id = p->segment_id;
                ranges[i].offset = p->offset;
                ranges[i].length = p->phys.size;
                ranges[i].whole_segment = p->whole_segment;
                range_ptrs[i] = &ranges[i];
        }
        Gpumem__ReleaseRequest req = GPUMEM__RELEASE_REQUEST__INIT;
        req.release_id = rel->id;
        req.n_ranges = n;
        req.ranges = range_ptrs;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST;
        env.release_request = &req;
        rel->sent_at_ms = gm_now_ms();
        rel->attempts++;
        int r = gm_session_send(s, &env, NULL, 0);
        free(ranges);
        free(range_ptrs);
        return r;
}

/* A ReleaseRequest must fit one packet: ranges are sent in batches of this many. */
#define RANGES_PER_RELEASE 512

void gm_session_flush_releases(gm_session_t *s) {
        while (s->to_release && !s->closing) {
                gm_release_t *rel = calloc(1, sizeof(*rel));
                if (!rel)
                        return; /* stays in to_release; retried at the next flush */
                rel->id = s->next_release_id++;
                for (int i = 0; i < RANGES_PER_RELEASE && s->to_release; i++) {
                        gm_piece_t *p = s->to_release;
                        s->to_release = p->next;
                        p->next = rel->pieces;
                        rel->pieces = p;
                        rel->bytes += p->phys.size;
                }
                rel->next = s->releases;
                s->releases = rel;
                s->releasing_bytes += rel->bytes;
                s->daemon->releasing_bytes += rel->bytes;
                gm_metrics_count_reclaim(s->daemon->metrics, GM_RECLAIM_REQUESTED);
                if (release_send(s, rel) < 0)
                        return; /* the session is closed (and everything released) */
        }
}

static void release_complete(gm_session_t *s, gm_release_t *rel) {
        s->releasing_bytes -= rel->bytes;
        s->daemon->releasing_bytes -= rel->bytes;
        while (rel->pieces) {
                gm_piece_t *p = rel->pieces;
                rel->pieces = p->next;
                gm_piece_release(s, p);
        }
        free(rel);
}

void gm_session_release_all(gm_session_t *s) {
        gm_local_release_all(s);
        s->heap = gm_heap_destroy(s->heap); /* releases every piece at once: s->closing is set */
        while (s->to_release) {
                gm_piece_t *p = s->to_release;
                s->to_release = p->next;
                gm_piece_release(s, p);
        }
        while (s->adopting) { /* stored pieces of a re-attach that did not finish */
                gm_piece_t *p = s->adopting;
                s->adopting = p->next;
                if (s->tenant)
                        s->tenant->charged_bytes += p->phys.size; /* never charged: keep the books even */
                gm_piece_release(s, p);
        }
        while (s->releases) {
                gm_release_t *rel = s->releases;
                s->releases = rel->next;
                release_complete(s, rel);
        }
        while (s->parked) {
                gm_parked_t *p = s->parked;
                s->parked = p->next;
                free(p);
        }
        s->n_parked = 0;
}

/* ---- replies ---- */

int gm_session_reply(gm_session_t *s, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds) {
        env->request_id = request_id;
        return gm_session_send(s, env, fds, n_fds);
}

int gm_session_reply_ok(gm_session_t *s, uint64_t request_id) {
        Gpumem__Ok ok = GPUMEM__OK__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_OK;
        env.ok = &ok;
        gm_session_reply(s, request_id, &env, NULL, 0);
        return 0;
}

/* Sends the new pieces' mappings (MapSegments packets while more than one
 * packet's worth of fds remains, the rest with the AllocReply). */
static int send_alloc_reply(gm_session_t *s, uint64_t request_id, const gm_alloc_result_t *res) {
        uint32_t max_fds = s->daemon->opts.limits.max_fds;
        size_t n = 0;
        for (gm_piece_t *p = s->new_pieces; p; p = p->next)
                n++;
        Gpumem__Mapping *maps = calloc(n ? n : 1, sizeof(*maps));
        Gpumem__Mapping **map_ptrs = calloc(n ? n : 1, sizeof(*map_ptrs));
        int *fds = calloc(n ? n : 1, sizeof(int));
        if (!maps || !map_ptrs || !fds) {
                free(maps);
                free(map_ptrs);
                free(fds);
                return -ENOMEM;
        }
        /* new_pieces is newest first; the client maps in creation order. */
        size_t i = n;
        for (gm_piece_t *p = s->new_pieces; p; p = p->next) {
                i--;
                gpumem__mapping__init(&maps[i]);
                maps[i].segment_id = p->segment_id;
                maps[i].segment_va_size = p->segment_va_size;
                maps[i].offset = p->offset;
                maps[i].length = p->phys.size;
                map_ptrs[i] = &maps[i];
                fds[i] = p->phys.fd;
        }
        int r = 0;
        size_t sent = 0;
        while (n - sent > max_fds) {
                Gpumem__MapSegments ms = GPUMEM__MAP_SEGMENTS__INIT;
                ms.n_mappings = max_fds;
                ms.mappings = map_ptrs + sent;
                Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                env.body_case = GPUMEM__ENVELOPE__BODY_MAP_SEGMENTS;
                env.map_segments = &ms;
                r = gm_session_reply(s, request_id, &env, fds + sent, max_fds);
                if (r < 0)
                        goto out;
                sent += max_fds;
        }
        Gpumem__AllocReply reply = GPUMEM__ALLOC_REPLY__INIT;
        reply.block_id = res->block_id;
        reply.segment_id = res->segment_id;
        reply.offset = res->offset;
        reply.block_size = res->size;
        reply.n_new_mappings = n - sent;
        reply.new_mappings = map_ptrs + sent;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &reply;
        r = gm_session_reply(s, request_id, &env, fds + sent, n - sent);
out:
        if (r == 0)
                for (gm_piece_t *p = s->new_pieces; p; p = p->next)
                        p->client_mapped = true;
        s->new_pieces = NULL; /* owned by the heap (via handles) from now on */
        free(maps);
        free(map_ptrs);
        free(fds);
        return r;
}

/* ---- reclaim across sessions ---- */

uint64_t gm_daemon_reclaim(gm_daemon_t *d, gm_session_t *requester, gm_tenant_t *tenant, uint64_t need) {
        uint64_t asked = 0;
        while (asked < need) {
                gm_session_t *victim = NULL;
                for (gm_session_t *o = d->sessions; o; o = o->next) {
                        if (o == requester || o->closing || (!o->heap && !o->local) || (tenant && o->tenant != tenant))
                                continue;
                        if (gm_session_cached_bytes(o) == 0 || (o->local && o->releasing_bytes))
                                continue; /* nothing cached, or already asked */
                        if (!victim || o->last_active_ms < victim->last_active_ms)
                                victim = o;
                }
                if (!victim)
                        break;
                uint64_t got = victim->local ? gm_local_reclaim(victim) : gm_heap_release_cached(victim->heap);
                victim->last_active_ms = gm_now_ms(); /* do not pick it again in this round */
                gm_session_flush_releases(victim);
                if (got == 0)
                        break; /* only split segments with live blocks remain cached */
                asked += got;
        }
        return asked;
}

/* ---- handlers ---- */

static int handle_hello(gm_session_t *s, uint64_t request_id, const Gpumem__Hello *hello) {
        gm_daemon_t *d = s->daemon;
        if (s->hello_done) {
                gm_session_send_error(s, request_id, EPROTO, "hello sent twice");
                return -EPROTO;
        }
        if (hello->protocol_version != GM_PROTOCOL_VERSION) {
                gm_session_send_error(s, request_id, EPROTONOSUPPORT,
                                      "protocol version %u not supported (daemon speaks %u)", hello->protocol_version,
                                      GM_PROTOCOL_VERSION);
                return -EPROTONOSUPPORT;
        }
        snprintf(s->name, sizeof(s->name), "%s", hello->client_name ? hello->client_name : "");
        s->admin_conn = hello->admin;
        if (hello->resume_token && hello->resume_token[0]) {
                int r = gm_restart_claim(s, hello->resume_token);
                if (r < 0) {
                        gm_session_send_error(s, request_id, -r, "gpumemd: cannot re-attach session: %s",
                                              r == -EBUSY   ? "it is attached to another connection"
                                              : r == -EPERM ? "it belongs to another user"
                                                            : "invalid token");
                        return r;
                }
        } else {
                gm_session_new_token(s->token);
        }
        s->tenant = gm_tenant_get(d, s->tenant_name);
        if (!s->tenant) {
                gm_session_send_error(s, request_id, ENOMEM, "out of memory");
                return -ENOMEM;
        }
        Gpumem__HelloReply reply = GPUMEM__HELLO_REPLY__INIT;
        int page_fd = -1;
        int r = gm_local_hello(s, request_id, hello, &reply, &page_fd);
        if (r < 0)
                return r;
        s->tenant->sessions++;
        s->hello_done = true;

        reply.protocol_version = GM_PROTOCOL_VERSION;
        reply.session_id = s->id;
        reply.backend = (char *) d->backend->ops->name;
        reply.device = d->backend->device;
        reply.capacity = d->backend->capacity;
        reply.max_packet = d->opts.limits.max_packet;
        reply.max_fds = d->opts.limits.max_fds;
        reply.tenant = s->tenant->name;
        reply.granularity = d->backend->granularity;
        reply.session_token = s->token;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO_REPLY;
        env.hello_reply = &reply;
        log_info("session %llu: pid %d uid %u tenant '%s' client '%s'", (unsigned long long) s->id, (int) s->cred.pid,
                 (unsigned) s->cred.uid, s->tenant->name, s->name);
        gm_session_reply(s, request_id, &env, page_fd >= 0 ? &page_fd : NULL, page_fd >= 0 ? 1 : 0);
        if (page_fd >= 0)
                close(page_fd);
        return 0;
}

/* Explains a refused allocation: PyTorch's out-of-memory text with the
 * device's, tenant's and session's figures, then gpumemd's diagnosis. */
static gm_oom_reason_t describe_refusal(gm_session_t *s, uint64_t size, int err, char *buf, size_t len) {
        gm_daemon_t *d = s->daemon;
        const gm_stats_t *st = gm_heap_stats(s->heap);
        uint64_t device_free = 0, device_total = 0;
        if (d->backend->ops->mem_info(d->backend, &device_free, &device_total) < 0)
                device_free = d->backend->capacity - d->backend->in_use;
        gm_local_refresh(d);
        uint64_t others_cached = gm_daemon_others_cached(d, s);
        double fraction = d->alloc_config.per_process_memory_fraction;
        gm_oom_report_t r = {
                .device = d->backend->device,
                .device_total = d->backend->capacity,
                .device_free = device_free,
                .allowed = fraction > 0 && fraction < 1 ? (uint64_t) (fraction * (double) d->backend->capacity) : 0,
                .session_allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current,
                .session_reserved = (uint64_t) st->reserved_bytes[GM_STAT_ALL].current,
                .session_cached = (uint64_t) (st->reserved_bytes[GM_STAT_ALL].current -
                                              st->active_bytes[GM_STAT_ALL].current),
                .largest_free = gm_heap_largest_free(s->heap),
                .tenant = s->tenant->name,
                .tenant_quota = s->tenant->quota,
                .tenant_reserved = s->tenant->charged_bytes,
                .tenant_live = (uint64_t) s->tenant->stats.active_bytes[GM_STAT_ALL].current,
                .broker_reserved = d->backend->in_use,
                .broker_live = (uint64_t) d->device_stats.active_bytes[GM_STAT_ALL].current,
                .others_cached = others_cached,
        };
        gm_heap_sizes_for(s->heap, size, &r.block_size, &r.alloc_size);
        r.reason = err == -EDQUOT ? GM_OOM_QUOTA : gm_oom_classify(&r);
        if (gm_oom_format(&r, buf, len) < 0)
                snprintf(buf, len, "gpumemd: out of memory allocating %llu bytes", (unsigned long long) size);
        return r.reason;
}

/* Tries one allocation. Returns 0 when a reply (success or refusal) was sent,
 * -EAGAIN when the request should wait for reclaimed memory, or a negative
 * errno when the session broke. */
static int try_alloc(gm_session_t *s, uint64_t request_id, uint64_t size, uint64_t stream, bool may_park) {
        gm_daemon_t *d = s->daemon;
        gm_heap_t *heap;
        int r = gm_session_heap(s, &heap);
        if (r < 0)
                return gm_session_send_error(s, request_id, r, "cannot create the session's allocator"), 0;
        if (gm_heap_live_blocks(heap) >= d->opts.limits.max_blocks_per_session)
                return gm_session_send_error(s, request_id, ENOBUFS,
                                             "gpumemd: session limit of %llu live blocks reached",
                                             (unsigned long long) d->opts.limits.max_blocks_per_session),
                       0;
        if (size == 0)
                return gm_session_send_error(s, request_id, EINVAL, "gpumemd: allocation of size 0"), 0;
        if (size > d->backend->capacity) {
                char a[32], c[32];
                return gm_session_send_error(s, request_id, ENOMEM,
                                             "gpumemd: tried to allocate %s, more than the device's capacity of %s",
                                             gm_format_size(size, a, sizeof(a)),
                                             gm_format_size(d->backend->capacity, c, sizeof(c))),
                       0;
        }
        /* The tenant's quota is also the heap's limit: its garbage collection
         * aims below it (PyTorch's garbage_collection_threshold). */
        gm_heap_set_limit(heap, s->tenant->quota, &s->tenant->stats);
        gm_alloc_result_t res;
        r = gm_heap_alloc(heap, size, stream, &res);
        if (r == 0)
                return send_alloc_reply(s, request_id, &res) < 0 ? -ECONNRESET : 0;
        if (r != -ENOMEM && r != -EDQUOT) {
                const char *detail = gm_backend_last_error(d->backend);
                log_warning("session %llu: allocation of %llu bytes failed: %s%s%s", (unsigned long long) s->id,
                            (unsigned long long) size, strerror(-r), detail[0] ? ": " : "", detail);
                return gm_session_send_error(s, request_id, r, "gpumemd: allocation failed: %s%s%s", strerror(-r),
                                             detail[0] ? ": " : "", detail),
                       0;
        }

        /* The allocator already gave back this session's own cache. Memory
         * reclaimed from other sessions arrives once their clients acknowledge. */
        uint64_t asked = gm_daemon_reclaim(d, s, r == -EDQUOT ? s->tenant : NULL, size);
        bool help_coming = asked > 0 || (r == -EDQUOT ? s->releasing_bytes > 0 : d->releasing_bytes > 0);
        if (may_park && help_coming && s->n_parked < d->opts.limits.max_parked_per_session)
                return -EAGAIN;
        char message[1024];
        gm_oom_reason_t reason = describe_refusal(s, size, r, message, sizeof(message));
        gm_metrics_count_refusal(d->metrics, s->tenant->name, reason);
        return gm_session_send_error(s, request_id, r, "%s", message), 0;
}

static int park(gm_session_t *s, uint64_t request_id, uint64_t size, uint64_t stream) {
        gm_parked_t *p = calloc(1, sizeof(*p));
        if (!p)
                return gm_session_send_error(s, request_id, ENOMEM, "out of memory"), 0;
        p->request_id = request_id;
        p->size = size;
        p->stream = stream;
        p->parked_at_ms = gm_now_ms();
        /* FIFO: append. */
        gm_parked_t **pp = &s->parked;
        while (*pp)
                pp = &(*pp)->next;
        *pp = p;
        s->n_parked++;
        return 0;
}

/* Retries parked allocations of every session in FIFO order, as far as they go. */
static void retry_parked(gm_daemon_t *d, bool timed_out_only) {
        uint64_t now = gm_now_ms();
        for (gm_session_t *s = d->sessions, *next; s; s = next) {
                next = s->next;
                while (s->parked && !s->closing) {
                        gm_parked_t *p = s->parked;
                        bool expired = now - p->parked_at_ms >= d->opts.limits.park_timeout_ms;
                        if (timed_out_only && !expired)
                                break;
                        s->parked = p->next;
                        s->n_parked--;
                        int r = try_alloc(s, p->request_id, p->size, p->stream, !expired);
                        if (r == -EAGAIN) {
                                /* Still waiting: back to the head, keep its age. */
                                p->next = s->parked;
                                s->parked = p;
                                s->n_parked++;
                                gm_session_flush_releases(s);
                                break;
                        }
                        free(p);
                        gm_session_flush_releases(s);
                }
        }
}

void gm_session_retry_parked(gm_daemon_t *d) {
        retry_parked(d, false);
}

/* Client-supplied frames kept with an allocation's trace event, at most. */
#define MAX_FRAMES 64

static int handle_alloc(gm_session_t *s, uint64_t request_id, const Gpumem__Alloc *alloc) {
        if (s->parked) /* keep order behind earlier waiting requests */
                return park(s, request_id, alloc->size, alloc->stream);
        gm_frame_t frames[MAX_FRAMES];
        size_t n_frames = alloc->n_frames < MAX_FRAMES ? alloc->n_frames : MAX_FRAMES;
        for (size_t i = 0; i < n_frames; i++)
                frames[i] = (gm_frame_t){
                        .filename = alloc->frames[i]->filename,
                        .line = alloc->frames[i]->line,
                        .name = alloc->frames[i]->name,
                };
        s->cur_frames = frames;
        s->n_cur_frames = n_frames;
        int r = try_alloc(s, request_id, alloc->size, alloc->stream, true);
        s->cur_frames = NULL;
        s->n_cur_frames = 0;
        if (r == -EAGAIN)
                return park(s, request_id, alloc->size, alloc->stream);
        return r == -ECONNRESET ? 0 : r;
}

static int handle_free(gm_session_t *s, uint64_t request_id, const Gpumem__Free *f) {
        int r = s->heap ? gm_heap_free(s->heap, f->block_id, f->deferred) : -ENOENT;
        if (r < 0)
                gm_session_send_error(s, request_id, EINVAL, "gpumemd: free of block %" PRIu64
                                      " refused: not a live block of this session (unknown id or double free)",
                                      f->block_id);
        return 0;
}

static int handle_free_completed(gm_session_t *s, uint64_t request_id, const Gpumem__FreeCompleted *f) {
        int r = s->heap ? gm_heap_free_completed(s->heap, f->block_id) : -ENOENT;
        if (r < 0)
                gm_session_send_error(s, request_id, EINVAL,
                                      "gpumemd: block %" PRIu64 " has no free pending completion", f->block_id);
        return 0;
}

static int handle_release_ack(gm_session_t *s, uint64_t request_id, const Gpumem__ReleaseAck *ack) {
        for (gm_release_t **rp = &s->releases; *rp; rp = &(*rp)->next) {
                gm_release_t *rel = *rp;
                if (rel->id != ack->release_id)
                        continue;
                *rp = rel->next;
                gm_metrics_count_reclaim(s->daemon->metrics, GM_RECLAIM_ACKNOWLEDGED);
                release_complete(s, rel);
                retry_parked(s->daemon, false);
                gm_local_retry_parked(s->daemon, false);
                return 0;
        }
        gm_session_send_error(s, request_id, EINVAL, "gpumemd: no release %" PRIu64 " is pending", ack->release_id);
        return 0;
}

static int handle_trim(gm_session_t *s, uint64_t request_id, const Gpumem__Trim *trim) {
        gm_daemon_t *d = s->daemon;
        uint64_t released = 0;
        bool everyone = trim->tenant && trim->tenant[0];
        gm_local_refresh(d); /* local sessions' cached bytes, as of now */
        if (!everyone && s->heap) {
                released = gm_heap_release_cached(s->heap);
                gm_session_flush_releases(s);
        }
        if (everyone || (!s->heap && s->admin)) {
                if (!s->admin)
                        return gm_session_send_error(s, request_id, EPERM,
                                                     "gpumemd: trimming other sessions needs admin rights"),
                               0;
                const char *tenant = everyone ? trim->tenant : NULL;
                if (tenant && strcmp(tenant, "*") == 0)
                        tenant = NULL;
                for (gm_session_t *o = d->sessions; o; o = o->next) {
                        if (o->closing || (tenant && strcmp(o->tenant->name, tenant) != 0))
                                continue;
                        if (o->local)
                                released += gm_local_reclaim(o); /* expected: they come back with its ack */
                        if (!o->heap)
                                continue;
                        released += gm_heap_release_cached(o->heap);
                        gm_session_flush_releases(o);
                }
        }
        Gpumem__TrimReply reply = GPUMEM__TRIM_REPLY__INIT;
        reply.released_bytes = released;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM_REPLY;
        env.trim_reply = &reply;
        gm_session_reply(s, request_id, &env, NULL, 0);
        return 0;
}

int gm_session_handle(gm_session_t *s, Gpumem__Envelope *env, int *fds, size_t n_fds) {
        uint64_t rid = env->request_id;
        if (n_fds > 0) {
                /* Clients never send fds in protocol 1. */
                gm_close_fds(fds, n_fds);
                gm_session_send_error(s, rid, EBADMSG, "gpumemd: unexpected file descriptors in a request");
                return -EBADMSG;
        }
        if (!s->hello_done && env->body_case != GPUMEM__ENVELOPE__BODY_HELLO) {
                gm_session_send_error(s, rid, EPROTO, "gpumemd: the first request must be Hello");
                return -EPROTO;
        }
        if (s->reattaching && env->body_case != GPUMEM__ENVELOPE__BODY_REATTACH) {
                gm_session_send_error(s, rid, EPROTO, "gpumemd: finish re-attaching first");
                return -EPROTO;
        }
        switch (env->body_case) {
        case GPUMEM__ENVELOPE__BODY_HELLO:
                return handle_hello(s, rid, env->hello);
        case GPUMEM__ENVELOPE__BODY_ALLOC:
                return handle_alloc(s, rid, env->alloc);
        case GPUMEM__ENVELOPE__BODY_FREE:
                return handle_free(s, rid, env->free);
        case GPUMEM__ENVELOPE__BODY_FREE_COMPLETED:
                return handle_free_completed(s, rid, env->free_completed);
        case GPUMEM__ENVELOPE__BODY_TRIM:
                return handle_trim(s, rid, env->trim);
        case GPUMEM__ENVELOPE__BODY_STATS:
                return gm_admin_stats(s, rid, env->stats);
        case GPUMEM__ENVELOPE__BODY_RESET_STATS:
                return gm_admin_reset_stats(s, rid, env->reset_stats);
        case GPUMEM__ENVELOPE__BODY_HISTORY_CONTROL:
                return gm_admin_history(s, rid, env->history_control);
        case GPUMEM__ENVELOPE__BODY_SNAPSHOT:
                return gm_admin_snapshot(s, rid, env->snapshot);
        case GPUMEM__ENVELOPE__BODY_ALLOC_CONF:
                return gm_admin_alloc_conf(s, rid, env->alloc_conf);
        case GPUMEM__ENVELOPE__BODY_QUOTA:
                return gm_admin_quota(s, rid, env->quota);
        case GPUMEM__ENVELOPE__BODY_CLIENTS:
                return gm_admin_clients(s, rid, env->clients);
        case GPUMEM__ENVELOPE__BODY_REATTACH:
                return gm_restart_reattach(s, rid, env->reattach);
        case GPUMEM__ENVELOPE__BODY_RELEASE_ACK:
                return handle_release_ack(s, rid, env->release_ack);
        case GPUMEM__ENVELOPE__BODY_GRANT:
                return gm_local_grant(s, rid, env->grant);
        case GPUMEM__ENVELOPE__BODY_RETURN_PIECES:
                return gm_local_return(s, rid, env->return_pieces);
        case GPUMEM__ENVELOPE__BODY_RECLAIM_ACK:
                return gm_local_reclaim_ack(s, rid, env->reclaim_ack);
        default:
                gm_session_send_error(s, rid, EPROTO, "gpumemd: message type %d is not a request",
                                      (int) env->body_case);
                return -EPROTO;
        }
}

void gm_daemon_tick(gm_daemon_t *d) {
        uint64_t now = gm_now_ms();
        for (gm_session_t *s = d->sessions; s; s = s->next)
                for (gm_release_t *rel = s->releases; rel && !s->closing; rel = rel->next)
                        if (now - rel->sent_at_ms >= d->opts.limits.release_timeout_ms) {
                                if (rel->attempts == 1) {
                                        gm_metrics_count_reclaim(d->metrics, GM_RECLAIM_TIMED_OUT);
                                        log_warning("session %llu (pid %d) has not acknowledged release %llu "
                                                    "(%llu bytes) in %u ms; asking again, the bytes stay charged",
                                                    (unsigned long long) s->id, (int) s->cred.pid,
                                                    (unsigned long long) rel->id, (unsigned long long) rel->bytes,
                                                    d->opts.limits.release_timeout_ms);
                                }
                                if (release_send(s, rel) < 0)
                                        break;
                        }
        retry_parked(d, true);
        gm_local_tick(d);
        gm_restart_expire(d, false);
}
