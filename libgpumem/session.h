/* libgpumem's third floor: the session (Hello, re-attach after a daemon
 * restart, reconnect, close, a fork()ed child's own session), over the
 * segment table (mapping.h) and the connection (conn.h). The heaps above it
 * are reached only through the hooks table gpumem_connect_heap() sets
 * (gm_session_hooks_t). Not installed. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>

#include "conn.h"

/* What the heaps do at the session's turns; every function is set. */
typedef struct gm_session_hooks {
        /* A session just said Hello and opened its mapper: the heaps start
         * with the daemon's figures. page_fd is a local session's statistics
         * page (-1 for a central one), the caller's to close. */
        int (*opened)(gpumem_client *c, const Gpumem__HelloReply *hr, int page_fd);
        /* A local session re-attached to a new daemon, whose statistics page
         * this is; consumes page_fd. Caller holds lock. */
        int (*page_replaced)(gpumem_client *c, int page_fd);
        /* The session closes: the heaps forget their blocks, pending frees
         * and fences (owner: false in a fork()ed child, whose events and
         * mappings are its parent's), before the segments go. */
        void (*forget)(gpumem_client *c, bool owner);
} gm_session_hooks_t;

/* Connects to c->socket_path, says Hello, opens the mapper and the heaps
 * (hooks) and starts the service thread. */
int gm_session_open(gpumem_client *c);
/* Stops the service thread and drops every mapping and table entry. `owner`
 * is false in a fork()ed child: the socket is shared with the parent (so no
 * shutdown(), which would end the parent's session too), the service thread
 * did not survive the fork, and the parent's mappings were not inherited. */
void gm_session_close(gpumem_client *c, bool owner);
/* The daemon went away: reconnect with backoff and re-attach the session, for
 * at most reconnect_timeout_ms. Returns true when the session is back (the
 * connection's reconnect handler). */
bool gm_session_reconnect(gpumem_client *c);

/* Bumped in every fork()ed child: a session whose generation differs may
 * belong to the parent, without a getpid() on every call. */
extern _Atomic unsigned gm_session_fork_generation;
/* Installs the fork hook (once per process); the generation now. */
unsigned gm_session_watch_fork(void);
/* A fork()ed child must not speak on its parent's session: its first call
 * starts a session of its own. The parent's mappings were not inherited
 * (MADV_DONTFORK; CUDA mappings never are), so nothing is unmapped. */
int gm_session_after_fork(gpumem_client *c, unsigned generation);

/* 0 once c's session is this process's own (a fork()ed child's first call
 * opens it). */
static inline int gm_session_ensure_own(gpumem_client *c) {
        unsigned generation = atomic_load_explicit(&gm_session_fork_generation, memory_order_relaxed);
        if (__builtin_expect(generation == c->fork_generation, 1))
                return 0;
        return gm_session_after_fork(c, generation);
}
