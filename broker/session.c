/* Sessions, both heap modes: lifetime, the releases a client owes
 * acknowledgements for, what it owes an answer to, and its FIFO of parked
 * requests (parked and retried by reclaim.c). Physical memory goes back to
 * the backend only after the client acknowledged unmapping it (or is gone). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "holder.h"
#include "size.h"
#include "text.h"

/* The session ends: its granted figures go to zero (its pieces are destroyed). */
static void drop_grants(gm_session_t *s) {
        gm_stat_update(&s->grants.bytes, -s->grants.bytes.current);
        gm_stat_update(&s->grants.segments, -s->grants.segments.current);
        s->grants.returned += s->grants.pieces;
        s->grants.pieces = 0;
}

/* ---- lifetime ---- */

int gm_session_new(gm_broker_t *b, const gm_session_params_t *params, gm_session_t **ret_session) {
        gm_session_t *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->broker = b;
        s->id = ++b->next_session_id;
        s->pid = params->pid;
        s->uid = params->uid;
        snprintf(s->unit, sizeof(s->unit), "%s", params->unit ? params->unit : "");
        s->admin = params->admin;
        s->userdata = params->userdata;
        s->next_release_id = 1;
        s->reclaim.next_id = 1;
        s->last_active_ms = gm_now_ms();
        s->next = b->sessions;
        if (b->sessions)
                b->sessions->prev = s;
        b->sessions = s;
        b->n_sessions++;
        *ret_session = s;
        return 0;
}

void gm_session_describe(gm_session_t *s, const char *name, bool admin_conn) {
        gm_text_escape(name, s->name, sizeof(s->name)); /* shown in logs, clients lists and snapshots */
        s->admin_conn = admin_conn;
}

void gm_session_touch(gm_session_t *s, uint64_t now_ms) {
        s->last_active_ms = now_ms;
}

int gm_session_start(gm_session_t *s, const char *tenant_name, const char *resume_token) {
        gm_broker_t *b = s->broker;
        if (s->tenant || s->ended)
                return -EALREADY;
        gm_tenant_t *t = gm_tenant_get(b, tenant_name);
        if (!t)
                return -ENOMEM;
        if (resume_token && resume_token[0]) {
                /* The tenant first: claimed pieces are charged to it as they are reported. */
                s->tenant = t;
                int r = gm_orphan_claim(s, resume_token);
                if (r < 0) {
                        s->tenant = NULL;
                        return r;
                }
        } else {
                gm_ledger_token_new(s->token);
                s->tenant = t;
                gm_ledger_session_started(b, s);
        }
        t->sessions++;
        return 0;
}

static void release_complete(gm_session_t *s, gm_release_t *rel) {
        gm_broker_t *b = s->broker;
        gm_assert(s->releasing_bytes >= rel->bytes && b->releasing_bytes >= rel->bytes);
        s->releasing_bytes -= rel->bytes;
        b->releasing_bytes -= rel->bytes;
        if (rel->unverified) {
                gm_assert(s->release_unverified_bytes >= rel->bytes &&
                          s->tenant->release_unverified_bytes >= rel->bytes);
                s->release_unverified_bytes -= rel->bytes;
                s->tenant->release_unverified_bytes -= rel->bytes;
        }
        while (rel->pieces) {
                gm_piece_t *p = rel->pieces;
                rel->pieces = p->queue;
                p->queue = NULL;
                gm_piece_destroy(b, p);
        }
        free(rel);
}

void gm_session_end(gm_session_t *s) {
        if (!s || s->ended)
                return;
        gm_broker_t *b = s->broker;
        gm_ledger_session_ended(b, s);
        if (s->pieces || s->shared_opens)
                b->memory_freed = true;
        s->ended = true;
        gm_process_check_end(s);                  /* while its pieces are listed: what its process may still map */
        gm_shared_session_ended(s);               /* its opens go; a shared object may go with its last */
        s->heap = gm_heap_destroy(s->heap);       /* every piece at once: ended is set */
        s->history = gm_history_free(s->history); /* nobody may read an ended session's history */
        free(s->moves);
        s->moves = NULL;
        s->n_moves = s->cap_moves = 0;
        free(s->fences);
        s->fences = NULL;
        s->n_fences = 0;
        s->new_head = s->new_tail = NULL; /* the heap's pieces, destroyed with it */
        while (s->rel_head) {
                gm_piece_t *p = s->rel_head;
                s->rel_head = p->queue;
                p->queue = NULL;
                gm_piece_destroy(b, p);
        }
        s->rel_tail = NULL;
        s->adopting = NULL; /* among s->pieces, destroyed below */
        while (s->releases) {
                gm_release_t *rel = s->releases;
                s->releases = rel->next;
                release_complete(s, rel);
        }
        if (s->local)
                drop_grants(s);
        while (s->pieces) /* granted without a heap, or a re-attach that did not finish */
                gm_piece_destroy(b, s->pieces);
        gm_session_unpark_all(s);
        if (s->tenant) {
                gm_claim_set(s, 0); /* its claim lapses */
                s->tenant->sessions--;
        }
}

