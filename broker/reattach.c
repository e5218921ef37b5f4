/* Re-attach after a restart: a resuming session's client reports the
 * segments, blocks and granted pieces it still maps; each must be a piece
 * the ledger gives that session (adopted, or an unbacked record), the heap
 * is rebuilt, and what the client no longer holds is released. The shared
 * objects it still maps make it their mapper again (the shared registry
 * checks each against the adopted objects). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "reclaim.h"

/* The link to the adopted (stored) piece with spec's coordinates, or NULL. */
static gm_piece_t **adopting_piece(gm_session_t *s, const gm_piece_spec_t *spec) {
        for (gm_piece_t **pp = &s->adopting; *pp; pp = &(*pp)->queue) {
                const gm_piece_t *p = *pp;
                if (p->segment_id == spec->segment_id && p->offset == spec->offset && p->phys.size == spec->size &&
                    p->segment_va_size == spec->segment_va_size)
                        return pp;
        }
        return NULL;
}

/* The piece behind one mapped range a client reports: the adopted one with
 * the same coordinates, or (no stored handle) an unbacked piece in place of
 * the journal's record of it. -ENOENT when the journal gives the session no
 * such piece, -ENOMEM when it does not fit the device (or no memory). */
static int claim_piece(gm_session_t *s, const gm_piece_spec_t *spec, gm_piece_t **ret_piece) {
        gm_broker_t *b = s->broker;
        gm_piece_t **pp = adopting_piece(s, spec);
        if (pp) {
                gm_piece_t *p = *pp;
                *pp = p->queue;
                p->queue = NULL;
                *ret_piece = p;
                return 0;
        }
        gm_ledger_entry_t *rec = gm_ledger_record_find(b, s->token, spec);
        if (!rec)
                return -ENOENT;
        gm_piece_t *p = gm_piece_new_unbacked(s, spec);
        if (!p)
                return -ENOMEM;
        p->record_id = rec->store_id; /* its journal line stays true: same token, same coordinates */
        p->pool = rec->pool;
        if (rec->tag && gm_session_tags_name(&s->tags, rec->tag, rec->tag_name) == 0)
                p->tag = (uint8_t) rec->tag;
        b->n_recorded++;
        *rec = b->records[--b->n_records];
        *ret_piece = p;
        return 0;
}

/* Puts a claimed piece back where it came from after a refused claim. */
static void unclaim_piece(gm_session_t *s, gm_piece_t *p) {
        gm_broker_t *b = s->broker;
        if (p->phys.fd < 0) {
                if (p->record_id) {
                        gm_ledger_entry_t *n = realloc(b->records, (b->n_records + 1) * sizeof(*n));
                        if (n) {
                                b->records = n;
                                n[b->n_records++] = gm_ledger_piece_entry(p, p->record_id, s->token, s->uid);
                                p->record_id = 0; /* still journaled, as the record */
                                b->n_recorded--;
                        }
                }
                gm_piece_destroy(b, p);
                return;
        }
        p->queue = s->adopting;
        s->adopting = p;
}

int gm_reattach_count(gm_session_t *s, uint64_t n) {
        if (!s->reattaching)
                return -EPROTO;
        s->reattach_items += n;
        return s->reattach_items > s->broker->limits.max_reattach_items ? -E2BIG : 0;
}

/* The pool the journal records of a segment's claimed pieces name. */
static int claimed_pool(gm_piece_t *const *claimed, size_t n, gm_piece_pool_t *ret_pool, const char **ret_why) {
        gm_piece_pool_t pool = GM_POOL_UNKNOWN;
        for (size_t i = 0; i < n; i++) {
                if (claimed[i]->pool != GM_POOL_UNKNOWN && pool != GM_POOL_UNKNOWN && claimed[i]->pool != pool) {
                        *ret_why = "the ledger records its pieces in both pools";
                        return -EINVAL;
                }
                if (claimed[i]->pool != GM_POOL_UNKNOWN)
                        pool = claimed[i]->pool;
        }
        *ret_pool = pool;
        return 0;
}

/* The tagged pool the journal records of a segment's claimed pieces name:
 * one segment, one pool (docs/tags.md). */
static int claimed_tag(gm_piece_t *const *claimed, size_t n, unsigned *ret_tag, const char **ret_why) {
        for (size_t i = 1; i < n; i++)
                if (claimed[i]->tag != claimed[0]->tag) {
                        *ret_why = "the ledger records its pieces in two tagged pools";
                        return -EINVAL;
                }
        *ret_tag = claimed[0]->tag;
        return 0;
}

