/* Local sessions: the heap runs in the client, and asks for pieces of
 * physical memory (a whole segment, or a run of pages of an expandable one,
 * granted all or nothing). Every
 * piece is created, charged and stored as a central segment is
 * (gm_piece_create), handed over (granted: not listed for a reply, never
 * "sent" in the release sense) and released at once when the client gives it
 * back, because it gives back only what it unmapped. A grant that finds the
 * device or the quota full waits in the session's parked requests (reclaim.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "holder.h"
#include "size.h"

/* The largest virtual range a segment may claim (2^48 bytes). */
#define MAX_SEGMENT_VA (UINT64_C(1) << 48)

int gm_session_local_enable(gm_session_t *s) {
        if (s->heap || s->ended || !s->tenant)
                return -EBUSY;
        s->local = true;
        return 0;
}

/* What the session was granted of one segment: its pieces' count, size and
 * the segment's virtual size (0 pieces: a new segment). */
typedef struct segment_view {
        size_t n;
        uint64_t piece_size;
        uint64_t va_size;
} segment_view_t;

static segment_view_t segment_view(const gm_session_t *s, uint64_t segment_id) {
        segment_view_t v = {0};
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->granted && p->segment_id == segment_id) {
                        v.n++;
                        v.piece_size = p->phys.size;
                        v.va_size = p->segment_va_size;
                }
        return v;
}

/* Why a piece cannot be granted against what the session holds, or NULL. */
static const char *grant_invalid(const gm_session_t *s, const gm_piece_spec_t *g) {
        uint64_t gran = s->broker->backend->granularity;
        if (g->segment_id == 0 || g->size == 0 || g->segment_va_size == 0)
                return "empty grant";
        if (g->segment_va_size > MAX_SEGMENT_VA)
                return "segment larger than any address space";
        if (gran && (g->size % gran || g->offset % gran || g->segment_va_size % gran))
                return "not a multiple of the backend's granularity";
        if (g->offset >= g->segment_va_size || g->size > g->segment_va_size - g->offset)
                return "piece outside its segment";
        segment_view_t v = segment_view(s, g->segment_id);
        if (v.n && (v.va_size != g->segment_va_size || v.piece_size != g->size || g->offset % g->size))
                return "piece does not match its segment";
        if (v.n && gm_piece_find(s, g->segment_id, g->offset))
                return "piece already granted";
        return NULL;
}

uint64_t gm_session_local_grant_pieces(const gm_grant_t *g) {
        return g->n_pieces ? g->n_pieces : 1;
}

uint64_t gm_session_local_grant_bytes(const gm_grant_t *g) {
        return gm_session_local_grant_pieces(g) * g->piece.size; /* checked not to overflow before anything is made */
}

/* Why a run of n > 1 pieces cannot be granted, beyond its first piece
 * (grant_invalid), or NULL: one walk over the session's pieces. */
static const char *run_invalid(const gm_session_t *s, const gm_piece_spec_t *g, uint64_t n) {
        if (n > GM_MAX_GRANT_PIECES)
                return "too many pieces in one grant";
        if (g->offset % g->size || n > (g->segment_va_size - g->offset) / g->size)
                return "pieces outside their segment";
        uint64_t end = g->offset + n * g->size;
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->granted && p->segment_id == g->segment_id && p->offset >= g->offset && p->offset < end)
                        return "piece already granted";
        return NULL;
}

/* Hands n LIVE pieces of one segment over to the client's heap and counts them. */
static void hand_over_run(gm_session_t *s, gm_piece_t *const *pieces, size_t n) {
        bool new_segment = segment_view(s, pieces[0]->segment_id).n == 0;
        for (size_t k = 0; k < n; k++) {
                gm_piece_granted(s, pieces[k]);
                gm_stat_update(&s->grants.bytes, (int64_t) pieces[k]->phys.size);
        }
        if (new_segment)
                gm_stat_update(&s->grants.segments, 1);
        s->grants.pieces += n;
}

void gm_session_local_hand_over(gm_session_t *s, gm_piece_t *p) {
        hand_over_run(s, &p, 1);
}

