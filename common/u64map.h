/* A small open-addressing hash map from non-zero uint64 keys to pointers.
 * Not thread-safe; the caller locks. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct gm_u64map {
        uint64_t *keys; /* 0 = empty slot; tombstones are avoided by backward-shift deletion */
        void **values;
        size_t cap;     /* power of two */
        size_t len;
} gm_u64map_t;

/* Inserts or replaces; -ENOMEM when growing fails. key must be non-zero. */
int gm_u64map_put(gm_u64map_t *m, uint64_t key, void *value);
void *gm_u64map_get(const gm_u64map_t *m, uint64_t key);
/* Removes `key` and returns its value (NULL if absent). */
void *gm_u64map_remove(gm_u64map_t *m, uint64_t key);
/* Frees the table (not the values). */
void gm_u64map_done(gm_u64map_t *m);
