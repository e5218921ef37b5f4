/* A small open-addressing hash map from uint64 keys to pointers: linear
 * probing, backward-shift deletion (no tombstones), load factor <= 1/2.
 * Not thread-safe; the caller locks. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gm_u64map {
        uint64_t *keys; /* 0 = empty slot; key 0 itself lives in zero_value */
        void **values;
        size_t cap; /* power of two */
        size_t len; /* entries, key 0 included */
        bool has_zero;
        void *zero_value;
} gm_u64map_t;

/* Makes room for `extra` more entries, so that as many puts cannot fail. */
int gm_u64map_reserve(gm_u64map_t *m, size_t extra);
/* Inserts or replaces; -ENOMEM when growing fails. */
int gm_u64map_put(gm_u64map_t *m, uint64_t key, void *value);
/* The value of `key`, or NULL (also for a NULL value: see gm_u64map_find). */
void *gm_u64map_get(const gm_u64map_t *m, uint64_t key);
/* Whether `key` is present; its value in *ret_value when it is. */
bool gm_u64map_find(const gm_u64map_t *m, uint64_t key, void **ret_value);
/* Removes `key` and returns its value (NULL if absent). */
void *gm_u64map_remove(gm_u64map_t *m, uint64_t key);
/* Frees the table (not the values). */
void gm_u64map_done(gm_u64map_t *m);
