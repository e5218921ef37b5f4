/* libgpumem's second floor: the session's segments and the mapping of their
 * pieces (mapper.h), over the connection (conn.h). Callers hold the client's
 * lock unless a function says otherwise. Not installed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "capture.h"
#include "conn.h"

/* Page reuse: moves one mapped piece to another place of this session's
 * segments, as the heap (the daemon's, or the local one) decided. -EPROTO
 * for a move that does not fit what is mapped here; else 0 or the mapper's
 * error, nothing changed. */
int gm_mapping_move(gpumem_client *c, const Gpumem__PageMove *mv);
/* Unmaps one range the daemon asks back (or the local heap gives back).
 * Returns false when it cannot be called released: the driver refused the
 * unmap (the piece stays mapped and known), or the range names a segment
 * this client does not know, whose memory it cannot account for. */
bool gm_mapping_unmap(gpumem_client *c, const Gpumem__Range *range);
/* Unmaps and unreserves every segment, after the device's queued work is
 * done (owner: false in a fork()ed child, which inherited none and waits for
 * nothing), and forgets them all. */
void gm_mapping_forget(gpumem_client *c, bool owner);
/* Waits for all work queued so far on the daemon's device, every stream of
 * it (before memory that work may use is unmapped). With no lock held but
 * the heap's. Nothing on backends without device streams. */
void gm_mapping_sync_device(gpumem_client *c);
/* The process's capture record's query (capture.h) through this client's
 * mapper: NULL when the mapper cannot tell (its kind has no stream capture). */
gm_capture_query_fn gm_mapping_capture_query(const gpumem_client *c);

/* The connection's handlers (conn.h) of the packets that map, move or
 * release memory: ReleaseRequest (`before` waits for the streams of its
 * segments; while a CUDA graph capture is in progress in the process,
 * capture.h, it waits for none and the request is held, answered by
 * gm_mapping_serve_held_releases() once none is), MapSegments, AllocReply,
 * GrantReply. */
void gm_mapping_release_streams(gpumem_client *c, const Gpumem__Envelope *env);
bool gm_mapping_on_release(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
/* The service thread's chore, holding no lock: answers the held release
 * requests once no capture is in progress (their streams waited for, their
 * ranges unmapped, each acknowledged). True while some wait. */
bool gm_mapping_serve_held_releases(gpumem_client *c);
/* Forgets the held release requests unanswered: the daemon that sent them
 * is gone (a re-attached session's new daemon numbers its releases anew and
 * was told what is still mapped), or the session ends. */
void gm_mapping_drop_held_releases(gpumem_client *c);
bool gm_mapping_on_map_segments(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
bool gm_mapping_on_alloc_reply(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
bool gm_mapping_on_grant_reply(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
/* A ClaimReply: the claim this client knows is the daemon's figure (new
 * pieces mapped after it consume it); the reply goes on to its waiter. */
bool gm_mapping_on_claim_reply(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);

/* Whether `stream` is being captured into a CUDA graph (the mapper's
 * capturing op; no op or an error: no). Asks the driver each call; inline,
 * so a kind without the op (host) pays one test on a central Alloc. */
static inline bool gm_mapping_stream_captured(gpumem_client *c, uint64_t stream) {
        return c->mapper->ops->capturing && c->mapper->ops->capturing(c->mapper, stream) == 1;
}

/* The mapper's stream events, in the (ctx = the client) form of the fence
 * and local-heap ops: page reuse's stream fences. No event is recorded on a
 * stream being captured (-EBUSY): it would be part of the graph, and the
 * fence's query of it would invalidate the capture; that fence is never
 * complete, its pages wait for a later one. */
int gm_mapping_event_record(void *ctx, uint64_t stream, uint64_t *ret_event);
int gm_mapping_event_query(void *ctx, uint64_t event);
void gm_mapping_event_destroy(void *ctx, uint64_t event);
