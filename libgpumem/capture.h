/* The process's CUDA graph captures in progress, as libgpumem knows them
 * (floor 0): captures declared by the application (gpumem_capture_begin/
 * end(), which libgpumem_torch calls from PyTorch's begin/end
 * allocate-to-pool hooks) and streams a local heap saw being captured (an
 * allocation's cache miss on a stream cuStreamIsCapturing called captured),
 * each while a block allocated on it during its capture is live: only then
 * is the stream asked about again (the application may destroy a stream once
 * its blocks are freed, and a destroyed stream must never be asked about).
 * While either says a capture is in progress, nothing in the process that
 * would synchronize the device or release cached memory for a Reclaim, a
 * trim or a local heap's own miss starts; such a release already under way
 * finishes before a declared capture begins. Process-wide (every session and device share one record);
 * a fork child starts with none. Calls nothing above it. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Streams a heap saw being captured, at most, noted at once; a capture seen
 * while the record is full goes unnoted (a declared one is always kept). */
#define GM_CAPTURE_MAX_STREAMS 64

/* Whether the application's `stream` is being captured into a CUDA graph: 1,
 * 0, or a negative errno (the stream is then forgotten). Asked only while the
 * record is locked, and never about a stream the record does not hold. */
typedef int (*gm_capture_query_fn)(void *ctx, uint64_t stream);

/* A capture the application declares begins: waits for a release already
 * under way (gm_capture_release_begin()) to end first. -EOVERFLOW past
 * INT32_MAX open declarations. */
int gm_capture_begin(void);

/* A declared capture ends. -EINVAL when none is open. */
int gm_capture_end(void);

/* A block was allocated on `stream` while a heap saw it captured: the
 * stream counts as capturing until a query says it is not, or until every
 * block noted on it was unnoted. Whether it was noted (false: the record is
 * full); only a noted block is unnoted. */
bool gm_capture_note_block(uint64_t stream);

/* A block gm_capture_note_block() noted on `stream` is freed (a stream
 * forgotten since is ignored). */
void gm_capture_unnote_block(uint64_t stream);

/* The application passed `stream` (alive) and it is not being captured:
 * it is forgotten. */
void gm_capture_forget_stream(uint64_t stream);

/* Captures open (declared ones plus noted streams), as the record last
 * published it under its lock; read only through gm_capture_any(). Hidden:
 * the library reads it with one PC-relative load, no GOT entry. */
extern __attribute__((visibility("hidden"))) atomic_uint gm_capture_open_;

/* Whether a capture may be in progress: one relaxed atomic load, no lock
 * and no query (a central session's cache miss asks it; a true answer is
 * confirmed with gm_capture_in_progress(), a noted stream's capture may have
 * ended since). */
static inline bool gm_capture_any(void) {
        return atomic_load_explicit(&gm_capture_open_, memory_order_relaxed) != 0;
}

/* Whether streams are noted (no query). */
bool gm_capture_noted(void);

/* Asks `query` (NULL: nothing is asked, noted streams are left as they are)
 * about every noted stream and forgets those that no longer capture; whether
 * a capture is still in progress, declared or noted. */
bool gm_capture_in_progress(gm_capture_query_fn query, void *ctx);

/* Starts a release (a synchronize of the device, unmaps of cached memory)
 * when no capture is in progress (asked as gm_capture_in_progress() does):
 * true, and declared captures wait until gm_capture_release_end(); false,
 * starting nothing, while one is. */
bool gm_capture_release_begin(gm_capture_query_fn query, void *ctx);

/* Ends a release gm_capture_release_begin() started. */
void gm_capture_release_end(void);

/* Checks the record's invariants (aborts on a broken one). */
void gm_capture_check(void);
