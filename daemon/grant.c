/* Local sessions: the daemon's side of a heap that runs in its client (the
 * wire; localstats.c reads their statistics pages).
 *
 * The client's heap asks for pieces of physical memory (Grant: a whole
 * segment, or one page of an expandable one) and gives them back
 * (ReturnPieces). The daemon stays the owner and the ledger: every piece is
 * created by the backend, checked against the tenant's quota and the device,
 * charged, kept in the fd store, and released when it comes back or the
 * session ends. Reserved and segment figures are the daemon's own and exact.
 *
 * Block figures come from the session's statistics page, which the client
 * writes. They are untrusted: a read that fails the bounds of what was
 * granted counts as zeros and flags the session; they are folded into the
 * tenant's and the device's statistics (never into charged bytes or quotas),
 * and counters folded never go backwards. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "local.h"
#include "log.h"
#include "metrics.h"
#include "oom.h"
#include "size.h"

/* The largest virtual range a segment may claim (2^48 bytes). */
#define MAX_SEGMENT_VA (UINT64_C(1) << 48)

/* ---- the exact figures ---- */

static void exact_update(gm_session_t *s, int64_t bytes, int64_t segments) {
        gm_stats_t *sinks[] = {&s->local->exact, &s->tenant->stats, &s->daemon->device_stats};
        for (size_t i = 0; i < sizeof(sinks) / sizeof(sinks[0]); i++) {
                gm_stat_update(&sinks[i]->reserved_bytes[GM_STAT_ALL], bytes);
                if (segments)
                        gm_stat_update(&sinks[i]->segment[GM_STAT_ALL], segments);
                if (bytes > 0)
                        sinks[i]->num_device_alloc++;
                else if (bytes < 0)
                        sinks[i]->num_device_free++;
        }
        s->local->figures.reserved_bytes[GM_STAT_ALL] = s->local->exact.reserved_bytes[GM_STAT_ALL];
        s->local->figures.segment[GM_STAT_ALL] = s->local->exact.segment[GM_STAT_ALL];
        s->local->figures.num_device_alloc = s->local->exact.num_device_alloc;
        s->local->figures.num_device_free = s->local->exact.num_device_free;
}

/* ---- hello ---- */

int gm_local_hello(gm_session_t *s, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd) {
        gm_daemon_t *d = s->daemon;
        bool wants_local = hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL ||
                           hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED;
        const gm_config_tenant_t *ct = gm_config_tenant_find(d->config, s->tenant_name);
        bool must_be_central = ct && ct->heap_central;
        *ret_page_fd = -1;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL;
        if (!wants_local || hello->admin)
                return 0;
        if (must_be_central) {
                if (hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED)
                        return 0;
                gm_session_send_error(s, request_id, EPERM,
                                      "gpumemd: tenant '%s' must use a central heap (the configuration's "
                                      "'heap = central'); connect without GPUMEM_HEAP=local",
                                      s->tenant_name);
                return -EPERM;
        }
        gm_local_session_t *l = calloc(1, sizeof(*l));
        int fd = -1;
        int r = l ? gm_statpage_create(sizeof(gm_stats_t), &fd) : -ENOMEM;
        if (r == 0)
                r = gm_statpage_map(fd, false, &l->page);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                free(l);
                gm_session_send_error(s, request_id, -r, "gpumemd: cannot create the statistics page: %s",
                                      strerror(-r));
                return r;
        }
        gm_stats_init(&l->exact);
        gm_stats_init(&l->figures);
        gm_stats_init(&l->applied);
        l->exact.max_split_size = l->figures.max_split_size = d->device_stats.max_split_size;
        l->applied.max_split_size = d->device_stats.max_split_size;
        l->next_reclaim_id = 1;
        s->local = l;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL;
        reply->alloc_conf = d->alloc_config.raw;
        reply->stats_page_size = GM_STATPAGE_SIZE;
        *ret_page_fd = fd;
        return 0;
}

/* ---- pieces ---- */

