/* The broker's private structures, shared by every floor (the calls each
 * floor offers those above it are in books.h, piece.h, holder.h and
 * reclaim.h).
 *
 * The broker in floors: a file calls only files on its own floor or below
 * it, and no two files call each other (scripts/check-layers.py knows the
 * map and fails on an upward include or call):
 *   5  broker.c (the facade: the daemon's requests, lifetime, tick, check),
 *      reattach.c
 *   4  reclaim.c (reclaim across sessions, parking, refusals)
 *   3  session_central.c, session_local.c (the two kinds of holders) over
 *      session.c
 *   2  piece.c, orphan.c, process_check.c
 *   1  ledger.c, tenant.c, outcome.c, host.c
 * Upward only through the host's gm_broker_ops_t. */
#pragma once

#include <syslog.h>

#include "broker.h"
#include "clock.h"
#include "debug.h"

/* A ReleaseRequest sent to a client and not yet acknowledged: its pieces stay
 * charged to the tenant and held in the backend until the ack. */
typedef struct gm_release {
        uint64_t id;
        gm_piece_t *pieces; /* RELEASING, linked by ->queue, in release order */
        uint64_t bytes;
        uint64_t sent_at_ms;
        uint32_t attempts;
        bool held;       /* charged, never asked again, until the session ends: the client could not unmap these,
                            or (unverified) said it did where nothing could check it */
        bool unverified; /* held: acknowledged, and counted in release_unverified_bytes */
        gm_holder_note_t holder; /* process_check.c: read when the release was first asked for */
        struct gm_release *next;
} gm_release_t;

/* What a session asks memory for: an allocation in its heap here (central)
 * or a piece for its client's heap (local). */
typedef struct gm_request {
        bool is_grant;
        uint64_t size, stream; /* an allocation */
        gm_grant_t grant;      /* a grant */
} gm_request_t;

/* A request that failed while reclaimed memory was on its way back; retried
 * when memory comes back, and refused after park_timeout_ms (reclaim.c). */
typedef struct gm_parked {
        uint64_t request_id;
        uint64_t seq; /* park order across sessions */
        gm_request_t rq;
        uint64_t parked_at_ms;
        struct gm_parked *next;
} gm_parked_t;

/* Stored pieces of one session of the previous daemon, awaiting its client. */
typedef struct gm_orphan {
        char token[GM_TOKEN_LEN + 1];
        uid_t uid;
        gm_piece_t *pieces; /* ORPHAN, linked by ->next */
        uint64_t bytes;
        struct gm_orphan *next;
} gm_orphan_t;

/* Memory whose session is gone (or whose client acknowledged a release) while
 * a process still maps it: it stays in the backend and charged to its tenant
 * until the backend says the last mapping is gone (checked every tick). */
typedef struct gm_lingering {
        gm_phys_t phys;
        gm_tenant_t *tenant;
        pid_t pid; /* the session's, where the backend can only tell per process */
        struct gm_lingering *next;
} gm_lingering_t;

/* A session the journal says the previous daemon had: only such tokens (or an
 * orphan's) may be re-attached, and only by the same uid. */
typedef struct gm_known_token {
        char token[GM_TOKEN_LEN + 1];
        uid_t uid;
} gm_known_token_t;

typedef struct gm_ledger_entry {
        uint64_t store_id;
        char token[GM_TOKEN_LEN + 1];
        unsigned uid;
        uint64_t segment_id, offset, size, va_size;
        gm_piece_pool_t pool;
} gm_ledger_entry_t;
