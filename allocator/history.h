/* Allocation history for memory snapshots (PyTorch's device_traces).
 *
 * A gm_history_t holds trace entries per process (the entry's pid), each
 * process's oldest first, at most max_entries of them all together. Once it
 * holds max_entries, each new entry drops the oldest entry of the process
 * holding the most: one busy process evicts its own entries, never those of
 * a process that holds fewer (PyTorch's ring, made fair). An entry may carry
 * a stack of frames. Stacks are interned: identical stacks are stored once and
 * shared by reference count, and their strings are interned as well; a stack
 * (and each string) is freed when the last entry using it is overwritten or
 * cleared. The bytes held by interned frame data never exceed the limit given
 * at creation: an entry whose new stack would pass it is kept without frames.
 * Pure C, no I/O, not thread-safe. Errors are negative errno. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct gm_history gm_history_t;

/* One stack frame, innermost first within a stack. NULL strings are stored
 * as "". */
typedef struct gm_frame {
        const char *filename;
        uint32_t line;
        const char *name;
} gm_frame_t;

typedef struct gm_history_entry {
        int action;    /* gm_trace_action_t (allocator.h) */
        uint64_t addr; /* for GM_TRACE_OOM: the device's free bytes (device_free) */
        uint64_t size;
        uint64_t stream;
        uint64_t time_us;    /* epoch microseconds */
        uint32_t pid;        /* the client process the event belongs to */
        uint64_t session_id; /* the daemon's session it belongs to (ids are never reused); 0 = not known
                              * (a client's own ring): then the pid says whose it is */
        uint64_t frames_id;  /* output only (ignored by record): 0 = no frames; entries
                             * with equal ids share one stack; ids are never reused */
} gm_history_entry_t;

/* Creates an empty history keeping up to max_entries entries (0 = disabled:
 * record does nothing; SIZE_MAX = unbounded, storage grows on demand) and at
 * most frame_bytes_limit bytes of interned frame data (0 = never keep frames). */
int gm_history_new(size_t max_entries, size_t frame_bytes_limit, gm_history_t **ret_history);
/* Frees the history and everything it holds. Accepts NULL; returns NULL. */
gm_history_t *gm_history_free(gm_history_t *h);

/* Changes the entry limit; when it shrinks below the current length entries
 * are dropped as by record (0 drops all and disables recording). Returns 0. */
int gm_history_set_max(gm_history_t *h, size_t max_entries);

/* Appends a copy of *e (frames_id is assigned by the history) with a copy of
 * frames[0..n_frames) (the caller keeps its strings). A no-op returning 0 when
 * disabled. On -ENOMEM nothing is recorded. */
int gm_history_record(gm_history_t *h, const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames);

/* Calls fn for every entry, oldest to newest (in the order they were
 * recorded, across processes), with its frames (NULL, 0 when it has none).
 * Pointers are valid until the history is next modified. */
typedef void (*gm_history_visit_fn)(const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames,
                                    void *userdata);
void gm_history_foreach(const gm_history_t *h, gm_history_visit_fn fn, void *userdata);

/* Drops every entry (and so every interned stack and string). */
void gm_history_clear(gm_history_t *h);

/* Number of entries held. */
size_t gm_history_len(const gm_history_t *h);
/* Bytes of interned frame data held now (stacks and strings, with their
 * headers): what frame_bytes_limit bounds. */
size_t gm_history_frame_bytes(const gm_history_t *h);
