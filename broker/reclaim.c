/* Reclaim across sessions and requests parked while reclaimed memory is on
 * its way: one mechanism for both heap modes. A central session's allocation
 * and a local session's grant wait in the same FIFO per session, are retried
 * whenever memory comes back (ReleaseAck, ReturnPieces, ReclaimAck, a
 * session's end) and refused after park_timeout_ms; a central request
 * waits so for its own cache too, released by its heap's ladder. A
 * session's cache is asked back with a ReleaseRequest (central: its heap
 * here gives cached segments up) or a Reclaim (local: its client's heap
 * chooses what to return). A client that answers neither for
 * unresponsive_timeout_ms is unresponsive: nothing waits for it any more,
 * and refusals name it. Its memory stays charged: its process still maps
 * it. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reclaim.h"
#include "size.h"
#include "text.h"

/* A session whose Reclaim brought nothing back is not asked again for this long. */
#define DRY_MS 1000
/* Unresponsive sessions a refusal names at most. */
#define MAX_NAMED_UNRESPONSIVE 3

/* ---- what sessions hold and owe ---- */

static void client_view(const gm_session_t *s, gm_client_view_t *ret) {
        const gm_broker_t *b = s->broker;
        *ret = (gm_client_view_t){0};
        if (b->ops.client_view)
                b->ops.client_view(b->ops.userdata, s, ret);
}

static uint64_t client_cached(const gm_session_t *s) {
        gm_client_view_t v;
        client_view(s, &v);
        uint64_t granted = (uint64_t) s->grants.bytes.current;
        return granted > v.session_active ? granted - v.session_active : 0;
}

/* Free bytes in the session's cache (its heap's here, or its client's). */
static uint64_t cached_bytes(const gm_session_t *s) {
        if (s->local)
                return client_cached(s);
        if (!s->heap)
                return 0;
        const gm_stats_t *st = gm_heap_stats(s->heap);
        int64_t cached = st->reserved_bytes[GM_STAT_ALL].current - st->active_bytes[GM_STAT_ALL].current;
        return cached > 0 ? (uint64_t) cached : 0;
}

/* Bytes the session holds that others could use: asked back, or cached. */
static uint64_t held_bytes(const gm_session_t *s) {
        return s->releasing_bytes + cached_bytes(s);
}

/* Bytes the session was asked back and may still give (releases not held, a
 * pending Reclaim); nothing from an unresponsive one. */
static uint64_t awaited_bytes(const gm_session_t *s) {
        if (s->unresponsive || s->ended)
                return 0;
        uint64_t bytes = s->reclaim.id ? s->reclaim.bytes : 0;
        for (const gm_release_t *rel = s->releases; rel; rel = rel->next)
                if (!rel->held)
                        bytes += rel->bytes;
        return bytes;
}

/* ---- asking sessions for their caches ---- */

static uint64_t ask_reclaim(gm_session_t *s) {
        gm_broker_t *b = s->broker;
        if (!s->local || s->ended || s->reclaim.id || s->unresponsive || gm_now_ms() < s->reclaim.dry_until_ms ||
            !b->ops.send_reclaim)
                return 0;
        uint64_t cached = client_cached(s);
        if (cached == 0)
                return 0;
        uint64_t id = s->reclaim.next_id++;
        if (b->ops.send_reclaim(b->ops.userdata, s, id, cached) < 0) {
                s->reclaim.dry_until_ms = gm_now_ms() + DRY_MS; /* not picked again at once */
                return 0;
        }
        s->reclaim.id = id;
        s->reclaim.bytes = cached;
        s->reclaim.sent_ms = gm_now_ms();
        if (!s->return_intents) /* an older client's: the pieces it returns for this are checked against now */
                gm_process_check_note(s, &s->holder);
        gm_session_owes(s);
        if (b->ops.count_reclaim)
                b->ops.count_reclaim(b->ops.userdata, GM_RECLAIM_REQUESTED);
        return cached;
}