void gm_session_free(gm_session_t *s) {
        if (!s)
                return;
        gm_broker_t *b = s->broker;
        gm_session_end(s);
        gm_assert(!s->pieces && !s->releases && !s->parked); /* an ended session holds nothing */
        if (s->prev)
                s->prev->next = s->next;
        else
                b->sessions = s->next;
        if (s->next)
                s->next->prev = s->prev;
        b->n_sessions--;
        free(s->owned);
        free(s);
}

static bool owes_answer(const gm_session_t *s) {
        if (s->reclaim.id)
                return true;
        for (const gm_release_t *rel = s->releases; rel; rel = rel->next)
                if (!rel->held)
                        return true;
        return false;
}

void gm_session_owes(gm_session_t *s) {
        if (!s->owing_since_ms)
                s->owing_since_ms = gm_now_ms();
}

void gm_session_answered(gm_session_t *s) {
        /* It is alive: what it still owes is counted from now. */
        s->owing_since_ms = owes_answer(s) ? gm_now_ms() : 0;
        if (!s->unresponsive)
                return;
        s->unresponsive = false;
        gm_broker_t *b = s->broker;
        gm_host_log(b, LOG_NOTICE, "session %" PRIu64 " (pid %d) answers again: no longer unresponsive", s->id,
                    (int) s->pid);
        if (b->ops.unresponsive)
                b->ops.unresponsive(b->ops.userdata, s, false);
}

/* ---- releases: ask the client, wait for the ack ---- */

static int release_send(gm_session_t *s, gm_release_t *rel) {
        gm_broker_t *b = s->broker;
        size_t n = 0;
        for (gm_piece_t *p = rel->pieces; p; p = p->queue)
                n++;
        gm_release_range_t *ranges = calloc(n ? n : 1, sizeof(*ranges));
        if (!ranges)
                return -ENOMEM;
        size_t i = 0;
        for (gm_piece_t *p = rel->pieces; p; p = p->queue, i++)
                ranges[i] = (gm_release_range_t){
                        .segment_id = p->segment_id,
                        .offset = p->offset,
                        .length = p->phys.size,
                        .whole_segment = p->whole_segment,
                };
        rel->sent_at_ms = gm_now_ms();
        if (rel->attempts == 0)
                gm_process_check_note(s, &rel->holder);
        rel->attempts++;
        gm_session_owes(s);
        int r = b->ops.send_release ? b->ops.send_release(b->ops.userdata, s, rel->id, ranges, n) : 0;
        free(ranges);
        return r;
}

void gm_session_flush_releases(gm_session_t *s) {
        gm_broker_t *b = s->broker;
        uint32_t per_release = b->limits.max_ranges_per_release ? b->limits.max_ranges_per_release : 512;
        while (s->rel_head && !s->ended) {
                gm_release_t *rel = calloc(1, sizeof(*rel));
                if (!rel)
                        return; /* stays queued; retried at the next flush */
                rel->id = s->next_release_id++;
                /* Oldest first: a segment's whole_segment piece, released after
                 * its other pieces, goes in the same or a later batch. */
                gm_piece_t **tail = &rel->pieces;
                for (uint32_t i = 0; i < per_release && s->rel_head; i++) {
                        gm_piece_t *p = s->rel_head;
                        s->rel_head = p->queue;
                        p->queue = NULL;
                        p->state = GM_PIECE_RELEASING;
                        *tail = p;
                        tail = &p->queue;
                        rel->bytes += p->phys.size;
                }
                if (!s->rel_head)
                        s->rel_tail = NULL;
                rel->next = s->releases;
                s->releases = rel;
                s->releasing_bytes += rel->bytes;
                b->releasing_bytes += rel->bytes;
                if (b->ops.count_reclaim)
                        b->ops.count_reclaim(b->ops.userdata, GM_RECLAIM_REQUESTED);
                if (release_send(s, rel) < 0)
                        return; /* the session is ended (everything released) or the next tick retries */
        }
}