static void piece_forget(gm_session_t *s, local_segment_t *seg, uint64_t segment_id, gm_piece_t *p) {
        gm_local_session_t *l = s->local;
        gm_u64map_remove(&seg->pieces, p->offset + 1);
        l->n_pieces--;
        l->granted -= p->phys.size;
        bool last = seg->pieces.len == 0;
        exact_update(s, -(int64_t) p->phys.size, last ? -1 : 0);
        gm_piece_release(s, p);
        if (last) {
                gm_u64map_remove(&l->segments, segment_id);
                gm_u64map_done(&seg->pieces);
                free(seg);
        }
}

/* Explains a refused grant as a central refusal would be explained. */
static gm_oom_reason_t describe_refusal(gm_session_t *s, const Gpumem__Grant *g, int err, char *buf, size_t len) {
        gm_daemon_t *d = s->daemon;
        gm_local_refresh(d);
        const gm_stats_t *st = &s->local->figures;
        uint64_t device_free = 0, device_total = 0;
        if (d->backend->ops->mem_info(d->backend, &device_free, &device_total) < 0)
                device_free = d->backend->capacity - d->backend->in_use;
        uint64_t reserved = s->local->granted;
        uint64_t active = (uint64_t) st->active_bytes[GM_STAT_ALL].current;
        gm_oom_report_t r = {
                .device = d->backend->device,
                .alloc_size = g->size,
                .device_total = d->backend->capacity,
                .device_free = device_free,
                .session_allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current,
                .session_reserved = reserved,
                .block_size = g->block_size,
                .session_cached = reserved > active ? reserved - active : 0,
                .largest_free = g->largest_free,
                .tenant = s->tenant->name,
                .tenant_quota = s->tenant->quota,
                .tenant_reserved = s->tenant->charged_bytes,
                .tenant_live = (uint64_t) s->tenant->stats.active_bytes[GM_STAT_ALL].current,
                .broker_reserved = d->backend->in_use,
                .broker_live = (uint64_t) d->device_stats.active_bytes[GM_STAT_ALL].current,
                .others_cached = gm_daemon_others_cached(d, s),
        };
        r.reason = err == -EDQUOT ? GM_OOM_QUOTA : gm_oom_classify(&r);
        if (gm_oom_format(&r, buf, len) < 0)
                snprintf(buf, len, "gpumemd: out of memory granting %" PRIu64 " bytes", g->size);
        return r.reason;
}

/* Whether a grant request is well formed against what the session holds. */
static const char *grant_invalid(const gm_session_t *s, const Gpumem__Grant *g, local_segment_t **ret_seg) {
        const gm_daemon_t *d = s->daemon;
        const gm_local_session_t *l = s->local;
        uint64_t gran = d->backend->granularity;
        if (g->segment_id == 0 || g->size == 0 || g->segment_va_size == 0)
                return "empty grant";
        if (g->segment_va_size > MAX_SEGMENT_VA)
                return "segment larger than any address space";
        if (g->size % gran || g->offset % gran || g->segment_va_size % gran)
                return "not a multiple of the backend's granularity";
        if (g->offset >= g->segment_va_size || g->size > g->segment_va_size - g->offset)
                return "piece outside its segment";
        local_segment_t *seg = gm_u64map_get(&l->segments, g->segment_id);
        if (seg && (seg->va_size != g->segment_va_size || seg->piece_size != g->size || g->offset % g->size))
                return "piece does not match its segment";
        if (seg && gm_u64map_get(&seg->pieces, g->offset + 1))
                return "piece already granted";
        *ret_seg = seg;
        return NULL;
}

/* Enters a piece (its segment fields set) into the session's ledger, under
 * `seg` (NULL: a new segment). -ENOMEM leaves everything as it was. */
static int insert_piece(gm_session_t *s, local_segment_t *seg, gm_piece_t *p) {
        gm_local_session_t *l = s->local;
        bool new_segment = !seg;
        if (new_segment) {
                seg = calloc(1, sizeof(*seg));
                if (!seg || gm_u64map_put(&l->segments, p->segment_id, seg) < 0) {
                        free(seg);
                        return -ENOMEM;
                }
                seg->va_size = p->segment_va_size;
                seg->piece_size = p->phys.size;
        }
        if (gm_u64map_put(&seg->pieces, p->offset + 1, p) < 0) {
                if (new_segment) {
                        gm_u64map_remove(&l->segments, p->segment_id);
                        free(seg);
                }
                return -ENOMEM;
        }
        l->segments_ever += new_segment;
        l->n_pieces++;
        l->granted += p->phys.size;
        exact_update(s, (int64_t) p->phys.size, new_segment ? 1 : 0);
        return 0;
}