int gm_reclaim_ack(gm_session_t *s, uint64_t reclaim_id, uint64_t released_bytes) {
        gm_broker_t *b = s->broker;
        if (reclaim_id == 0 || reclaim_id >= s->reclaim.next_id)
                return -ENOENT;
        if (reclaim_id != s->reclaim.id) { /* one that timed out: late, but an answer */
                gm_session_answered(s);
                gm_reclaim_retry_parked(b, false);
                return 0;
        }
        s->reclaim.id = 0;
        s->reclaim.bytes = 0;
        if (released_bytes == 0) /* its cache is split under live blocks */
                s->reclaim.dry_until_ms = gm_now_ms() + DRY_MS;
        gm_session_answered(s);
        if (b->ops.count_reclaim)
                b->ops.count_reclaim(b->ops.userdata, GM_RECLAIM_ACKNOWLEDGED);
        gm_reclaim_retry_parked(b, false);
        return 0;
}

/* Asks one session for its cache; the bytes on their way. */
static uint64_t ask(gm_session_t *victim) {
        if (victim->local)
                return ask_reclaim(victim);
        uint64_t got = gm_heap_release_cached(victim->heap);
        gm_session_flush_releases(victim);
        return got;
}

static bool may_ask(const gm_session_t *o, const gm_session_t *requester, const gm_tenant_t *tenant) {
        if (o == requester || o->ended || o->unresponsive || !o->tenant || (tenant && o->tenant != tenant))
                return false;
        if (o->local ? o->reclaim.id != 0 || gm_now_ms() < o->reclaim.dry_until_ms : !o->heap)
                return false;
        return cached_bytes(o) > 0;
}

/* Asks idle sessions (least recently active first) other than `requester` for
 * their caches until `need` bytes are on their way back. Only sessions of
 * `tenant` when it is not NULL (quota pressure). Returns the bytes asked for. */
static uint64_t reclaim_from_others(gm_broker_t *b, gm_session_t *requester, gm_tenant_t *tenant, uint64_t need) {
        uint64_t asked = 0;
        while (asked < need) {
                gm_session_t *victim = NULL;
                for (gm_session_t *o = b->sessions; o; o = o->next)
                        if (may_ask(o, requester, tenant) && (!victim || o->last_active_ms < victim->last_active_ms))
                                victim = o;
                if (!victim)
                        break;
                victim->last_active_ms = gm_now_ms(); /* do not pick it again in this round */
                uint64_t got = ask(victim);
                if (got == 0 && !victim->local)
                        break; /* only split segments with live blocks remain cached */
                asked += got;
        }
        return asked;
}

uint64_t gm_reclaim_trim(gm_broker_t *b, const char *tenant) {
        uint64_t released = 0;
        for (gm_session_t *o = b->sessions; o; o = o->next) {
                if (o->ended || !o->tenant || (tenant && strcmp(o->tenant->name, tenant) != 0))
                        continue;
                released += o->local ? ask_reclaim(o) : gm_session_central_trim(o);
        }
        return released;
}

/* ---- refusals ---- */

void gm_reclaim_device_view(gm_broker_t *b, uint64_t *ret_free, uint64_t *ret_total) {
        uint64_t cap = b->backend->capacity, reserved = gm_piece_reserved(b) + b->audited_bytes;
        uint64_t capacity_free = reserved < cap ? cap - reserved : 0, device_free = 0, device_total = 0;
        if (b->backend->ops->mem_info(b->backend, &device_free, &device_total) < 0)
                device_free = device_total = cap;
        *ret_total = device_total < cap ? device_total : cap;
        *ret_free = device_free < capacity_free ? device_free : capacity_free;
}

/* Names the unresponsive sessions (of `tenant`, NULL: all) whose memory
 * could have helped. */
static void name_unresponsive(gm_broker_t *b, const gm_session_t *s, const gm_tenant_t *tenant, char *buf, size_t len) {
        unsigned named = 0, more = 0;
        uint64_t now = gm_now_ms();
        for (const gm_session_t *o = b->sessions; o; o = o->next) {
                if (o == s || !o->unresponsive || o->ended || (tenant && o->tenant != tenant))
                        continue;
                if (named == MAX_NAMED_UNRESPONSIVE) {
                        more++;
                        continue;
                }
                char held[32];
                gm_text_append(buf, len,
                               "%sunresponsive session %" PRIu64 " (pid %d, tenant '%s') holds %s and has answered no "
                               "release request for %" PRIu64 " ms (stopped or hung?)",
                               named ? "; " : " gpumemd: ", o->id, (int) o->pid, o->tenant->name,
                               gm_format_size(held_bytes(o), held, sizeof(held)), now - o->owing_since_ms);
                named++;
        }
        if (more)
                gm_text_append(buf, len, "; %u more unresponsive sessions", more);
        if (named)
                gm_text_append(buf, len,
                               ". That memory stays charged while mapped: resume (kill -CONT) or end the process.");
}

