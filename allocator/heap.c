/* The caching allocator core: PyTorch's native CUDA caching-allocator policy
 * (c10/cuda/CUDACachingAllocator.cpp) over a gm_provider_t.
 *
 * Invariants (gm_heap_check() verifies them all): the blocks of a segment tile
 * it exactly; no two neighbouring free blocks share a mapped state; every free
 * mapped block is in its pool's free set and every free unmapped range in its
 * pool's unmapped set, nothing else is; every live block is in the id map; the
 * heap's own statistics equal a recount of the structures. Segment addresses
 * come from a monotonic shared cursor, so the segment list (creation order) is
 * also address order. The cheap per-step halves of these invariants are
 * gm_dassert()s on the paths that change them (common/debug.h). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "allocator.h"
#include "debug.h"
#include "heap-internal.h"

#define MIN_BLOCK_SIZE 512ULL         /* every block is a multiple of this */
#define SMALL_SIZE (1ULL << 20)       /* largest request served by the small pool */
#define SMALL_BUFFER (2ULL << 20)     /* small-pool segment and expandable page size */
#define LARGE_BUFFER (20ULL << 20)    /* segment for 1-10 MiB requests, large expandable page */
#define MIN_LARGE_ALLOC (10ULL << 20) /* from here segments are the request rounded to 2 MiB */
#define ROUND_LARGE (2ULL << 20)      /* that rounding; also synthetic address alignment */
#define MAX_REQUEST (1ULL << 60)      /* PyTorch refuses "more than 1EB" */
#define SPARE_BLOCKS 64               /* block structs kept for reuse */
#define ALLOC_BLOCKS 4                /* most block structs one alloc_block + split needs */
#define REUSE_STREAMS 64              /* streams whose completed work page reuse tracks */

typedef struct pool {
        gm_tnode_t *free_set; /* free mapped blocks by (stream, size, addr) */
        gm_tnode_t *unmapped; /* free unmapped ranges by (stream, 0, addr) */
        uint64_t gc_calls;    /* get_free_block calls while GC is active */
        bool small;
        uint8_t tag; /* every segment of the pool carries it */
} pool_t;

/* Page reuse: what is known of a stream's device work. */
typedef struct reuse_stream {
        uint64_t stream;
        uint64_t done_seq;    /* every free up to this free count has its work done */
        uint64_t asked_alloc; /* the allocation (h->n_allocs) that last asked the provider */
} reuse_stream_t;

struct gm_heap {
        gm_alloc_config_t cfg;
        gm_provider_t prov;
        gm_heap_params_t params;
        gm_stats_t *stats; /* own_stats, or the params' home */
        gm_stats_t own_stats;
        gm_stats_t *sinks[4]; /* stats, then the params' extra sinks */
        size_t n_sinks;
        /* [tag][1] small, [tag][0] large: a tag's blocks come only from its
         * own pools, so two tags never share a segment */
        pool_t pools[GM_HEAP_MAX_TAGS][2];
        unsigned n_tags;        /* tags 0 .. n_tags-1 have been used (>= 1) */
        uint32_t held_tags;     /* bit t: tag t is held (gm_heap_hold_tags()), within GM_HEAP_ALL_TAGS */
        gm_stats_t *tag_stats;  /* per tag, from the first tagged allocation on (NULL: only tag 0 so far) */
        bool tag_stats_stopped; /* gm_heap_move_stats() left the params' tag_stats without a copy */
        gm_segment_t *seg_head, *seg_tail;
        gm_idmap_t live;
        gm_block_t *spare; /* spare block structs, linked through next */
        uint64_t n_spare;
        uint64_t next_block_id, next_segment_id;
        uint64_t limit; /* gm_heap_set_limit(); 0 = none */
        const gm_stats_t *limit_measured;
        /* page reuse */
        uint64_t free_seq;       /* free_block() calls so far */
        uint64_t n_allocs;       /* gm_heap_alloc() calls so far */
        reuse_stream_t *streams; /* REUSE_STREAMS at most */
        uint64_t n_streams;
        gm_page_reuse_info_t reuse;            /* counters (flags are computed on demand) */
        uint64_t refused_size, refused_stream; /* the last refusal (defer_oom: traced when counted) */
        bool refusal_uncounted;                /* the last gm_heap_alloc() was refused, not yet counted */
        bool holding;                          /* this allocation releases and moves nothing (may_release) */
};

static const char *const trace_names[_GM_TRACE_ACTION_MAX] = {
        [GM_TRACE_ALLOC] = "alloc",
        [GM_TRACE_FREE_REQUESTED] = "free_requested",
        [GM_TRACE_FREE_COMPLETED] = "free_completed",
        [GM_TRACE_SEGMENT_ALLOC] = "segment_alloc",
        [GM_TRACE_SEGMENT_FREE] = "segment_free",
        [GM_TRACE_SEGMENT_MAP] = "segment_map",
        [GM_TRACE_SEGMENT_UNMAP] = "segment_unmap",
        [GM_TRACE_SNAPSHOT] = "snapshot",
        [GM_TRACE_OOM] = "oom",
};

const char *gm_trace_action_name(int action) {
        if (action < 0 || action >= _GM_TRACE_ACTION_MAX)
                return NULL;
        return trace_names[action];
}

/* ---- statistics: the heap's own plus every extra sink ---- */

/* Inline, all of them: an allocation or a free makes five to seven updates,
 * each on every sink of h->sinks (the heap's own statistics first). */
static void sinks_refresh(gm_heap_t *h) {
        h->sinks[0] = h->stats;
        h->n_sinks = 1;
        for (size_t i = 0; i < 3 && h->params.extra_sinks[i]; i++)
                h->sinks[h->n_sinks++] = h->params.extra_sinks[i];
}

static inline void stat_pool_one(gm_stats_t *sink, size_t off, gm_stat_type_t pool, int64_t delta) {
        gm_stat_t *a = (gm_stat_t *) ((char *) sink + off);

        gm_stat_update(&a[GM_STAT_ALL], delta);
        gm_stat_update(&a[pool], delta);
}

/* Every sink, then segment s's tag where tags are counted. */
static inline void stat_pool(gm_heap_t *h, size_t off, const gm_segment_t *s, int64_t delta) {
        gm_stat_type_t pool = s->small ? GM_STAT_SMALL_POOL : GM_STAT_LARGE_POOL;

        if (!delta)
                return;
        for (size_t i = 0; i < h->n_sinks; i++)
                stat_pool_one(h->sinks[i], off, pool, delta);
        if (h->tag_stats)
                stat_pool_one(&h->tag_stats[s->tag], off, pool, delta);
}

static inline void stat_single(gm_heap_t *h, size_t off, const gm_segment_t *s, int64_t delta) {
        for (size_t i = 0; i < h->n_sinks; i++)
                gm_stat_update((gm_stat_t *) ((char *) h->sinks[i] + off), delta);
        if (h->tag_stats)
                gm_stat_update((gm_stat_t *) ((char *) &h->tag_stats[s->tag] + off), delta);
}

static inline void count_event(gm_heap_t *h, size_t off) {
        for (size_t i = 0; i < h->n_sinks; i++)
                (*(int64_t *) ((char *) h->sinks[i] + off))++;
}

/* The figures every handout and every free_block() moves, one pass over the
 * sinks for them all (sign = +1 for a handout, -1 for a completed free). */
static inline void stat_block_one(gm_stats_t *s, gm_stat_type_t pool, int sign, uint64_t size, uint64_t requested) {
        if (sign > 0) { /* allocation and allocated_bytes drop at free_request() */
                gm_stat_update(&s->allocation[GM_STAT_ALL], 1);
                gm_stat_update(&s->allocation[pool], 1);
                gm_stat_update(&s->allocated_bytes[GM_STAT_ALL], (int64_t) size);
                gm_stat_update(&s->allocated_bytes[pool], (int64_t) size);
        }
        gm_stat_update(&s->active[GM_STAT_ALL], sign);
        gm_stat_update(&s->active[pool], sign);
        gm_stat_update(&s->active_bytes[GM_STAT_ALL], sign * (int64_t) size);
        gm_stat_update(&s->active_bytes[pool], sign * (int64_t) size);
        gm_stat_update(&s->requested_bytes[GM_STAT_ALL], sign * (int64_t) requested);
        gm_stat_update(&s->requested_bytes[pool], sign * (int64_t) requested);
}

static inline void stat_block(gm_heap_t *h, const gm_segment_t *seg, int sign, uint64_t size, uint64_t requested) {
        gm_stat_type_t pool = seg->small ? GM_STAT_SMALL_POOL : GM_STAT_LARGE_POOL;

        for (size_t i = 0; i < h->n_sinks; i++)
                stat_block_one(h->sinks[i], pool, sign, size, requested);
        if (h->tag_stats)
                stat_block_one(&h->tag_stats[seg->tag], pool, sign, size, requested);
}

#define STAT(h, field, seg, delta) stat_pool(h, offsetof(gm_stats_t, field), seg, (int64_t) (delta))
#define STAT1(h, field, seg, delta) stat_single(h, offsetof(gm_stats_t, field), seg, (int64_t) (delta))
#define COUNT(h, field) count_event(h, offsetof(gm_stats_t, field))

static void trace(gm_heap_t *h, int action, uint64_t addr, uint64_t size, uint64_t stream) {
        if (h->prov.trace)
                h->prov.trace(h->prov.userdata, action, addr, size, stream);
}

/* ---- sizes ---- */

static unsigned log2_floor(uint64_t v) {
        return 63 - (unsigned) __builtin_clzll(v);
}

static uint64_t round_up(uint64_t v, uint64_t to) {
        return (v + to - 1) / to * to;
}

/* PyTorch's round_size(): 512 granularity, or power-of-two divisions when the
 * size's slot has d > 1 and the size exceeds 512 * d. */
static uint64_t round_size(const gm_alloc_config_t *c, uint64_t n) {
        unsigned slot;
        uint64_t d, floor2, step;

        if (n < MIN_BLOCK_SIZE)
                return MIN_BLOCK_SIZE;
        slot = log2_floor(n) > 20 ? log2_floor(n) - 20 : 0;
        if (slot >= GM_ROUNDUP_SLOTS)
                slot = GM_ROUNDUP_SLOTS - 1;
        d = c->roundup_power2_divisions[slot];
        if (d <= 1 || n <= MIN_BLOCK_SIZE * d)
                return round_up(n, MIN_BLOCK_SIZE);
        if (!(n & (n - 1)))
                return n;
        floor2 = 1ULL << log2_floor(n);
        step = floor2 >> log2_floor(d);
        if (!step)
                return floor2 << 1;
        return round_up(n, step);
}

