/* Local sessions: the daemon's side of a heap that runs in its client (the
 * wire; localstats.c reads the statistics pages).
 *
 * The client's heap asks for pieces of physical memory (Grant: a whole
 * segment, or one page of an expandable one) and gives them back once it
 * unmapped them (ReturnPieces). The daemon stays the owner and the ledger:
 * every piece is the broker's (gm_piece_create: backend, quota, device,
 * charge, fd store; gm_piece_release), and released when it comes back or
 * the session ends. A local piece is never "sent" in the broker's sense: its
 * release needs no ReleaseRequest, because the client gives it back only
 * after unmapping it. Reserved and segment figures are the daemon's own. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "local.h"
#include "log.h"
#include "metrics.h"
#include "size.h"

/* A session whose reclaim brought nothing back is not asked again for this long. */
#define DRY_MS 1000
/* Ranges one ReturnPieces may name. */
#define MAX_RETURN_RANGES 512u
/* The largest virtual range a segment may claim (2^48 bytes). */
#define MAX_SEGMENT_VA (UINT64_C(1) << 48)

/* A central session's allocation waiting for local sessions' caches. */
typedef struct gm_parked_alloc {
        uint64_t request_id;
        uint64_t size, stream;
        uint64_t parked_at_ms;
        struct gm_parked_alloc *next;
} gm_parked_alloc_t;

struct gm_parked_grant {
        uint64_t request_id;
        Gpumem__Grant grant; /* scalars only */
        uint64_t parked_at_ms;
        struct gm_parked_grant *next;
};

/* ---- hello ---- */

int gm_local_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd) {
        const gm_requests_t *d = c->rq;
        bool wants_local = hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL ||
                           hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED;
        const gm_config_tenant_t *ct = gm_config_tenant_find(d->config->file, c->tenant_name);
        *ret_page_fd = -1;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL;
        if (!wants_local || hello->admin)
                return 0;
        if (ct && ct->heap_central) {
                if (hello->heap_mode == GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL_PREFERRED)
                        return 0;
                gm_request_error(c, request_id, EPERM,
                                 "tenant '%s' must use a central heap (the configuration's 'heap = central'); "
                                 "connect without GPUMEM_HEAP=local",
                                 c->tenant_name);
                return -EPERM;
        }
        gm_local_t *l = calloc(1, sizeof(*l));
        int fd = -1;
        int r = l ? gm_statpage_create(sizeof(gm_stats_t), &fd) : -ENOMEM;
        if (r == 0)
                r = gm_statpage_map(fd, false, &l->page);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                free(l);
                gm_request_error(c, request_id, r, "cannot create the statistics page: %s", strerror(-r));
                return r;
        }
        gm_stats_init(&l->exact);
        gm_stats_init(&l->figures);
        gm_stats_init(&l->applied);
        l->exact.max_split_size = l->figures.max_split_size = d->broker->device_stats.max_split_size;
        l->next_reclaim_id = 1;
        c->local = l;
        reply->heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL;
        reply->alloc_conf = d->broker->alloc_config.raw;
        reply->stats_page_size = GM_STATPAGE_SIZE;
        *ret_page_fd = fd;
        return 0;
}

/* ---- pieces ---- */

/* What the session holds of one segment: its LIVE pieces' count, size and
 * the segment's virtual size (0 pieces: a new segment). */
typedef struct segment_view {
        size_t n;
        uint64_t piece_size;
        uint64_t va_size;
} segment_view_t;

static segment_view_t segment_view(const gm_session_t *s, uint64_t segment_id) {
        segment_view_t v = {0};
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->state == GM_PIECE_LIVE && p->segment_id == segment_id) {
                        v.n++;
                        v.piece_size = p->phys.size;
                        v.va_size = p->segment_va_size;
                }
        return v;
}

