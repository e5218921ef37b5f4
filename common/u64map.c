#include "u64map.h"

#include <errno.h>
#include <stdlib.h>

static size_t slot_of(uint64_t key, size_t cap) {
        key ^= key >> 33;
        key *= 0xff51afd7ed558ccdull;
        key ^= key >> 33;
        return (size_t) key & (cap - 1);
}

static int grow_to(gm_u64map_t *m, size_t cap) {
        uint64_t *keys = calloc(cap, sizeof(*keys));
        void **values = calloc(cap, sizeof(*values));
        if (!keys || !values) {
                free(keys);
                free(values);
                return -ENOMEM;
        }
        for (size_t i = 0; i < m->cap; i++) {
                if (!m->keys[i])
                        continue;
                size_t j = slot_of(m->keys[i], cap);
                while (keys[j])
                        j = (j + 1) & (cap - 1);
                keys[j] = m->keys[i];
                values[j] = m->values[i];
        }
        free(m->keys);
        free(m->values);
        m->keys = keys;
        m->values = values;
        m->cap = cap;
        return 0;
}

int gm_u64map_reserve(gm_u64map_t *m, size_t extra) {
        size_t cap = m->cap ? m->cap : 64;
        while ((m->len + extra) * 2 > cap)
                cap *= 2;
        return cap == m->cap ? 0 : grow_to(m, cap);
}

int gm_u64map_put(gm_u64map_t *m, uint64_t key, void *value) {
        if (!key) {
                m->len += !m->has_zero;
                m->has_zero = true;
                m->zero_value = value;
                return 0;
        }
        if ((m->len + 1) * 2 > m->cap) {
                int r = gm_u64map_reserve(m, 1);
                if (r < 0)
                        return r;
        }
        size_t i = slot_of(key, m->cap);
        while (m->keys[i] && m->keys[i] != key)
                i = (i + 1) & (m->cap - 1);
        if (!m->keys[i])
                m->len++;
        m->keys[i] = key;
        m->values[i] = value;
        return 0;
}

bool gm_u64map_find(const gm_u64map_t *m, uint64_t key, void **ret_value) {
        if (!key) {
                if (m->has_zero && ret_value)
                        *ret_value = m->zero_value;
                return m->has_zero;
        }
        if (!m->cap)
                return false;
        for (size_t i = slot_of(key, m->cap); m->keys[i]; i = (i + 1) & (m->cap - 1))
                if (m->keys[i] == key) {
                        if (ret_value)
                                *ret_value = m->values[i];
                        return true;
                }
        return false;
}

void *gm_u64map_get(const gm_u64map_t *m, uint64_t key) {
        void *value = NULL;
        gm_u64map_find(m, key, &value);
        return value;
}

void *gm_u64map_remove(gm_u64map_t *m, uint64_t key) {
        if (!key) {
                void *value = m->has_zero ? m->zero_value : NULL;
                m->len -= m->has_zero;
                m->has_zero = false;
                m->zero_value = NULL;
                return value;
        }
        if (!m->cap)
                return NULL;
        size_t mask = m->cap - 1, i = slot_of(key, m->cap);
        while (m->keys[i] && m->keys[i] != key)
                i = (i + 1) & mask;
        if (!m->keys[i])
                return NULL;
        void *value = m->values[i];
        /* Backward-shift deletion keeps every probe chain unbroken. */
        size_t hole = i;
        for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
                size_t home = slot_of(m->keys[j], m->cap);
                if (((j - home) & mask) >= ((j - hole) & mask)) {
                        m->keys[hole] = m->keys[j];
                        m->values[hole] = m->values[j];
                        hole = j;
                }
        }
        m->keys[hole] = 0;
        m->values[hole] = NULL;
        m->len--;
        return value;
}

void gm_u64map_done(gm_u64map_t *m) {
        free(m->keys);
        free(m->values);
        *m = (gm_u64map_t){0};
}