/* Physical sizes are multiples of the backend's granularity: PyTorch's
 * constants where it divides them (2 MiB on every NVIDIA GPU so far), else
 * rounded up to it. */
static uint64_t physical_unit(const gm_heap_t *h) {
        return h->params.granularity > ROUND_LARGE ? h->params.granularity : ROUND_LARGE;
}

static uint64_t small_buffer(const gm_heap_t *h) {
        return round_up(SMALL_BUFFER, physical_unit(h));
}

static uint64_t large_buffer(const gm_heap_t *h) {
        return round_up(LARGE_BUFFER, physical_unit(h));
}

/* PyTorch's get_allocation_size(): the size of a new segment for a rounded request. */
static uint64_t allocation_size(const gm_heap_t *h, uint64_t rsize) {
        if (rsize <= SMALL_SIZE)
                return small_buffer(h);
        if (rsize < MIN_LARGE_ALLOC)
                return large_buffer(h);
        return round_up(rsize, physical_unit(h));
}

void gm_heap_sizes_for(const gm_heap_t *h, uint64_t size, uint64_t *ret_block_size, uint64_t *ret_segment_size) {
        uint64_t rsize = round_size(&h->cfg, size);
        *ret_block_size = rsize;
        *ret_segment_size = allocation_size(h, rsize);
}

/* ---- block structs: a small spare list keeps the hot paths free of malloc failures ---- */

static int reserve_blocks(gm_heap_t *h, uint64_t n) {
        while (h->n_spare < n) {
                gm_block_t *b = malloc(sizeof(*b));

                if (!b)
                        return -ENOMEM;
                b->next = h->spare;
                h->spare = b;
                h->n_spare++;
        }
        return 0;
}

/* Takes a zeroed block struct; one must have been reserved. */
static gm_block_t *block_new(gm_heap_t *h, gm_segment_t *s, uint64_t offset, uint64_t size, bool mapped) {
        gm_block_t *b = h->spare;

        gm_dassert(b && h->n_spare > 0);
        gm_dassert(size > 0 && size % MIN_BLOCK_SIZE == 0 && offset % MIN_BLOCK_SIZE == 0);
        gm_dassert(offset < s->size && size <= s->size - offset);
        h->spare = b->next;
        h->n_spare--;
        *b = (gm_block_t){.seg = s, .offset = offset, .size = size, .mapped = mapped};
        return b;
}

/* Only free blocks go: a live one would leave a dangling id map entry. */
static void block_drop(gm_heap_t *h, gm_block_t *b) {
        gm_dassert(b->state == GM_BSTATE_FREE && b->id == 0);
        if (h->n_spare >= SPARE_BLOCKS) {
                free(b);
                return;
        }
        b->next = h->spare;
        h->spare = b;
        h->n_spare++;
}

/* Links `n` into its segment right after `b`. */
static void link_after(gm_block_t *b, gm_block_t *n) {
        gm_dassert(n->seg == b->seg && n->offset > b->offset);
        n->prev = b;
        n->next = b->next;
        if (b->next)
                b->next->prev = n;
        b->next = n;
}

/* Links `n` into its segment right before `b`. */
static void link_before(gm_block_t *b, gm_block_t *n) {
        gm_dassert(n->seg == b->seg && n->offset <= b->offset);
        if (b->prev) {
                link_after(b->prev, n);
                return;
        }
        n->next = b;
        b->prev = n;
        b->seg->first = n;
}

static gm_block_t *block_of(gm_tnode_t *n) {
        return n ? (gm_block_t *) ((char *) n - offsetof(gm_block_t, node)) : NULL;
}

static uint64_t block_addr(const gm_block_t *b) {
        return b->seg->addr + b->offset;
}

static bool is_split(const gm_block_t *b) {
        return b->prev || b->next;
}

static pool_t *pool_of(gm_heap_t *h, const gm_segment_t *s) {
        return &h->pools[s->tag][s->small];
}

static void free_key(const gm_block_t *b, uint64_t key[3]) {
        key[0] = b->seg->stream;
        key[1] = b->size;
        key[2] = block_addr(b);
}

/* The address is the last word, so the subtree maxima of key[1] stay 0 and
 * an unmapped block may move its start in place (unmapped_rekey()). */
static void unmapped_key(const gm_block_t *b, uint64_t key[3]) {
        key[0] = b->seg->stream;
        key[1] = 0;
        key[2] = block_addr(b);
}

/* Whether `b` sits under the key its fields give (in its set, the key is
 * current: a block changes size, start or mapping only outside its set). */
static bool key_current(const gm_block_t *b) {
        uint64_t key[3];

        if (b->mapped)
                free_key(b, key);
        else
                unmapped_key(b, key);
        return memcmp(key, b->node.key, sizeof(key)) == 0;
}

/* Puts a free block into its pool's set (free set when mapped, else unmapped). */
static void set_insert(gm_heap_t *h, gm_block_t *b) {
        pool_t *p = pool_of(h, b->seg);

        gm_dassert(b->state == GM_BSTATE_FREE && b->id == 0);
        if (b->mapped) {
                free_key(b, b->node.key);
                b->gc_stamp = p->gc_calls;
                gm_tree_insert(&p->free_set, &b->node);
        } else {
                unmapped_key(b, b->node.key);
                gm_tree_insert(&p->unmapped, &b->node);
        }
}

static void set_remove(gm_heap_t *h, gm_block_t *b) {
        pool_t *p = pool_of(h, b->seg);

        gm_dassert(b->state == GM_BSTATE_FREE && key_current(b));
        gm_tree_remove(b->mapped ? &p->free_set : &p->unmapped, &b->node);
}

/* Refreshes the key of unmapped block `b` (in its set) after its start moved
 * within the range it covered before: no other unmapped block of the stream
 * lies in between, so the set's order holds without a remove and insert. */
static void unmapped_rekey(gm_block_t *b) {
        b->node.key[2] = block_addr(b);
}

static gm_tnode_t *tree_first(gm_tnode_t *root) {
        static const uint64_t zero[3];

        return gm_tree_lower_bound(root, zero);
}

/* ---- limits: memory fraction and gm_heap_set_limit() ---- */

static uint64_t reserved_total(const gm_stats_t *s) {
        return (uint64_t) s->reserved_bytes[GM_STAT_ALL].current;
}

static bool fraction_set(const gm_heap_t *h) {
        double f = h->cfg.per_process_memory_fraction;

        return f > 0 && f < 1;
}

static uint64_t fraction_allowed(const gm_heap_t *h) {
        return (uint64_t) (h->cfg.per_process_memory_fraction * (double) h->params.capacity);
}

static const gm_stats_t *limit_measured(const gm_heap_t *h) {
        return h->limit_measured ? h->limit_measured : h->stats;
}

/* Whether a new `size`-byte segment would exceed a limit, without asking the
 * provider: -ENOMEM for the memory fraction (PyTorch treats it as the device
 * being full), -EDQUOT for the gm_heap_set_limit() quota, 0 when it fits. */
static int over_limit(const gm_heap_t *h, uint64_t size) {
        if (fraction_set(h) && reserved_total(h->stats) + size > fraction_allowed(h))
                return -ENOMEM;
        if (h->limit && reserved_total(limit_measured(h)) + size > h->limit)
                return -EDQUOT;
        return 0;
}

static bool gc_active(const gm_heap_t *h) {
        return h->cfg.garbage_collection_threshold > 0 && (h->limit || fraction_set(h));
}

/* ---- segments ---- */

static uint64_t take_va(gm_heap_t *h, uint64_t size) {
        uint64_t addr = round_up(*h->params.va_cursor, physical_unit(h));

        *h->params.va_cursor = addr + round_up(size, physical_unit(h));
        return addr;
}

static void segment_link(gm_heap_t *h, gm_segment_t *s) {
        s->prev = h->seg_tail;
        if (h->seg_tail)
                h->seg_tail->next = s;
        else
                h->seg_head = s;
        h->seg_tail = s;
}

/* Forgets a segment: its free blocks leave their sets, its structs go. */
static void segment_forget(gm_heap_t *h, gm_segment_t *s) {
        gm_block_t *b, *next;

        for (b = s->first; b; b = next) {
                next = b->next;
                if (b->state == GM_BSTATE_FREE)
                        set_remove(h, b);
                block_drop(h, b);
        }
        if (s->prev)
                s->prev->next = s->next;
        else
                h->seg_head = s->next;
        if (s->next)
                s->next->prev = s->prev;
        else
                h->seg_tail = s->prev;
        free(s->page_handle);
        free(s->page_mapped);
        free(s);
}

/* cudaMalloc: a new ordinary segment of `size` bytes, returned as one free
 * block outside the pool's set. */
static int segment_alloc(gm_heap_t *h, pool_t *p, uint64_t stream, uint64_t size, gm_block_t **ret_block) {
        gm_segment_t *s = calloc(1, sizeof(*s));
        int r;

        if (!s)
                return -ENOMEM;
        s->id = h->next_segment_id++;
        r = h->prov.create(h->prov.userdata, s->id, size, 0, size, &s->handle);
        if (r < 0) {
                free(s);
                return r;
        }
        s->addr = take_va(h, size);
        s->size = size;
        s->stream = stream;
        s->small = p->small;
        s->tag = p->tag;
        s->first = block_new(h, s, 0, size, true);
        segment_link(h, s);
        STAT(h, segment, s, 1);
        STAT(h, reserved_bytes, s, size);
        if (size >= h->cfg.max_split_size) {
                s->oversize = true;
                STAT1(h, oversize_segments, s, 1);
        }
        COUNT(h, num_device_alloc);
        trace(h, GM_TRACE_SEGMENT_ALLOC, s->addr, size, stream);
        *ret_block = s->first;
        return 0;
}

/* cudaFree of an idle unsplit ordinary segment (`b` is its only block, free). */
static uint64_t release_block(gm_heap_t *h, gm_block_t *b) {
        gm_segment_t *s = b->seg;
        uint64_t id = s->id, size = s->size, handle = s->handle;

        gm_dassert(b->state == GM_BSTATE_FREE && !is_split(b) && !s->expandable && b->size == size);
        COUNT(h, num_device_free);
        trace(h, GM_TRACE_SEGMENT_FREE, s->addr, size, s->stream);
        STAT(h, segment, s, -1);
        STAT(h, reserved_bytes, s, -(int64_t) size);
        if (s->oversize)
                STAT1(h, oversize_segments, s, -1);
        segment_forget(h, s);
        h->prov.release(h->prov.userdata, id, 0, size, handle, true);
        return size;
}

