/* Tagged pools on the client: the session's names and the threads' scope
 * stacks (pool.h). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "pool.h"
#include "text.h"

#define STACKS_PER_THREAD 4 /* clients a thread may have scopes open on at once */

/* One thread's scopes on one client (depth 0: a free slot). */
typedef struct pool_stack {
        const gm_pool_names_t *names;
        uint64_t serial;
        unsigned depth;
        uint8_t ids[GM_POOL_MAX_DEPTH];
} pool_stack_t;

static _Thread_local pool_stack_t stacks[STACKS_PER_THREAD];
static _Atomic uint64_t next_serial = 1;
_Atomic unsigned long gm_pool_scopes_open;

void gm_pool_names_init(gm_pool_names_t *p) {
        memset(p, 0, sizeof(*p));
        pthread_mutex_init(&p->lock, NULL);
        p->serial = atomic_fetch_add(&next_serial, 1);
}

void gm_pool_names_done(gm_pool_names_t *p) {
        if (p)
                pthread_mutex_destroy(&p->lock);
}

static pool_stack_t *stack_of(const gm_pool_names_t *p) {
        for (int i = 0; i < STACKS_PER_THREAD; i++)
                if (stacks[i].names == p && stacks[i].serial == p->serial && stacks[i].depth)
                        return &stacks[i];
        return NULL;
}

int gm_pool_find(const gm_pool_names_t *p, const char *tag, unsigned *ret_id) {
        unsigned n = atomic_load_explicit(&p->n, memory_order_acquire);

        if (!gm_text_tag_valid(tag, true))
                return -EINVAL;
        if (!*tag) {
                *ret_id = 0;
                return 0;
        }
        for (unsigned id = 1; id <= n; id++)
                if (strcmp(p->names[id], tag) == 0) {
                        *ret_id = id;
                        return 0;
                }
        return -ENOENT;
}

/* The id of `tag`, appended to the names if new. */
static int intern(gm_pool_names_t *p, const char *tag, unsigned *ret_id) {
        int r = gm_pool_find(p, tag, ret_id);
        unsigned n;

        if (r != -ENOENT)
                return r;
        pthread_mutex_lock(&p->lock);
        r = gm_pool_find(p, tag, ret_id); /* another thread may have added it */
        n = atomic_load_explicit(&p->n, memory_order_relaxed);
        if (r == -ENOENT && n < GM_POOL_MAX_TAGS) {
                strcpy(p->names[n + 1], tag); /* gm_text_tag_valid(): at most 31 bytes */
                atomic_store_explicit(&p->n, n + 1, memory_order_release);
                *ret_id = n + 1;
                r = 0;
        } else if (r == -ENOENT)
                r = -E2BIG;
        pthread_mutex_unlock(&p->lock);
        return r;
}

int gm_pool_begin(gm_pool_names_t *p, const char *tag) {
        pool_stack_t *st = stack_of(p);
        unsigned id;
        int r;

        if (st && st->depth >= GM_POOL_MAX_DEPTH)
                return -E2BIG;
        r = intern(p, tag, &id);
        if (r < 0)
                return r;
        for (int i = 0; !st && i < STACKS_PER_THREAD; i++)
                if (!stacks[i].depth) {
                        st = &stacks[i];
                        *st = (pool_stack_t){.names = p, .serial = p->serial};
                }
        if (!st)
                return -ENOBUFS;
        st->ids[st->depth++] = (uint8_t) id;
        atomic_fetch_add_explicit(&gm_pool_scopes_open, 1, memory_order_relaxed);
        return 0;
}

int gm_pool_end(const gm_pool_names_t *p) {
        pool_stack_t *st = stack_of(p);

        if (!st)
                return -ENOENT;
        st->depth--;
        atomic_fetch_sub_explicit(&gm_pool_scopes_open, 1, memory_order_relaxed);
        return 0;
}

unsigned gm_pool_current_slow(const gm_pool_names_t *p) {
        const pool_stack_t *st = stack_of(p);

        return st ? st->ids[st->depth - 1] : 0;
}

const char *gm_pool_name(const gm_pool_names_t *p, unsigned id) {
        if (id == 0 || id > atomic_load_explicit(&p->n, memory_order_acquire))
                return "";
        return p->names[id];
}
