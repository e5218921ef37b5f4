/* Floor 1 of the broker, the books: tenants (tenant.c, public in broker.h)
 * and the restart ledger (ledger.c), with the host's log (host.c) and
 * outcomes (outcome.c) every floor uses. Calls nothing above it. */
#pragma once

#include "broker-internal.h"

/* host.c: one log line through ops->log. */
void gm_host_log(const gm_broker_t *b, int priority, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* checker.c: gm_broker_check()'s violations; the first is described in why. */
typedef struct gm_checker {
        int violations;
        char *why;
        size_t why_len;
} gm_checker_t;
void gm_check_violation(gm_checker_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* outcome.c: fills a REFUSE with `err` and the client's message; returns 0
 * (the outcome is decided), for the callers that return it. */
/* An empty REPLY: every field set but the arrays past their counts (pieces,
 * marks), so a request does not pay for clearing the whole record. */
void gm_outcome_init(gm_outcome_t *out);
int gm_outcome_refuse(gm_outcome_t *out, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* claim.c: a session's claim (gm_broker_claim()) and its tenant's and the
 * broker's books of claims. */
/* Sets s's unconsumed claim to `bytes` (0: it lapses); a smaller claim marks
 * memory as freed for the parked requests. */
void gm_claim_set(gm_session_t *s, uint64_t bytes);
/* s was given `bytes` of new memory: taken from its claim first. */
void gm_claim_consume(gm_session_t *s, uint64_t bytes);
/* What sessions other than s have claimed, of its tenant and of the device:
 * taken, for s. */
uint64_t gm_claim_others_of_tenant(const gm_session_t *s);
uint64_t gm_claim_others_of_device(const gm_session_t *s);

/* ledger.c */
void gm_ledger_store(gm_broker_t *b, const gm_session_t *s, gm_piece_t *p);
void gm_ledger_unstore(gm_broker_t *b, gm_piece_t *p);
/* A stored piece's place changed (page reuse): journalled anew. */
void gm_ledger_moved(gm_broker_t *b, gm_piece_t *p);
/* Journals a session's token and uid at its start, and its end (unless the
 * broker is stopping: then its client may claim it from the next daemon). */
void gm_ledger_session_started(gm_broker_t *b, const gm_session_t *s);
void gm_ledger_session_ended(gm_broker_t *b, const gm_session_t *s);
/* Shared objects (shared.c's registry) in the journal: an "o" line per
 * published object (store id, version, size, retention, publication time,
 * tenant, name) and a side file <journal>.o<store id> with its readers and
 * meta; its fd in the store as GM_STORE_PREFIX<store id>. store: journals
 * and stores o (nothing without a store or journal: it then lives until this
 * daemon ends); unstore: forgets it (no-op when not stored). */
void gm_ledger_shared_store(gm_broker_t *b, gm_shared_t *o);
void gm_ledger_shared_unstore(gm_broker_t *b, gm_shared_t *o);
/* An "o" entry whose fd did not come back: journalled gone, side file removed. */
void gm_ledger_shared_forget(gm_broker_t *b, uint64_t store_id);
/* The "o" entry of a stored fd's name, read at open; NULL when none. */
const gm_ledger_shared_t *gm_ledger_shared_find(const gm_broker_t *b, const char *name);
/* Reads the side file of object store_id (malloc'd readers and meta). */
int gm_ledger_shared_load(gm_broker_t *b, uint64_t store_id, char ***ret_readers, size_t *ret_n_readers,
                          void **ret_meta, size_t *ret_meta_len);
/* Whether t is a session token (GM_TOKEN_LEN lowercase hex digits). */
bool gm_ledger_token_valid(const char *t);
/* A stored piece (or a record) is gone: journalled, compacting when due. */
void gm_ledger_forget(gm_broker_t *b, uint64_t store_id);
/* The journal's entry of a stored fd's name (GM_STORE_PREFIX + id), read at
 * open and kept until adoption is done; NULL when it has none. */
const gm_ledger_entry_t *gm_ledger_find(const gm_broker_t *b, const char *name);
/* The previous daemon's record of a piece of the session with `token`, with
 * spec's coordinates; NULL when it has none. */
gm_ledger_entry_t *gm_ledger_record_find(gm_broker_t *b, const char *token, const gm_piece_spec_t *spec);
/* The journal's entry for piece p under `id`, of the session (token, uid). */
gm_ledger_entry_t gm_ledger_piece_entry(const gm_piece_t *p, uint64_t id, const char *token, uid_t uid);
gm_known_token_t *gm_ledger_known_token_find(gm_broker_t *b, const char *token);
void gm_ledger_known_token_remove(gm_broker_t *b, gm_known_token_t *k);
/* The previous daemon's sessions are not coming back: their tokens and
 * records are forgotten (the records journalled as gone when `journal`). */
void gm_ledger_forget_sessions(gm_broker_t *b, bool journal);
