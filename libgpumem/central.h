/* libgpumem's fourth floor, central heap: a session whose allocator runs in
 * the daemon (Alloc, Free, Trim, Stats round trips; page reuse's stream
 * fences), over stream-ordered frees (frees.h), the segment table and the
 * connection. Not installed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_state.h"

/* A central session's allocation: one Alloc round trip; the reply's memory
 * is mapped by whichever thread reads it. */
int gm_central_alloc(gpumem_client *c, size_t size, uint64_t stream, const gpumem_frame *frames, size_t n_frames,
                     void **ret_ptr);
/* Frees b, already out of the blocks table (and freed here): a Free, or with
 * `p` (its stream events) a deferred Free whose completion waits in the
 * pending list. */
int gm_central_free(gpumem_client *c, block_t *b, pending_free_t *p);
/* empty_cache() in the daemon: *ret_released_bytes (may be NULL). */
int gm_central_trim(gpumem_client *c, uint64_t *ret_released_bytes);
/* One statistic of the session (tag NULL) or of its tagged pool `tag`
 * ("" the default), asked of the daemon. */
int gm_central_stat(gpumem_client *c, const char *tag, const char *pytorch_stat_name, int64_t *ret_value);
/* The session said Hello: on a kind with device streams, its fences start. */
void gm_central_open(gpumem_client *c, const Gpumem__HelloReply *hr);
/* Holding lock, before env (not yet numbered) is sent on any path but an
 * Alloc's: the carried frees go first, so the daemon sees every free before
 * any later message (the connection's before_send handler). */
void gm_central_before_send(gpumem_client *c, const Gpumem__Envelope *env);
/* Holding lock: sends the carried frees now, as one Free (block_id and
 * more_block_ids), ahead of whatever is sent next (the service thread's
 * turns, 64 waiting, the session's end). */
void gm_central_send_carried(gpumem_client *c);
/* The session closes: carried frees are sent (owner), its fences go. */
void gm_central_forget(gpumem_client *c, bool owner);