int gm_local_adopt(gm_session_t *s, gm_piece_t *p) {
        Gpumem__Grant g = GPUMEM__GRANT__INIT;
        g.segment_id = p->segment_id;
        g.segment_va_size = p->segment_va_size;
        g.offset = p->offset;
        g.size = p->phys.size;
        local_segment_t *seg = NULL;
        if (grant_invalid(s, &g, &seg) || insert_piece(s, seg, p) < 0)
                return -EINVAL;
        s->tenant->charged_bytes += p->phys.size;
        p->client_mapped = true;
        return 0;
}

static uint64_t reclaim_from_locals_and_others(gm_session_t *s, int err, uint64_t need) {
        return gm_daemon_reclaim(s->daemon, s, err == -EDQUOT ? s->tenant : NULL, need);
}

/* One try. 0 when answered (piece or refusal), -EAGAIN to wait for
 * reclaimed memory, another negative errno when the session broke. */
static int try_grant(gm_session_t *s, uint64_t request_id, const Gpumem__Grant *g, bool may_park) {
        gm_daemon_t *d = s->daemon;
        gm_local_session_t *l = s->local;
        local_segment_t *seg = NULL;
        const char *bad = grant_invalid(s, g, &seg);
        if (bad)
                return gm_session_send_error(s, request_id, EINVAL, "gpumemd: grant refused: %s", bad), 0;
        if (g->size > d->backend->capacity) {
                char a[32], c[32];
                return gm_session_send_error(s, request_id, ENOMEM,
                                             "gpumemd: tried to allocate %s, more than the device's capacity of %s",
                                             gm_format_size(g->size, a, sizeof(a)),
                                             gm_format_size(d->backend->capacity, c, sizeof(c))),
                       0;
        }
        if (l->n_pieces >= d->opts.limits.max_blocks_per_session)
                return gm_session_send_error(s, request_id, ENOBUFS,
                                             "gpumemd: session limit of %llu pieces reached",
                                             (unsigned long long) d->opts.limits.max_blocks_per_session),
                       0;
        gm_tenant_t *t = s->tenant;
        int r = t->quota && t->charged_bytes + g->size > t->quota ? -EDQUOT : 0;
        gm_piece_t *p = NULL;
        if (r == 0) {
                p = calloc(1, sizeof(*p));
                r = p ? gm_backend_create(d->backend, g->size, &p->phys) : -ENOMEM;
                if (r < 0) {
                        free(p);
                        p = NULL;
                }
        }
        if (r == -ENOMEM || r == -EDQUOT) {
                uint64_t asked = reclaim_from_locals_and_others(s, r, g->size);
                bool help_coming = asked > 0 || (r == -EDQUOT ? s->releasing_bytes > 0 : d->releasing_bytes > 0);
                if (may_park && help_coming && l->n_parked < d->opts.limits.max_parked_per_session)
                        return -EAGAIN;
                char message[1024];
                gm_oom_reason_t reason = describe_refusal(s, g, r, message, sizeof(message));
                gm_metrics_count_refusal(d->metrics, t->name, reason);
                return gm_session_send_error(s, request_id, -r, "%s", message), 0;
        }
        if (r < 0) {
                const char *detail = gm_backend_last_error(d->backend);
                return gm_session_send_error(s, request_id, -r, "gpumemd: grant failed: %s%s%s", strerror(-r),
                                             detail[0] ? ": " : "", detail),
                       0;
        }
        p->segment_id = g->segment_id;
        p->segment_va_size = g->segment_va_size;
        p->offset = g->offset;
        if (insert_piece(s, seg, p) < 0) {
                gm_backend_release(d->backend, &p->phys);
                free(p);
                return gm_session_send_error(s, request_id, ENOMEM, "gpumemd: out of memory"), 0;
        }
        t->charged_bytes += g->size;
        gm_piece_store(s, p);
        p->client_mapped = true;

        Gpumem__Mapping m = GPUMEM__MAPPING__INIT;
        m.segment_id = g->segment_id;
        m.segment_va_size = g->segment_va_size;
        m.offset = g->offset;
        m.length = g->size;
        Gpumem__GrantReply gr = GPUMEM__GRANT_REPLY__INIT;
        gr.mapping = &m;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_GRANT_REPLY;
        env.grant_reply = &gr;
        return gm_session_reply(s, request_id, &env, &p->phys.fd, 1) < 0 ? -ECONNRESET : 0;
}

