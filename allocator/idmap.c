/* Block id -> live block: open addressing with linear probing and
 * backward-shift deletion (no tombstones). Load factor stays <= 1/2. */
#include <errno.h>
#include <stdlib.h>

#include "heap-internal.h"

static uint64_t hash(uint64_t x) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
        return x;
}

static void put_raw(gm_block_t **slots, uint64_t cap, gm_block_t *b) {
        uint64_t i = hash(b->id) & (cap - 1);

        while (slots[i])
                i = (i + 1) & (cap - 1);
        slots[i] = b;
}

int gm_idmap_reserve(gm_idmap_t *m, uint64_t extra) {
        uint64_t cap = m->cap ? m->cap : 16;
        gm_block_t **slots;

        while ((m->count + extra) * 2 > cap)
                cap *= 2;
        if (cap == m->cap)
                return 0;
        slots = calloc(cap, sizeof(*slots));
        if (!slots)
                return -ENOMEM;
        for (uint64_t i = 0; i < m->cap; i++)
                if (m->slots[i])
                        put_raw(slots, cap, m->slots[i]);
        free(m->slots);
        m->slots = slots;
        m->cap = cap;
        return 0;
}

void gm_idmap_put(gm_idmap_t *m, gm_block_t *b) {
        put_raw(m->slots, m->cap, b);
        m->count++;
}

static uint64_t find(const gm_idmap_t *m, uint64_t id) {
        uint64_t i;

        if (!m->cap)
                return UINT64_MAX;
        for (i = hash(id) & (m->cap - 1); m->slots[i]; i = (i + 1) & (m->cap - 1))
                if (m->slots[i]->id == id)
                        return i;
        return UINT64_MAX;
}

gm_block_t *gm_idmap_get(const gm_idmap_t *m, uint64_t id) {
        uint64_t i = find(m, id);

        return i == UINT64_MAX ? NULL : m->slots[i];
}

void gm_idmap_del(gm_idmap_t *m, uint64_t id) {
        uint64_t mask = m->cap - 1, i = find(m, id), j;

        if (i == UINT64_MAX)
                return;
        m->slots[i] = NULL;
        m->count--;
        /* Shift back every later entry of the cluster that may not stay behind the hole. */
        for (j = (i + 1) & mask; m->slots[j]; j = (j + 1) & mask) {
                uint64_t home = hash(m->slots[j]->id) & mask;

                if (((j - home) & mask) >= ((j - i) & mask)) {
                        m->slots[i] = m->slots[j];
                        m->slots[j] = NULL;
                        i = j;
                }
        }
}

void gm_idmap_done(gm_idmap_t *m) {
        free(m->slots);
        *m = (gm_idmap_t){0};
}
