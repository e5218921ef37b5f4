/* libgpumem's fourth floor, shared by both heaps: stream-ordered frees (a
 * free waits in c->pending_frees for its streams' events), the note of a
 * free sent, for the central heap's fence checks, and the error of an
 * allocation refused during a stream capture. Over the connection.
 * Not installed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_state.h"

/* Records one event on each stream in streams[0..n) (deduplicated by the
 * caller) into p's events and streams. A stream being captured into a CUDA
 * graph gets its event once the capture ends (gm_frees_poll()): an event
 * recorded inside a capture is part of the graph, and querying it would
 * invalidate the capture. On failure nothing stays recorded and p is as
 * it was. */
int gm_frees_record_events(gpumem_client *c, pending_free_t *p, const uint64_t *streams, size_t n);
/* Frees a pending free, destroying its events when `owner` (a fork()ed
 * child's are its parent's). */
void gm_frees_destroy(gpumem_client *c, pending_free_t *p, bool owner);
/* The connection's poll (conn.h): sends FreeCompleted (local mode: queues
 * the free for the heap, completed_frees) for every pending free whose
 * stream work is done. Caller holds lock. Returns true while some remain
 * pending. */
bool gm_frees_poll(gpumem_client *c);
/* The free of a block of `stream`, `size` bytes, went out (a Free or
 * FreeCompleted): the next Alloc checks that stream (client_fences). A
 * block smaller than a page holds no whole page: its free is not checked
 * (the cost of a cached small pair stays nil; a page it completes by
 * merging waits for a mark the daemon asks for). Caller holds lock. */
void gm_frees_sent(gpumem_client *c, uint64_t stream, uint64_t size);
/* An allocation of `size` on `stream` refused with r (-ENOMEM, -EDQUOT)
 * while the stream was captured (`elsewhere`: while another capture of the
 * process was in progress), the cache left as it was (releasing it would
 * synchronize and unmap, invalidating the capture): sets the thread's error
 * saying so, with the daemon's diagnosis when `told` (the daemon refused
 * it), and returns r. Both heaps. */
int gm_frees_refused_in_capture(gpumem_client *c, int r, size_t size, uint64_t stream, bool told, bool elsewhere);
/* The session closes: every pending and completed free goes. */
void gm_frees_forget(gpumem_client *c, bool owner);