static void park_grant(gm_session_t *s, uint64_t request_id, const Gpumem__Grant *g) {
        parked_grant_t *pg = calloc(1, sizeof(*pg));
        if (!pg) {
                gm_session_send_error(s, request_id, ENOMEM, "gpumemd: out of memory");
                return;
        }
        pg->request_id = request_id;
        gpumem__grant__init(&pg->grant);
        pg->grant.segment_id = g->segment_id;
        pg->grant.segment_va_size = g->segment_va_size;
        pg->grant.offset = g->offset;
        pg->grant.size = g->size;
        pg->grant.block_size = g->block_size;
        pg->grant.largest_free = g->largest_free;
        pg->parked_at_ms = gm_now_ms();
        parked_grant_t **pp = &s->local->parked;
        while (*pp)
                pp = &(*pp)->next;
        *pp = pg;
        s->local->n_parked++;
}

int gm_local_grant(gm_session_t *s, uint64_t request_id, const Gpumem__Grant *g) {
        if (!s->local)
                return gm_session_send_error(s, request_id, EPROTO, "gpumemd: Grant needs a local session"), 0;
        if (s->local->parked) {
                park_grant(s, request_id, g);
                return 0;
        }
        int r = try_grant(s, request_id, g, true);
        if (r == -EAGAIN) {
                park_grant(s, request_id, g);
                r = 0;
        }
        return r == -ECONNRESET ? 0 : r;
}

void gm_local_retry_parked(gm_daemon_t *d, bool timed_out_only) {
        uint64_t now = gm_now_ms();
        for (gm_session_t *s = d->sessions, *next; s; s = next) {
                next = s->next;
                while (s->local && s->local->parked && !s->closing) {
                        gm_local_session_t *l = s->local;
                        parked_grant_t *pg = l->parked;
                        bool expired = now - pg->parked_at_ms >= d->opts.limits.park_timeout_ms;
                        if (timed_out_only && !expired)
                                break;
                        l->parked = pg->next;
                        l->n_parked--;
                        int r = try_grant(s, pg->request_id, &pg->grant, !expired);
                        if (r == -EAGAIN) {
                                pg->next = l->parked;
                                l->parked = pg;
                                l->n_parked++;
                                break;
                        }
                        free(pg);
                }
        }
}

int gm_local_return(gm_session_t *s, uint64_t request_id, const Gpumem__ReturnPieces *ret) {
        gm_local_session_t *l = s->local;
        if (!l)
                return gm_session_send_error(s, request_id, EPROTO, "gpumemd: ReturnPieces needs a local session"), 0;
        for (size_t i = 0; i < ret->n_ranges; i++) {
                const Gpumem__Range *range = ret->ranges[i];
                local_segment_t *seg = gm_u64map_get(&l->segments, range->segment_id);
                gm_piece_t *p = seg && range->offset != UINT64_MAX ? gm_u64map_get(&seg->pieces, range->offset + 1)
                                                                   : NULL;
                if (!p || p->phys.size != range->length) {
                        gm_session_send_error(s, request_id, EINVAL,
                                              "gpumemd: no piece of %" PRIu64 " bytes at %" PRIu64
                                              " of segment %" PRIu64 " was granted",
                                              range->length, range->offset, range->segment_id);
                        continue;
                }
                piece_forget(s, seg, range->segment_id, p);
        }
        gm_local_retry_parked(s->daemon, false);
        gm_session_retry_parked(s->daemon);
        return 0;
}

/* ---- reclaim ---- */

