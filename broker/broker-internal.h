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
 *   2  piece.c, orphan.c (adopts shared objects too), shared.c (the shared
 *      registry), process_check.c
 *   1  ledger.c, tenant.c, claim.c, outcome.c, host.c, checker.c
 * Upward only through the host's gm_broker_ops_t. */
#pragma once

#include <syslog.h>

#include "broker.h"
#include "clock.h"
#include "debug.h"

/* The Reclaim a local session's client was asked (one at a time). */
typedef struct gm_session_reclaim {
        uint64_t id;    /* outstanding (0: none) */
        uint64_t bytes; /* what it should bring back */
        uint64_t sent_ms;
        uint64_t next_id;
        uint64_t dry_until_ms; /* its last one brought nothing back: not asked again before */
} gm_session_reclaim_t;

/* Page reuse's stream fences of a central session on a device backend: its
 * heap marks fences (stream_fence()), the next allocation reply asks the
 * client to record them (an event on the stream when it applies the reply:
 * after the frees it sent), and the client reports the complete ones with
 * its next allocations; or the client marks one on its own before an
 * allocation and finds it complete (gm_session_central_frees_fenced()). asked >=
 * sent >= done. */
typedef struct gm_session_fence {
        uint64_t stream;
        uint64_t asked; /* highest fence number the heap marked */
        uint64_t sent;  /* highest one the client was asked to mark, or marked on its own */
        uint64_t done;  /* highest one the client reported complete */
} gm_session_fence_t;

/* A session's process as the driver sees it (process_check.c): its device
 * memory less what the daemon had mapped into it, read at one moment. */
typedef struct gm_process_check_note {
        bool noted; /* false: the driver gave no figure */
        int64_t unaccounted;
        uint64_t in_flight; /* live bytes handed to the process just before: maybe not mapped by it yet */
} gm_holder_note_t;

/* A session: opaque outside the broker (the daemon reads it through
 * gm_session_view() and a few accessors). */
struct gm_session {
        gm_broker_t *broker;
        uint64_t id;
        pid_t pid;
        uid_t uid;
        char name[64];
        char unit[256];
        bool admin;
        bool admin_conn;
        void *userdata;
        gm_tenant_t *tenant; /* set at start */
        char token[GM_TOKEN_LEN + 1];
        bool reattaching;             /* between a resuming start and the last re-attach report */
        bool lied;                    /* acknowledged a release it had not done: its memory is checked when it ends */
        bool local;                   /* its heap runs in its client: granted pieces, no heap here */
        bool unresponsive;            /* answered nothing it owes for unresponsive_timeout_ms: not waited for */
        uint64_t owing_since_ms;      /* since when it owes an answer to a release or Reclaim (0: nothing) */
        gm_session_grants_t grants;   /* local */
        gm_session_sleep_t sleep;     /* local: asleep (gm_session_local_sleep_state) */
        gm_session_tags_t tags;       /* its tagged pools' names and charged bytes (piece.c books them) */
        uint8_t cur_tag;              /* central: the tag of the allocation being served (its new pieces') */
        bool cur_capturing;           /* central: the allocation being served is on a captured stream (only within
                                       * gm_session_central_try_alloc) */
        gm_session_reclaim_t reclaim; /* local */
        uint64_t reattach_items;
        bool ended;      /* memory released; no request is served any more */
        gm_heap_t *heap; /* created at the first allocation */
        uint64_t last_active_ms;
        const gm_frame_t *cur_frames; /* frames of the allocation being served (history) */
        gm_history_t *history;        /* its own history (gm_session_history()); NULL while off */
        size_t history_max_entries;   /* its own history's bound */
        size_t n_cur_frames;
        gm_piece_t *pieces;              /* every piece it owns (any state) */
        gm_piece_t *new_head, *new_tail; /* LIVE, not yet sent, in creation order */
        gm_piece_t *rel_head, *rel_tail; /* TO_RELEASE, in release order */
        gm_piece_t *adopting;            /* ADOPTING */
        struct gm_release *releases;     /* sent, awaiting ReleaseAck */
        uint64_t releasing_bytes;
        uint64_t next_release_id;
        struct gm_parked *parked, *parked_tail;
        uint32_t n_parked;
        void *owned;           /* the daemon's one block for it (gm_session_owned()): opaque here, freed with it */
        uint64_t retry_pass;   /* the last retry that left its first parked request waiting */
        gm_page_move_t *moves; /* pending, in the order the heap made them */
        size_t n_moves, cap_moves;
        gm_session_fence_t *fences; /* GM_SESSION_FENCE_STREAMS, made on first use; those with asked > sent go
                                       * out with the next allocation reply */
        size_t n_fences;
        uint64_t release_unverified_bytes; /* released on its word, which nothing could check: held until it ends */
        uint64_t claim_bytes;              /* its unconsumed claim (claim.c): set aside for it alone */
        gm_holder_note_t holder;           /* local: what its returned pieces are checked against */
        bool return_intent_open; /* local: holder was noted for a give-back whose last ReturnPieces has not come */
        bool return_intents;     /* local: it has announced a give-back: each brings its own reference */
        /* The audit (process_check.c): bytes released on its process's figure
         * (its client may keep their fds and map them again), the figure less
         * the daemon's memory that its process may hold of its own (the
         * lowest reference of those releases, less what was audited then),
         * what the last audit found beyond it, and when. */
        uint64_t audit_released;
        bool audit_based;
        bool baseline_tried;       /* its baseline was read (once, before its first hand-out) */
        gm_holder_note_t baseline; /* its process's own memory then: what an ended session is audited against */
        int64_t audit_base;
        uint64_t audited_bytes;
        uint64_t audited_ms;
        uint32_t shared_opens; /* its opens and staging objects in the shared registry (shared.c) */
        struct gm_session *prev, *next;
};

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
        uint8_t tag;           /* its tagged pool (an id of the session's tags) */
        bool capturing;        /* an allocation whose stream its client captures: the heap releases nothing */
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
        gm_session_tags_t tags; /* the pool names its pieces' journal lines give their tag ids */
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