int gm_reattach_segment(gm_session_t *s, uint64_t segment_id, uint64_t va_size, uint64_t stream,
                        const gm_reattach_range_t *mapped, size_t n_mapped, const char **ret_why) {
        enum { MAX_PIECES = 1 << 16 };
        if (!s->reattaching)
                return -EPROTO;
        if (n_mapped == 0 || n_mapped > MAX_PIECES)
                return -EINVAL;
        gm_heap_t *heap;
        int r = gm_session_central_heap(s, &heap);
        if (r < 0)
                return r;
        gm_restore_piece_t *rp = calloc(n_mapped, sizeof(*rp));
        gm_piece_t **claimed = calloc(n_mapped, sizeof(*claimed));
        r = rp && claimed ? 0 : -ENOMEM;
        uint64_t unbacked = 0; /* bytes claimed below with nothing here to back them */
        for (size_t i = 0; i < n_mapped && r == 0; i++) {
                const gm_reattach_range_t *m = &mapped[i];
                if (m->length == 0 || m->offset + m->length < m->offset || m->offset + m->length > va_size) {
                        r = -EINVAL;
                        break;
                }
                gm_piece_spec_t spec = {
                        .segment_id = segment_id, .segment_va_size = va_size, .offset = m->offset, .size = m->length};
                if (!adopting_piece(s, &spec)) {
                        /* Only the client's word: it must fit the tenant's quota (and the device). */
                        const gm_tenant_t *t = s->tenant;
                        unbacked += m->length;
                        if (t->quota && (unbacked > t->quota || t->charged_bytes > t->quota - unbacked)) {
                                r = -EDQUOT;
                                break;
                        }
                }
                r = claim_piece(s, &spec, &claimed[i]);
                if (r < 0)
                        break;
                rp[i] = (gm_restore_piece_t){
                        .offset = m->offset, .size = m->length, .handle = (uint64_t) (uintptr_t) claimed[i]};
        }
        gm_piece_pool_t pool = GM_POOL_UNKNOWN;
        unsigned tag = 0;
        if (r == 0)
                r = claimed_pool(claimed, n_mapped, &pool, ret_why);
        if (r == 0)
                r = claimed_tag(claimed, n_mapped, &tag, ret_why);
        if (r == 0) /* no record names the pool: as the page size says */
                r = gm_heap_restore_segment_tagged(heap, segment_id, va_size, stream,
                                                   pool == GM_POOL_UNKNOWN ? -1 : pool == GM_POOL_SMALL, tag, rp,
                                                   n_mapped);
        for (size_t i = 0; claimed && i < n_mapped && claimed[i]; i++) {
                if (r < 0)
                        unclaim_piece(s, claimed[i]);
                else {
                        if (pool != GM_POOL_UNKNOWN) /* a piece an older daemon journaled learns it too */
                                claimed[i]->pool = pool;
                        gm_piece_claimed(s, claimed[i]);
                }
        }
        free(rp);
        free(claimed);
        return r;
}

int gm_reattach_grant(gm_session_t *s, const gm_piece_spec_t *spec, gm_piece_t **ret_piece) {
        if (!s->reattaching)
                return -EPROTO;
        int r = gm_session_local_check_grant(s, spec);
        if (r < 0)
                return r;
        const gm_tenant_t *t = s->tenant;
        if (!adopting_piece(s, spec) && t->quota && t->charged_bytes + spec->size > t->quota)
                return -EDQUOT; /* only the client's word: it must fit the tenant's quota */
        gm_piece_t *p;
        r = claim_piece(s, spec, &p);
        if (r < 0)
                return r;
        gm_piece_claimed(s, p);
        gm_session_local_hand_over(s, p);
        *ret_piece = p;
        return 0;
}

int gm_reattach_block(gm_session_t *s, uint64_t block_id, uint64_t segment_id, uint64_t offset, uint64_t size,
                      uint64_t requested_size, bool pending_free) {
        if (!s->reattaching)
                return -EPROTO;
        gm_heap_t *heap;
        int r = gm_session_central_heap(s, &heap);
        if (r < 0)
                return r;
        return gm_heap_restore_block(heap, block_id, segment_id, offset, size, requested_size, pending_free);
}