/* Why a grant request is malformed against what the session holds, or NULL. */
static const char *grant_invalid(const gm_request_conn_t *c, const Gpumem__Grant *g) {
        uint64_t gran = c->rq->broker->backend->granularity;
        if (g->segment_id == 0 || g->size == 0 || g->segment_va_size == 0)
                return "empty grant";
        if (g->segment_va_size > MAX_SEGMENT_VA)
                return "segment larger than any address space";
        if (g->size % gran || g->offset % gran || g->segment_va_size % gran)
                return "not a multiple of the backend's granularity";
        if (g->offset >= g->segment_va_size || g->size > g->segment_va_size - g->offset)
                return "piece outside its segment";
        segment_view_t v = segment_view(c->session, g->segment_id);
        if (v.n && (v.va_size != g->segment_va_size || v.piece_size != g->size || g->offset % g->size))
                return "piece does not match its segment";
        if (v.n && gm_session_find_piece(c->session, g->segment_id, g->offset))
                return "piece already granted";
        return NULL;
}

/* Bytes cached by `c`'s session: reserved minus active. */
static uint64_t cached_bytes(const gm_session_t *s) {
        const gm_stats_t *st = gm_conn_stats(s);
        int64_t cached = st ? st->reserved_bytes[GM_STAT_ALL].current - st->active_bytes[GM_STAT_ALL].current : 0;
        return cached > 0 ? (uint64_t) cached : 0;
}

/* Explains a refused grant as a central refusal is explained. */
static gm_oom_reason_t describe_refusal(gm_request_conn_t *c, const Gpumem__Grant *g, int err, char *buf, size_t len) {
        const gm_requests_t *d = c->rq;
        gm_session_t *s = c->session;
        gm_local_refresh(d);
        const gm_stats_t *st = &c->local->figures;
        uint64_t device_free, device_total;
        gm_broker_device_view(d->broker, &device_free, &device_total);
        uint64_t others_cached = d->broker->releasing_bytes - s->releasing_bytes;
        for (const gm_session_t *o = d->broker->sessions; o; o = o->next)
                if (o != s && !o->ended)
                        others_cached += cached_bytes(o);
        gm_stats_t tenant, device;
        gm_local_tenant_stats(d, s->tenant, &tenant);
        gm_local_device_stats(d, &device);
        uint64_t reserved = c->local->granted, active = (uint64_t) st->active_bytes[GM_STAT_ALL].current;
        gm_oom_report_t r = {
                .device = d->broker->backend->device,
                .alloc_size = g->size,
                .device_total = device_total,
                .device_free = device_free,
                .session_allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current,
                .session_reserved = reserved,
                .block_size = g->block_size,
                .session_cached = reserved > active ? reserved - active : 0,
                .largest_free = g->largest_free,
                .tenant = s->tenant->name,
                .tenant_quota = s->tenant->quota,
                .tenant_reserved = s->tenant->charged_bytes,
                .tenant_live = (uint64_t) tenant.active_bytes[GM_STAT_ALL].current,
                .broker_reserved = gm_broker_reserved(d->broker),
                .broker_live = (uint64_t) device.active_bytes[GM_STAT_ALL].current,
                .others_cached = others_cached,
                .caller_admin = s->admin,
        };
        r.reason = err == -EDQUOT ? GM_OOM_QUOTA : gm_oom_classify(&r);
        if (gm_oom_format(&r, buf, len) < 0)
                snprintf(buf, len, "gpumemd: out of memory granting %" PRIu64 " bytes", g->size);
        return r.reason;
}

static bool reclaim_pending(const gm_requests_t *d) {
        for (const gm_session_t *os = d->broker->sessions; os; os = os->next) {
                const gm_request_conn_t *o = os->userdata;
                if (o && o->local && o->local->reclaim_id)
                        return true;
        }
        return d->broker->releasing_bytes > 0;
}

/* One try. 0 when answered (piece or refusal), -EAGAIN to wait for
 * reclaimed memory, another negative errno when the connection broke. */
