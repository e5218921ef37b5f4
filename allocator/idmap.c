/* Block id -> live block, over the common u64 map. */
#include "debug.h"
#include "heap-internal.h"

int gm_idmap_reserve(gm_idmap_t *m, uint64_t extra) {
        return gm_u64map_reserve(&m->map, (size_t) extra);
}

void gm_idmap_put(gm_idmap_t *m, gm_block_t *b) {
        uint64_t count = m->count;
        int r;

        gm_dassert(b->id != 0 && b->state != GM_BSTATE_FREE);
        r = gm_u64map_put(&m->map, b->id, b);
        gm_assert(r == 0); /* room was reserved */
        m->count = m->map.len;
        gm_dassert(m->count == count + 1); /* ids are unique among live blocks */
}

gm_block_t *gm_idmap_get(const gm_idmap_t *m, uint64_t id) {
        return gm_u64map_get(&m->map, id);
}

void gm_idmap_del(gm_idmap_t *m, uint64_t id) {
        gm_u64map_remove(&m->map, id);
        m->count = m->map.len;
}

void gm_idmap_done(gm_idmap_t *m) {
        gm_u64map_done(&m->map);
        m->count = 0;
}
