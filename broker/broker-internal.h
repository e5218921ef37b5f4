/* The broker's private structures and the calls its files make to each other. */
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
 * when memory comes back, and refused after park_timeout_ms (park.c). */
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

/* Checks the lingering memory, releasing what nobody maps any more; with
 * `all`, releases all of it (the broker is going away). */
void gm_lingering_sweep(gm_broker_t *b, bool all);
/* Whether the backend says this piece's memory is still mapped somewhere. */
bool gm_piece_still_mapped(const gm_broker_t *b, const gm_piece_t *p);

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

void gm_broker_log(const gm_broker_t *b, int priority, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
uint64_t gm_broker_now_ms(void);

/* piece.c */
bool gm_piece_charged(const gm_piece_t *p);
/* Links a piece into s's list (state and charge as given). */
void gm_piece_attach(gm_session_t *s, gm_piece_t *p, gm_piece_state_t state);
/* Returns a piece's memory to the backend, uncharges and unstores it (keeps
 * it stored when the broker keeps stored pieces), unlinks and frees it. */
void gm_piece_destroy(gm_broker_t *b, gm_piece_t *p);
/* An orphan from the fd store, adopted through the backend. */
int gm_piece_adopt(gm_broker_t *b, int fd, const gm_ledger_entry_t *e, gm_piece_t **ret_piece);
/* A piece a re-attaching client reports with no stored handle: accounted,
 * unbacked (the client's mapping is its only reference). NULL when it does
 * not fit the device or on -ENOMEM. */
gm_piece_t *gm_piece_new_unbacked(gm_session_t *s, const gm_piece_spec_t *spec);
/* Appends p to the session's pieces not yet sent to its client (s->new_head). */
void gm_piece_list_unsent(gm_session_t *s, gm_piece_t *p);
/* Moves an ADOPTING piece to LIVE in the heap (charges it). */
void gm_piece_claimed(gm_session_t *s, gm_piece_t *p);
/* A LIVE piece goes to the client's heap: granted, in no heap here, not
 * listed for a reply. */
void gm_piece_granted(gm_session_t *s, gm_piece_t *p);

/* ledger.c */
void gm_ledger_store(gm_broker_t *b, const gm_session_t *s, gm_piece_t *p);
void gm_ledger_unstore(gm_broker_t *b, gm_piece_t *p);
/* A stored piece's place changed (page reuse): journalled anew. */
void gm_ledger_moved(gm_broker_t *b, gm_piece_t *p);
/* Journals a session's token and uid at its start, and its end (unless the
 * broker is stopping: then its client may claim it from the next daemon). */
void gm_ledger_session_started(gm_broker_t *b, const gm_session_t *s);
void gm_ledger_session_ended(gm_broker_t *b, const gm_session_t *s);
void gm_ledger_free_orphans(gm_broker_t *b);
/* A resuming start: the orphan with that token becomes s's adopting pieces. */
int gm_ledger_claim(gm_session_t *s, const char *token);

/* process_check.c: whether released memory left its process, where the
 * backend cannot tell per piece. */
typedef enum gm_release_verdict {
        GM_RELEASE_GONE,       /* the driver's figure shows the memory left the process */
        GM_RELEASE_KEPT,       /* it shows the process still holds all of it: the client lied */
        GM_RELEASE_UNVERIFIED, /* nothing shows either: charged until the session ends */
} gm_release_verdict_t;
/* Reads the reference for a later verdict on what s's process gives back
 * (not noted where the driver gives no figure). */
void gm_holder_note(gm_session_t *s, gm_holder_note_t *ret);
/* The verdict on `acknowledged` bytes given back by s against `note` (the
 * pieces are still listed on the session). */
gm_release_verdict_t gm_release_verdict(gm_session_t *s, const gm_holder_note_t *note, uint64_t acknowledged);
/* Whether the driver (once it has shown that it counts mappings) lists pid
 * with any device memory. */
bool gm_process_holds_device_memory(const gm_broker_t *b, pid_t pid);
/* Holds `rel` (pieces RELEASING, not on s->releases) until the session ends,
 * counted as released on the client's word. */
void gm_release_hold_unverified(gm_session_t *s, gm_release_t *rel);

/* session.c */
/* One try of an allocation: REPLY, REFUSE, or PARK (only when `may_park`). */
void gm_session_try_alloc(gm_session_t *s, uint64_t size, uint64_t stream, bool may_park, gm_outcome_t *out);
void gm_outcome_refuse(gm_outcome_t *out, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* grant.c */
/* 0 when `spec` may be granted to the local session s (-EPROTO: not local,
 * -EINVAL: malformed against what it holds, or past its piece limit). */
int gm_session_check_grant(const gm_session_t *s, const gm_piece_spec_t *spec);
/* Hands a LIVE piece over to the client's heap (gm_piece_granted) and counts it. */
void gm_session_hand_over(gm_session_t *s, gm_piece_t *p);
/* The session ends: its granted figures go to zero (its pieces are destroyed). */
void gm_session_drop_grants(gm_session_t *s);
void gm_session_try_grant(gm_session_t *s, const gm_grant_t *g, bool may_park, gm_outcome_t *out);
/* A grant's pieces (n_pieces, 0 meaning 1) and bytes (all of them). */
uint64_t gm_grant_pieces(const gm_grant_t *g);
uint64_t gm_grant_bytes(const gm_grant_t *g);
/* Bytes a local session's heap caches by its client's word (bounded by what it was granted). */
uint64_t gm_session_client_cached(const gm_session_t *s);

/* park.c: reclaim across sessions and parked requests, both heap modes. */
/* `s` needs memory its own cache could not give (err: -ENOMEM for the device,
 * -EDQUOT for its tenant's quota): other sessions are asked for their caches;
 * PARK when memory is on its way (may_park, room left), else REFUSE with the
 * diagnosis of `rq`. */
void gm_session_out_of_memory(gm_session_t *s, const gm_request_t *rq, int err, bool may_park, gm_outcome_t *out);
/* Queues a request behind the session's parked ones (out: PARK, or REFUSE on -ENOMEM). */
void gm_session_park(gm_session_t *s, uint64_t request_id, const gm_request_t *rq, gm_outcome_t *out);
/* Retries parked requests of every session in FIFO order, as far as they go
 * (only those past park_timeout_ms when `timed_out_only`). */
void gm_broker_retry_parked(gm_broker_t *b, bool timed_out_only);
/* The client answered what it owed (a ReleaseAck or ReclaimAck). */
void gm_session_answered(gm_session_t *s);
/* A release request or Reclaim went to the client: it owes an answer. */
void gm_session_owes(gm_session_t *s);
/* Asks a local session for its cache; the bytes asked for (0: not asked). */
uint64_t gm_session_ask_reclaim(gm_session_t *s);
/* Drops the session's parked requests and Reclaim (it ends). */
void gm_session_unpark_all(gm_session_t *s);
/* Periodic: Reclaims past release_timeout_ms, unresponsive sessions. */
void gm_park_tick(gm_broker_t *b, uint64_t now_ms);