/* A process whose session ended while its driver figure still showed
 * memory the daemon had handed it (process_check.c): audited on the tick
 * like a live session, the excess charged to its tenant as audited, until
 * the driver lists it with no memory (it exited). One per process and
 * tenant, at most limits.max_audited_processes, the oldest dropped. */
typedef struct gm_audited_process {
        pid_t pid;
        gm_tenant_t *tenant;
        int64_t base;           /* its own memory: its figure less the daemon's, before its sessions' first hand-out */
        uint64_t held;          /* the most it may still map: what its ended sessions were handed or gave back */
        uint64_t audited_bytes; /* what the last audit found of it: charged as audited */
        uint64_t audited_ms;
        uint64_t ended_ms; /* its latest session's end */
        struct gm_audited_process *next;
} gm_audited_process_t;

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
        unsigned tag;      /* its session's tagged pool id (0: the default), named tag_name */
        char tag_name[32]; /* "" with tag 0 */
} gm_ledger_entry_t;

/* A session's opens of one shared object. */
typedef struct gm_shared_open {
        gm_session_t *session;
        uint32_t count;
        uint64_t handed_ms; /* its last open's fd was sent (gm_now_ms): maybe not mapped yet */
        uint64_t client_id; /* re-attached: the previous daemon's id the client closes it by (0: opened here) */
        struct gm_shared_open *next;
} gm_shared_open_t;

/* A shared object (shared.c). Charged to `tenant` while it exists; its phys
 * counts in the backend's in_use. */
struct gm_shared {
        uint64_t id;
        char name[GM_SHARED_NAME_MAX + 1];
        uint64_t version;
        gm_tenant_t *tenant;
        gm_phys_t phys;
        gm_shared_state_t state;
        gm_session_t *stager; /* STAGING: the session filling it */
        uint64_t handed_ms;   /* STAGING: when its fd went to the stager (gm_now_ms) */
        gm_shared_open_t *opens;
        uint32_t mappers; /* = the opens' counts */
        uint64_t created_unix_ms;
        uint32_t retention_s;
        char **readers;
        size_t n_readers;
        void *meta;
        size_t meta_len;
        uint64_t store_id; /* kept in the fd store and journalled (0: not) */
        /* Adopted from the previous daemon, and its re-attach window
         * (orphans_deadline_ms) is not over: sessions that map it may still
         * re-attach, so it is not released while withdrawn. */
        bool mappers_unknown;
        struct gm_shared *next;
};

/* A shared object as the journal recorded it ("o" line and its side file). */
typedef struct gm_ledger_shared {
        uint64_t store_id, version, size, created_unix_ms;
        uint32_t retention_s;
        char name[GM_SHARED_NAME_MAX + 1];
        char tenant[64];
} gm_ledger_shared_t;
