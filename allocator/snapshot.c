/* Memory snapshots: see snapshot.h. The heaps are walked into one flat table
 * first (segments of all heaps must come out sorted by address), then the
 * whole tree is written with a gm_pickler_t. Segment totals are summed from
 * the blocks, as PyTorch does, so total_size always equals the sum of the
 * block sizes. */
#include "snapshot.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "pickle.h"

typedef struct seg_rec {
        gm_segment_info_t info;
        const gm_snapshot_heap_t *owner;
        size_t first_block, n_blocks; /* range in collector_t.blocks */
} seg_rec_t;

typedef struct collector {
        seg_rec_t *segs;
        size_t n_segs, cap_segs;
        gm_block_info_t *blocks;
        size_t n_blocks, cap_blocks;
        const gm_snapshot_heap_t *owner; /* heap being walked */
        int error;
} collector_t;

/* The stack of the newest `alloc` trace entry at an address: a live block's
 * frames, as PyTorch records them at allocation. Addresses are unique on the
 * device (one VA cursor), so the address names the block. */
typedef struct alloc_frames {
        uint64_t addr;
        size_t seq;               /* entry order: the newest entry at an address wins */
        const gm_frame_t *frames; /* the history's, valid while it is not modified */
        size_t n_frames;
} alloc_frames_t;

typedef struct frames_index {
        alloc_frames_t *items;
        size_t n, cap;
        int error;
} frames_index_t;

typedef struct trace_ctx {
        gm_pickler_t *w;
        const uint32_t *pids; /* sorted; NULL = keep every entry */
        size_t n_pids;
} trace_ctx_t;

/* Makes room for one more element in *arr. */
static bool grow(void **arr, size_t *cap, size_t n, size_t elem) {
        if (n < *cap)
                return true;
        size_t ncap = *cap ? *cap * 2 : 64;
        if (ncap > SIZE_MAX / elem)
                return false;
        void *p = realloc(*arr, ncap * elem);
        if (!p)
                return false;
        *arr = p;
        *cap = ncap;
        return true;
}

static void collect_segment(const gm_segment_info_t *seg, void *userdata) {
        collector_t *c = userdata;

        if (c->error != 0)
                return;
        if (!grow((void **) &c->segs, &c->cap_segs, c->n_segs, sizeof(*c->segs))) {
                c->error = -ENOMEM;
                return;
        }
        c->segs[c->n_segs++] = (seg_rec_t){.info = *seg, .owner = c->owner, .first_block = c->n_blocks};
}

static void collect_block(const gm_segment_info_t *seg, const gm_block_info_t *block, void *userdata) {
        collector_t *c = userdata;

        if (c->error != 0)
                return;
        if (!grow((void **) &c->blocks, &c->cap_blocks, c->n_blocks, sizeof(*c->blocks))) {
                c->error = -ENOMEM;
                return;
        }
        seg_rec_t *s = &c->segs[c->n_segs - 1];
        assert(s->info.id == seg->id);
        /* The walk's contract: blocks tile their segment in address order. */
        assert(block->addr ==
               (s->n_blocks == 0 ? s->info.addr : c->blocks[c->n_blocks - 1].addr + c->blocks[c->n_blocks - 1].size));
        c->blocks[c->n_blocks++] = *block;
        s->n_blocks++;
}

static int cmp_seg_addr(const void *a, const void *b) {
        const seg_rec_t *x = a, *y = b;
        return (x->info.addr > y->info.addr) - (x->info.addr < y->info.addr);
}

static int cmp_u32(const void *a, const void *b) {
        uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
        return (x > y) - (x < y);
}

static const char *state_name(gm_block_state_t state) {
        switch (state) {
        case GM_BLOCK_ACTIVE_ALLOCATED:
                return "active_allocated";
        case GM_BLOCK_ACTIVE_PENDING_FREE:
                return "active_pending_free";
        default:
                return "inactive";
        }
}

static void key_uint(gm_pickler_t *w, const char *key, uint64_t v) {
        gm_pickler_key(w, key);
        gm_pickler_uint(w, v);
}

static void key_empty_list(gm_pickler_t *w, const char *key) {
        gm_pickler_key(w, key);
        gm_pickler_begin_list(w);
        gm_pickler_end_list(w);
}

static void key_frames(gm_pickler_t *w, const gm_frame_t *frames, size_t n_frames) {
        gm_pickler_key(w, "frames");
        gm_pickler_begin_list(w);
        for (size_t i = 0; i < n_frames; i++) {
                gm_pickler_begin_dict(w);
                gm_pickler_key(w, "filename");
                gm_pickler_str(w, frames[i].filename);
                key_uint(w, "line", frames[i].line);
                gm_pickler_key(w, "name");
                gm_pickler_str(w, frames[i].name);
                gm_pickler_end_dict(w);
        }
        gm_pickler_end_list(w);
}