static void reclaim_done(gm_session_t *s) {
        gm_local_session_t *l = s->local;
        s->releasing_bytes -= l->reclaim_bytes;
        s->daemon->releasing_bytes -= l->reclaim_bytes;
        l->reclaim_id = 0;
        l->reclaim_bytes = 0;
}

uint64_t gm_local_reclaim(gm_session_t *s) {
        gm_local_session_t *l = s->local;
        if (!l || l->reclaim_id || s->closing)
                return 0;
        uint64_t cached = gm_session_cached_bytes(s);
        if (cached == 0)
                return 0;
        Gpumem__Reclaim rq = GPUMEM__RECLAIM__INIT;
        rq.reclaim_id = l->next_reclaim_id++;
        rq.bytes = cached;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RECLAIM;
        env.reclaim = &rq;
        if (gm_session_send(s, &env, NULL, 0) < 0)
                return 0;
        l->reclaim_id = rq.reclaim_id;
        l->reclaim_bytes = cached;
        l->reclaim_sent_ms = gm_now_ms();
        s->releasing_bytes += cached;
        s->daemon->releasing_bytes += cached;
        gm_metrics_count_reclaim(s->daemon->metrics, GM_RECLAIM_REQUESTED);
        return cached;
}

int gm_local_reclaim_ack(gm_session_t *s, uint64_t request_id, const Gpumem__ReclaimAck *ack) {
        gm_local_session_t *l = s->local;
        if (!l || !l->reclaim_id || ack->reclaim_id != l->reclaim_id)
                return gm_session_send_error(s, request_id, EINVAL, "gpumemd: no reclaim %" PRIu64 " is pending",
                                             ack->reclaim_id),
                       0;
        reclaim_done(s);
        gm_metrics_count_reclaim(s->daemon->metrics, GM_RECLAIM_ACKNOWLEDGED);
        gm_local_refresh_session(s);
        gm_local_retry_parked(s->daemon, false);
        gm_session_retry_parked(s->daemon);
        return 0;
}

void gm_local_tick(gm_daemon_t *d) {
        uint64_t now = gm_now_ms();
        for (gm_session_t *s = d->sessions; s; s = s->next)
                if (s->local && s->local->reclaim_id && !s->closing &&
                    now - s->local->reclaim_sent_ms >= d->opts.limits.release_timeout_ms) {
                        gm_metrics_count_reclaim(d->metrics, GM_RECLAIM_TIMED_OUT);
                        log_warning("session %llu (pid %d) has not answered reclaim %llu in %u ms",
                                    (unsigned long long) s->id, (int) s->cred.pid,
                                    (unsigned long long) s->local->reclaim_id, d->opts.limits.release_timeout_ms);
                        reclaim_done(s);
                }
        gm_local_refresh(d);
        gm_local_retry_parked(d, true);
}

/* ---- the end of a session ---- */

void gm_local_release_all(gm_session_t *s) {
        gm_local_session_t *l = s->local;
        if (!l)
                return;
        /* Its block figures leave the tenant's and device's currents. */
        gm_stats_t gone = l->applied;
        gm_local_zero_currents(&gone);
        if (s->tenant)
                gm_local_fold(&s->tenant->stats, &gone, &l->applied);
        gm_local_fold(&s->daemon->device_stats, &gone, &l->applied);
        if (l->reclaim_id)
                reclaim_done(s);
        for (size_t i = 0; i < l->segments.cap; i++) {
                local_segment_t *seg = l->segments.values[i];
                if (!seg)
                        continue;
                for (size_t k = 0; k < seg->pieces.cap; k++) {
                        gm_piece_t *p = seg->pieces.values[k];
                        if (!p)
                                continue;
                        l->granted -= p->phys.size;
                        exact_update(s, -(int64_t) p->phys.size, 0);
                        gm_piece_release(s, p);
                }
                exact_update(s, 0, -1);
                gm_u64map_done(&seg->pieces);
                free(seg);
        }
        gm_u64map_done(&l->segments);
        while (l->parked) {
                parked_grant_t *pg = l->parked;
                l->parked = pg->next;
                free(pg);
        }
        gm_statpage_unmap(l->page);
        free(l);
        s->local = NULL;
}
