/* The broker's lifetime, settings, memory history, tenant views and the
 * integrity checker. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reclaim.h"
#include "size.h"
#include "text.h"
#include "u64map.h"

/* Interned frame text of the memory history, all entries together. */
#define HISTORY_FRAME_BYTES (64u << 20)
#define HISTORY_DEFAULT_ENTRIES 100000

static int64_t max_split_stat(const gm_alloc_config_t *c) {
        return c->max_split_size == UINT64_MAX ? -1 : (int64_t) c->max_split_size;
}

int gm_broker_new(const gm_broker_params_t *params, gm_broker_t **ret_broker) {
        if (!params->backend || !params->alloc_config)
                return -EINVAL;
        gm_broker_t *b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        b->backend = params->backend;
        b->ops = params->ops;
        b->limits = params->limits;
        b->alloc_config = *params->alloc_config;
        b->store_max = params->store_max;
        b->ledger_fd = -1;
        gm_stats_init(&b->device_stats);
        b->device_stats.max_split_size = max_split_stat(&b->alloc_config);
        b->va_cursor = 1ull << 40; /* synthetic addresses: away from 0, far below 2^53 */
        *ret_broker = b;
        return 0;
}

gm_broker_t *gm_broker_free(gm_broker_t *b) {
        if (!b)
                return NULL;
        while (b->sessions)
                gm_session_free(b->sessions);
        gm_shared_free_all(b);
        gm_piece_sweep_lingering(b, true);
        gm_process_check_free_all(b);
        gm_orphan_free_all(b);
        gm_ledger_close(b);
        while (b->tenants) {
                gm_tenant_t *t = b->tenants;
                b->tenants = t->next;
                free(t);
        }
        gm_history_free(b->history);
        free(b);
        return NULL;
}

void gm_broker_set_limits(gm_broker_t *b, const gm_broker_limits_t *limits) {
        b->limits = *limits;
}

void gm_broker_set_alloc_config(gm_broker_t *b, const gm_alloc_config_t *config) {
        b->alloc_config = *config;
        int64_t mss = max_split_stat(config);
        b->device_stats.max_split_size = mss;
        for (gm_tenant_t *t = b->tenants; t; t = t->next)
                t->stats.max_split_size = mss;
        for (gm_session_t *s = b->sessions; s; s = s->next) {
                if (s->heap)
                        gm_heap_set_config(s->heap, config);
                else if (s->local && !s->ended && b->ops.alloc_conf_changed)
                        b->ops.alloc_conf_changed(b->ops.userdata, s, config);
        }
}

int gm_broker_history(gm_broker_t *b, bool enabled, size_t max_entries) {
        if (max_entries)
                b->history_max_entries = max_entries;
        if (!b->history_max_entries)
                b->history_max_entries = HISTORY_DEFAULT_ENTRIES;
        if (!enabled) {
                b->history = gm_history_free(b->history); /* as PyTorch: disabling clears it */
                return 0;
        }
        if (!b->history)
                return gm_history_new(b->history_max_entries, HISTORY_FRAME_BYTES, &b->history);
        return gm_history_set_max(b->history, b->history_max_entries);
}

int gm_broker_set_quota(gm_broker_t *b, const char *name, bool runtime, uint64_t bytes, const char *state_dir) {
        gm_tenant_t *t = gm_tenant_find(b, name);
        if (!t && b->n_tenants >= GM_BROKER_MAX_TENANTS)
                return -ENOSPC;
        if (!t && !(t = gm_tenant_get(b, name)))
                return -ENOMEM;
        gm_quota_source_t source = runtime ? GM_QUOTA_RUNTIME : GM_QUOTA_PERSISTENT;
        bool had = t->quota_set[source];
        uint64_t old = t->quota_by_source[source];
        gm_tenant_set_quota(t, source, bytes != 0, bytes);
        if (runtime) {
                gm_ledger_runtime_quota(b, t->name, bytes);
                return 0;
        }
        int r = gm_tenant_quotas_save(b, state_dir);
        if (r < 0)
                gm_tenant_set_quota(t, source, had, old);
        return r;
}

