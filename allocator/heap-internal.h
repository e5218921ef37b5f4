/* Internal structures of the caching allocator (heap.c, freeset.c, idmap.c).
 *
 * A segment is one provider allocation (or, when expandable, one virtual range
 * mapped page by page). Its blocks tile it exactly, linked by address through
 * prev/next. A free, mapped block sits in its pool's free set ordered by
 * (stream, size, address); a free unmapped range of an expandable
 * segment sits in the pool's unmapped set ordered by (stream, 0, address).
 * Allocated and pending-free blocks sit in the id map instead. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "allocator.h"
#include "u64map.h"

/* Intrusive AVL tree node; the key is copied in at insertion so the tree
 * stays ordered even while the owner's fields change outside it. */
typedef struct gm_tnode {
        struct gm_tnode *left, *right;
        uint64_t key[3];
        uint64_t max_key1; /* largest key[1] in this subtree (free set: size) */
        int height;
} gm_tnode_t;

/* Inserts `n` (its key already set; keys are unique). */
void gm_tree_insert(gm_tnode_t **root, gm_tnode_t *n);
/* Removes `n`, which must be in the tree. */
void gm_tree_remove(gm_tnode_t **root, gm_tnode_t *n);
/* First node with key >= k (NULL if none). */
gm_tnode_t *gm_tree_lower_bound(gm_tnode_t *root, const uint64_t k[3]);
/* First node with key > k, last node with key < k (NULL if none). */
gm_tnode_t *gm_tree_next(gm_tnode_t *root, const uint64_t k[3]);
gm_tnode_t *gm_tree_prev(gm_tnode_t *root, const uint64_t k[3]);
/* Number of structural violations (order, heights, balance, max_key1);
 * stores the node count in *ret_count. */
int gm_tree_check(const gm_tnode_t *root, uint64_t *ret_count);

typedef enum gm_bstate {
        GM_BSTATE_FREE,
        GM_BSTATE_ALLOCATED,
        GM_BSTATE_PENDING,
} gm_bstate_t;

typedef struct gm_segment gm_segment_t;

typedef struct gm_block {
        gm_tnode_t node;              /* free set or unmapped set (free blocks only) */
        struct gm_block *prev, *next; /* neighbours by address in the segment */
        gm_segment_t *seg;
        uint64_t id;     /* 0 while free */
        uint64_t offset; /* in the segment */
        uint64_t size;
        uint64_t requested_size; /* original request of the last handout */
        uint64_t gc_stamp;       /* pool's get_free_block count at insertion */
        uint64_t free_seq;       /* free blocks: the heap's free count at the newest
                                      * free inside it (0 = never handed out since mapped) */
        uint8_t state;           /* gm_bstate_t */
        bool mapped;             /* always true outside expandable segments */
        bool oversize;           /* counted in oversize_allocations */
} gm_block_t;

struct gm_segment {
        gm_segment_t *prev, *next; /* heap's list, address order */
        gm_block_t *first;         /* block at offset 0 */
        uint64_t id;
        uint64_t addr;
        uint64_t size; /* virtual size (the whole segment) */
        uint64_t stream;
        uint64_t handle; /* ordinary segment: the provider handle */
        bool small;
        bool expandable;
        bool oversize; /* counted in oversize_segments */
        uint8_t tag;   /* its pool's tag (gm_heap_alloc_tagged()); never changes */
        /* expandable only: */
        uint64_t page_size;
        uint64_t n_pages, mapped_pages;
        uint64_t cap_pages;    /* length of the two page arrays, grown on demand; pages
                                    * from here to n_pages are unmapped */
        uint64_t *page_handle; /* per page; valid where page_mapped */
        uint8_t *page_mapped;
};

/* Block id -> live (allocated or pending) block. */
typedef struct gm_idmap {
        gm_u64map_t map;
        uint64_t count; /* = map.len */
} gm_idmap_t;

/* Makes room for `extra` more entries; -ENOMEM on failure (map unchanged). */
int gm_idmap_reserve(gm_idmap_t *m, uint64_t extra);
/* Inserts `b` keyed by b->id; room must have been reserved. */
void gm_idmap_put(gm_idmap_t *m, gm_block_t *b);
gm_block_t *gm_idmap_get(const gm_idmap_t *m, uint64_t id);
/* Removes the entry of `id` if present. */
void gm_idmap_del(gm_idmap_t *m, uint64_t id);
void gm_idmap_done(gm_idmap_t *m);
