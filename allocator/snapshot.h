/* Memory snapshots in PyTorch's 2.x torch.cuda.memory._snapshot() schema,
 * written as a protocol-2 pickle (loadable by pickle.load, _memory_viz.py and
 * MemoryViz.js) or as JSON with the same tree.
 *
 * Top level: `segments` (every heap's segments, sorted by address, with their
 * blocks and the extra keys `pid`, `tenant`, `session_id`), `device_traces`
 * (device + 1 lists; the last holds the history oldest to newest, each entry
 * with the extra key `pid`), `allocator_settings` and `external_annotations`
 * (always empty). A live block's `frames` are those of the newest `alloc`
 * entry at its address still in the history (else empty). Pure C, no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator.h"
#include "alloc_conf.h"
#include "history.h"

typedef enum gm_snapshot_format {
        GM_SNAPSHOT_PICKLE,
        GM_SNAPSHOT_JSON,
        _GM_SNAPSHOT_FORMAT_MAX,
} gm_snapshot_format_t;

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