static int try_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Grant *g, bool may_park) {
        const gm_requests_t *d = c->rq;
        gm_local_t *l = c->local;
        gm_session_t *s = c->session;
        const char *bad = grant_invalid(c, g);
        if (bad)
                return gm_request_error(c, request_id, EINVAL, "grant refused: %s", bad), 0;
        if (g->size > d->broker->backend->capacity) {
                char a[32], cap[32];
                return gm_request_error(c, request_id, ENOMEM,
                                        "tried to allocate %s, more than the device's capacity of %s",
                                        gm_format_size(g->size, a, sizeof(a)),
                                        gm_format_size(d->broker->backend->capacity, cap, sizeof(cap))),
                       0;
        }
        if (l->n_pieces >= GM_LOCAL_MAX_PIECES)
                return gm_request_error(c, request_id, ENOBUFS, "session limit of %u pieces reached",
                                        GM_LOCAL_MAX_PIECES),
                       0;
        segment_view_t v = segment_view(s, g->segment_id);
        gm_piece_spec_t spec = {.segment_id = g->segment_id,
                                .segment_va_size = g->segment_va_size,
                                .offset = g->offset,
                                .size = g->size};
        gm_piece_t *p = NULL;
        int r = gm_piece_create(s, &spec, &p);
        if (r == -ENOMEM || r == -EDQUOT) {
                /* Other sessions' caches: local ones are asked, central ones trimmed. */
                const gm_tenant_t *scope = r == -EDQUOT ? s->tenant : NULL;
                uint64_t asked = gm_local_reclaim(d, c, scope) + gm_broker_trim(d->broker, scope ? scope->name : NULL);
                if (may_park && (asked > 0 || reclaim_pending(d)) &&
                    l->n_parked < d->broker->limits.max_parked_per_session)
                        return -EAGAIN;
                char message[1024];
                gm_oom_reason_t reason = describe_refusal(c, g, r, message, sizeof(message));
                if (!g->will_retry) /* the application sees this one */
                        gm_requests_count_refusal(d, s->tenant->name, reason);
                gm_outcome_t out = {.kind = GM_OUTCOME_REFUSE, .error = r};
                snprintf(out.message, sizeof(out.message), "%s", message);
                return gm_request_refusal(c, request_id, &out), 0;
        }
        if (r < 0) {
                const char *detail = gm_backend_last_error(d->broker->backend);
                return gm_request_error(c, request_id, r, "grant failed: %s%s%s", strerror(-r), detail[0] ? ": " : "",
                                        detail),
                       0;
        }
        l->granted += g->size;
        l->n_pieces++;
        if (v.n == 0) {
                l->segments++;
                l->segments_ever++;
        }
        gm_local_exact_update(c, (int64_t) g->size, v.n == 0 ? 1 : 0);

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
        return gm_request_send(c, request_id, &env, &p->phys.fd, 1) < 0 ? -ECONNRESET : 0;
}