/* Joins neighbour `src`, already outside any set, into `dst` and drops it;
 * returns the bytes taken over. The joined block keeps the newer free_seq. */
static uint64_t join(gm_heap_t *h, gm_block_t *dst, gm_block_t *src) {
        uint64_t size;

        gm_dassert(dst->state == GM_BSTATE_FREE && src->state == GM_BSTATE_FREE && src->mapped == dst->mapped);
        gm_dassert(src == dst->prev ? src->offset + src->size == dst->offset
                                    : src == dst->next && dst->offset + dst->size == src->offset);
        if (src == dst->prev) {
                dst->offset = src->offset;
                dst->prev = src->prev;
                if (dst->prev)
                        dst->prev->next = dst;
                else
                        dst->seg->first = dst;
        } else {
                dst->next = src->next;
                if (dst->next)
                        dst->next->prev = dst;
        }
        size = src->size;
        dst->size += size;
        if (src->free_seq > dst->free_seq)
                dst->free_seq = src->free_seq;
        block_drop(h, src);
        return size;
}

/* Merges free neighbour `src` into `dst` when both are free with the same
 * mapped state; returns the bytes taken over (0 = no merge). `dst` is outside
 * any set, or in the unmapped set when `src` follows it (that key, stream and
 * address, does not change). */
static uint64_t try_merge(gm_heap_t *h, gm_block_t *dst, gm_block_t *src) {
        if (!src || src->state != GM_BSTATE_FREE || src->mapped != dst->mapped)
                return 0;
        set_remove(h, src);
        return join(h, dst, src);
}

/* ---- expandable segments ---- */

static bool reuse_active(const gm_heap_t *h) {
        return h->cfg.expandable_segments && h->cfg.page_reuse && h->prov.remap;
}

/* Grows the page arrays of `s` to cover pages [0, end) (end <= n_pages),
 * so that a segment costs what it maps, not its virtual size. */
static int pages_reserve(gm_segment_t *s, uint64_t end) {
        uint64_t cap = s->cap_pages ? 2 * s->cap_pages : 64, *handles;
        uint8_t *mapped;

        if (end <= s->cap_pages)
                return 0;
        if (cap < end)
                cap = end;
        if (cap > s->n_pages)
                cap = s->n_pages;
        handles = realloc(s->page_handle, cap * sizeof(*handles));
        if (!handles)
                return -ENOMEM;
        s->page_handle = handles;
        mapped = realloc(s->page_mapped, cap * sizeof(*mapped));
        if (!mapped)
                return -ENOMEM;
        memset(mapped + s->cap_pages, 0, cap - s->cap_pages);
        s->page_mapped = mapped;
        s->cap_pages = cap;
        return 0;
}

static bool page_is_mapped(const gm_segment_t *s, uint64_t i) {
        return i < s->cap_pages && s->page_mapped[i];
}

/* Gives mapped pages [first, end) back, in one provider release_run() (or a
 * release() per page where it has none); the run carries whole_segment when
 * it is the segment's last. */
static void pages_release(gm_heap_t *h, gm_segment_t *s, uint64_t first, uint64_t end) {
        uint64_t page = s->page_size;

        gm_dassert(first < end && end <= s->cap_pages && s->mapped_pages >= end - first);
        memset(&s->page_mapped[first], 0, end - first);
        s->mapped_pages -= end - first;
        if (h->prov.release_run) {
                h->prov.release_run(h->prov.userdata, s->id, first * page, page, end - first, &s->page_handle[first],
                                    s->mapped_pages == 0);
                return;
        }
        for (uint64_t i = first; i < end; i++)
                h->prov.release(h->prov.userdata, s->id, i * page, page, s->page_handle[i],
                                s->mapped_pages == 0 && i + 1 == end);
}

/* A new expandable segment of the pool for `stream`: 1 1/8 of the device in
 * pages, all unmapped (one block in the unmapped set). */
static int expandable_new(gm_heap_t *h, pool_t *p, uint64_t stream, uint64_t min_size, gm_block_t **ret_block) {
        uint64_t page = p->small || reuse_active(h) ? small_buffer(h) : large_buffer(h);
        uint64_t n = (uint64_t) (((unsigned __int128) h->params.capacity * 9 + 8 * page - 1) / (8 * page));
        gm_segment_t *s;

        if (n == 0 || n * page < min_size)
                return -ENOMEM;
        s = calloc(1, sizeof(*s)); /* page arrays come with the first map_block() */
        if (!s)
                return -ENOMEM;
        s->id = h->next_segment_id++;
        s->size = n * page;
        s->addr = take_va(h, s->size);
        s->stream = stream;
        s->small = p->small;
        s->tag = p->tag;
        s->expandable = true;
        s->page_size = page;
        s->n_pages = n;
        s->first = block_new(h, s, 0, s->size, false);
        segment_link(h, s);
        set_insert(h, s->first);
        *ret_block = s->first;
        return 0;
}

/* Turns whole pages [begin, end) of free mapped block `b` into one unmapped
 * free block, joined with its unmapped neighbours (the one before takes it
 * over; it takes over the one after, so an unmapped block right after the
 * range survives only if it is the one before); what is left of `b` on either
 * side stays free and mapped. The pages themselves (page_mapped, handles,
 * the provider) are the caller's. Needs two spare block structs. */
static void unmap_range(gm_heap_t *h, gm_block_t *b, uint64_t begin, uint64_t end) {
        gm_segment_t *s = b->seg;
        uint64_t page = s->page_size, before = begin * page - b->offset, after = b->offset + b->size - end * page;
        gm_block_t *m = b;

        gm_dassert(b->state == GM_BSTATE_FREE && b->mapped && s->expandable && begin < end);
        gm_dassert(begin * page >= b->offset && end * page <= b->offset + b->size);
        set_remove(h, b);
        if (before) {
                gm_block_t *x = block_new(h, s, b->offset, before, true);

                x->free_seq = b->free_seq;
                link_before(b, x);
                set_insert(h, x);
        }
        if (after) {
                link_after(b, block_new(h, s, end * page, after, true));
                b->next->free_seq = b->free_seq;
                set_insert(h, b->next);
        }
        b->offset = begin * page;
        b->size = (end - begin) * page;
        b->mapped = false;
        STAT(h, reserved_bytes, s, -(int64_t) b->size);
        COUNT(h, num_device_free);
        trace(h, GM_TRACE_SEGMENT_UNMAP, block_addr(b), b->size, s->stream);
        set_insert(h, b);
        /* an unmapped block's key (stream, address) survives growing to the right */
        if (b->prev && b->prev->state == GM_BSTATE_FREE && !b->prev->mapped) {
                m = b->prev;
                try_merge(h, m, b);
        }
        try_merge(h, m, m->next);
}

/* Unmaps the pages that free mapped block `b` fully covers and gives them
 * back; the partial pages at either end stay as free mapped blocks. Returns
 * the bytes unmapped. */
static uint64_t unmap_block(gm_heap_t *h, gm_block_t *b) {
        gm_segment_t *s = b->seg;
        uint64_t page = s->page_size, begin = round_up(b->offset, page) / page, end = (b->offset + b->size) / page;

        if (begin >= end || reserve_blocks(h, 2) < 0)
                return 0;
        unmap_range(h, b, begin, end);
        pages_release(h, s, begin, end);
        if (!s->mapped_pages)
                segment_forget(h, s);
        return (end - begin) * page;
}

/* ---- page reuse ---- */

/* The pages of segment `seg` that an expandable allocation will occupy: no
 * page moves out of them. */
typedef struct reuse_target {
        gm_segment_t *seg;
        uint64_t begin, end;
} reuse_target_t;

/* The tracking entry of `stream`, made on first use; NULL when the table is
 * full or out of memory (that stream's used pages then never move). */
static reuse_stream_t *reuse_stream(gm_heap_t *h, uint64_t stream) {
        for (uint64_t i = 0; i < h->n_streams; i++)
                if (h->streams[i].stream == stream)
                        return &h->streams[i];
        if (h->n_streams == REUSE_STREAMS)
                return NULL;
        if (!h->streams && !(h->streams = calloc(REUSE_STREAMS, sizeof(*h->streams))))
                return NULL;
        h->streams[h->n_streams] = (reuse_stream_t){.stream = stream};
        return &h->streams[h->n_streams++];
}

/* Whether no queued device work can still touch free block `b`: it was never
 * handed out since it was mapped, or a fence its stream got after its last
 * free is complete. Asks the provider (marking a fence at the current free
 * count) at most once per allocation and stream. */
static bool work_done(gm_heap_t *h, const gm_block_t *b) {
        reuse_stream_t *st;
        uint64_t done = 0;

        if (b->free_seq == 0 || !h->prov.stream_fence)
                return true;
        st = reuse_stream(h, b->seg->stream);
        if (!st)
                return false;
        if (b->free_seq <= st->done_seq)
                return true;
        if (st->asked_alloc == h->n_allocs)
                return false;
        st->asked_alloc = h->n_allocs;
        h->reuse.stream_queries++;
        if (h->prov.stream_fence(h->prov.userdata, st->stream, h->free_seq, &done) == 0 && done > st->done_seq)
                st->done_seq = done < h->free_seq ? done : h->free_seq;
        return b->free_seq <= st->done_seq;
}

/* The whole pages of free block `b` that may move to `t`: [*ret_begin,
 * *ret_end), outside t's pages (a free block next to t's unmapped pages lies
 * on one side of them). False if there are none. */
static bool donor_pages(const gm_block_t *b, const reuse_target_t *t, uint64_t *ret_begin, uint64_t *ret_end) {
        const gm_segment_t *s = b->seg;
        uint64_t page = s->page_size, begin, end;

        if (!s->expandable || page != t->seg->page_size)
                return false;
        begin = round_up(b->offset, page) / page;
        end = (b->offset + b->size) / page;
        if (s == t->seg && begin < t->end && end > t->begin) {
                if (begin < t->begin)
                        end = t->begin;
                else
                        begin = t->end;
        }
        if (begin >= end)
                return false;
        *ret_begin = begin;
        *ret_end = end;
        return true;
}

/* The first free block of `p` at or after key `k` (stream, size, address)
 * that is at least a page, smallest first within a stream; advances `k`
 * past it. Runs of smaller blocks are skipped a stream at a time. */