/* Says how much of the session's own cache was released (by its heap's
 * ladder for a miss, or a trim) and still waits for its client's ReleaseAck
 * (the client must unmap it first): charged until then, whether the client
 * is unresponsive or not. */
static void name_own_releases(const gm_session_t *s, char *buf, size_t len) {
        uint64_t bytes = 0;
        for (const gm_release_t *rel = s->releases; rel; rel = rel->next)
                if (!rel->held)
                        bytes += rel->bytes;
        if (!bytes)
                return;
        char held[32];
        gm_text_append(buf, len,
                       " gpumemd: %s of this session's own cache was released, but its client has not "
                       "acknowledged unmapping it (ReleaseAck) for %" PRIu64
                       " ms: it stays charged until then (is the library's service thread running?).",
                       gm_format_size(bytes, held, sizeof(held)),
                       s->owing_since_ms ? gm_now_ms() - s->owing_since_ms : 0);
}

/* Says how much of the memory that could have helped (of `tenant`, NULL:
 * all) was released on its clients' word only and stays charged. */
static void name_unverified(const gm_broker_t *b, const gm_tenant_t *tenant, char *buf, size_t len) {
        uint64_t bytes = 0;
        unsigned tenants = 0;
        for (const gm_tenant_t *t = b->tenants; t; t = t->next)
                if ((!tenant || t == tenant) && t->release_unverified_bytes) {
                        bytes += t->release_unverified_bytes;
                        tenants++;
                }
        if (!bytes)
                return;
        char held[32];
        gm_text_append(buf, len,
                       " gpumemd: %s of it is memory %s released that cannot be checked as unmapped (no per-process "
                       "figure from the driver shows it): it stays charged until the releasing sessions end.",
                       gm_format_size(bytes, held, sizeof(held)),
                       tenant         ? "this tenant's clients"
                       : tenants == 1 ? "one tenant's clients"
                                      : "clients");
}

/* Names the tenant's biggest tagged pools (at most three, by the bytes its
 * sessions' pieces charge to each name), when its sessions named any. */
static void name_biggest_pools(const gm_broker_t *b, const gm_tenant_t *tenant, char *buf, size_t len) {
        struct {
                const char *name;
                uint64_t bytes;
        } pools[GM_SESSION_MAX_TAGS + 1] = {{0}};
        size_t n = 0;
        for (const gm_session_t *s = b->sessions; s; s = s->next)
                for (unsigned id = 0; s->tenant == tenant && id <= s->tags.n; id++) {
                        const char *name = id ? s->tags.names[id] : "";
                        size_t k = 0;
                        while (k < n && strcmp(pools[k].name, name) != 0)
                                k++;
                        if (k == n && n == GM_SESSION_MAX_TAGS + 1)
                                continue; /* beyond the names counted: left out */
                        if (k == n)
                                pools[n++].name = name;
                        pools[k].bytes += s->tags.bytes[id];
                }
        if (n < 2)
                return; /* the default pool alone: nothing to tell apart */
        gm_text_append(buf, len, " gpumemd: its biggest pools:");
        for (int shown = 0; shown < 3; shown++) {
                size_t best = n;
                for (size_t k = 0; k < n; k++)
                        if (pools[k].bytes && (best == n || pools[k].bytes > pools[best].bytes))
                                best = k;
                if (best == n)
                        break;
                char size[32];
                gm_text_append(buf, len, "%s '%s' %s", shown ? "," : "",
                               pools[best].name[0] ? pools[best].name : "default",
                               gm_format_size(pools[best].bytes, size, sizeof(size)));
                pools[best].bytes = 0;
        }
        gm_text_append(buf, len, ".");
}

/* Says how much of the tenant's (NULL: the device's) memory is memory its
 * clients gave back and map again (the audit, process_check.c). */
static void name_audited(const gm_broker_t *b, const gm_tenant_t *tenant, char *buf, size_t len) {
        uint64_t bytes = tenant ? tenant->audited_bytes : b->audited_bytes;
        if (!bytes)
                return;
        char held[32];
        gm_text_append(buf, len,
                       " gpumemd: %s more is device memory %s gave back and map again (their processes' driver "
                       "figures, audited): it counts as charged until they unmap it.",
                       gm_format_size(bytes, held, sizeof(held)), tenant ? "this tenant's clients" : "clients");
}