static void park_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Grant *g) {
        gm_parked_grant_t *pg = calloc(1, sizeof(*pg));
        if (!pg) {
                gm_request_error(c, request_id, ENOMEM, "out of memory");
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
        pg->grant.will_retry = g->will_retry;
        pg->parked_at_ms = gm_now_ms();
        gm_parked_grant_t **pp = &c->local->parked;
        while (*pp)
                pp = &(*pp)->next;
        *pp = pg;
        c->local->n_parked++;
        gm_local_count_reclaim_wait(c);
}

static int refuse_central(gm_request_conn_t *c, uint64_t request_id, const char *what) {
        return gm_request_error(c, request_id, EPROTO, "%s needs a local session", what), 0;
}

int gm_handle_grant(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        if (!c->local)
                return refuse_central(c, request_id, "Grant");
        if (c->local->parked) { /* in order behind the waiting ones */
                park_grant(c, request_id, env->grant);
                return 0;
        }
        int r = try_grant(c, request_id, env->grant, true);
        if (r == -EAGAIN) {
                park_grant(c, request_id, env->grant);
                r = 0;
        }
        return r == -ECONNRESET ? 0 : r;
}

static void retry_conn(gm_request_conn_t *c, uint64_t now, bool timed_out_only) {
        const gm_requests_t *d = c->rq;
        while (c->local && c->local->parked && !c->closed) {
                gm_local_t *l = c->local;
                gm_parked_grant_t *pg = l->parked;
                bool expired = now - pg->parked_at_ms >= d->broker->limits.park_timeout_ms;
                if (timed_out_only && !expired)
                        break;
                l->parked = pg->next;
                l->n_parked--;
                int r = try_grant(c, pg->request_id, &pg->grant, !expired);
                if (r == -EAGAIN) {
                        pg->next = l->parked;
                        l->parked = pg;
                        l->n_parked++;
                        break;
                }
                gm_requests_parked_done(d, now - pg->parked_at_ms);
                free(pg);
        }
}

static bool local_reclaim_pending(const gm_requests_t *d) {
        for (const gm_session_t *os = d->broker->sessions; os; os = os->next) {
                const gm_request_conn_t *o = os->userdata;
                if (o && o->local && o->local->reclaim_id)
                        return true;
        }
        return false;
}

bool gm_local_park_alloc(gm_request_conn_t *c, uint64_t request_id, uint64_t size, uint64_t stream,
                         const gm_outcome_t *out) {
        const gm_requests_t *d = c->rq;
        if (out->error != -ENOMEM && out->error != -EDQUOT)
                return false;
        uint32_t n = 0;
        for (const gm_parked_alloc_t *pa = c->parked_allocs; pa; pa = pa->next)
                n++;
        const gm_tenant_t *scope = out->error == -EDQUOT ? c->session->tenant : NULL;
        if (n >= d->broker->limits.max_parked_per_session || gm_local_reclaim(d, c, scope) == 0)
                return false;
        gm_parked_alloc_t *pa = calloc(1, sizeof(*pa));
        if (!pa)
                return false;
        *pa = (gm_parked_alloc_t){
                .request_id = request_id, .size = size, .stream = stream, .parked_at_ms = gm_now_ms()};
        gm_parked_alloc_t **pp = &c->parked_allocs;
        while (*pp)
                pp = &(*pp)->next;
        *pp = pa;
        gm_session_count_reclaim_wait(c->session);
        return true;
}

/* Central allocations parked here, in order, while local reclaims are out. */
static void retry_allocs(gm_request_conn_t *c, uint64_t now, bool timed_out_only) {
        const gm_requests_t *d = c->rq;
        while (c->parked_allocs && !c->closed) {
                gm_parked_alloc_t *pa = c->parked_allocs;
                bool expired = now - pa->parked_at_ms >= d->broker->limits.park_timeout_ms;
                if (timed_out_only && !expired)
                        break;
                gm_outcome_t out;
                gm_session_alloc(c->session, pa->request_id, pa->size, pa->stream, NULL, 0, &out);
                if (out.kind == GM_OUTCOME_REFUSE && !expired && local_reclaim_pending(d))
                        break; /* more may come back */
                c->parked_allocs = pa->next;
                if (out.kind != GM_OUTCOME_PARK) {
                        gm_requests_parked_done(d, now - pa->parked_at_ms);
                        gm_requests_answer_alloc(c, pa->request_id, &out);
                }
                free(pa);
        }
}

static void retry_all(const gm_requests_t *d, bool timed_out_only) {
        uint64_t now = gm_now_ms();
        for (gm_session_t *s = d->broker->sessions, *next; s; s = next) {
                next = s->next; /* a failed send closes the connection (its session stays listed until the loop runs) */
                if (s->userdata) {
                        retry_conn(s->userdata, now, timed_out_only);
                        retry_allocs(s->userdata, now, timed_out_only);
                }
        }
}

void gm_local_retry_parked(const gm_requests_t *d) {
        retry_all(d, false);
}

int gm_handle_return_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_local_t *l = c->local;
        if (!l)
                return refuse_central(c, request_id, "ReturnPieces");
        const Gpumem__ReturnPieces *ret = env->return_pieces;
        if (ret->n_ranges > MAX_RETURN_RANGES) { /* each is a walk over the session's pieces */
                gm_request_error(c, request_id, E2BIG, "at most %u pieces in one ReturnPieces", MAX_RETURN_RANGES);
                return -E2BIG;
        }
        for (size_t i = 0; i < ret->n_ranges; i++) {
                const Gpumem__Range *range = ret->ranges[i];
                gm_piece_t *p = gm_session_find_piece(c->session, range->segment_id, range->offset);
                if (!p || p->phys.size != range->length || p->in_heap) {
                        gm_request_error(c, request_id, EINVAL,
                                         "no piece of %" PRIu64 " bytes at %" PRIu64 " of segment %" PRIu64
                                         " was granted",
                                         range->length, range->offset, range->segment_id);
                        continue;
                }
                uint64_t size = p->phys.size, segment_id = p->segment_id;
                gm_piece_release(c->session, p, false); /* never sent: back to the backend at once */
                bool last = segment_view(c->session, segment_id).n == 0;
                l->granted -= size;
                l->n_pieces--;
                l->segments -= last;
                gm_local_exact_update(c, -(int64_t) size, last ? -1 : 0);
        }
        gm_local_retry_parked(c->rq);
        return 0;
}

