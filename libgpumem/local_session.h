/* libgpumem's fourth floor, local heap: a session whose allocator runs in
 * this process (local_heap.h), with its provider, the service thread's
 * chores and its snapshot side; over stream-ordered frees (frees.h), the
 * segment table and the connection. Not installed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "local_heap.h"

/* Maps the statistics page (fd stays the caller's) and starts the heap with
 * the daemon's allocator settings. */
int gm_local_session_open(gpumem_client *c, const Gpumem__HelloReply *hr, int page_fd);
/* After a re-attach: swaps in the new daemon's statistics page, now if the
 * heap is free, else the service thread does it once it is (the new daemon
 * reads zeros until then). Consumes page_fd. Caller holds lock. */
int gm_local_session_page_replace(gpumem_client *c, int page_fd);
/* The session closes: the heap, its spare block records and its page go. */
void gm_local_session_forget(gpumem_client *c, bool owner);

/* A local session's allocation: no message unless the heap needs memory.
 * trace_frames (may be NULL) go into its trace entry while history is on. */
int gm_local_session_alloc(gpumem_client *c, size_t size, uint64_t stream, const gm_frame_t *trace_frames,
                           size_t n_trace, void **ret_ptr);
/* gm_local_session_alloc() with the caller's frames for its trace entry. */
int gm_local_session_alloc_frames(gpumem_client *c, size_t size, uint64_t stream, const gpumem_frame *frames,
                                  size_t n_frames, void **ret_ptr);
/* A local session's free, the block already out of the table: at once, or
 * once `p`'s stream events completed (the service thread finishes it).
 * Called with heap_lock held; releases it. */
int gm_local_session_free(gpumem_client *c, block_t *b, pending_free_t *p);
/* empty_cache(): what the heap gave back and the daemon got (pieces whose
 * unmap failed stay here: not released). Caller holds heap_lock. */
uint64_t gm_local_session_release_cached(gpumem_client *c);

/* Sleep and wake (sleep.c): pieces given back as the heap's provider does,
 * keeping the segment's range reserved; and granted again at the same place
 * (the segment stays reserved when this fails), waiting for memory up to
 * wait_ms (0: the daemon's park_timeout_ms). Caller holds heap_lock. */
void gm_local_session_give_back(gpumem_client *c, uint64_t segment_id, uint64_t offset, uint64_t size,
                                uint64_t n_pieces);
int gm_local_session_regrant(gpumem_client *c, const gm_local_heap_grant_t *g, uint32_t wait_ms);

/* The connection's serve handler (conn.h): a local session's Reclaim, new
 * settings, completed frees, page swap and snapshot asks, each once the
 * heap is free. */
bool gm_local_session_serve(gpumem_client *c);
/* The connection's handlers of SnapshotQuery and HistoryPush,
 * AllocConfUpdate and Reclaim pushes: noted for the service thread. */
bool gm_local_session_on_ask(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
bool gm_local_session_on_alloc_conf(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
bool gm_local_session_on_reclaim(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