void gm_broker_tick(gm_broker_t *b, uint64_t now_ms) {
        gm_piece_sweep_lingering(b, false);
        for (gm_session_t *s = b->sessions; s; s = s->next)
                gm_session_tick(s, now_ms);
        gm_process_check_audit_tick(b, now_ms);
        gm_reclaim_tick(b, now_ms);
        gm_orphan_expire(b, now_ms, false);
        gm_shared_expire(b, gm_realtime_us() / 1000);
}

/* ---- requests ---- */

void gm_broker_alloc(gm_session_t *s, uint64_t request_id, uint64_t size, uint64_t stream, const gm_frame_t *frames,
                     size_t n_frames, gm_outcome_t *ret) {
        gm_broker_alloc_tagged(s, request_id, size, stream, "", false, frames, n_frames, ret);
}

void gm_broker_alloc_tagged(gm_session_t *s, uint64_t request_id, uint64_t size, uint64_t stream, const char *tag,
                            bool capturing, const gm_frame_t *frames, size_t n_frames, gm_outcome_t *ret) {
        gm_outcome_init(ret);
        if (s->ended || !s->tenant) {
                gm_outcome_refuse(ret, -ESHUTDOWN, "gpumemd: the session has ended");
                return;
        }
        unsigned tag_id = 0;
        int r = gm_session_tags_intern(&s->tags, tag, &tag_id);
        if (r < 0) {
                gm_outcome_refuse(ret, r, "gpumemd: allocation refused: %s",
                                  r == -E2BIG ? "more than 16 tagged pools in the session"
                                              : "malformed pool tag (want [A-Za-z0-9_.-]{1,31})");
                return;
        }
        gm_process_check_baseline(s, NULL); /* what its process holds before gpumemd's memory */
        gm_request_t rq = {.size = size, .stream = stream, .tag = (uint8_t) tag_id, .capturing = capturing};
        if (s->parked) /* keep order behind earlier waiting requests */
                return gm_reclaim_park(s, request_id, &rq, ret);
        s->cur_frames = frames;
        s->n_cur_frames = n_frames;
        gm_reclaim_try(s, &rq, true, ret);
        s->cur_frames = NULL;
        s->n_cur_frames = 0;
        if (ret->kind == GM_OUTCOME_PARK)
                gm_reclaim_park(s, request_id, &rq, ret);
}

void gm_broker_commit(gm_session_t *s, const gm_outcome_t *out) {
        gm_assert(out->kind == GM_OUTCOME_REPLY && out->new_pieces == gm_session_central_new_pieces(s));
        gm_session_central_pieces_sent(s);
}

void gm_broker_undo(gm_session_t *s, const gm_outcome_t *out) {
        gm_session_central_alloc_undo(s, out->alloc.block_id);
}

void gm_broker_grant(gm_session_t *s, uint64_t request_id, const gm_grant_t *g, gm_outcome_t *ret) {
        gm_outcome_init(ret);
        if (s->ended || !s->tenant) {
                gm_outcome_refuse(ret, -ESHUTDOWN, "gpumemd: the session has ended");
                return;
        }
        if (!s->local) {
                gm_outcome_refuse(ret, -EPROTO, "gpumemd: Grant needs a local session");
                return;
        }
        int r = gm_session_tags_name(&s->tags, g->tag_id, g->tag ? g->tag : "");
        if (r < 0) {
                gm_outcome_refuse(ret, r, "gpumemd: grant refused: %s (pool id %u)",
                                  r == -E2BIG ? "more than 16 tagged pools in the session"
                                              : "malformed pool tag, or another name than its id has",
                                  g->tag_id);
                return;
        }
        bool first = !s->holder.noted && s->grants.pieces == 0 && s->grants.returned == 0;
        if (first)
                gm_process_check_note(s, &s->holder); /* what its process holds before gpumemd's memory */
        gm_process_check_baseline(s, first ? &s->holder : NULL);
        gm_request_t rq = {.is_grant = true, .grant = *g};
        rq.grant.piece.tag = (uint8_t) g->tag_id; /* the name is in s->tags now: a parked grant keeps no pointer */
        rq.grant.tag = NULL;
        if (s->parked) /* in order behind the waiting ones */
                return gm_reclaim_park(s, request_id, &rq, ret);
        gm_reclaim_try(s, &rq, true, ret);
        if (ret->kind == GM_OUTCOME_PARK)
                gm_reclaim_park(s, request_id, &rq, ret);
}