int gm_reattach_shared(gm_session_t *s, uint64_t client_id, const char *name, uint64_t version, uint64_t size) {
        if (!s->reattaching)
                return -EPROTO;
        return gm_shared_reattach(s, client_id, name, version, size);
}

/* The sleep record of a session that re-attaches asleep: its pieces went
 * back before the restart, so nothing in the ledger bounds what its wake
 * needs but the capacity (the record is not charged; a wake is granted as
 * any grant is). Its heap still counts the sleeping blocks and segments:
 * the statistics page's bounds add the bytes, and a segment per granule. */
static int restore_sleep(gm_session_t *s, uint64_t bytes) {
        const gm_backend_t *be = s->broker->backend;
        if (!bytes)
                return 0;
        if (!s->local || bytes > be->capacity)
                return -EINVAL;
        s->sleep = (gm_session_sleep_t){.asleep = true,
                                        .bytes = bytes,
                                        .granted_bytes = bytes,
                                        .segments = bytes / (be->granularity ? be->granularity : 1)};
        return 0;
}

int gm_reattach_finish(gm_session_t *s, const gm_reattach_state_t *told, uint64_t *ret_claimed) {
        if (!s->reattaching)
                return -EPROTO;
        gm_heap_t *heap = NULL;
        int r = restore_sleep(s, told->sleeping_bytes);
        if (r == 0 && !s->local) /* a local session's heap is its client's */
                r = gm_session_central_heap(s, &heap);
        if (r == 0 && heap)
                r = gm_heap_restore_finish(heap);
        if (r < 0)
                return r;
        s->reattaching = false;
        uint64_t dropped = 0;
        while (s->adopting) { /* stored pieces the client does not hold (e.g. a reply it never got) */
                gm_piece_t *p = s->adopting;
                s->adopting = p->queue;
                p->queue = NULL;
                dropped += p->phys.size;
                gm_piece_destroy(s->broker, p);
        }
        gm_broker_t *b = s->broker;
        for (size_t i = 0; i < b->n_records;) { /* records of memory the client no longer holds */
                if (strcmp(b->records[i].token, s->token) != 0) {
                        i++;
                        continue;
                }
                uint64_t record_id = b->records[i].store_id;
                b->records[i] = b->records[--b->n_records];
                gm_ledger_forget(b, record_id); /* after: a compaction here must not keep it */
        }
        /* Its claim, as a fresh one: what it holds is back, so what is free now
         * bounds it, less what the journal records of sessions still to come
         * back (theirs is mapped, not free: a claim must not refuse their
         * re-attach). */
        uint64_t cap = b->backend->capacity, claimed = 0, pending = 0;
        for (size_t i = 0; i < b->n_records; i++)
                pending += b->records[i].size;
        uint64_t room = gm_broker_room(s);
        uint64_t settable = room > pending ? room - pending : 0;
        uint64_t want = told->claim_bytes < cap ? told->claim_bytes : cap;
        if (want > settable)
                want = settable;
        if (want)
                gm_broker_claim(s, want, &claimed);
        if (claimed < told->claim_bytes)
                gm_host_log(b, LOG_NOTICE,
                            "session %" PRIu64 " (pid %d) re-attached with a claim of %" PRIu64 " bytes: %" PRIu64
                            " are free to set aside again",
                            s->id, (int) s->pid, told->claim_bytes, claimed);
        *ret_claimed = claimed;
        if (!heap) {
                gm_host_log(s->broker, LOG_NOTICE,
                            "session %" PRIu64 " (pid %d) re-attached: %" PRId64 " bytes granted in %" PRIu64
                            " pieces%s%s",
                            s->id, (int) s->pid, s->grants.bytes.current, s->grants.pieces,
                            s->sleep.asleep ? ", asleep" : "", dropped ? "; unclaimed stored memory released" : "");
                return 0;
        }
        const gm_stats_t *st = gm_heap_stats(heap);
        gm_host_log(s->broker, LOG_NOTICE,
                    "session %" PRIu64 " (pid %d) re-attached: %" PRId64 " bytes reserved, %" PRId64
                    " allocated in %" PRId64 " blocks%s",
                    s->id, (int) s->pid, st->reserved_bytes[GM_STAT_ALL].current,
                    st->allocated_bytes[GM_STAT_ALL].current, st->active[GM_STAT_ALL].current,
                    dropped ? "; unclaimed stored memory released" : "");
        return 0;
}