int gm_session_local_check_grant(const gm_session_t *s, const gm_piece_spec_t *spec) {
        if (!s->local)
                return -EPROTO;
        if (grant_invalid(s, spec) || s->grants.pieces >= GM_MAX_GRANTED_PIECES)
                return -EINVAL;
        return 0;
}

int gm_session_local_try_grant(gm_session_t *s, const gm_grant_t *g, gm_outcome_t *out) {
        gm_broker_t *b = s->broker;
        uint64_t n = gm_session_local_grant_pieces(g);
        const char *bad = grant_invalid(s, &g->piece);
        if (!bad && n > 1)
                bad = run_invalid(s, &g->piece, n);
        if (bad)
                return gm_outcome_refuse(out, -EINVAL, "gpumemd: grant refused: %s", bad);
        if (gm_session_local_grant_bytes(g) > b->backend->capacity) {
                char a[32], cap[32];
                return gm_outcome_refuse(out, -ENOMEM,
                                         "gpumemd: tried to allocate %s, more than the device's capacity of %s",
                                         gm_format_size(gm_session_local_grant_bytes(g), a, sizeof(a)),
                                         gm_format_size(b->backend->capacity, cap, sizeof(cap)));
        }
        if (n > GM_MAX_GRANTED_PIECES - s->grants.pieces)
                return gm_outcome_refuse(out, -ENOBUFS, "gpumemd: session limit of %u pieces reached",
                                         GM_MAX_GRANTED_PIECES);
        gm_piece_t *pieces[GM_MAX_GRANT_PIECES];
        int r = gm_piece_create_run(s, &g->piece, n, pieces);
        if (r == -ENOMEM || r == -EDQUOT)
                return r;
        if (r < 0) {
                const char *detail = gm_backend_last_error(b->backend);
                return gm_outcome_refuse(out, r, "gpumemd: grant failed: %s%s%s", strerror(-r), detail[0] ? ": " : "",
                                         detail);
        }
        hand_over_run(s, pieces, n);
        out->kind = GM_OUTCOME_REPLY;
        for (size_t k = 0; k < n; k++)
                out->pieces[k] = pieces[k];
        out->n_pieces = n;
        return 0;
}

/* The piece named by a returned range, or NULL. */
static gm_piece_t *returned_piece(const gm_session_t *s, const gm_release_range_t *range) {
        gm_piece_t *p = gm_piece_find(s, range->segment_id, range->offset);
        return p && p->granted && p->phys.size == range->length ? p : NULL;
}

/* Checks the returned pieces (linked by ->queue) with the backend, or the
 * driver's figure against the session's reference. */
static gm_release_verdict_t returned_verdict(gm_session_t *s, const gm_piece_t *returned, uint64_t bytes) {
        if (!s->broker->backend->ops->mapped)
                return gm_process_check_verdict(s, &s->holder, bytes);
        for (const gm_piece_t *p = returned; p; p = p->queue)
                if (gm_piece_still_mapped(s->broker, p))
                        return GM_RELEASE_KEPT;
        return GM_RELEASE_GONE;
}

/* The returned pieces leave the session's grants. */
static void ungrant(gm_session_t *s, gm_piece_t *p) {
        gm_assert(p->granted && s->grants.pieces > 0);
        p->granted = false;
        gm_stat_update(&s->grants.bytes, -(int64_t) p->phys.size);
        if (segment_view(s, p->segment_id).n == 0)
                gm_stat_update(&s->grants.segments, -1);
        s->grants.pieces--;
        s->grants.returned++;
}

/* Keeps returned pieces charged in a held release (they may still be
 * mapped: checked as a release's when the session ends); false when it
 * cannot (they stay granted, charged all the same). */
