/* Tagged pools on the client (floor 0): a session's table of tag names
 * (id 0 is the default pool "", ids 1 .. GM_POOL_MAX_TAGS the names its
 * scopes used, in order of first use, never forgotten while the session
 * lives) and each thread's stack of open scopes per client. An allocation
 * carries the id on top of its thread's stack (the heap's tag id, allocator.h),
 * its name travels in Grant and Alloc. Calls nothing above it. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define GM_POOL_MAX_TAGS 16 /* distinct names per session (the contract's max_tags) */
#define GM_POOL_MAX_DEPTH 8 /* open scopes per thread and client */

/* The session's names; lives in gpumem_client (client_state.h). Names are
 * only appended: n is published (release) after its name is written, so a
 * reader that loads n (acquire) reads names below it without a lock. */
typedef struct gm_pool_names {
        pthread_mutex_t lock; /* serialises appends */
        _Atomic unsigned n;   /* names[1 .. n] are in use */
        uint64_t serial;      /* tells this client's thread stacks from a freed one's at the same address */
        char names[GM_POOL_MAX_TAGS + 1][32];
} gm_pool_names_t;

/* Scopes are open on some thread of the process (read before any lookup). */
extern _Atomic unsigned long gm_pool_scopes_open;

void gm_pool_names_init(gm_pool_names_t *p);
void gm_pool_names_done(gm_pool_names_t *p);
/* Opens a scope of `tag` ("" = the default pool) on the calling thread:
 * -EINVAL for a malformed name, -E2BIG past GM_POOL_MAX_DEPTH open scopes
 * or GM_POOL_MAX_TAGS names, -ENOBUFS when the thread has scopes open on
 * four other clients. */
int gm_pool_begin(gm_pool_names_t *p, const char *tag);
/* Closes the thread's innermost scope of these names' client: -ENOENT when none is open. */
int gm_pool_end(const gm_pool_names_t *p);
/* gm_pool_current() once some scope is open somewhere. */
unsigned gm_pool_current_slow(const gm_pool_names_t *p);
/* The id of the thread's innermost scope on c (0: none); inline, one
 * relaxed load while no scope is open anywhere in the process. */
static inline unsigned gm_pool_current(const gm_pool_names_t *p) {
        if (!atomic_load_explicit(&gm_pool_scopes_open, memory_order_relaxed))
                return 0;
        return gm_pool_current_slow(p);
}
/* The name of id (`""` for 0 or an id not in use). */
const char *gm_pool_name(const gm_pool_names_t *p, unsigned id);
/* The id of `tag`: 0 for "", -ENOENT for a name the session never used. */
int gm_pool_find(const gm_pool_names_t *p, const char *tag, unsigned *ret_id);
/* A thread that exits with scopes open leaves gm_pool_scopes_open above 0:
 * gm_pool_current() then takes its slow path (a lookup in the thread's four
 * slots) for the rest of the process, still correct. */