/* Says how much of the tenant's (NULL: the device's) free memory other
 * sessions than s have claimed (gpumem_claim()): set aside for them. */
static void name_claimed(const gm_session_t *s, const gm_tenant_t *tenant, char *buf, size_t len) {
        uint64_t bytes = tenant ? gm_claim_others_of_tenant(s) : gm_claim_others_of_device(s);
        if (!bytes)
                return;
        char held[32];
        gm_text_append(buf, len,
                       " gpumemd: %s of what is free is claimed by %s (gpumem_claim): set aside for them until "
                       "they use it, claim less, or end.",
                       gm_format_size(bytes, held, sizeof(held)),
                       tenant ? "other sessions of this tenant" : "other sessions");
}

/* Explains why `rq` was refused with `err` (PyTorch's text plus the
 * diagnosis) into buf; returns the reason. */
static gm_oom_reason_t describe_refusal(gm_session_t *s, const gm_request_t *rq, int err, char *buf, size_t len) {
        gm_broker_t *b = s->broker;
        gm_client_view_t v;
        client_view(s, &v);
        uint64_t device_free, device_total;
        gm_reclaim_device_view(b, &device_free, &device_total);
        /* Releases held unverified are not coming back while their sessions last. */
        uint64_t others_cached = b->releasing_bytes - s->releasing_bytes, others_unverified = 0;
        for (gm_session_t *o = b->sessions; o; o = o->next)
                if (o != s && !o->ended) {
                        others_cached += cached_bytes(o);
                        others_unverified += o->release_unverified_bytes;
                }
        others_cached -= others_unverified;
        double fraction = b->alloc_config.per_process_memory_fraction;
        gm_oom_report_t r = {
                .device = b->backend->device,
                .device_total = device_total,
                .device_free = device_free,
                .session_cached = cached_bytes(s),
                .tenant = s->tenant->name,
                .tenant_quota = s->tenant->quota,
                .tenant_reserved = s->tenant->charged_bytes,
                .tenant_live = (uint64_t) s->tenant->stats.active_bytes[GM_STAT_ALL].current + v.tenant_active,
                .broker_reserved = gm_piece_reserved(b),
                .broker_live = (uint64_t) b->device_stats.active_bytes[GM_STAT_ALL].current + v.device_active,
                .others_cached = others_cached,
                .caller_admin = s->admin,
        };
        if (rq->is_grant) {
                r.alloc_size = gm_session_local_grant_bytes(&rq->grant);
                r.block_size = rq->grant.block_size;
                r.largest_free = rq->grant.largest_free;
                r.session_allocated = v.session_allocated;
                r.session_reserved = (uint64_t) s->grants.bytes.current;
        } else {
                r.allowed = fraction > 0 && fraction < 1 ? (uint64_t) (fraction * (double) b->backend->capacity) : 0;
                if (s->heap) {
                        const gm_stats_t *st = gm_heap_stats(s->heap);
                        r.session_allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current;
                        r.session_reserved = (uint64_t) st->reserved_bytes[GM_STAT_ALL].current;
                        r.largest_free = gm_heap_largest_free(s->heap);
                        gm_heap_sizes_for(s->heap, rq->size, &r.block_size, &r.alloc_size);
                }
        }
        r.reason = err == -EDQUOT ? GM_OOM_QUOTA : gm_oom_classify(&r);
        uint64_t tag_charged;
        const gm_tag_quota_t *tq = err == -EDQUOT
                                           ? gm_piece_tag_quota_over(s, rq->is_grant ? rq->grant.piece.tag : rq->tag,
                                                                     r.alloc_size ? r.alloc_size : 1, &tag_charged)
                                           : NULL;
        if (tq) { /* the tagged pool's own limit, not the tenant's */
                char q[32], c[32], a[32];
                snprintf(buf, len,
                         "gpumemd: out of memory %s %s in pool '%s': tenant '%s' has a tag_quota of %s for it, "
                         "%s of which its sessions hold",
                         rq->is_grant ? "granting" : "allocating", gm_format_size(r.alloc_size, a, sizeof(a)), tq->tag,
                         s->tenant->name, gm_format_size(tq->bytes, q, sizeof(q)),
                         gm_format_size(tag_charged, c, sizeof(c)));
        } else if (gm_oom_format(&r, buf, len) < 0)
                snprintf(buf, len, "gpumemd: out of memory %s %" PRIu64 " bytes",
                         rq->is_grant ? "granting" : "allocating",
                         rq->is_grant ? gm_session_local_grant_bytes(&rq->grant) : rq->size);
        name_own_releases(s, buf, len);
        name_unresponsive(b, s, err == -EDQUOT ? s->tenant : NULL, buf, len);
        name_unverified(b, err == -EDQUOT ? s->tenant : NULL, buf, len);
        name_audited(b, err == -EDQUOT ? s->tenant : NULL, buf, len);
        name_claimed(s, err == -EDQUOT ? s->tenant : NULL, buf, len);
        if (err == -EDQUOT)
                name_biggest_pools(b, s->tenant, buf, len);
        return r.reason;
}

