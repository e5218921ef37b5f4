/* Memory snapshots in PyTorch's 2.x torch.cuda.memory._snapshot() schema,
 * written as a protocol-2 pickle (loadable by pickle.load, _memory_viz.py and
 * MemoryViz.js) or as JSON with the same tree.
 *
 * Top level: `segments` (every heap's segments, sorted by address, with their
 * blocks and the extra keys `pid`, `tenant`, `session_id`), `device_traces`
 * (device + 1 lists; the last holds the history oldest to newest, each entry
 * with the extra key `pid`), `allocator_settings` and `external_annotations`
 * (always empty). A live block's `frames` are those of the newest `alloc`
 * entry at its address still in the history (else empty). Blocks and trace
 * entries may carry a `category` (tenant or pid) and an outermost frame
 * naming their process. PyTorch 1.13's format is the bare list of segments,
 * blocks {size, state, history: [{addr, real_size, frames}]}. Pure C, no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator.h"
#include "alloc_conf.h"
#include "history.h"

typedef enum gm_snapshot_format {
        GM_SNAPSHOT_PICKLE,      /* PyTorch 2.x: {segments, device_traces, ...} */
        GM_SNAPSHOT_JSON,        /* the same tree as JSON */
        GM_SNAPSHOT_PICKLE_1_13, /* PyTorch 1.13: a bare list of segments (torch.cuda._memory_viz of 1.x) */
        _GM_SNAPSHOT_FORMAT_MAX,
} gm_snapshot_format_t;

/* What a block's and a trace entry's `category` names (MemoryViz colours
 * the trace by it and draws a legend). */
typedef enum gm_snapshot_category {
        GM_SNAPSHOT_CATEGORY_NONE, /* no category key */
        GM_SNAPSHOT_CATEGORY_TENANT,
        GM_SNAPSHOT_CATEGORY_PID, /* "pid N" */
        GM_SNAPSHOT_CATEGORY_TAG, /* the segment's tagged pool ("default" for tag 0, "unknown" for a trace
                                   * entry at an address no segment of the snapshot holds any more) */
        _GM_SNAPSHOT_CATEGORY_MAX,
} gm_snapshot_category_t;

/* One session's heap and who it belongs to. */
typedef struct gm_snapshot_heap {
        const gm_heap_t *heap;
        uint32_t pid;
        const char *tenant;
        uint64_t session_id;
} gm_snapshot_heap_t;

typedef struct gm_snapshot_source {
        int device; /* device index, >= 0 */
        const gm_snapshot_heap_t *heaps;
        size_t n_heaps;
        const gm_history_t *history;     /* the device's trace ring; NULL = no traces */
        bool only_heap_pids;             /* keep only trace entries whose pid owns one of
                                         * `heaps`: set it whenever `heaps` is not every
                                         * session of the device (a tenant's own view), or
                                         * the viewers' replay of the trace will not match */
        const gm_alloc_config_t *config; /* reported as allocator_settings */
} gm_snapshot_source_t;

/* Writes the snapshot of src. On success *ret_buf (freed with free()) holds
 * *ret_len bytes. -EINVAL for a bad source or format, -ENOMEM. */
int gm_snapshot_write(const gm_snapshot_source_t *src, gm_snapshot_format_t fmt, char **ret_buf, size_t *ret_len);

/* ---- the two phases: collect (a flat, owned copy), then render ----
 *
 * A gm_snapshot_data_t owns everything it holds (no pointer into a heap or a
 * history), so it can be rendered on another thread while the heaps it was
 * copied from change. */
typedef struct gm_snapshot_data gm_snapshot_data_t;

/* Who a part of the snapshot belongs to (strings are copied). */
typedef struct gm_snapshot_owner {
        uint32_t pid;
        const char *tenant;
        const char *command; /* the process's name; NULL = none */
        uint64_t session_id;
        bool blocks_unknown; /* its blocks are not known (a local session that did not
                              * answer in time): each of its segments is written as one
                              * active block and marked `gpumemd_blocks_unknown` */
        /* Its tagged pools' names by heap tag id (n_tag_names <= GM_HEAP_MAX_TAGS; a
         * missing or empty one reads "default" for id 0, "tag N" above). */
        const char *const *tag_names;
        size_t n_tag_names;
} gm_snapshot_owner_t;

int gm_snapshot_data_new(gm_snapshot_data_t **ret_data);
/* Accepts NULL; returns NULL. */
gm_snapshot_data_t *gm_snapshot_data_free(gm_snapshot_data_t *d);
/* Adds an owner; *ret_owner names it in the calls below. */
int gm_snapshot_data_add_owner(gm_snapshot_data_t *d, const gm_snapshot_owner_t *o, uint32_t *ret_owner);
/* Marks an owner's blocks as not known (see gm_snapshot_owner_t). */
void gm_snapshot_data_set_blocks_unknown(gm_snapshot_data_t *d, uint32_t owner);
/* Copies every segment and block of heap. */
int gm_snapshot_data_add_heap(gm_snapshot_data_t *d, uint32_t owner, const gm_heap_t *heap);
/* Adds one segment with its blocks, which must tile it in address order
 * from seg->addr (-EINVAL otherwise, nothing added). The segment's own
 * totals are not read: they are summed from the blocks. */
int gm_snapshot_data_add_segment(gm_snapshot_data_t *d, uint32_t owner, const gm_segment_info_t *seg,
                                 const gm_block_info_t *blocks, size_t n_blocks);
/* Copies the entries of h (with their frames), oldest first; only_owned
 * keeps only entries whose pid is an owner's added so far. */