static gm_block_t *donor_candidate(pool_t *p, uint64_t page, uint64_t k[3]) {
        gm_block_t *b;

        if (!p->free_set || p->free_set->max_key1 < page)
                return NULL; /* no free block of the pool is a page */
        while ((b = block_of(gm_tree_lower_bound(p->free_set, k)))) {
                if (b->size >= page) {
                        memcpy(k, b->node.key, 3 * sizeof(*k));
                        k[2]++;
                        return b;
                }
                k[0] = b->seg->stream;
                k[1] = page;
                k[2] = 0;
        }
        return NULL;
}

/* Moves the top `n` (at most) of pages [begin, end) of free block `b` to
 * pages [dst, dst + n) of segment `ds` through the provider, in one remap()
 * call; the moved range becomes unmapped free space (a segment left without
 * pages is forgotten). Needs two spare block structs. Returns the number
 * moved (fewer when remap() fails). */
static uint64_t move_pages(gm_heap_t *h, gm_block_t *b, uint64_t begin, uint64_t end, gm_segment_t *ds, uint64_t dst,
                           uint64_t n) {
        gm_segment_t *s = b->seg;
        uint64_t page = s->page_size, k = end - begin < n ? end - begin : n, first = end - k, moved;
        int64_t r = h->prov.remap(h->prov.userdata, &s->page_handle[first], k, s->id, first * page, ds->id, ds->size,
                                  dst * page, page, s != ds && s->mapped_pages == k);

        moved = r < 0 ? 0 : (uint64_t) r < k ? (uint64_t) r : k;
        gm_dassert(ds->expandable && dst + moved <= ds->cap_pages && s->mapped_pages >= moved);
        if (moved < k)
                h->reuse.remap_failures++;
        if (!moved)
                return 0;
        memmove(&ds->page_handle[dst], &s->page_handle[first], moved * sizeof(*s->page_handle));
        memset(&s->page_mapped[first], 0, moved);
        memset(&ds->page_mapped[dst], 1, moved);
        s->mapped_pages -= moved;
        ds->mapped_pages += moved;
        unmap_range(h, b, first, first + moved);
        h->reuse.pages_moved += moved;
        h->reuse.ranges_moved++;
        if (!s->mapped_pages)
                segment_forget(h, s);
        return moved;
}

/* Fills pages [first, end) of t->seg, in order, with pages moved from free
 * blocks of t->seg's tag (the target's pool first; within a pool by
 * stream, then smallest block first, each giving its top pages); returns how
 * many were filled. */
static uint64_t reuse_pages(gm_heap_t *h, const reuse_target_t *t, uint64_t first, uint64_t end) {
        pool_t *pools[2] = {pool_of(h, t->seg), &h->pools[t->seg->tag][!t->seg->small]}; /* pages stay in the tag */
        uint64_t page = t->seg->page_size, filled = 0;

        for (int i = 0; i < 2 && first + filled < end; i++) {
                uint64_t k[3] = {0, page, 0}, begin, stop, want, moved;
                gm_block_t *b;

                while (first + filled < end && (b = donor_candidate(pools[i], page, k))) {
                        if (!donor_pages(b, t, &begin, &stop))
                                continue;
                        if (!work_done(h, b)) {
                                h->reuse.refused_busy++;
                                continue;
                        }
                        /* unmap_range() takes two; what alloc_block() reserved stays */
                        if (reserve_blocks(h, ALLOC_BLOCKS + 2) < 0)
                                return filled;
                        want = end - first - filled;
                        moved = move_pages(h, b, begin, stop, t->seg, first + filled, want);
                        filled += moved;
                        if (moved < want && moved < stop - begin)
                                return filled; /* remap() failed: create the rest */
                }
        }
        return filled;
}

/* Creates pages [first, end) of `s` (unmapped, arrays reserved), all or
 * nothing: one provider create_run(), or a create() per page where it has
 * none. */
static int create_pages(gm_heap_t *h, gm_segment_t *s, uint64_t first, uint64_t end) {
        uint64_t page = s->page_size, i = first;
        int r = 0;

        gm_dassert(s->expandable && first < end && end <= s->cap_pages);
        if (h->prov.create_run)
                r = h->prov.create_run(h->prov.userdata, s->id, s->size, first * page, page, end - first,
                                       &s->page_handle[first]);
        else
                for (; i < end && r == 0; i += r == 0)
                        r = h->prov.create(h->prov.userdata, s->id, s->size, i * page, page, &s->page_handle[i]);
        if (r < 0) {
                while (!h->prov.create_run && i-- > first) /* the created ones, the run's first last */
                        h->prov.release(h->prov.userdata, s->id, i * page, page, s->page_handle[i],
                                        s->mapped_pages == 0 && i == first);
                return r;
        }
        memset(&s->page_mapped[first], 1, end - first);
        s->mapped_pages += end - first;
        return 0;
}

/* Maps the pages under the first `size` bytes of unmapped block `b` (one
 * provider create_run for the new pages; with page reuse, pages moved from
 * free blocks first, outside target `t`, and only the shortfall is created,
 * within the limits); the mapped part joins its free neighbours (taking them
 * out of the free set; `taken`, when not NULL, is b's free mapped previous
 * block that the caller already took out) and is returned in *ret_block
 * outside any set, for the caller to hand out. What stays unmapped of `b`
 * keeps its place in the unmapped set. On failure the pages placed here go
 * back; a segment left without pages is forgotten. */
static int map_block(gm_heap_t *h, gm_block_t *b, uint64_t size, const reuse_target_t *t, gm_block_t *taken,
                     gm_block_t **ret_block) {
        gm_segment_t *s = b->seg;
        uint64_t first = b->offset / s->page_size, end = (b->offset + size + s->page_size - 1) / s->page_size;
        uint64_t i = first, addr = block_addr(b), mapped = (end - first) * s->page_size;
        gm_block_t *m = b; /* the mapped run */
        int r;

        gm_dassert(b->state == GM_BSTATE_FREE && !b->mapped && size > 0 && size <= b->size);
        gm_dassert(!taken || (taken == b->prev && taken->state == GM_BSTATE_FREE && taken->mapped));
        r = pages_reserve(s, end);

        if (t && r == 0)
                i += reuse_pages(h, t, first, end); /* b survives: no moved range lies right before it */
        /* the moved pages left the reserved total and come back with this range */
        if (r == 0 && reuse_active(h) && i < end)
                r = over_limit(h, (end - first) * s->page_size);
        if (r == 0 && i < end)
                r = create_pages(h, s, i, end);
        if (r < 0) {
                if (i > first) /* the pages moved here */
                        pages_release(h, s, first, i);
                if (!s->mapped_pages)
                        segment_forget(h, s);
                return r;
        }
        if (mapped < b->size) {
                /* the mapped front is a new block; b keeps the unmapped rest */
                m = block_new(h, s, b->offset, mapped, true);
                link_before(b, m);
                b->offset += mapped;
                b->size -= mapped;
                b->free_seq = 0;
                unmapped_rekey(b);
        } else {
                set_remove(h, b);
                b->mapped = true;
        }
        m->free_seq = 0; /* fresh pages, or moved ones whose old work is done */
        if (taken)
                join(h, m, taken);
        else
                try_merge(h, m, m->prev);
        if (m == b) /* else its next is b, unmapped */
                try_merge(h, m, m->next);
        gm_dassert(m->mapped && m->size >= mapped &&
                   (!m->next || !m->next->mapped || m->next->state != GM_BSTATE_FREE));
        *ret_block = m;
        STAT(h, reserved_bytes, s, mapped);
        COUNT(h, num_device_alloc);
        trace(h, GM_TRACE_SEGMENT_MAP, addr, mapped, s->stream);
        return 0;
}

/* Whether the free blocks from `b` on (mapped or not) add up to `size`. */
static bool has_room(const gm_block_t *b, uint64_t size) {
        uint64_t bytes = 0;

        for (; b && bytes < size && b->state == GM_BSTATE_FREE; b = b->next)
                bytes += b->size;
        return bytes >= size;
}

/* PyTorch's try_allocate_expandable_block(): maps just enough pages at the
 * lowest address of the stream's expandable segments with room, else in a new
 * one; returns the free mapped block (>= rsize) taken out of the free set.
 * With page reuse the request's pages are its target: they never give pages. */
static int expandable_alloc(gm_heap_t *h, pool_t *p, uint64_t stream, uint64_t rsize, gm_block_t **ret_block) {
        uint64_t key[3] = {stream, 0, 0};
        gm_block_t *c = NULL, *u;
        reuse_target_t target, *t = NULL;
        int r;

        for (u = block_of(gm_tree_lower_bound(p->unmapped, key)); u && u->seg->stream == stream;
             u = block_of(gm_tree_next(p->unmapped, u->node.key))) {
                c = u->prev && u->prev->state == GM_BSTATE_FREE ? u->prev : u;
                if (has_room(c, rsize))
                        break;
                c = NULL;
        }
        if (!c) {
                r = expandable_new(h, p, stream, rsize, &c);
                if (r < 0)
                        return r;
        }
        if (reuse_active(h) && !h->holding && c->seg->page_size == small_buffer(h)) {
                uint64_t page = c->seg->page_size;
                target = (reuse_target_t){
                        .seg = c->seg,
                        .begin = c->offset / page,
                        .end = round_up(c->offset + rsize, page) / page,
                };
                t = &target;
        }
        if (c->mapped)
                set_remove(h, c); /* taken now: it lies in the target, so it is no donor */
        else {
                r = map_block(h, c, c->size < rsize ? c->size : rsize, t, NULL, &c);
                if (r < 0)
                        return r;
        }
        while (c->size < rsize) {
                /* c is free and mapped (outside the free set), its next is
                 * unmapped and has the rest */
                gm_block_t *n = c->next;
                uint64_t need = rsize - c->size;

                r = map_block(h, n, need < n->size ? need : n->size, t, c, &c);
                if (r < 0) {
                        set_insert(h, c); /* still free */
                        return r;
                }
        }
        *ret_block = c;
        return 0;
}

/* ---- the pool policy ---- */

/* The size a free block can grow to in place: itself plus the unmapped range
 * right after it (PyTorch's expandable_size()). */
