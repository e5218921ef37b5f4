/* Floor 3 of the broker, the holders: sessions (session.c) and the two
 * kinds of them over it, central (session_central.c: the heap runs here)
 * and local (session_local.c: the heap runs in the client). Calls only the
 * floors below. */
#pragma once

#include "piece.h"

/* session.c */
/* A release request or Reclaim went to the client: it owes an answer. */
void gm_session_owes(gm_session_t *s);
/* The client answered what it owed (a ReleaseAck or ReclaimAck). */
void gm_session_answered(gm_session_t *s);
/* A ReleaseAck (gm_broker_release_ack() without the retry): 1 when it was
 * taken (parked requests are to be retried), 0 when it could not be split
 * (all of it stays held), -EBUSY when the client still maps the memory,
 * -ENOENT. */
int gm_session_release_acked(gm_session_t *s, uint64_t release_id, const gm_release_range_t *not_released,
                             size_t n_not_released);
/* Holds `rel` (pieces RELEASING, not on s->releases) until the session ends,
 * counted as released on the client's word. */
void gm_session_hold_unverified(gm_session_t *s, gm_release_t *rel);
/* Re-asks the session's releases past release_timeout_ms. */
void gm_session_tick(gm_session_t *s, uint64_t now_ms);
/* The session's FIFO of parked requests: appends (or, with `front`, puts back
 * at the head), and takes the first. */
void gm_session_parked_push(gm_session_t *s, gm_parked_t *p, bool front);
gm_parked_t *gm_session_parked_pop(gm_session_t *s);
/* Drops the session's parked requests and Reclaim (it ends). */
void gm_session_unpark_all(gm_session_t *s);

/* session_central.c */
/* The session's heap, created on first use (-EPROTO: a local session). */
int gm_session_central_heap(gm_session_t *s, gm_heap_t **ret_heap);
/* One try of an allocation: 0 with REPLY or REFUSE in *out, or -ENOMEM /
 * -EDQUOT when the device or the quota is full (the heap already gave back
 * the session's own cache, unless `capturing`: then it released and moved
 * none of it): reclaim decides. */
int gm_session_central_try_alloc(gm_session_t *s, uint64_t size, uint64_t stream, unsigned tag, bool capturing,
                                 gm_outcome_t *out);
/* An allocation waits for reclaimed memory: num_reclaim_waits. */
void gm_session_central_count_reclaim_wait(gm_session_t *s);

/* session_local.c */
/* 0 when `spec` may be granted to the local session s (-EPROTO: not local,
 * -EINVAL: malformed against what it holds, or past its piece limit). */
int gm_session_local_check_grant(const gm_session_t *s, const gm_piece_spec_t *spec);
/* Hands a LIVE piece over to the client's heap (gm_piece_granted) and counts it. */
void gm_session_local_hand_over(gm_session_t *s, gm_piece_t *p);
/* One try of a grant, as gm_session_central_try_alloc(). */
int gm_session_local_try_grant(gm_session_t *s, const gm_grant_t *g, gm_outcome_t *out);
/* gm_broker_return_pieces() without the retry of parked requests. */
size_t gm_session_local_return_pieces(gm_session_t *s, const gm_release_range_t *ranges, size_t n,
                                      size_t *ret_first_bad);
/* A grant's pieces (n_pieces, 0 meaning 1) and bytes (all of them). */
uint64_t gm_session_local_grant_pieces(const gm_grant_t *g);
uint64_t gm_session_local_grant_bytes(const gm_grant_t *g);