int gm_broker_release_ack(gm_session_t *s, uint64_t release_id, const gm_release_range_t *not_released,
                          size_t n_not_released) {
        int r = gm_session_release_acked(s, release_id, not_released, n_not_released);
        if (r <= 0)
                return r;
        gm_reclaim_retry_parked(s->broker, false);
        return 0;
}

size_t gm_broker_return_pieces(gm_session_t *s, const gm_release_range_t *ranges, size_t n, size_t *ret_first_bad) {
        size_t bad = gm_session_local_return_pieces(s, ranges, n, ret_first_bad);
        gm_reclaim_retry_parked(s->broker, false);
        return bad;
}

int gm_broker_claim(gm_session_t *s, uint64_t bytes, uint64_t *ret_claimed) {
        if (s->ended || !s->tenant)
                return -ESHUTDOWN;
        if (bytes > s->broker->backend->capacity)
                return -EINVAL;
        uint64_t old = s->claim_bytes;
        gm_claim_set(s, 0); /* a new claim replaces the old one */
        uint64_t room = gm_piece_room(s);
        uint64_t claimed = bytes < room ? bytes : room;
        gm_claim_set(s, claimed);
        if (claimed < old)
                gm_reclaim_retry_parked(s->broker, false);
        *ret_claimed = claimed;
        return 0;
}

uint64_t gm_broker_room(const gm_session_t *s) {
        return s->ended || !s->tenant ? 0 : gm_piece_room(s);
}

/* ---- views ---- */

static int view_by_name(const void *x, const void *y) {
        return strcmp(((const gm_tenant_view_t *) x)->tenant->name, ((const gm_tenant_view_t *) y)->tenant->name);
}

int gm_broker_tenant_views(const gm_broker_t *b, gm_tenant_view_t **ret_views, size_t *ret_n) {
        size_t n = 0;
        for (const gm_tenant_t *t = b->tenants; t; t = t->next)
                n++;
        gm_tenant_view_t *v = calloc(n ? n : 1, sizeof(*v));
        if (!v)
                return -ENOMEM;
        size_t i = 0;
        for (const gm_tenant_t *t = b->tenants; t; t = t->next)
                v[i++].tenant = t;
        qsort(v, n, sizeof(*v), view_by_name);
        /* Per-tenant figures that live in the sessions: one pass over them, each
         * finding its tenant's row by binary search on the name. */
        for (const gm_session_t *s = b->sessions; s; s = s->next) {
                if (!s->tenant)
                        continue;
                gm_tenant_view_t key = {.tenant = s->tenant};
                gm_tenant_view_t *row = bsearch(&key, v, n, sizeof(*v), view_by_name);
                if (!row)
                        continue;
                row->releasing_bytes += s->releasing_bytes;
                row->unresponsive += s->unresponsive && !s->ended;
                if (s->heap) {
                        uint64_t lf = gm_heap_largest_free(s->heap);
                        if (lf > row->largest_free)
                                row->largest_free = lf;
                }
        }
        *ret_views = v;
        *ret_n = n;
        return 0;
}

/* ---- the integrity checker ---- */

static bool in_queue(const gm_piece_t *head, const gm_piece_t *p) {
        for (; head; head = head->queue)
                if (head == p)
                        return true;
        return false;
}

static size_t queue_len(const gm_piece_t *head) {
        size_t n = 0;
        for (; head; head = head->queue)
                n++;
        return n;
}