/* ---- parking ---- */

/* How long `rq` may stay parked: a wake's own wait, else park_timeout_ms. */
static uint64_t park_limit_ms(const gm_broker_t *b, const gm_request_t *rq) {
        return rq->is_grant && rq->grant.wait_for_memory && rq->grant.wait_ms ? rq->grant.wait_ms
                                                                              : b->limits.park_timeout_ms;
}

/* Whether memory asked back from sessions (of `tenant`, NULL: any) other
 * than `except` (NULL: none) is still expected. */
static bool help_coming(const gm_broker_t *b, const gm_tenant_t *tenant, const gm_session_t *except) {
        for (const gm_session_t *o = b->sessions; o; o = o->next)
                if (o != except && (!tenant || o->tenant == tenant) && awaited_bytes(o) > 0)
                        return true;
        return false;
}

static void out_of_memory(gm_session_t *s, const gm_request_t *rq, int err, bool may_park, gm_outcome_t *out) {
        gm_broker_t *b = s->broker;
        gm_tenant_t *scope = err == -EDQUOT ? s->tenant : NULL;
        /* The session's own cache, which its heap's ladder just released for
         * this miss, is asked back now: the request waits for its client's
         * ReleaseAck as for another session's give-back (help_coming()). */
        gm_session_flush_releases(s);
        /* Memory reclaimed from other sessions arrives once their clients answer. */
        uint64_t need = rq->is_grant ? gm_session_local_grant_bytes(&rq->grant) : rq->size;
        uint64_t asked = reclaim_from_others(b, s, scope, need);
        bool waits = asked > 0 || help_coming(b, scope, NULL) || (rq->is_grant && rq->grant.wait_for_memory);
        if (may_park && waits && s->n_parked < b->limits.max_parked_per_session) {
                out->kind = GM_OUTCOME_PARK;
                return;
        }
        out->kind = GM_OUTCOME_REFUSE;
        out->error = err;
        gm_oom_reason_t reason = describe_refusal(s, rq, err, out->message, sizeof(out->message));
        out->oom = !(rq->is_grant && rq->grant.will_retry); /* one the application sees */
        out->oom_reason = reason;
        out->oom_size = !rq->is_grant          ? rq->size
                        : rq->grant.block_size ? rq->grant.block_size
                                               : gm_session_local_grant_bytes(&rq->grant);
        if (b->ops.count_refusal && out->oom)
                b->ops.count_refusal(b->ops.userdata, s->tenant->name, reason);
}

void gm_reclaim_park(gm_session_t *s, uint64_t request_id, const gm_request_t *rq, gm_outcome_t *out) {
        gm_parked_t *p = calloc(1, sizeof(*p));
        if (!p) {
                gm_outcome_refuse(out, -ENOMEM, "gpumemd: out of memory");
                return;
        }
        p->request_id = request_id;
        p->seq = ++s->broker->next_park_seq;
        p->rq = *rq;
        p->parked_at_ms = gm_now_ms();
        gm_session_parked_push(s, p, false);
        /* num_reclaim_waits counts waits for other sessions' memory: one for
         * the session's own cache alone is its own ladder, as in a local heap. */
        if (help_coming(s->broker, NULL, s))
                gm_session_central_count_reclaim_wait(s);
        out->kind = GM_OUTCOME_PARK;
}

void gm_reclaim_try(gm_session_t *s, const gm_request_t *rq, bool may_park, gm_outcome_t *out) {
        int r = rq->is_grant ? gm_session_local_try_grant(s, &rq->grant, out)
                             : gm_session_central_try_alloc(s, rq->size, rq->stream, rq->tag, rq->capturing, out);
        if (r < 0)
                out_of_memory(s, rq, r, may_park, out);
}

