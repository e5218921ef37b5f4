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
        bool held;         /* the client could not unmap these: charged, never asked again, until the session ends */
        bool holder_noted; /* process_check.c: the driver's figure was read at the first request */
        int64_t holder_unaccounted; /* then: the process's figure less what the daemon had mapped into it */
        struct gm_release *next;
} gm_release_t;

/* An allocation that failed while reclaimed memory was on its way back; it is
 * retried when releases are acknowledged, and refused after park_timeout_ms. */
typedef struct gm_parked {
        uint64_t request_id;
        uint64_t size;
        uint64_t stream;
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

/* ledger.c */
void gm_ledger_store(gm_broker_t *b, const gm_session_t *s, gm_piece_t *p);
void gm_ledger_unstore(gm_broker_t *b, gm_piece_t *p);
/* Journals a session's token and uid at its start, and its end (unless the
 * broker is stopping: then its client may claim it from the next daemon). */
void gm_ledger_session_started(gm_broker_t *b, const gm_session_t *s);
void gm_ledger_session_ended(gm_broker_t *b, const gm_session_t *s);
void gm_ledger_free_orphans(gm_broker_t *b);
/* A resuming start: the orphan with that token becomes s's adopting pieces. */
int gm_ledger_claim(gm_session_t *s, const char *token);

/* process_check.c: where the backend cannot tell per piece but the driver
 * gives each process's device memory. Notes the process's figure when a
 * release is first asked for. */
void gm_release_note_holder(gm_session_t *s, gm_release_t *rel);
/* Whether the process's figure says it kept the `acknowledged` bytes of rel. */
bool gm_release_still_held(gm_session_t *s, const gm_release_t *rel, uint64_t acknowledged);
/* Whether the driver (once it has shown that it counts mappings) lists pid
 * with any device memory. */
bool gm_process_holds_device_memory(const gm_broker_t *b, pid_t pid);

/* session.c */
void gm_broker_retry_parked(gm_broker_t *b, bool timed_out_only);
