/* What the files of libgpumem share beyond the public header: gpumem.c owns
 * the session (connection, service thread, blocks); admin.c builds the
 * observability and administration calls on its request path. Not installed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "gpumem/gpumem.h"
#include "msg.h"
#include "stats.h"

/* Records the calling thread's detailed message for gpumem_last_error(c) and
 * returns err. */
int gm_client_set_error(const gpumem_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Sends env on c's session (a fork()ed child gets its own first) and waits for
 * a reply with body `want`. An Error reply becomes its negative code, with its
 * text for gpumem_last_error(). With ret_fd, *ret_fd is the first fd the reply
 * carried or -1, the caller's to close; without, fds are closed. */
int gm_client_call(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                   Gpumem__Envelope **ret_reply, int *ret_fd);

/* A local session: resets its heap's peaks and/or accumulated figures (the
 * daemon's own figures of the session follow its ResetStats). Central: nothing. */
void gm_client_reset_local_stats(gpumem_client *c, bool peak, bool accumulated);

/* A local session's heap statistics (a copy), its daemon's device index and
 * capacity; -EOPNOTSUPP for a central session. */
int gm_client_local_stats(gpumem_client *c, gm_stats_t *ret_stats, int *ret_device, uint64_t *ret_capacity);
/* A local session's snapshot of its own heap (its segments, blocks and trace
 * ring), JSON or pickle, freed with free(); -EOPNOTSUPP for a central one. */
int gm_client_local_snapshot(gpumem_client *c, bool json, char **ret_buf, size_t *ret_len);
/* A local session's heap records its trace (at most max_entries) or stops
 * (clearing it); a central one: nothing. */
int gm_client_local_history(gpumem_client *c, bool enabled, uint64_t max_entries);

/* The socket c is connected to. */
const char *gm_client_socket_path(const gpumem_client *c);

/* Points wire[0..n) and ptrs[0..n) at frames[0..n) for an Alloc request, n
 * being at most GPUMEM_MAX_FRAMES; returns n. NULL strings become "". */
size_t gm_client_wire_frames(const gpumem_frame *frames, size_t n_frames, Gpumem__Frame *wire, Gpumem__Frame **ptrs);

/* ---- local_snapshot.c: the daemon's snapshot queries and history pushes ----
 * The dispatcher (holding the client's lock) records what the daemon asked
 * (gm_local_asks_note); the service thread serves it once it holds the heap
 * (gm_local_asks_serve), as it serves a Reclaim. */
typedef struct gm_local_asks {
        uint64_t query_id; /* a SnapshotQuery yet to answer (0: none) */
        uint64_t query_max_bytes;
        bool history_due; /* a history push yet to apply */
        bool history_enabled;
        uint64_t history_max_entries;
} gm_local_asks_t;

/* Notes a SnapshotQuery or HistoryControl push; true when it is one (the
 * service thread is then to be woken). Caller holds the client's lock. */
bool gm_local_asks_note(gm_local_asks_t *asks, const Gpumem__Envelope *env);
/* Serves what was noted; service thread only, holding neither lock. Returns
 * true while something waits (the heap was busy). */
bool gm_local_asks_serve(gpumem_client *c);

/* What local_snapshot.c needs of the session (gpumem.c). */
gm_local_asks_t *gm_client_asks_lock(gpumem_client *c); /* takes the client's lock */
void gm_client_asks_unlock(gpumem_client *c);
struct gm_local *gm_client_heap_trylock(gpumem_client *c); /* NULL: busy (or no heap) */
void gm_client_heap_unlock(gpumem_client *c);
/* Sends a daemon-initiated exchange's packet (an answer), in order. */
int gm_client_post(gpumem_client *c, Gpumem__Envelope *env);
/* The largest packet the daemon accepts. */
uint32_t gm_client_max_packet(const gpumem_client *c);