/* A local session's granted figures against its granted pieces. */
static void check_grants(gm_checker_t *c, const gm_session_t *s) {
        uint64_t bytes = 0, pieces = 0;
        gm_u64map_t segments = {0};
        bool counted = true;
        for (const gm_piece_t *p = s->pieces; p; p = p->next) {
                if (!p->granted)
                        continue;
                if (!s->local || p->state != GM_PIECE_LIVE || p->in_heap || p->sent)
                        gm_check_violation(c, "session %llu: granted piece of segment %llu is not a local LIVE one",
                                           (unsigned long long) s->id, (unsigned long long) p->segment_id);
                bytes += p->phys.size;
                pieces++;
                if (gm_u64map_put(&segments, p->segment_id, (void *) p) < 0)
                        counted = false;
        }
        const gm_session_grants_t *g = &s->grants;
        if ((uint64_t) g->bytes.current != bytes || g->pieces != pieces)
                gm_check_violation(c, "session %llu: %lld bytes in %llu pieces granted counted, %llu in %llu held",
                                   (unsigned long long) s->id, (long long) g->bytes.current,
                                   (unsigned long long) g->pieces, (unsigned long long) bytes,
                                   (unsigned long long) pieces);
        if (counted && (uint64_t) g->segments.current != segments.len)
                gm_check_violation(c, "session %llu: %lld granted segments counted, %zu held",
                                   (unsigned long long) s->id, (long long) g->segments.current, segments.len);
        if (g->bytes.peak < g->bytes.current || g->segments.peak < g->segments.current ||
            g->pieces > GM_MAX_GRANTED_PIECES)
                gm_check_violation(c, "session %llu: granted figures out of bounds", (unsigned long long) s->id);
        if (s->local && s->heap)
                gm_check_violation(c, "local session %llu has a heap in the daemon", (unsigned long long) s->id);
        const gm_session_sleep_t *sl = &s->sleep;
        if (sl->asleep ? !s->local || sl->bytes > sl->granted_bytes || sl->bytes > s->broker->backend->capacity
                       : sl->bytes || sl->granted_bytes || sl->segments)
                gm_check_violation(c, "session %llu: its sleep record (%llu bytes of %llu) is out of bounds",
                                   (unsigned long long) s->id, (unsigned long long) sl->bytes,
                                   (unsigned long long) sl->granted_bytes);
        gm_u64map_done(&segments);
}

/* Tagged pools: each id's bytes are its charged pieces', ids in use are named. */
static void check_session_tags(gm_checker_t *c, const gm_session_t *s) {
        uint64_t bytes[GM_SESSION_MAX_TAGS + 1] = {0};
        const gm_session_tags_t *t = &s->tags;
        for (const gm_piece_t *p = s->pieces; p; p = p->next) {
                if (p->tag > GM_SESSION_MAX_TAGS || (p->tag && !t->names[p->tag][0])) {
                        gm_check_violation(c, "session %llu: a piece in unnamed pool %u", (unsigned long long) s->id,
                                           p->tag);
                        continue;
                }
                if (gm_piece_charged(p))
                        bytes[p->tag] += p->phys.size;
        }
        if (t->n > GM_SESSION_MAX_TAGS || t->names[0][0])
                gm_check_violation(c, "session %llu: %u tagged pools", (unsigned long long) s->id, t->n);
        for (unsigned k = 0; k <= GM_SESSION_MAX_TAGS; k++)
                if (bytes[k] != t->bytes[k])
                        gm_check_violation(c, "session %llu: pool '%s' counts %llu bytes, its pieces %llu",
                                           (unsigned long long) s->id, t->names[k], (unsigned long long) t->bytes[k],
                                           (unsigned long long) bytes[k]);
}