static uint64_t expandable_size(const gm_block_t *b) {
        return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

static gm_block_t *free_set_next(pool_t *p, const gm_block_t *b) {
        return block_of(gm_tree_next(p->free_set, b->node.key));
}

/* PyTorch's get_free_block(): best fit on the same stream, oversize rules.
 * When the best fit lies in an expandable segment, the fit is judged by the
 * size the block can grow to: while the next larger block of the stream can
 * grow to less, it is taken instead (so a block followed by unmapped space,
 * whose growth is the segment's whole tail, yields to a hole that fits). */
static gm_block_t *get_free_block(gm_heap_t *h, pool_t *p, uint64_t stream, uint64_t rsize) {
        uint64_t key[3] = {stream, rsize, 0}, msplit = h->cfg.max_split_size;
        gm_block_t *b, *n;

        if (gc_active(h))
                p->gc_calls++;
        b = block_of(gm_tree_lower_bound(p->free_set, key));
        if (b && b->seg->stream == stream && b->seg->expandable && h->cfg.expandable_segments)
                for (n = free_set_next(p, b);
                     b->seg->expandable && n && n->seg->stream == stream && expandable_size(n) < expandable_size(b);
                     n = free_set_next(p, n))
                        b = n;
        /* expandable segments switched off at run time: skip their blocks */
        while (b && !h->cfg.expandable_segments && b->seg->expandable && b->seg->stream == stream)
                b = free_set_next(p, b);
        if (!b || b->seg->stream != stream)
                return NULL;
        if (rsize < msplit && b->size >= msplit)
                return NULL;
        if (rsize >= msplit && b->size - rsize >= h->cfg.max_non_split_rounding)
                return NULL;
        gm_dassert(pool_of(h, b->seg) == p && b->mapped && b->size >= rsize);
        set_remove(h, b);
        return b;
}

static bool should_split(const gm_heap_t *h, const gm_block_t *b, uint64_t size) {
        uint64_t remaining = b->size - size;

        if (b->seg->small || h->cfg.expandable_segments)
                return remaining >= MIN_BLOCK_SIZE;
        return size < h->cfg.max_split_size && remaining > SMALL_SIZE;
}

/* Free mapped blocks of the large pool that GC may release, and their age. */
static bool gc_candidate(const gm_block_t *b) {
        return !is_split(b) && !b->seg->expandable;
}

static uint64_t gc_age(const gm_heap_t *h, const gm_block_t *b) {
        return h->pools[b->seg->tag][0].gc_calls - b->gc_stamp;
}

/* PyTorch's garbage_collect_cached_blocks() on one large pool: releases idle
 * unsplit segments of at least the mean age, round after round, until
 * `target` bytes went; returns the bytes released. */
static uint64_t garbage_collect_pool(gm_heap_t *h, pool_t *p, uint64_t target) {
        uint64_t reclaimed = 0, total_age = 0, count = 0, key[3];
        bool freed = true;
        gm_block_t *b;

        for (b = block_of(tree_first(p->free_set)); b; b = block_of(gm_tree_next(p->free_set, b->node.key)))
                if (gc_candidate(b)) {
                        total_age += gc_age(h, b);
                        count++;
                }
        while (reclaimed < target && freed && count > 0) {
                double age_threshold = (double) total_age / (double) count;

                freed = false;
                for (b = block_of(tree_first(p->free_set)); b; b = block_of(gm_tree_next(p->free_set, key))) {
                        memcpy(key, b->node.key, sizeof(key));
                        if (!gc_candidate(b) || (double) gc_age(h, b) < age_threshold)
                                continue;
                        freed = true;
                        total_age -= gc_age(h, b);
                        count--;
                        reclaimed += release_block(h, b);
                }
        }
        return reclaimed;
}

/* Whether tag `tag`'s pools are held: nothing is carved from or released out of them. */
static bool tag_held(const gm_heap_t *h, unsigned tag) {
        return (h->held_tags >> tag) & 1u;
}

/* Above threshold x allowed, each tag's large pool in turn (tag 0 first;
 * held tags left out). */
static void garbage_collect(gm_heap_t *h) {
        uint64_t allowed = h->limit ? h->limit : fraction_allowed(h);
        uint64_t total = h->limit ? reserved_total(limit_measured(h)) : reserved_total(h->stats);
        uint64_t threshold = (uint64_t) (h->cfg.garbage_collection_threshold * (double) allowed);
        uint64_t reclaimed = 0;

        for (unsigned t = 0; t < h->n_tags && total > threshold + reclaimed; t++)
                if (!tag_held(h, t))
                        reclaimed += garbage_collect_pool(h, &h->pools[t][0], total - threshold - reclaimed);
}

/* An idle unsplit ordinary segment. */
static bool releasable(const gm_block_t *b) {
        return !is_split(b) && !b->seg->expandable;
}

/* PyTorch's release_available_cached_blocks() (only with max_split_size set):
 * releases one cached block >= max(rsize, max_split_size) of the stream, else
 * oversize blocks from the largest down until that much is released. */
static bool release_available(gm_heap_t *h, pool_t *p, uint64_t stream, uint64_t rsize) {
        uint64_t msplit = h->cfg.max_split_size, released = 0;
        uint64_t key[3] = {stream, rsize > msplit ? rsize : msplit, 0}, cur[3];
        static const uint64_t last[3] = {UINT64_MAX, UINT64_MAX, UINT64_MAX};
        gm_block_t *b;

        if (msplit == UINT64_MAX)
                return false;
        b = block_of(gm_tree_lower_bound(p->free_set, key));
        if (b && b->seg->stream == stream && releasable(b)) {
                release_block(h, b);
                return true;
        }
        b = block_of(gm_tree_prev(p->free_set, b ? b->node.key : last));
        while (b && released < key[1] && b->seg->stream == stream && b->size >= msplit) {
                memcpy(cur, b->node.key, sizeof(cur));
                if (releasable(b))
                        released += release_block(h, b);
                b = block_of(gm_tree_prev(p->free_set, cur));
        }
        return released >= key[1];
}

/* PyTorch's release_blocks() for one pool: idle unsplit ordinary segments go,
 * then expandable free blocks give back their whole pages. */
static uint64_t release_pool(gm_heap_t *h, pool_t *p) {
        uint64_t released = 0, key[3];
        gm_block_t *b;

        for (b = block_of(tree_first(p->free_set)); b; b = block_of(gm_tree_next(p->free_set, key))) {
                memcpy(key, b->node.key, sizeof(key));
                if (releasable(b))
                        released += release_block(h, b);
        }
        /* unmapping leaves only smaller pieces behind, so the walk never meets them */
        for (b = block_of(tree_first(p->free_set)); b; b = block_of(gm_tree_next(p->free_set, key))) {
                memcpy(key, b->node.key, sizeof(key));
                if (b->seg->expandable)
                        released += unmap_block(h, b);
        }
        return released;
}

uint64_t gm_heap_release_cached(gm_heap_t *h) {
        uint64_t released = 0;

        COUNT(h, num_sync_all_streams);
        for (unsigned t = 0; t < h->n_tags; t++) {
                if (tag_held(h, t))
                        continue;
                released += release_pool(h, &h->pools[t][0]);
                released += release_pool(h, &h->pools[t][1]);
        }
        return released;
}

void gm_heap_hold_tags(gm_heap_t *h, uint32_t mask) {
        h->held_tags = mask & GM_HEAP_ALL_TAGS;
}

uint32_t gm_heap_held_tags(const gm_heap_t *h) {
        return h->held_tags;
}

/* PyTorch's alloc_block(): a new segment (or newly mapped expandable pages). */
static int alloc_block(gm_heap_t *h, pool_t *p, uint64_t stream, uint64_t rsize, uint64_t asize, bool retry,
                       gm_block_t **ret_block) {
        if (retry)
                COUNT(h, num_alloc_retries);
        /* with page reuse the limits see only what map_block() creates */
        int r = reuse_active(h) ? 0 : over_limit(h, asize);
        if (r < 0)
                return r;
        if (reserve_blocks(h, ALLOC_BLOCKS) < 0)
                return -ENOMEM;
        if (h->cfg.expandable_segments)
                return expandable_alloc(h, p, stream, rsize, ret_block);
        return segment_alloc(h, p, stream, asize, ret_block);
}

/* PyTorch's alloc_found_block(): splits off the remainder, hands the block out. */
static void hand_out(gm_heap_t *h, gm_block_t *b, uint64_t rsize, uint64_t orig, gm_alloc_result_t *ret_result) {
        gm_segment_t *s = b->seg;
        bool counted = !s->expandable, already_split = is_split(b);

        gm_dassert(b->state == GM_BSTATE_FREE && b->mapped && b->size >= rsize && rsize >= orig);
        if (should_split(h, b, rsize)) {
                link_after(b, block_new(h, s, b->offset + rsize, b->size - rsize, true));
                b->next->free_seq = b->free_seq;
                b->size = rsize;
                gm_dassert(b->next->offset == b->offset + b->size);
                set_insert(h, b->next);
                if (counted && already_split)
                        STAT(h, inactive_split_bytes, s, -(int64_t) rsize);
                else if (counted) {
                        STAT(h, inactive_split_bytes, s, b->next->size);
                        STAT(h, inactive_split, s, 1);
                }
        } else if (counted && already_split) {
                STAT(h, inactive_split_bytes, s, -(int64_t) b->size);
                STAT(h, inactive_split, s, -1);
        }
        b->state = GM_BSTATE_ALLOCATED;
        b->id = h->next_block_id++;
        b->requested_size = orig;
        gm_idmap_put(&h->live, b);
        trace(h, GM_TRACE_ALLOC, block_addr(b), orig, s->stream);
        stat_block(h, s, 1, b->size, orig);
        b->oversize = b->size >= h->cfg.max_split_size;
        if (b->oversize)
                STAT1(h, oversize_allocations, s, 1);
        *ret_result = (gm_alloc_result_t){
                .block_id = b->id,
                .segment_id = s->id,
                .offset = b->offset,
                .size = b->size,
                .addr = block_addr(b),
        };
}

static bool is_oom(int r) {
        return r == -ENOMEM || r == -EDQUOT;
}

void gm_heap_count_oom(gm_heap_t *h) {
        if (!h->refusal_uncounted)
                return;
        h->refusal_uncounted = false;
        COUNT(h, num_ooms);
        trace(h, GM_TRACE_OOM, 0, h->refused_size, h->refused_stream);
}

void gm_heap_count_reclaim_wait(gm_heap_t *h) {
        COUNT(h, num_reclaim_waits);
}

/* Tag `tag` is used from now on: its statistics start (tag 0's as a copy
 * of the heap's, which until the first tag were all tag 0's). */
static int tag_start(gm_heap_t *h, unsigned tag) {
        if (!h->tag_stats && !h->tag_stats_stopped) {
                h->tag_stats =
                        h->params.tag_stats ? h->params.tag_stats : calloc(GM_HEAP_MAX_TAGS, sizeof(*h->tag_stats));
                if (!h->tag_stats)
                        return -ENOMEM;
                for (unsigned t = 0; t < GM_HEAP_MAX_TAGS; t++)
                        gm_stats_init(&h->tag_stats[t]);
                h->tag_stats[0] = *h->stats;
                h->tag_stats[0].num_alloc_retries = h->tag_stats[0].num_ooms = 0;
                h->tag_stats[0].num_sync_all_streams = h->tag_stats[0].num_device_alloc = 0;
                h->tag_stats[0].num_device_free = h->tag_stats[0].num_reclaim_waits = 0;
        }
        if (tag >= h->n_tags)
                h->n_tags = tag + 1;
        return 0;
}

int gm_heap_alloc_tagged(gm_heap_t *h, uint64_t size, uint64_t stream, unsigned tag, gm_alloc_result_t *ret_result) {
        uint64_t rsize, asize, moved_before = h->reuse.pages_moved;
        gm_block_t *b;
        pool_t *p;
        int r;

        if (size == 0 || size >= MAX_REQUEST)
                return -EINVAL;
        if (tag < GM_HEAP_MAX_TAGS && tag_held(h, tag))
                return -EAGAIN;
        if (tag >= h->n_tags) {
                if (tag >= GM_HEAP_MAX_TAGS)
                        return -EINVAL;
                r = tag_start(h, tag);
                if (r < 0)
                        return r;
        }
        h->n_allocs++;
        h->refusal_uncounted = false;
        rsize = round_size(&h->cfg, size);
        p = &h->pools[tag][rsize <= SMALL_SIZE];
        asize = allocation_size(h, rsize);
        r = gm_idmap_reserve(&h->live, 1);
        if (r >= 0)
                r = reserve_blocks(h, 1);
        if (r < 0)
                return r;
        b = get_free_block(h, p, stream, rsize);
        if (!b) {
                bool asked = h->prov.may_release != NULL;
                h->holding = asked && !h->prov.may_release(h->prov.userdata, stream);
                if (gc_active(h) && !h->holding)
                        garbage_collect(h);
                r = alloc_block(h, p, stream, rsize, asize, false, &b);
                if (is_oom(r) && !h->holding && release_available(h, p, stream, rsize))
                        r = alloc_block(h, p, stream, rsize, asize, false, &b);
                if (is_oom(r) && !h->holding) {
                        gm_heap_release_cached(h);
                        r = alloc_block(h, p, stream, rsize, asize, true, &b);
                }
                if (asked && !h->holding && h->prov.release_done)
                        h->prov.release_done(h->prov.userdata); /* every return below is past the releases */
                h->holding = false;
                if (is_oom(r)) {
                        h->refused_size = rsize;
                        h->refused_stream = stream;
                        h->refusal_uncounted = true;
                        if (!h->params.defer_oom)
                                gm_heap_count_oom(h);
                }
                if (h->reuse.pages_moved != moved_before)
                        h->reuse.allocs_with_moves++;
                if (r < 0)
                        return r;
        }
        gm_dassert(pool_of(h, b->seg) == p && b->seg->stream == stream);
        hand_out(h, b, rsize, size, ret_result);
        return 0;
}

int gm_heap_alloc(gm_heap_t *h, uint64_t size, uint64_t stream, gm_alloc_result_t *ret_result) {
        return gm_heap_alloc_tagged(h, size, stream, 0, ret_result);
}

/* PyTorch's free_block(): the block returns to its pool, merged with free
 * neighbours; active/requested drop. */
static void free_block(gm_heap_t *h, gm_block_t *b) {
        gm_segment_t *s = b->seg;
        uint64_t size = b->size, req = b->requested_size, m;
        int64_t d_count = 0, d_bytes = 0;
        uint64_t live = h->live.count;

        gm_dassert(b->state == GM_BSTATE_PENDING && b->mapped && live > 0);
        trace(h, GM_TRACE_FREE_COMPLETED, block_addr(b), req, s->stream);
        gm_idmap_del(&h->live, b->id);
        gm_dassert(h->live.count == live - 1); /* b was in the id map */
        b->id = 0;
        b->state = GM_BSTATE_FREE;
        b->free_seq = ++h->free_seq;
        if ((m = try_merge(h, b, b->prev))) {
                d_count--;
                d_bytes -= (int64_t) m;
        }
        if ((m = try_merge(h, b, b->next))) {
                d_count--;
                d_bytes -= (int64_t) m;
        }
        /* coalesced: no free neighbour of the same mapped state is left */
        gm_dassert(!b->prev || b->prev->state != GM_BSTATE_FREE || b->prev->mapped != b->mapped);
        gm_dassert(!b->next || b->next->state != GM_BSTATE_FREE || b->next->mapped != b->mapped);
        set_insert(h, b);
        if (is_split(b)) {
                d_count++;
                d_bytes += (int64_t) b->size;
        }
        if (!s->expandable) {
                STAT(h, inactive_split, s, d_count);
                STAT(h, inactive_split_bytes, s, d_bytes);
        }
        stat_block(h, s, -1, size, req);
}

/* PyTorch's free(): allocation counts drop now, the block stays active until free_block. */
static void free_request(gm_heap_t *h, gm_block_t *b) {
        gm_segment_t *s = b->seg;

        gm_dassert(b->state == GM_BSTATE_ALLOCATED);
        b->state = GM_BSTATE_PENDING;
        STAT(h, allocation, s, -1);
        STAT(h, allocated_bytes, s, -(int64_t) b->size);
        trace(h, GM_TRACE_FREE_REQUESTED, block_addr(b), b->requested_size, s->stream);
        if (b->oversize) {
                b->oversize = false;
                STAT1(h, oversize_allocations, s, -1);
        }
}

int gm_heap_free(gm_heap_t *h, uint64_t block_id, bool deferred) {
        gm_block_t *b = gm_idmap_get(&h->live, block_id);

        if (!b || b->state != GM_BSTATE_ALLOCATED)
                return -ENOENT;
        free_request(h, b);
        if (!deferred)
                free_block(h, b);
        return 0;
}

int gm_heap_free_completed(gm_heap_t *h, uint64_t block_id) {
        gm_block_t *b = gm_idmap_get(&h->live, block_id);

        if (!b || b->state != GM_BSTATE_PENDING)
                return -ENOENT;
        free_block(h, b);
        return 0;
}

/* ---- lifetime and knobs ---- */

static void apply_config(gm_heap_t *h, const gm_alloc_config_t *config) {
        h->cfg = *config;
        h->stats->max_split_size = config->max_split_size == UINT64_MAX ? -1 : (int64_t) config->max_split_size;
}

int gm_heap_new(const gm_alloc_config_t *config, const gm_provider_t *provider, const gm_heap_params_t *params,
                gm_heap_t **ret_heap) {
        gm_heap_t *h;

        if (!config || !provider || !provider->create || !provider->release || !params || !params->va_cursor)
                return -EINVAL;
        h = calloc(1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        h->prov = *provider;
        h->params = *params;
        h->stats = params->stats ? params->stats : &h->own_stats;
        sinks_refresh(h);
        gm_stats_init(h->stats);
        apply_config(h, config);
        for (unsigned t = 0; t < GM_HEAP_MAX_TAGS; t++) {
                h->pools[t][1].small = true;
                h->pools[t][0].tag = h->pools[t][1].tag = (uint8_t) t;
        }
        h->n_tags = 1;
        h->next_block_id = 1;
        h->next_segment_id = 1;
        *ret_heap = h;
        return 0;
}

/* Frees every live block of `s` and gives the whole segment back. */
static void segment_teardown(gm_heap_t *h, gm_segment_t *s) {
        gm_block_t *b;

        for (b = s->first; b; b = b->next)
                if (b->state != GM_BSTATE_FREE) {
                        if (b->state == GM_BSTATE_ALLOCATED)
                                free_request(h, b);
                        free_block(h, b); /* b survives the merges */
                }
        if (!s->expandable) {
                release_block(h, s->first);
                return;
        }
        /* all free now: each mapped run is one block of whole pages */
        for (;;) {
                bool last;

                for (b = s->first; !b->mapped; b = b->next)
                        ;
                last = b->size / s->page_size == s->mapped_pages;
                unmap_block(h, b);
                if (last)
                        return;
        }
}

gm_heap_t *gm_heap_destroy(gm_heap_t *h) {
        if (!h)
                return NULL;
        while (h->seg_head)
                segment_teardown(h, h->seg_head);
        while (h->spare) {
                gm_block_t *b = h->spare;

                h->spare = b->next;
                free(b);
        }
        gm_idmap_done(&h->live);
        free(h->streams);
        if (h->tag_stats != h->params.tag_stats)
                free(h->tag_stats);
        free(h);
        return NULL;
}

void gm_heap_set_config(gm_heap_t *h, const gm_alloc_config_t *config) {
        apply_config(h, config);
}

void gm_heap_set_limit(gm_heap_t *h, uint64_t allowed_max, const gm_stats_t *measured) {
        h->limit = allowed_max;
        h->limit_measured = measured;
}

void gm_heap_page_reuse(const gm_heap_t *h, gm_page_reuse_info_t *ret_info) {
        gm_page_reuse_info_t info = h->reuse;

        info.configured = h->cfg.page_reuse;
        info.active = reuse_active(h);
        info.inactive_reason = info.active                   ? NULL
                               : !h->cfg.page_reuse          ? "not configured (alloc_conf gpumemd_page_reuse:True)"
                               : !h->cfg.expandable_segments ? "expandable segments are off"
                                                             : "the memory provider cannot move pages (no remap)";
        *ret_info = info;
}

uint64_t gm_heap_live_blocks(const gm_heap_t *h) {
        return h->live.count;
}

uint64_t gm_heap_free_count(const gm_heap_t *h) {
        return h->free_seq;
}

uint64_t gm_heap_largest_free(const gm_heap_t *h) {
        uint64_t largest = 0;

        for (unsigned t = 0; t < h->n_tags; t++)
                for (int i = 0; i < 2; i++)
                        if (h->pools[t][i].free_set && h->pools[t][i].free_set->max_key1 > largest)
                                largest = h->pools[t][i].free_set->max_key1;
        return largest;
}

const gm_stats_t *gm_heap_stats(const gm_heap_t *h) {
        return h->stats;
}

gm_stats_t *gm_heap_stats_mut(gm_heap_t *h) {
        return h->stats;
}

void gm_heap_move_stats(gm_heap_t *h, gm_stats_t *home, bool copy) {
        gm_stats_t *to = home ? home : &h->own_stats;

        if (copy && to != h->stats)
                *to = *h->stats;
        h->stats = to;
        sinks_refresh(h);
        if (home || !h->tag_stats || h->tag_stats != h->params.tag_stats)
                return;
        gm_stats_t *own = copy ? malloc(GM_HEAP_MAX_TAGS * sizeof(*own)) : NULL;
        if (own)
                memcpy(own, h->tag_stats, GM_HEAP_MAX_TAGS * sizeof(*own));
        h->tag_stats = own;
        h->tag_stats_stopped = !own;
}

/* ---- snapshots ---- */

static gm_block_state_t block_state(const gm_block_t *b) {
        switch (b->state) {
        case GM_BSTATE_ALLOCATED:
                return GM_BLOCK_ACTIVE_ALLOCATED;
        case GM_BSTATE_PENDING:
                return GM_BLOCK_ACTIVE_PENDING_FREE;
        default:
                return GM_BLOCK_INACTIVE;
        }
}

void gm_heap_walk(const gm_heap_t *h, const gm_heap_visitor_t *visitor) {
        for (const gm_segment_t *s = h->seg_head; s; s = s->next) {
                const gm_block_t *b = s->first, *e;

                while (b) {
                        gm_segment_info_t info = {
                                .id = s->id,
                                .addr = block_addr(b),
                                .offset = b->offset,
                                .stream = s->stream,
                                .small_pool = s->small,
                                .expandable = s->expandable,
                                .tag = s->tag,
                        };

                        if (!b->mapped) {
                                b = b->next;
                                continue;
                        }
                        /* one "segment" per contiguous mapped range */
                        for (e = b; e && e->mapped; e = e->next) {
                                info.size += e->size;
                                if (e->state == GM_BSTATE_ALLOCATED)
                                        info.allocated_size += e->size;
                                if (e->state != GM_BSTATE_FREE) {
                                        info.active_size += e->size;
                                        info.requested_size += e->requested_size;
                                }
                        }
                        if (visitor->segment_fn)
                                visitor->segment_fn(&info, visitor->userdata);
                        for (e = b; e && e->mapped; e = e->next) {
                                gm_block_info_t bi = {
                                        .id = e->id,
                                        .addr = block_addr(e),
                                        .size = e->size,
                                        .requested_size = e->state == GM_BSTATE_FREE ? 0 : e->requested_size,
                                        .state = block_state(e),
                                };

                                if (visitor->block_fn)
                                        visitor->block_fn(&info, &bi, visitor->userdata);
                        }
                        b = e;
                }
        }
}

/* ---- integrity ---- */

typedef struct recount {
        int64_t allocation, allocated_bytes, active, active_bytes, requested_bytes;
        int64_t reserved_bytes, segment, inactive_split, inactive_split_bytes;
        uint64_t free_blocks, unmapped_blocks;
} recount_t;

typedef struct check_ctx {
        recount_t pool[2];                  /* [0] small, [1] large */
        recount_t tag[GM_HEAP_MAX_TAGS][2]; /* the same per tag */
        uint64_t live, oversize_allocations, oversize_segments;
} check_ctx_t;

/* Whether pages [first, end) are all mapped (want = 1) or all unmapped (want = 0). */
static bool pages_are(const gm_segment_t *s, uint64_t first, uint64_t end, uint8_t want) {
        for (uint64_t i = first; i < end; i++)
                if (page_is_mapped(s, i) != want)
                        return false;
        return true;
}

/* The block must be exactly the node found under its key in its set. */
static int check_in_set(const gm_heap_t *h, const gm_block_t *b) {
        const pool_t *p = &h->pools[b->seg->tag][b->seg->small];

        if (!key_current(b))
                return 1;
        return gm_tree_lower_bound(b->mapped ? p->free_set : p->unmapped, b->node.key) != &b->node;
}

static int check_block(const gm_heap_t *h, const gm_block_t *b, bool split, check_ctx_t *c) {
        const gm_segment_t *s = b->seg;
        recount_t *r = &c->tag[s->tag][s->small ? 0 : 1];
        int bad = 0;

        if (s->expandable) {
                uint64_t page = s->page_size, first = b->offset / page;
                if (b->mapped)
                        bad += !pages_are(s, first, round_up(b->offset + b->size, page) / page, 1);
                else
                        bad += b->offset % page || b->size % page ||
                               !pages_are(s, first, (b->offset + b->size) / page, 0);
        } else
                bad += !b->mapped;
        if (b->oversize) {
                bad += b->state != GM_BSTATE_ALLOCATED;
                c->oversize_allocations++;
        }
        switch (b->state) {
        case GM_BSTATE_FREE:
                bad += b->id != 0;
                bad += b->free_seq > h->free_seq;
                bad += check_in_set(h, b);
                if (!b->mapped) {
                        r->unmapped_blocks++;
                        break;
                }
                r->free_blocks++;
                if (split && !s->expandable) {
                        r->inactive_split++;
                        r->inactive_split_bytes += (int64_t) b->size;
                }
                break;
        case GM_BSTATE_ALLOCATED:
                r->allocation++;
                r->allocated_bytes += (int64_t) b->size;
                /* fall through */
        case GM_BSTATE_PENDING:
                r->active++;
                r->active_bytes += (int64_t) b->size;
                r->requested_bytes += (int64_t) b->requested_size;
                c->live++;
                bad += !b->mapped || b->id == 0 || gm_idmap_get(&h->live, b->id) != b;
                break;
        default:
                bad++;
        }
        return bad;
}

static int check_segment(const gm_heap_t *h, const gm_segment_t *s, check_ctx_t *c) {
        recount_t *r = &c->tag[s->tag][s->small ? 0 : 1];
        const gm_block_t *b, *pb = NULL;
        uint64_t off = 0, pages = 0;
        int bad = 0;

        if (!s->first)
                return 1;
        for (b = s->first; b; pb = b, b = b->next) {
                if (b->seg != s || b->prev != pb || b->offset != off || b->size == 0 || b->size > s->size - off)
                        return bad + 1; /* the chain itself is broken: stop here */
                off += b->size;
                if (pb && pb->state == GM_BSTATE_FREE && b->state == GM_BSTATE_FREE && pb->mapped == b->mapped)
                        bad++; /* uncoalesced */
                bad += check_block(h, b, s->first->next != NULL, c);
        }
        bad += off != s->size;
        if (s->expandable) {
                for (uint64_t i = 0; i < s->cap_pages; i++)
                        pages += s->page_mapped[i];
                bad += pages != s->mapped_pages || pages == 0 || s->n_pages * s->page_size != s->size ||
                       s->cap_pages > s->n_pages;
                r->reserved_bytes += (int64_t) (pages * s->page_size);
        } else {
                r->segment++;
                r->reserved_bytes += (int64_t) s->size;
                if (s->oversize)
                        c->oversize_segments++;
        }
        return bad;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return (x > y) - (x < y);
}

/* Page reuse moves handles between segments: each mapped page's handle must
 * still be mapped exactly once, and the stream table must be consistent. */
static int check_reuse(const gm_heap_t *h) {
        uint64_t n = 0, k = 0, *handles;
        int bad = h->n_streams > REUSE_STREAMS;

        for (uint64_t i = 0; i < h->n_streams; i++)
                bad += h->streams[i].done_seq > h->free_seq || h->streams[i].asked_alloc > h->n_allocs;
        for (const gm_segment_t *s = h->seg_head; s; s = s->next)
                n += s->expandable ? s->mapped_pages : 0;
        handles = malloc((n ? n : 1) * sizeof(*handles));
        if (!handles)
                return bad; /* nothing to sort with: the rest is not checked */
        for (const gm_segment_t *s = h->seg_head; s; s = s->next)
                for (uint64_t i = 0; s->expandable && i < s->cap_pages && k < n; i++)
                        if (s->page_mapped[i])
                                handles[k++] = s->page_handle[i];
        qsort(handles, k, sizeof(*handles), cmp_u64);
        for (uint64_t i = 1; i < k; i++)
                bad += handles[i] == handles[i - 1];
        free(handles);
        return bad;
}

static int check_stat(const gm_stat_t *a, int64_t small, int64_t large) {
        return (a[GM_STAT_SMALL_POOL].current != small) + (a[GM_STAT_LARGE_POOL].current != large) +
               (a[GM_STAT_ALL].current != small + large);
}

#define CHECK_STAT(stats, r, field) check_stat((stats)->field, (r)[0].field, (r)[1].field)

/* The statistics `st` against recount `r` ([0] small, [1] large). */
static int check_stats(const gm_stats_t *st, const recount_t r[2]) {
        int bad = 0;

        bad += CHECK_STAT(st, r, allocation);
        bad += CHECK_STAT(st, r, allocated_bytes);
        bad += CHECK_STAT(st, r, active);
        bad += CHECK_STAT(st, r, active_bytes);
        bad += CHECK_STAT(st, r, requested_bytes);
        bad += CHECK_STAT(st, r, reserved_bytes);
        bad += CHECK_STAT(st, r, segment);
        bad += CHECK_STAT(st, r, inactive_split);
        bad += CHECK_STAT(st, r, inactive_split_bytes);
        return bad;
}

static void recount_add(recount_t *to, const recount_t *r) {
        to->allocation += r->allocation;
        to->allocated_bytes += r->allocated_bytes;
        to->active += r->active;
        to->active_bytes += r->active_bytes;
        to->requested_bytes += r->requested_bytes;
        to->reserved_bytes += r->reserved_bytes;
        to->segment += r->segment;
        to->inactive_split += r->inactive_split;
        to->inactive_split_bytes += r->inactive_split_bytes;
        to->free_blocks += r->free_blocks;
        to->unmapped_blocks += r->unmapped_blocks;
}

int gm_heap_check(const gm_heap_t *h) {
        check_ctx_t c = {0}; /* about 3 KiB */
        const gm_segment_t *s, *ps = NULL;
        uint64_t n;
        int bad = 0;

        bad += h->n_tags == 0 || h->n_tags > GM_HEAP_MAX_TAGS ||
               (h->n_tags > 1 && !h->tag_stats && !h->tag_stats_stopped);
        bad += (h->held_tags & ~(uint32_t) GM_HEAP_ALL_TAGS) != 0; /* only tags there are are held */
        for (s = h->seg_head; s; ps = s, s = s->next) {
                if (s->prev != ps || (ps && ps->addr + ps->size > s->addr))
                        bad++;
                bad += s->tag >= h->n_tags; /* a segment's tag is one in use */
                bad += check_segment(h, s, &c);
        }
        bad += ps != h->seg_tail;
        for (unsigned t = 0; t < GM_HEAP_MAX_TAGS; t++)
                for (int i = 0; i < 2; i++) {
                        const pool_t *p = &h->pools[t][i ? 0 : 1]; /* recount [0] small, [1] large */

                        bad += p->tag != t || p->small != !i;
                        bad += gm_tree_check(p->free_set, &n);
                        bad += n != c.tag[t][i].free_blocks;
                        bad += gm_tree_check(p->unmapped, &n);
                        bad += n != c.tag[t][i].unmapped_blocks;
                        recount_add(&c.pool[i], &c.tag[t][i]);
                        if (h->tag_stats)
                                bad += i == 1 ? check_stats(&h->tag_stats[t], c.tag[t]) : 0;
                }
        bad += c.live != h->live.count;
        bad += check_stats(h->stats, c.pool);
        bad += h->stats->oversize_allocations.current != (int64_t) c.oversize_allocations;
        bad += h->stats->oversize_segments.current != (int64_t) c.oversize_segments;
        if (h->cfg.page_reuse)
                bad += check_reuse(h);
        return bad;
}

/* ---- restore after a daemon restart ----
 * The segments and live blocks a client reports are rebuilt without asking
 * the provider (the memory exists); everything in between becomes free. */

static gm_segment_t *segment_find(const gm_heap_t *h, uint64_t id) {
        for (gm_segment_t *s = h->seg_head; s; s = s->next)
                if (s->id == id)
                        return s;
        return NULL;
}

int gm_heap_segment_tag(const gm_heap_t *h, uint64_t segment_id, unsigned *ret_tag) {
        const gm_segment_t *s = segment_find(h, segment_id);
        if (!s)
                return -ENOENT;
        *ret_tag = s->tag;
        return 0;
}

int gm_heap_tag_stats(const gm_heap_t *h, unsigned tag, gm_stats_t *ret_stats) {
        if (tag >= GM_HEAP_MAX_TAGS)
                return -EINVAL;
        if (h->tag_stats)
                *ret_stats = h->tag_stats[tag];
        else if (tag == 0)
                *ret_stats = *h->stats;
        else
                gm_stats_init(ret_stats);
        ret_stats->max_split_size = h->stats->max_split_size;
        return 0;
}

int gm_heap_segment_pool(const gm_heap_t *h, uint64_t segment_id, bool *ret_small_pool) {
        const gm_segment_t *s = segment_find(h, segment_id);
        if (!s)
                return -ENOENT;
        *ret_small_pool = s->small;
        return 0;
}

/* Blocks for runs of equally mapped pages of a restored expandable segment. */
static int restore_page_runs(gm_heap_t *h, gm_segment_t *s) {
        gm_block_t *last = NULL;
        uint64_t i = 0;

        while (i < s->n_pages) {
                uint64_t j = i;
                while (j < s->n_pages && s->page_mapped[j] == s->page_mapped[i])
                        j++;
                if (reserve_blocks(h, 1) < 0)
                        return -ENOMEM;
                gm_block_t *b = block_new(h, s, i * s->page_size, (j - i) * s->page_size, s->page_mapped[i]);
                if (last)
                        link_after(last, b);
                else
                        s->first = b;
                last = b;
                i = j;
        }
        return 0;
}

/* pool: 1 small, 0 large, -1 = inferred from the sizes */
static int restore_segment(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream, int pool, unsigned tag,
                           const gm_restore_piece_t *pieces, size_t n_pieces) {
        if (segment_id == 0 || !pieces || n_pieces == 0 || va_size == 0 || va_size % MIN_BLOCK_SIZE ||
            va_size >= MAX_REQUEST || tag >= GM_HEAP_MAX_TAGS)
                return -EINVAL;
        if (segment_find(h, segment_id))
                return -EEXIST;
        if (tag && tag_start(h, tag) < 0)
                return -ENOMEM;
        bool expandable = !(n_pieces == 1 && pieces[0].offset == 0 && pieces[0].size == va_size);
        uint64_t page = pieces[0].size;
        if (expandable && ((page != small_buffer(h) && page != large_buffer(h)) || va_size % page ||
                           va_size / page > (1u << 24) || (pool == 1 && page != small_buffer(h))))
                return -EINVAL;
        gm_segment_t *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->id = segment_id;
        s->size = va_size;
        s->stream = stream;
        s->expandable = expandable;
        s->tag = (uint8_t) tag;
        if (!expandable) {
                s->small = pool >= 0 ? pool == 1 : va_size == small_buffer(h); /* no large-pool segment has that size */
                s->handle = pieces[0].handle;
                if (reserve_blocks(h, 1) < 0) {
                        free(s);
                        return -ENOMEM;
                }
                s->first = block_new(h, s, 0, va_size, true);
        } else {
                s->small = pool >= 0 ? pool == 1 : page == small_buffer(h); /* page reuse: small pages in both pools */
                s->page_size = page;
                s->n_pages = va_size / page;
                int r = pages_reserve(s, s->n_pages);
                for (size_t i = 0; i < n_pieces && r == 0; i++) {
                        uint64_t k = pieces[i].offset / page;
                        if (pieces[i].size != page || pieces[i].offset % page || k >= s->n_pages || s->page_mapped[k])
                                r = -EINVAL;
                        else {
                                s->page_mapped[k] = 1;
                                s->page_handle[k] = pieces[i].handle;
                                s->mapped_pages++;
                        }
                }
                if (r == 0)
                        r = restore_page_runs(h, s);
                if (r < 0) {
                        for (gm_block_t *b = s->first, *next; b; b = next) {
                                next = b->next;
                                block_drop(h, b);
                        }
                        free(s->page_handle);
                        free(s->page_mapped);
                        free(s);
                        return r;
                }
        }
        s->addr = take_va(h, va_size);
        segment_link(h, s);
        for (gm_block_t *b = s->first; b; b = b->next)
                set_insert(h, b);
        uint64_t reserved = expandable ? s->mapped_pages * page : va_size;
        if (!expandable) {
                STAT(h, segment, s, 1);
                if (va_size >= h->cfg.max_split_size) {
                        s->oversize = true;
                        STAT1(h, oversize_segments, s, 1);
                }
        }
        STAT(h, reserved_bytes, s, reserved);
        COUNT(h, num_device_alloc);
        if (segment_id >= h->next_segment_id)
                h->next_segment_id = segment_id + 1;
        return 0;
}

int gm_heap_restore_segment(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream,
                            const gm_restore_piece_t *pieces, size_t n_pieces) {
        return restore_segment(h, segment_id, va_size, stream, -1, 0, pieces, n_pieces);
}

int gm_heap_restore_segment_in_pool(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream,
                                    bool small_pool, const gm_restore_piece_t *pieces, size_t n_pieces) {
        return restore_segment(h, segment_id, va_size, stream, small_pool ? 1 : 0, 0, pieces, n_pieces);
}

int gm_heap_restore_segment_tagged(gm_heap_t *h, uint64_t segment_id, uint64_t va_size, uint64_t stream, int pool,
                                   unsigned tag, const gm_restore_piece_t *pieces, size_t n_pieces) {
        return restore_segment(h, segment_id, va_size, stream, pool < 0 ? -1 : pool > 0, tag, pieces, n_pieces);
}

int gm_heap_restore_block(gm_heap_t *h, uint64_t block_id, uint64_t segment_id, uint64_t offset, uint64_t size,
                          uint64_t requested_size, bool pending) {
        if (block_id == 0 || size == 0 || size % MIN_BLOCK_SIZE || offset % MIN_BLOCK_SIZE || requested_size == 0 ||
            requested_size > size || gm_idmap_get(&h->live, block_id))
                return -EINVAL;
        gm_segment_t *s = segment_find(h, segment_id);
        if (!s || offset >= s->size || size > s->size - offset)
                return -EINVAL;
        gm_block_t *b = s->first;
        while (b && b->offset + b->size <= offset)
                b = b->next;
        /* The block must lie inside one free, mapped stretch (no overlap with another). */
        if (!b || b->state != GM_BSTATE_FREE || !b->mapped || offset + size > b->offset + b->size)
                return -EINVAL;
        if (reserve_blocks(h, 2) < 0 || gm_idmap_reserve(&h->live, 1) < 0)
                return -ENOMEM;
        set_remove(h, b);
        if (offset > b->offset) {
                gm_block_t *n = block_new(h, s, offset, b->offset + b->size - offset, true);
                link_after(b, n);
                b->size = offset - b->offset;
                set_insert(h, b);
                b = n;
        }
        if (b->size > size) {
                link_after(b, block_new(h, s, offset + size, b->size - size, true));
                b->size = size;
                set_insert(h, b->next);
        }
        b->state = pending ? GM_BSTATE_PENDING : GM_BSTATE_ALLOCATED;
        b->id = block_id;
        b->requested_size = requested_size;
        gm_idmap_put(&h->live, b);
        if (!pending) {
                STAT(h, allocation, s, 1);
                STAT(h, allocated_bytes, s, size);
                b->oversize = size >= h->cfg.max_split_size;
                if (b->oversize)
                        STAT1(h, oversize_allocations, s, 1);
        }
        STAT(h, active, s, 1);
        STAT(h, active_bytes, s, size);
        STAT(h, requested_bytes, s, requested_size);
        if (block_id >= h->next_block_id)
                h->next_block_id = block_id + 1;
        return 0;
}

int gm_heap_restore_finish(gm_heap_t *h) {
        for (gm_segment_t *s = h->seg_head; s; s = s->next) {
                /* restored free memory may still have device work queued */
                for (gm_block_t *b = s->first; b; b = b->next)
                        if (b->state == GM_BSTATE_FREE && b->mapped)
                                b->free_seq = ++h->free_seq;
                if (s->expandable)
                        continue;
                for (gm_block_t *b = s->first; b; b = b->next)
                        if (b->state == GM_BSTATE_FREE && is_split(b)) {
                                STAT(h, inactive_split, s, 1);
                                STAT(h, inactive_split_bytes, s, b->size);
                        }
        }
        return gm_heap_check(h) == 0 ? 0 : -EBADMSG;
}