int gm_snapshot_data_add_history(gm_snapshot_data_t *d, const gm_history_t *h, bool only_owned);
/* Adds one trace entry with a copy of its frames. */
int gm_snapshot_data_add_trace(gm_snapshot_data_t *d, const gm_history_entry_t *e, const gm_frame_t *frames,
                               size_t n_frames);
/* Shared objects' segments are placed from here up (each on an address of
 * its own, below 2^53); everything else stays below. */
#define GM_SNAPSHOT_SHARED_BASE (1ull << 52)

/* A session that maps a shared object. */
typedef struct gm_snapshot_mapper {
        uint32_t pid;
        uint64_t session_id;
        const char *tenant;
} gm_snapshot_mapper_t;

/* A shared object (the daemon's, not a process's heap; strings are copied). */
typedef struct gm_snapshot_shared {
        const char *name;
        uint64_t version;   /* 0 while staging */
        const char *tenant; /* charged for it: its publisher's */
        const char *state;  /* "staging", "published" or "withdrawn" */
        uint64_t size;
        const gm_snapshot_mapper_t *mappers; /* those the snapshot may show */
        size_t n_mappers;
} gm_snapshot_shared_t;

/* Adds a shared object once, whoever maps it: one segment of one active
 * block at the next address from GM_SNAPSHOT_SHARED_BASE, owned by pid 0
 * and its tenant, written with `gpumemd_shared` (name, version, state and
 * its mappers' pids, sessions and tenants; PyTorch's viewers ignore it).
 * -EINVAL (size 0, or past 2^53), -ENOMEM. */
int gm_snapshot_data_add_shared(gm_snapshot_data_t *d, const gm_snapshot_shared_t *s);
size_t gm_snapshot_data_blocks(const gm_snapshot_data_t *d);
size_t gm_snapshot_data_traces(const gm_snapshot_data_t *d);

typedef struct gm_snapshot_options {
        int device; /* >= 0 */
        gm_snapshot_format_t format;
        gm_snapshot_category_t category; /* 2.x formats only */
        bool process_frames;             /* name each block's and trace entry's process in an
                                          * outermost frame ("pid N (command)") */
        uint64_t now_us;                 /* time of the closing `snapshot` trace entry written
                                          * with categories (it carries "unknown", which
                                          * MemoryViz needs once any category is present) */
        size_t max_bytes;                /* the output's limit: -EFBIG beyond it; 0 = none */
        const gm_alloc_config_t *config; /* allocator_settings */
} gm_snapshot_options_t;

/* Renders d (whose segments it sorts by address). -EINVAL, -ENOMEM, -EFBIG. */
int gm_snapshot_render(gm_snapshot_data_t *d, const gm_snapshot_options_t *o, char **ret_buf, size_t *ret_len);

/* ---- a local session's answer: its heap and trace, from libgpumem to the daemon ----
 *
 * A flat little-endian record file (header, segments, blocks, trace entries,
 * frames, strings), written by the client into a memfd. The daemon treats
 * it as untrusted: gm_snapshot_data_add_answer() checks every count, size,
 * offset and string against the buffer's length, the limits and the pieces
 * the daemon granted, and adds nothing unless all of it holds. */

/* Encodes heap's segments and blocks and the entries of h (NULL: none);
 * *ret_buf is freed with free(). -EFBIG beyond max_bytes (0: no limit). */
int gm_snapshot_answer_encode(const gm_heap_t *heap, const gm_history_t *h, size_t max_bytes, char **ret_buf,
                              size_t *ret_len);

/* A piece the daemon granted the session: `size` bytes at `offset` of
 * segment `segment_id`, whose virtual range is `va_size` bytes. */
typedef struct gm_snapshot_piece {
        uint64_t segment_id, va_size, offset, size;
} gm_snapshot_piece_t;

typedef struct gm_snapshot_answer_limits {
        const gm_snapshot_piece_t *pieces; /* sorted by segment_id, then offset */
        size_t n_pieces;
        uint64_t max_va_span; /* the client's addresses lie below this */
        size_t max_blocks;    /* segments + blocks + trace entries, all together */
        uint32_t pid;         /* the session's process: every trace entry is its */
} gm_snapshot_answer_limits_t;

/* The most frames one answered trace entry may carry. */
#define GM_SNAPSHOT_ANSWER_MAX_FRAMES 64

/* Validates an answer and adds it under `owner`: each of its addresses
 * (below the span it declares) is moved up by `base`, each segment must be
 * made of pieces of lim->pieces, segments may not overlap, blocks must tile
 * them, trace entries name lim->pid and keep their order. *ret_span is the
 * declared span (the address window the answer used). -EBADMSG for an
 * answer that fails a check, -E2BIG beyond lim->max_blocks, -ENOMEM; on
 * failure nothing is added. */
int gm_snapshot_data_add_answer(gm_snapshot_data_t *d, uint32_t owner, const void *buf, size_t len,
                                const gm_snapshot_answer_limits_t *lim, uint64_t base, uint64_t *ret_span);

/* Adds pieces (sorted as in the limits) as segments of one active block
 * each, one per run of contiguous pieces of a segment, laid out from `base`
 * in that order; *ret_span is the window used. For a session whose blocks
 * are not known (an owner with blocks_unknown). */
int gm_snapshot_data_add_pieces(gm_snapshot_data_t *d, uint32_t owner, const gm_snapshot_piece_t *pieces,
                                size_t n_pieces, uint64_t base, uint64_t *ret_span);