int gm_handle_move_pieces(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_local_t *l = c->local;
        if (!l)
                return refuse_central(c, request_id, "MovePieces");
        const Gpumem__MovePieces *mp = env->move_pieces;
        if (mp->n_moves > MAX_RETURN_RANGES) { /* each is a walk over the session's pieces */
                gm_request_error(c, request_id, E2BIG, "at most %u pieces in one MovePieces", MAX_RETURN_RANGES);
                return -E2BIG;
        }
        for (size_t i = 0; i < mp->n_moves; i++) {
                const Gpumem__PageMove *m = mp->moves[i];
                gm_piece_t *p = gm_session_find_piece(c->session, m->from_segment_id, m->from_offset);
                Gpumem__Grant g = GPUMEM__GRANT__INIT; /* the new place, checked as a grant there */
                g.segment_id = m->to_segment_id;
                g.segment_va_size = m->to_segment_va_size;
                g.offset = m->to_offset;
                g.size = m->length;
                const char *bad = !p || p->phys.size != m->length || p->in_heap ? "no such piece was granted"
                                                                                : grant_invalid(c, &g);
                if (bad) {
                        gm_request_error(c, request_id, EINVAL,
                                         "move of %" PRIu64 " at %" PRIu64 " of segment %" PRIu64 " refused: %s",
                                         m->length, m->from_offset, m->from_segment_id, bad);
                        continue;
                }
                int64_t segments = segment_view(c->session, g.segment_id).n == 0;
                gm_piece_move(c->rq->broker, p, g.segment_id, g.segment_va_size, g.offset);
                segments -= segment_view(c->session, m->from_segment_id).n == 0;
                l->segments += segments;
                l->segments_ever += segments > 0;
                gm_local_exact_update(c, 0, segments);
        }
        return 0;
}

/* ---- reclaim ---- */

static void reclaim_done(gm_request_conn_t *c) {
        c->local->reclaim_id = 0;
        c->local->reclaim_bytes = 0;
}

static uint64_t reclaim_one(gm_request_conn_t *c) {
        gm_local_t *l = c->local;
        if (l->reclaim_id || c->closed || gm_now_ms() < l->dry_until_ms)
                return 0;
        uint64_t cached = cached_bytes(c->session);
        if (cached == 0)
                return 0;
        Gpumem__Reclaim rq = GPUMEM__RECLAIM__INIT;
        rq.reclaim_id = l->next_reclaim_id++;
        rq.bytes = cached;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RECLAIM;
        env.reclaim = &rq;
        if (gm_request_send(c, 0, &env, NULL, 0) < 0)
                return 0;
        l->reclaim_id = rq.reclaim_id;
        l->reclaim_bytes = cached;
        l->reclaim_sent_ms = gm_now_ms();
        gm_requests_count_reclaim(c->rq, GM_RECLAIM_REQUESTED);
        return cached;
}

uint64_t gm_local_reclaim(const gm_requests_t *d, const gm_request_conn_t *except, const gm_tenant_t *tenant) {
        gm_local_refresh(d);
        uint64_t asked = 0;
        for (gm_session_t *os = d->broker->sessions, *next; os; os = next) {
                next = os->next;
                gm_request_conn_t *o = os->userdata;
                if (o && o != except && o->local && !o->closed && (!tenant || os->tenant == tenant))
                        asked += reclaim_one(o);
        }
        return asked;
}

int gm_handle_reclaim_ack(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_local_t *l = c->local;
        const Gpumem__ReclaimAck *ack = env->reclaim_ack;
        if (!l || !l->reclaim_id || ack->reclaim_id != l->reclaim_id)
                return gm_request_error(c, request_id, EINVAL, "no reclaim %" PRIu64 " is pending", ack->reclaim_id), 0;
        reclaim_done(c);
        if (ack->released_bytes == 0) /* its cache is split under live blocks */
                l->dry_until_ms = gm_now_ms() + DRY_MS;
        gm_requests_count_reclaim(c->rq, GM_RECLAIM_ACKNOWLEDGED);
        gm_local_refresh_conn(c);
        gm_local_retry_parked(c->rq);
        return 0;
}