static void check_session(gm_checker_t *c, const gm_session_t *s, uint64_t *backed, uint64_t *unbacked,
                          uint32_t *stored, uint32_t *recorded) {
        uint64_t in_heap = 0, releasing = 0;
        size_t n_new = 0, n_rel = 0, n_adopting = 0;
        for (const gm_piece_t *p = s->pieces; p; p = p->next) {
                if (p->session != s)
                        gm_check_violation(c, "session %llu: a piece names another owner", (unsigned long long) s->id);
                if (p->next && p->next->prev != p)
                        gm_check_violation(c, "session %llu: piece list broken", (unsigned long long) s->id);
                if (p->phys.fd < 0)
                        *unbacked += p->phys.size;
                else
                        *backed += p->phys.size;
                if (p->store_id)
                        (*stored)++;
                if (p->record_id)
                        (*recorded)++;
                if (p->store_id && p->record_id)
                        gm_check_violation(c, "session %llu: a piece both stored and only recorded",
                                           (unsigned long long) s->id);
                if (p->state == GM_PIECE_ORPHAN)
                        gm_check_violation(c, "session %llu holds an orphan piece", (unsigned long long) s->id);
                if (p->in_heap && p->state != GM_PIECE_LIVE)
                        gm_check_violation(c, "session %llu: a released piece is still in the heap",
                                           (unsigned long long) s->id);
                if (p->unverified && p->state != GM_PIECE_RELEASING)
                        gm_check_violation(c, "session %llu: a piece released unverified is not releasing",
                                           (unsigned long long) s->id);
                if (p->in_heap)
                        in_heap += p->phys.size;
                if (p->state == GM_PIECE_RELEASING)
                        releasing += p->phys.size;
                if (p->state == GM_PIECE_LIVE && !p->sent && !p->granted && !s->ended) {
                        n_new++;
                        if (!in_queue(s->new_head, p))
                                gm_check_violation(c, "session %llu: an unsent piece is not listed for the reply",
                                                   (unsigned long long) s->id);
                }
                if (p->state == GM_PIECE_TO_RELEASE) {
                        n_rel++;
                        if (!in_queue(s->rel_head, p))
                                gm_check_violation(c, "session %llu: a released piece is not queued",
                                                   (unsigned long long) s->id);
                }
                if (p->state == GM_PIECE_ADOPTING && p->phys.fd >= 0)
                        n_adopting++;
        }
        size_t q = queue_len(s->new_head);
        if (q != n_new)
                gm_check_violation(c, "session %llu: %zu pieces listed for the reply, %zu unsent",
                                   (unsigned long long) s->id, q, n_new);
        q = queue_len(s->rel_head);
        if (q != n_rel)
                gm_check_violation(c, "session %llu: %zu pieces queued for release, %zu released",
                                   (unsigned long long) s->id, q, n_rel);
        q = queue_len(s->adopting);
        if (q != n_adopting)
                gm_check_violation(c, "session %llu: %zu pieces adopting, %zu listed", (unsigned long long) s->id,
                                   n_adopting, q);
        uint64_t rel_bytes = 0, unverified = 0;
        for (const gm_release_t *rel = s->releases; rel; rel = rel->next) {
                uint64_t bytes = 0;
                if (rel->unverified && !rel->held)
                        gm_check_violation(c, "session %llu: release %llu unverified but not held",
                                           (unsigned long long) s->id, (unsigned long long) rel->id);
                for (const gm_piece_t *p = rel->pieces; p; p = p->queue) {
                        bytes += p->phys.size;
                        if (p->unverified != rel->unverified)
                                gm_check_violation(c, "session %llu: release %llu and its piece disagree on unverified",
                                                   (unsigned long long) s->id, (unsigned long long) rel->id);
                        if (p->state != GM_PIECE_RELEASING || p->session != s)
                                gm_check_violation(c, "session %llu: release %llu holds a piece not releasing",
                                                   (unsigned long long) s->id, (unsigned long long) rel->id);
                }
                if (bytes != rel->bytes)
                        gm_check_violation(c, "session %llu: release %llu counts %llu bytes of %llu",
                                           (unsigned long long) s->id, (unsigned long long) rel->id,
                                           (unsigned long long) rel->bytes, (unsigned long long) bytes);
                rel_bytes += bytes;
                if (rel->unverified)
                        unverified += bytes;
        }
        if (unverified != s->release_unverified_bytes)
                gm_check_violation(c, "session %llu: %llu bytes released unverified counted, its releases hold %llu",
                                   (unsigned long long) s->id, (unsigned long long) s->release_unverified_bytes,
                                   (unsigned long long) unverified);
        if (rel_bytes != releasing || s->releasing_bytes != releasing)
                gm_check_violation(c, "session %llu: releasing %llu bytes, its pieces %llu, its releases %llu",
                                   (unsigned long long) s->id, (unsigned long long) s->releasing_bytes,
                                   (unsigned long long) releasing, (unsigned long long) rel_bytes);
        check_grants(c, s);
        uint32_t parked = 0;
        const gm_parked_t *last = NULL;
        for (const gm_parked_t *p = s->parked; p; p = p->next) {
                parked++;
                last = p;
                if (p->rq.is_grant != s->local)
                        gm_check_violation(c, "session %llu: a parked %s in a %s session", (unsigned long long) s->id,
                                           p->rq.is_grant ? "grant" : "allocation", s->local ? "local" : "central");
                if (p->rq.is_grant && p->rq.capturing)
                        gm_check_violation(c, "session %llu: a parked grant marked as made during a capture",
                                           (unsigned long long) s->id);
        }
        if (s->cur_capturing || s->cur_tag)
                gm_check_violation(c, "session %llu: an allocation's capture flag or tag left set between requests",
                                   (unsigned long long) s->id);
        if (s->unresponsive && !s->owing_since_ms)
                gm_check_violation(c, "session %llu: unresponsive while owing nothing", (unsigned long long) s->id);
        if (s->reclaim.id && (s->ended || !s->local))
                gm_check_violation(c, "session %llu: a Reclaim pending in a %s session", (unsigned long long) s->id,
                                   s->ended ? "ended" : "central");
        if (s->return_intent_open && (!s->local || !s->return_intents))
                gm_check_violation(c, "session %llu: a return intent open in a %s session", (unsigned long long) s->id,
                                   s->local ? "local session that never sent one" : "central");
        if (parked != s->n_parked || last != s->parked_tail)
                gm_check_violation(c, "session %llu: %u parked counted, %u queued", (unsigned long long) s->id,
                                   s->n_parked, parked);
        for (size_t i = 0; i < s->n_moves; i++) {
                const gm_piece_t *p = s->moves[i].piece;
                if (p->session != s || p->state != GM_PIECE_LIVE || !p->in_heap || !p->sent)
                        gm_check_violation(
                                c, "session %llu: a pending page move names a piece its heap does not hold mapped",
                                (unsigned long long) s->id);
        }
        for (size_t i = 0; i < s->n_fences; i++) {
                const gm_session_fence_t *f = &s->fences[i];
                if (s->local || f->done > f->sent || f->sent > f->asked)
                        gm_check_violation(
                                c, "session %llu: stream fence %llu reported complete, %llu sent, %llu marked%s",
                                (unsigned long long) s->id, (unsigned long long) f->done, (unsigned long long) f->sent,
                                (unsigned long long) f->asked, s->local ? " in a local session" : "");
        }
        if (s->ended && (s->pieces || s->heap || s->parked || s->releases || s->n_moves || s->n_fences))
                gm_check_violation(c, "session %llu ended but still holds memory or requests",
                                   (unsigned long long) s->id);
        if (s->heap) {
                int hv = gm_heap_check(s->heap);
                if (hv)
                        gm_check_violation(c, "session %llu: heap check found %d violations",
                                           (unsigned long long) s->id, hv);
                int64_t reserved = gm_heap_stats(s->heap)->reserved_bytes[GM_STAT_ALL].current;
                if (reserved < 0 || (uint64_t) reserved != in_heap)
                        gm_check_violation(c, "session %llu: heap reserves %lld bytes, its pieces hold %llu",
                                           (unsigned long long) s->id, (long long) reserved,
                                           (unsigned long long) in_heap);
        } else if (in_heap) {
                gm_check_violation(c, "session %llu: pieces in a heap it does not have", (unsigned long long) s->id);
        }
}