static bool hold_returned(gm_session_t *s, gm_piece_t *returned, uint64_t bytes, gm_release_verdict_t verdict) {
        gm_broker_t *b = s->broker;
        gm_release_t *rel = calloc(1, sizeof(*rel));
        if (!rel)
                return false;
        rel->id = s->next_release_id++;
        rel->pieces = returned;
        rel->bytes = bytes;
        for (gm_piece_t *p = returned; p; p = p->queue) {
                ungrant(s, p);
                p->sent = true; /* its client may map it */
        }
        s->releasing_bytes += bytes;
        b->releasing_bytes += bytes;
        if (verdict == GM_RELEASE_UNVERIFIED) {
                gm_session_hold_unverified(s, rel);
                return true;
        }
        rel->held = true;
        rel->next = s->releases;
        s->releases = rel;
        s->lied = true;
        gm_host_log(b, LOG_WARNING,
                    "session %" PRIu64 " (pid %d) returned %" PRIu64
                    " bytes it still maps: they stay charged while mapped",
                    s->id, (int) s->pid, bytes);
        return true;
}

size_t gm_session_local_return_pieces(gm_session_t *s, const gm_release_range_t *ranges, size_t n,
                                      size_t *ret_first_bad) {
        size_t bad = 0;
        gm_piece_t *returned = NULL, **tail = &returned;
        uint64_t bytes = 0;
        for (size_t i = 0; i < n && !s->ended; i++) {
                gm_piece_t *p = returned_piece(s, &ranges[i]);
                if (!p) {
                        if (bad++ == 0)
                                *ret_first_bad = i;
                        continue;
                }
                p->state = GM_PIECE_RELEASING; /* charged still; not found again by a repeated range */
                *tail = p;
                tail = &p->queue;
                bytes += p->phys.size;
        }
        gm_release_verdict_t verdict = returned ? returned_verdict(s, returned, bytes) : GM_RELEASE_GONE;
        if (verdict != GM_RELEASE_GONE && hold_returned(s, returned, bytes, verdict))
                returned = NULL;
        else if (verdict == GM_RELEASE_KEPT)
                s->lied = true; /* not held, but closed all the same */
        while (returned) {
                gm_piece_t *p = returned;
                returned = p->queue;
                p->queue = NULL;
                if (verdict != GM_RELEASE_GONE) { /* could not be held: it stays granted */
                        p->state = GM_PIECE_LIVE;
                        continue;
                }
                ungrant(s, p);
                gm_piece_destroy(s->broker, p); /* back to the backend at once */
        }
        return bad;
}

int gm_session_local_open_return_intent(gm_session_t *s) {
        if (s->ended)
                return -ESHUTDOWN;
        if (!s->local)
                return -EPROTO;
        if (s->return_intent_open)
                return -EBUSY;
        gm_process_check_note(s, &s->holder);
        s->return_intent_open = true;
        s->return_intents = true;
        return 0;
}

void gm_session_local_close_return_intent(gm_session_t *s) {
        s->return_intent_open = false;
}

int gm_session_local_sleep_state(gm_session_t *s, bool asleep, uint64_t sleeping_bytes) {
        if (s->ended)
                return -ESHUTDOWN;
        if (!s->local)
                return -EPROTO;
        if (!asleep) {
                s->sleep = (gm_session_sleep_t){0};
                return 0;
        }
        if (s->sleep.asleep)
                return -EBUSY;
        if (sleeping_bytes > (uint64_t) s->grants.bytes.current)
                return -EINVAL;
        s->sleep = (gm_session_sleep_t){.asleep = true,
                                        .bytes = sleeping_bytes,
                                        .granted_bytes = (uint64_t) s->grants.bytes.current,
                                        .segments = (uint64_t) s->grants.segments.current};
        return 0;
}

int gm_session_local_move_granted(gm_session_t *s, uint64_t from_segment_id, uint64_t from_offset,
                                  const gm_piece_spec_t *to, const char **ret_why) {
        gm_piece_t *p = gm_piece_find(s, from_segment_id, from_offset);
        const char *bad = !p || !p->granted || p->phys.size != to->size ? "no such piece was granted"
                                                                        : grant_invalid(s, to); /* checked as a grant */
        if (bad) {
                *ret_why = bad;
                return -EINVAL;
        }
        int64_t segments = segment_view(s, to->segment_id).n == 0;
        gm_piece_move(s->broker, p, to->segment_id, to->segment_va_size, to->offset);
        segments -= segment_view(s, from_segment_id).n == 0;
        if (segments)
                gm_stat_update(&s->grants.segments, segments);
        return 0;
}