void gm_local_tick(const gm_requests_t *d) {
        uint64_t now = gm_now_ms();
        for (gm_session_t *s = d->broker->sessions; s; s = s->next) {
                gm_request_conn_t *c = s->userdata;
                if (c && c->local && c->local->reclaim_id && !c->closed &&
                    now - c->local->reclaim_sent_ms >= d->broker->limits.release_timeout_ms) {
                        gm_requests_count_reclaim(d, GM_RECLAIM_TIMED_OUT);
                        log_warning("session %llu (pid %d) has not answered reclaim %llu in %u ms",
                                    (unsigned long long) c->session->id, (int) c->session->pid,
                                    (unsigned long long) c->local->reclaim_id, d->broker->limits.release_timeout_ms);
                        reclaim_done(c);
                }
        }
        gm_local_refresh(d);
        retry_all(d, true);
}

/* ---- re-attach ---- */

int gm_local_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req) {
        gm_session_t *s = c->session;
        int r = req->n_blocks ? -EINVAL : 0; /* a local heap keeps its blocks */
        for (size_t i = 0; i < req->n_segments && r == 0; i++) {
                const Gpumem__ReattachSegment *seg = req->segments[i];
                for (size_t k = 0; k < seg->n_mapped && r == 0; k++) {
                        Gpumem__Grant g = GPUMEM__GRANT__INIT;
                        g.segment_id = seg->segment_id;
                        g.segment_va_size = seg->va_size;
                        g.offset = seg->mapped[k]->offset;
                        g.size = seg->mapped[k]->length;
                        if (grant_invalid(c, &g) || c->local->n_pieces >= GM_LOCAL_MAX_PIECES) {
                                r = -EINVAL;
                                break;
                        }
                        bool new_segment = segment_view(s, g.segment_id).n == 0;
                        gm_piece_spec_t spec = {.segment_id = g.segment_id,
                                                .segment_va_size = g.segment_va_size,
                                                .offset = g.offset,
                                                .size = g.size};
                        gm_piece_t *p;
                        r = gm_session_reattach_grant(s, &spec, &p);
                        if (r < 0)
                                break;
                        c->local->granted += g.size;
                        c->local->n_pieces++;
                        c->local->segments += new_segment;
                        c->local->segments_ever += new_segment;
                        gm_local_exact_update(c, (int64_t) g.size, new_segment ? 1 : 0);
                }
        }
        if (r == 0 && req->last)
                r = gm_session_reattach_finish(s);
        if (r < 0) {
                gm_request_error(c, request_id, r, "re-attach refused: %s", strerror(-r));
                return r;
        }
        return req->last ? gm_reply_ok(c, request_id) : 0;
}

/* ---- the end of a session ---- */

void gm_local_end(gm_request_conn_t *c) {
        while (c->parked_allocs) {
                gm_parked_alloc_t *pa = c->parked_allocs;
                c->parked_allocs = pa->next;
                free(pa);
        }
        gm_local_t *l = c->local;
        if (!l)
                return;
        const gm_requests_t *d = c->rq;
        /* Its figures leave the local totals (the broker releases its pieces). */
        gm_stats_t gone = l->applied;
        gm_local_zero_currents(&gone);
        gm_local_tenant_t *lt = c->session->tenant ? gm_local_tenant(d, c->session->tenant->name) : NULL;
        if (lt)
                gm_local_fold(&lt->stats, &gone, &l->applied);
        gm_local_fold(&d->local->device, &gone, &l->applied);
        if (c->session->tenant && l->granted)
                gm_local_exact_update(c, -(int64_t) l->granted, -(int64_t) l->segments);
        while (l->parked) {
                gm_parked_grant_t *pg = l->parked;
                l->parked = pg->next;
                free(pg);
        }
        gm_statpage_unmap(l->page);
        free(l);
        c->local = NULL;
}