int gm_broker_check(const gm_broker_t *b, char *why, size_t why_len) {
        gm_checker_t c = {.why = why, .why_len = why_len};
        if (why && why_len)
                why[0] = '\0';
        uint64_t backed = 0, unbacked = 0, releasing = 0;
        uint32_t stored = 0, recorded = 0, n_sessions = 0;
        for (const gm_session_t *s = b->sessions; s; s = s->next) {
                n_sessions++;
                if (s->next && s->next->prev != s)
                        gm_check_violation(&c, "session list broken at %llu", (unsigned long long) s->id);
                check_session(&c, s, &backed, &unbacked, &stored, &recorded);
                check_session_tags(&c, s);
                releasing += s->releasing_bytes;
        }
        if (n_sessions != b->n_sessions)
                gm_check_violation(&c, "%u sessions listed, %u counted", n_sessions, b->n_sessions);
        for (const gm_orphan_t *o = b->orphans; o; o = o->next) {
                uint64_t bytes = 0;
                for (const gm_piece_t *p = o->pieces; p; p = p->next) {
                        if (p->state != GM_PIECE_ORPHAN || p->session || p->orphan != o)
                                gm_check_violation(&c, "orphan %.8s holds a piece that is not its orphan", o->token);
                        if (p->tag > GM_SESSION_MAX_TAGS || (p->tag && !o->tags.names[p->tag][0]))
                                gm_check_violation(&c, "orphan %.8s holds a piece in unnamed pool %u", o->token,
                                                   p->tag);
                        bytes += p->phys.size;
                        backed += p->phys.size;
                        if (p->store_id)
                                stored++;
                }
                if (bytes != o->bytes)
                        gm_check_violation(&c, "orphan %.8s counts %llu bytes of %llu", o->token,
                                           (unsigned long long) o->bytes, (unsigned long long) bytes);
        }
        for (const gm_lingering_t *l = b->lingering; l; l = l->next)
                backed += l->phys.size;
        gm_shared_check(b, &c, &backed, &stored);
        if (backed != b->backend->in_use)
                gm_check_violation(&c, "backend in use %llu bytes, pieces with handles %llu",
                                   (unsigned long long) b->backend->in_use, (unsigned long long) backed);
        if (unbacked != b->unbacked_bytes)
                gm_check_violation(&c, "unbacked %llu bytes counted, %llu held", (unsigned long long) b->unbacked_bytes,
                                   (unsigned long long) unbacked);
        if (!b->keep_stored && stored != b->n_stored)
                gm_check_violation(&c, "%u pieces stored, %u counted", stored, b->n_stored);
        if (!b->keep_stored && recorded != b->n_recorded)
                gm_check_violation(&c, "%u pieces recorded in the journal, %u counted", recorded, b->n_recorded);
        if (releasing != b->releasing_bytes)
                gm_check_violation(&c, "releasing %llu bytes counted, sessions %llu",
                                   (unsigned long long) b->releasing_bytes, (unsigned long long) releasing);
        uint32_t n_tenants = 0;
        uint64_t audited_all = 0, claimed_all = 0, charged_all = 0;
        for (const gm_tenant_t *t = b->tenants; t; t = t->next) {
                n_tenants++;
                uint64_t charged = 0, unverified = 0, audited = 0, claimed = 0;
                int64_t reserved = 0;
                uint32_t sessions = 0;
                for (const gm_session_t *s = b->sessions; s; s = s->next) {
                        if (s->tenant != t)
                                continue;
                        if (!s->ended)
                                sessions++;
                        unverified += s->release_unverified_bytes;
                        audited += s->audited_bytes;
                        claimed += s->claim_bytes;
                        if (s->ended && s->claim_bytes)
                                gm_check_violation(&c, "session %llu has ended and still claims %llu bytes",
                                                   (unsigned long long) s->id, (unsigned long long) s->claim_bytes);
                        if (s->audited_bytes > s->audit_released || (s->ended && s->audited_bytes))
                                gm_check_violation(&c, "session %llu: %llu bytes audited, beyond what it gave back",
                                                   (unsigned long long) s->id, (unsigned long long) s->audited_bytes);
                        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                                if (gm_piece_charged(p))
                                        charged += p->phys.size;
                        if (s->heap)
                                reserved += gm_heap_stats(s->heap)->reserved_bytes[GM_STAT_ALL].current;
                }
                for (const gm_lingering_t *l = b->lingering; l; l = l->next)
                        if (l->tenant == t)
                                charged += l->phys.size;
                charged += gm_shared_charged(b, t);
                for (const gm_audited_process_t *a = b->audited_processes; a; a = a->next)
                        if (a->tenant == t) {
                                audited += a->audited_bytes;
                                if (a->audited_bytes > a->held)
                                        gm_check_violation(&c, "pid %d: %llu bytes audited, beyond what it was handed",
                                                           (int) a->pid, (unsigned long long) a->audited_bytes);
                        }
                if (charged != t->charged_bytes)
                        gm_check_violation(
                                &c, "tenant '%s' charged %llu bytes, its sessions' pieces and shared objects %llu",
                                t->name, (unsigned long long) t->charged_bytes, (unsigned long long) charged);
                if (unverified != t->release_unverified_bytes || unverified > charged)
                        gm_check_violation(&c, "tenant '%s' counts %llu bytes released unverified, its sessions %llu",
                                           t->name, (unsigned long long) t->release_unverified_bytes,
                                           (unsigned long long) unverified);
                if (audited != t->audited_bytes)
                        gm_check_violation(&c, "tenant '%s' counts %llu bytes audited, its sessions %llu", t->name,
                                           (unsigned long long) t->audited_bytes, (unsigned long long) audited);
                audited_all += audited;
                if (claimed != t->claimed_bytes)
                        gm_check_violation(&c, "tenant '%s' counts %llu bytes claimed, its sessions %llu", t->name,
                                           (unsigned long long) t->claimed_bytes, (unsigned long long) claimed);
                claimed_all += claimed;
                charged_all += t->charged_bytes;
                if (sessions != t->sessions)
                        gm_check_violation(&c, "tenant '%s' counts %u sessions, %u are live", t->name, t->sessions,
                                           sessions);
                if (reserved != t->stats.reserved_bytes[GM_STAT_ALL].current)
                        gm_check_violation(&c, "tenant '%s' reserves %lld bytes, its heaps %lld", t->name,
                                           (long long) t->stats.reserved_bytes[GM_STAT_ALL].current,
                                           (long long) reserved);
        }
        if (n_tenants != b->n_tenants)
                gm_check_violation(&c, "%u tenants listed, %u counted", n_tenants, b->n_tenants);
        uint32_t n_audited = 0;
        for (const gm_audited_process_t *a = b->audited_processes; a; a = a->next)
                n_audited++;
        if (n_audited != b->n_audited_processes)
                gm_check_violation(&c, "%u ended processes audited, %u counted", n_audited, b->n_audited_processes);
        if (claimed_all != b->claimed_bytes)
                gm_check_violation(&c, "%llu bytes claimed counted, tenants %llu",
                                   (unsigned long long) b->claimed_bytes, (unsigned long long) claimed_all);
        if (claimed_all && claimed_all + charged_all > b->backend->capacity) /* a claim never over-commits */
                gm_check_violation(&c, "%llu bytes claimed and %llu charged exceed the capacity of %llu",
                                   (unsigned long long) claimed_all, (unsigned long long) charged_all,
                                   (unsigned long long) b->backend->capacity);
        if (audited_all != b->audited_bytes)
                gm_check_violation(&c, "%llu bytes audited counted, tenants %llu",
                                   (unsigned long long) b->audited_bytes, (unsigned long long) audited_all);
        return c.violations;
}