void gm_session_tick(gm_session_t *s, uint64_t now_ms) {
        gm_broker_t *b = s->broker;
        for (gm_release_t *rel = s->releases; rel && !s->ended; rel = rel->next) {
                if (rel->held || s->unresponsive || now_ms - rel->sent_at_ms < b->limits.release_timeout_ms)
                        continue; /* an unresponsive client is asked again once it answers something */
                if (rel->attempts == 1) {
                        if (b->ops.count_reclaim)
                                b->ops.count_reclaim(b->ops.userdata, GM_RECLAIM_TIMED_OUT);
                        gm_host_log(b, LOG_WARNING,
                                    "session %" PRIu64 " (pid %d) has not acknowledged release %" PRIu64 " (%" PRIu64
                                    " bytes) in %u ms; asking again, the bytes stay charged",
                                    s->id, (int) s->pid, rel->id, rel->bytes, b->limits.release_timeout_ms);
                }
                if (release_send(s, rel) < 0)
                        return;
        }
}

static bool range_named(const gm_piece_t *p, const gm_release_range_t *ranges, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (ranges[i].segment_id == p->segment_id && ranges[i].offset == p->offset)
                        return true;
        return false;
}

/* Moves the pieces of `rel` named in `not_released` to `kept`, a held release
 * listed on the session: they stay charged until the session ends, when the
 * client's mappings are gone for sure. */
static void hold_not_released(gm_session_t *s, gm_release_t *rel, gm_release_t *kept,
                              const gm_release_range_t *not_released, size_t n) {
        gm_piece_t **kept_tail = &kept->pieces;
        for (gm_piece_t **pp = &rel->pieces; *pp;) {
                gm_piece_t *p = *pp;
                if (!range_named(p, not_released, n)) {
                        pp = &p->queue;
                        continue;
                }
                *pp = p->queue;
                p->queue = NULL;
                *kept_tail = p;
                kept_tail = &p->queue;
                kept->bytes += p->phys.size;
                rel->bytes -= p->phys.size;
        }
        kept->id = rel->id;
        kept->held = true;
        kept->next = s->releases;
        s->releases = kept;
        gm_host_log(s->broker, LOG_WARNING,
                    "session %" PRIu64 " (pid %d) could not unmap %zu of the ranges of release %" PRIu64
                    ": their %" PRIu64 " bytes stay charged until the session ends",
                    s->id, (int) s->pid, n, rel->id, kept->bytes);
}

int gm_session_release_acked(gm_session_t *s, uint64_t release_id, const gm_release_range_t *not_released,
                             size_t n_not_released) {
        gm_broker_t *b = s->broker;
        for (gm_release_t **rp = &s->releases; *rp; rp = &(*rp)->next) {
                gm_release_t *rel = *rp;
                if (rel->id != release_id || rel->held)
                        continue;
                /* The word of a client that still maps the memory is not taken:
                 * it all stays charged (held), and the caller ends the session. */
                for (const gm_piece_t *p = rel->pieces; p; p = p->queue)
                        if (!range_named(p, not_released, n_not_released) && gm_piece_still_mapped(b, p)) {
                                rel->held = true;
                                s->lied = true;
                                gm_host_log(b, LOG_WARNING,
                                            "session %" PRIu64 " (pid %d) acknowledged release %" PRIu64
                                            " but still maps segment %" PRIu64 ": its %" PRIu64 " bytes stay charged",
                                            s->id, (int) s->pid, rel->id, p->segment_id, rel->bytes);
                                return -EBUSY;
                        }
                uint64_t acknowledged = 0;
                for (const gm_piece_t *p = rel->pieces; p; p = p->queue)
                        if (!range_named(p, not_released, n_not_released))
                                acknowledged += p->phys.size;
                /* Where the backend answered per piece above, it is gone. */
                gm_release_verdict_t verdict = b->backend->ops->mapped
                                                       ? GM_RELEASE_GONE
                                                       : gm_process_check_verdict(s, &rel->holder, acknowledged);
                if (verdict == GM_RELEASE_KEPT) {
                        rel->held = true;
                        s->lied = true;
                        gm_host_log(b, LOG_WARNING,
                                    "session %" PRIu64 " (pid %d) acknowledged release %" PRIu64
                                    " but the driver still counts its %" PRIu64
                                    " bytes in that process: they stay charged",
                                    s->id, (int) s->pid, rel->id, acknowledged);
                        return -EBUSY;
                }
                gm_release_t *kept = NULL;
                if (n_not_released > 0 && !(kept = calloc(1, sizeof(*kept)))) {
                        rel->held = true; /* cannot split it: all of it stays charged */
                        return 0;
                }
                *rp = rel->next;
                gm_session_answered(s);
                if (b->ops.count_reclaim)
                        b->ops.count_reclaim(b->ops.userdata, GM_RECLAIM_ACKNOWLEDGED);
                if (kept)
                        hold_not_released(s, rel, kept, not_released, n_not_released);
                if (verdict == GM_RELEASE_UNVERIFIED)
                        gm_session_hold_unverified(s, rel); /* charged until the session ends */
                else
                        release_complete(s, rel);
                return 1;
        }
        return -ENOENT;
}