/* The session whose first parked request is the oldest (in park order),
 * among those not left waiting in retry pass `pass`. */
static gm_session_t *oldest_parked(gm_broker_t *b, uint64_t pass, uint64_t now, bool timed_out_only) {
        gm_session_t *oldest = NULL;
        for (gm_session_t *s = b->sessions; s; s = s->next) {
                if (!s->parked || s->ended || s->retry_pass == pass)
                        continue;
                if (timed_out_only && now - s->parked->parked_at_ms < park_limit_ms(b, &s->parked->rq))
                        continue;
                if (!oldest || s->parked->seq < oldest->parked->seq)
                        oldest = s;
        }
        return oldest;
}

void gm_reclaim_retry_parked(gm_broker_t *b, bool timed_out_only) {
        uint64_t now = gm_now_ms(), pass = ++b->retry_pass;
        /* Oldest first across sessions, in order within one: a session whose
         * first request still waits keeps the rest waiting behind it. */
        for (gm_session_t *s; (s = oldest_parked(b, pass, now, timed_out_only));) {
                gm_parked_t *p = gm_session_parked_pop(s);
                bool expired = now - p->parked_at_ms >= park_limit_ms(b, &p->rq);
                gm_outcome_t out;
                gm_outcome_init(&out);
                gm_reclaim_try(s, &p->rq, !expired, &out);
                if (out.kind == GM_OUTCOME_PARK) {
                        /* Still waiting: back to the head, keep its age. */
                        gm_session_parked_push(s, p, true);
                        s->retry_pass = pass;
                        gm_session_flush_releases(s);
                        continue;
                }
                if (b->ops.parked_done)
                        b->ops.parked_done(b->ops.userdata, now - p->parked_at_ms);
                if (b->ops.alloc_done)
                        b->ops.alloc_done(b->ops.userdata, s, p->request_id, &out);
                else if (out.kind == GM_OUTCOME_REPLY)
                        gm_session_central_pieces_sent(s);
                free(p);
                gm_session_flush_releases(s);
        }
}

/* ---- the clock ---- */

/* Marks `s` unresponsive once it has owed an answer for the limit; true when
 * it just was. */
static bool check_unresponsive(gm_broker_t *b, gm_session_t *s, uint64_t now_ms) {
        uint32_t limit = b->limits.unresponsive_timeout_ms;
        if (!limit || s->unresponsive || s->ended || !s->owing_since_ms || now_ms - s->owing_since_ms < limit)
                return false;
        s->unresponsive = true;
        gm_host_log(b, LOG_WARNING,
                    "session %" PRIu64 " (pid %d, tenant '%s') has answered no release request for %" PRIu64
                    " ms: unresponsive (stopped or hung?). Nothing waits for it any more; its %" PRIu64
                    " bytes stay charged while its process maps them",
                    s->id, (int) s->pid, s->tenant ? s->tenant->name : "-", now_ms - s->owing_since_ms, held_bytes(s));
        if (b->ops.unresponsive)
                b->ops.unresponsive(b->ops.userdata, s, true);
        return true;
}

void gm_reclaim_tick(gm_broker_t *b, uint64_t now_ms) {
        bool retry_all = b->memory_freed;
        b->memory_freed = false;
        for (gm_session_t *s = b->sessions; s; s = s->next) {
                if (s->reclaim.id && !s->ended && !s->unresponsive &&
                    now_ms - s->reclaim.sent_ms >= b->limits.release_timeout_ms) {
                        if (b->ops.count_reclaim)
                                b->ops.count_reclaim(b->ops.userdata, GM_RECLAIM_TIMED_OUT);
                        gm_host_log(b, LOG_WARNING,
                                    "session %" PRIu64 " (pid %d) has not answered reclaim %" PRIu64 " in %u ms", s->id,
                                    (int) s->pid, s->reclaim.id, b->limits.release_timeout_ms);
                        s->reclaim.id = 0; /* it may be asked again; it still owes the answer */
                        s->reclaim.bytes = 0;
                        retry_all = true;
                }
                if (check_unresponsive(b, s, now_ms))
                        retry_all = true; /* what waits for it is decided now */
        }
        gm_reclaim_retry_parked(b, !retry_all);
}