static void index_alloc_frames(const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames, void *userdata) {
        frames_index_t *x = userdata;
        if (x->error || e->action != GM_TRACE_ALLOC)
                return;
        if (!grow((void **) &x->items, &x->cap, x->n, sizeof(*x->items))) {
                x->error = -ENOMEM;
                return;
        }
        x->items[x->n] = (alloc_frames_t){.addr = e->addr, .seq = x->n, .frames = frames, .n_frames = n_frames};
        x->n++;
}

static int cmp_alloc_frames(const void *a, const void *b) {
        const alloc_frames_t *x = a, *y = b;
        if (x->addr != y->addr)
                return (x->addr > y->addr) - (x->addr < y->addr);
        return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Address -> frames of the newest alloc entry there, sorted by address. */
static int frames_index_build(frames_index_t *x, const gm_history_t *h) {
        if (h)
                gm_history_foreach(h, index_alloc_frames, x);
        if (x->error)
                return x->error;
        if (x->n > 1) /* items is NULL when empty, and one item is sorted */
                qsort(x->items, x->n, sizeof(*x->items), cmp_alloc_frames);
        size_t k = 0;
        for (size_t i = 0; i < x->n; i++) {
                if (k > 0 && x->items[k - 1].addr == x->items[i].addr)
                        k--; /* a newer allocation at the same address replaces it */
                x->items[k++] = x->items[i];
        }
        x->n = k;
        return 0;
}

static const alloc_frames_t *frames_find(const frames_index_t *x, uint64_t addr) {
        size_t lo = 0, hi = x->n;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (x->items[mid].addr < addr)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo < x->n && x->items[lo].addr == addr ? &x->items[lo] : NULL;
}

static void write_segment(gm_pickler_t *w, int device, const seg_rec_t *s, const gm_block_info_t *blocks,
                          const frames_index_t *frames) {
        static const int64_t default_pool[2] = {0, 0};
        uint64_t total = 0, allocated = 0, active = 0, requested = 0;

        for (size_t i = 0; i < s->n_blocks; i++) {
                const gm_block_info_t *b = &blocks[i];
                total += b->size;
                if (b->state == GM_BLOCK_ACTIVE_ALLOCATED)
                        allocated += b->size;
                if (b->state != GM_BLOCK_INACTIVE) {
                        active += b->size;
                        requested += b->requested_size;
                }
        }
        assert(total == s->info.size);

        gm_pickler_begin_dict(w);
        gm_pickler_key(w, "device");
        gm_pickler_int(w, device);
        key_uint(w, "address", s->info.addr);
        key_uint(w, "total_size", total);
        key_uint(w, "allocated_size", allocated);
        key_uint(w, "active_size", active);
        key_uint(w, "requested_size", requested);
        key_uint(w, "stream", s->info.stream);
        gm_pickler_key(w, "segment_type");
        gm_pickler_str(w, s->info.small_pool ? "small" : "large");
        gm_pickler_key(w, "segment_pool_id");
        gm_pickler_tuple_ints(w, default_pool, 2);
        gm_pickler_key(w, "is_expandable");
        gm_pickler_bool(w, s->info.expandable);
        key_empty_list(w, "frames");
        gm_pickler_key(w, "blocks");
        gm_pickler_begin_list(w);
        for (size_t i = 0; i < s->n_blocks; i++) {
                const gm_block_info_t *b = &blocks[i];
                gm_pickler_begin_dict(w);
                key_uint(w, "address", b->addr);
                key_uint(w, "size", b->size);
                key_uint(w, "requested_size", b->requested_size);
                gm_pickler_key(w, "state");
                gm_pickler_str(w, state_name(b->state));
                const alloc_frames_t *f = b->state != GM_BLOCK_INACTIVE ? frames_find(frames, b->addr) : NULL;
                key_frames(w, f ? f->frames : NULL, f ? f->n_frames : 0);
                gm_pickler_end_dict(w);
        }
        gm_pickler_end_list(w);
        key_uint(w, "pid", s->owner->pid);
        gm_pickler_key(w, "tenant");
        gm_pickler_str(w, s->owner->tenant ? s->owner->tenant : "");
        key_uint(w, "session_id", s->owner->session_id);
        gm_pickler_end_dict(w);
}

static void write_trace_entry(const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames, void *userdata) {
        const trace_ctx_t *t = userdata;
        gm_pickler_t *w = t->w;
        const char *action = gm_trace_action_name(e->action);

        if (t->pids && !bsearch(&e->pid, t->pids, t->n_pids, sizeof(*t->pids), cmp_u32))
                return;
        gm_pickler_begin_dict(w);
        gm_pickler_key(w, "action");
        gm_pickler_str(w, action ? action : "unknown");
        key_uint(w, e->action == GM_TRACE_OOM ? "device_free" : "addr", e->addr);
        key_uint(w, "size", e->size);
        key_uint(w, "stream", e->stream);
        key_uint(w, "time_us", e->time_us);
        if (n_frames > 0)
                key_frames(w, frames, n_frames);
        key_uint(w, "pid", e->pid);
        gm_pickler_end_dict(w);
}

static void write_traces(gm_pickler_t *w, const gm_snapshot_source_t *src, const uint32_t *pids) {
        trace_ctx_t t = {.w = w, .pids = pids, .n_pids = src->n_heaps};

        gm_pickler_begin_list(w);
        for (int d = 0; d < src->device; d++) {
                gm_pickler_begin_list(w);
                gm_pickler_end_list(w);
        }
        gm_pickler_begin_list(w);
        if (src->history)
                gm_history_foreach(src->history, write_trace_entry, &t);
        gm_pickler_end_list(w);
        gm_pickler_end_list(w);
}

static void write_settings(gm_pickler_t *w, const gm_alloc_config_t *c) {
        gm_pickler_begin_dict(w);
        gm_pickler_key(w, "PYTORCH_CUDA_ALLOC_CONF");
        gm_pickler_str(w, c->raw);
        gm_pickler_key(w, "max_split_size");
        gm_pickler_int(w, c->max_split_size == UINT64_MAX ? -1 : (int64_t) c->max_split_size);
        gm_pickler_key(w, "garbage_collection_threshold");
        gm_pickler_double(w, c->garbage_collection_threshold);
        gm_pickler_key(w, "expandable_segments");
        gm_pickler_bool(w, c->expandable_segments);
        if (c->page_reuse) { /* gpumemd extension: absent unless set, so default snapshots match PyTorch's */
                gm_pickler_key(w, "gpumemd_page_reuse");
                gm_pickler_bool(w, true);
        }
        gm_pickler_key(w, "release_lock_on_cudamalloc");
        gm_pickler_bool(w, c->release_lock_on_cudamalloc);
        gm_pickler_key(w, "pinned_use_cuda_host_register");
        gm_pickler_bool(w, c->pinned_use_cuda_host_register);
        gm_pickler_key(w, "pinned_num_register_threads");
        gm_pickler_uint(w, c->pinned_num_register_threads);
        /* Slot i governs sizes from 2^i MiB: keys "1", "2", ..., "32768". */
        gm_pickler_key(w, "roundup_power2_divisions");
        gm_pickler_begin_dict(w);
        for (unsigned i = 0; i < GM_ROUNDUP_SLOTS; i++) {
                char key[8];
                snprintf(key, sizeof(key), "%u", 1u << i);
                gm_pickler_key(w, key);
                gm_pickler_uint(w, c->roundup_power2_divisions[i]);
        }
        gm_pickler_end_dict(w);
        gm_pickler_end_dict(w);
}

int gm_snapshot_write(const gm_snapshot_source_t *src, gm_snapshot_format_t fmt, char **ret_buf, size_t *ret_len) {
        collector_t c = {0};
        frames_index_t frames = {0};
        uint32_t *pids = NULL;
        gm_pickler_t w;
        int r;

        if (!src || src->device < 0 || !src->config || (src->n_heaps > 0 && !src->heaps) ||
            (unsigned) fmt >= _GM_SNAPSHOT_FORMAT_MAX)
                return -EINVAL;
        for (size_t i = 0; i < src->n_heaps; i++)
                if (!src->heaps[i].heap)
                        return -EINVAL;

        const gm_heap_visitor_t visitor = {
                .segment_fn = collect_segment,
                .block_fn = collect_block,
                .userdata = &c,
        };
        for (size_t i = 0; i < src->n_heaps && c.error == 0; i++) {
                c.owner = &src->heaps[i];
                gm_heap_walk(src->heaps[i].heap, &visitor);
        }
        r = c.error;
        if (r < 0)
                goto finish;
        if (c.n_segs > 1)
                qsort(c.segs, c.n_segs, sizeof(*c.segs), cmp_seg_addr);
        r = frames_index_build(&frames, src->history);
        if (r < 0)
                goto finish;

        if (src->only_heap_pids) {
                pids = calloc(src->n_heaps + 1, sizeof(*pids));
                if (!pids) {
                        r = -ENOMEM;
                        goto finish;
                }
                for (size_t i = 0; i < src->n_heaps; i++)
                        pids[i] = src->heaps[i].pid;
                qsort(pids, src->n_heaps, sizeof(*pids), cmp_u32);
        }

        r = gm_pickler_init(&w, fmt == GM_SNAPSHOT_JSON ? GM_PICKLE_FORMAT_JSON : GM_PICKLE_FORMAT_PICKLE);
        if (r < 0)
                goto finish;
        gm_pickler_begin_dict(&w);
        gm_pickler_key(&w, "segments");
        gm_pickler_begin_list(&w);
        for (size_t i = 0; i < c.n_segs; i++)
                write_segment(&w, src->device, &c.segs[i], c.blocks + c.segs[i].first_block, &frames);
        gm_pickler_end_list(&w);
        gm_pickler_key(&w, "device_traces");
        write_traces(&w, src, pids);
        gm_pickler_key(&w, "allocator_settings");
        write_settings(&w, src->config);
        key_empty_list(&w, "external_annotations");
        gm_pickler_end_dict(&w);
        r = gm_pickler_finish(&w, ret_buf, ret_len);
finish:
        free(frames.items);
        free(pids);
        free(c.blocks);
        free(c.segs);
        return r;
}