void gm_session_hold_unverified(gm_session_t *s, gm_release_t *rel) {
        gm_broker_t *b = s->broker;
        if (s->release_unverified_bytes == 0) /* once per session: on some hosts it is every release */
                gm_host_log(b, LOG_NOTICE,
                            "session %" PRIu64 " (pid %d, tenant '%s') released memory that cannot be checked "
                            "as unmapped (no per-process figure from the driver, or one that did not drop by "
                            "it): it stays charged until the session ends",
                            s->id, (int) s->pid, s->tenant->name);
        rel->held = true;
        rel->unverified = true;
        for (gm_piece_t *p = rel->pieces; p; p = p->queue)
                p->unverified = true;
        rel->next = s->releases;
        s->releases = rel;
        s->release_unverified_bytes += rel->bytes;
        s->tenant->release_unverified_bytes += rel->bytes;
}

/* Appends (or, with `front`, puts back at the head) a parked request. */
void gm_session_parked_push(gm_session_t *s, gm_parked_t *p, bool front) {
        if (front) {
                p->next = s->parked;
                s->parked = p;
                if (!s->parked_tail)
                        s->parked_tail = p;
        } else {
                p->next = NULL;
                if (s->parked_tail)
                        s->parked_tail->next = p;
                else
                        s->parked = p;
                s->parked_tail = p;
        }
        s->n_parked++;
}

gm_parked_t *gm_session_parked_pop(gm_session_t *s) {
        gm_assert(s->parked && s->n_parked > 0);
        gm_parked_t *p = s->parked;
        s->parked = p->next;
        if (!s->parked)
                s->parked_tail = NULL;
        p->next = NULL;
        s->n_parked--;
        return p;
}

void gm_session_unpark_all(gm_session_t *s) {
        while (s->parked)
                free(gm_session_parked_pop(s));
        s->reclaim.id = 0;
        s->reclaim.bytes = 0;
}

/* ---- what the daemon reads ---- */

void gm_session_view(const gm_session_t *s, gm_session_view_t *ret) {
        *ret = (gm_session_view_t){
                .id = s->id,
                .pid = s->pid,
                .uid = s->uid,
                .name = s->name,
                .unit = s->unit,
                .token = s->token,
                .admin = s->admin,
                .admin_conn = s->admin_conn,
                .tenant = s->tenant,
                .local = s->local,
                .ended = s->ended,
                .reattaching = s->reattaching,
                .lied = s->lied,
                .unresponsive = s->unresponsive,
                .owing_since_ms = s->owing_since_ms,
                .releasing_bytes = s->releasing_bytes,
                .reclaim_bytes = s->reclaim.id ? s->reclaim.bytes : 0,
                .release_unverified_bytes = s->release_unverified_bytes,
                .claim_bytes = s->claim_bytes,
                .heap = s->heap,
                .grants = s->grants,
                .sleep = s->sleep,
                .pieces = s->pieces,
                .userdata = s->userdata,
                .owned = s->owned,
                .history = s->history,
                .history_max_entries = s->history ? s->history_max_entries : 0,
                .tags = &s->tags,
        };
}

void *gm_session_userdata(const gm_session_t *s) {
        return s->userdata;
}

gm_session_t *gm_session_next(const gm_session_t *s) {
        return s->next;
}

void **gm_session_owned(gm_session_t *s) {
        return &s->owned;
}

/* ---- its own history ---- */

/* Interned frame data one session's own history may hold, at most. */
#define SESSION_HISTORY_FRAME_BYTES (16u << 20)
#define SESSION_HISTORY_DEFAULT_ENTRIES 100000u

int gm_session_history(gm_session_t *s, bool enabled, size_t max_entries) {
        if (!enabled) {
                s->history = gm_history_free(s->history); /* as PyTorch: disabling clears it */
                return 0;
        }
        if (max_entries)
                s->history_max_entries = max_entries;
        if (!s->history_max_entries)
                s->history_max_entries = SESSION_HISTORY_DEFAULT_ENTRIES;
        if (s->history_max_entries > GM_SESSION_HISTORY_MAX_ENTRIES)
                s->history_max_entries = GM_SESSION_HISTORY_MAX_ENTRIES;
        if (s->ended)
                return 0;
        if (!s->history)
                return gm_history_new(s->history_max_entries, SESSION_HISTORY_FRAME_BYTES, &s->history);
        return gm_history_set_max(s->history, s->history_max_entries);
}
