/* Floor 2 of the broker: pieces of physical memory (piece.c), the previous
 * daemon's orphans (orphan.c) and whether given-back memory left its
 * process (process_check.c). Calls only the books below it. */
#pragma once

#include "books.h"

/* piece.c */
bool gm_piece_charged(const gm_piece_t *p);
/* The most that session s could be given now (gm_piece_create's checks):
 * the least of its tenant's quota room and the device's. */
uint64_t gm_piece_room(const gm_session_t *s);
/* 0 when `bytes` more fit the quota of session s's tenant, its tag quota of
 * pool `tag` (0: the default pool, which has none) and the device
 * (gm_piece_create's checks), else -EDQUOT or -ENOMEM. */
int gm_piece_room_for(const gm_session_t *s, uint64_t bytes, unsigned tag);
/* The tag quota of session s's tenant that `bytes` more in pool `tag` would
 * exceed (*ret_charged: what the pool's pieces charge now), or NULL. */
const gm_tag_quota_t *gm_piece_tag_quota_over(const gm_session_t *s, unsigned tag, uint64_t bytes,
                                              uint64_t *ret_charged);
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
/* Whether the backend says this piece's memory is still mapped somewhere. */
bool gm_piece_still_mapped(const gm_broker_t *b, const gm_piece_t *p);
/* Checks the lingering memory, releasing what nobody maps any more; with
 * `all`, releases all of it (the broker is going away). */
void gm_piece_sweep_lingering(gm_broker_t *b, bool all);

/* shared.c: the shared registry's calls for the floors above (its public
 * ones are in broker.h). */
/* s ends: its opens are dropped, its staging objects released. */
void gm_shared_session_ended(gm_session_t *s);
/* Bytes of shared objects s maps (staging or opened, each once: the
 * driver's figure of its process shows them), and in *ret_recent those
 * handed to it less than settle_ms before now_ms (maybe not mapped yet). */
uint64_t gm_shared_mapped(const gm_session_t *s, uint64_t now_ms, uint64_t settle_ms, uint64_t *ret_recent);
/* Withdraws published objects whose retention ran out (realtime clock). */
void gm_shared_expire(gm_broker_t *b, uint64_t now_unix_ms);
/* Releases every object (the broker goes away; stored ones stay stored for
 * the next daemon when the broker keeps stored pieces). */
void gm_shared_free_all(gm_broker_t *b);
/* A stored fd the journal names as a shared object: adopted, published
 * again with no mappers. Consumes fd. */
int gm_shared_adopt(gm_broker_t *b, const gm_ledger_shared_t *e, int fd);
/* A re-attaching session maps adopted object name@version of `size` bytes,
 * which its client knows by the previous daemon's `client_id`: s is its
 * mapper again. -ENOENT (no such adopted object while its re-attach window
 * is open), -EACCES (s's tenant not admitted), -ENOSPC (s's opens). */
int gm_shared_reattach(gm_session_t *s, uint64_t client_id, const char *name, uint64_t version, uint64_t size);
/* Adoption is over: journalled objects whose fd did not come back are forgotten. */
void gm_shared_adopt_done(gm_broker_t *b);
/* gm_broker_check()'s part: the registry's books, into c; adds its bytes
 * to *backed and its stored objects to *stored (a tenant's part of its
 * charge is gm_shared_charged()). */
void gm_shared_check(const gm_broker_t *b, gm_checker_t *c, uint64_t *backed, uint32_t *stored);
uint64_t gm_shared_charged(const gm_broker_t *b, const gm_tenant_t *t);

/* orphan.c */
/* Frees every orphan (their pieces kept stored when the broker keeps them). */
void gm_orphan_free_all(gm_broker_t *b);
/* A resuming start: the orphan with that token becomes s's adopting pieces. */
int gm_orphan_claim(gm_session_t *s, const char *token);

/* process_check.c: whether released memory left its process, where the
 * backend cannot tell per piece. */
typedef enum gm_release_verdict {
        GM_RELEASE_GONE,       /* the driver's figure shows the memory left the process */
        GM_RELEASE_KEPT,       /* it shows the process still holds all of it: the client lied */
        GM_RELEASE_UNVERIFIED, /* nothing shows either: charged until the session ends */
} gm_release_verdict_t;
/* Reads the reference for a later verdict on what s's process gives back
 * (not noted where the driver gives no figure). */
void gm_process_check_note(gm_session_t *s, gm_holder_note_t *ret);
/* The verdict on `acknowledged` bytes given back by s against `note` (the
 * pieces are still listed on the session). */
gm_release_verdict_t gm_process_check_verdict(gm_session_t *s, const gm_holder_note_t *note, uint64_t acknowledged);
/* Whether the driver (once it has shown that it counts mappings) lists pid
 * with any device memory. */
bool gm_process_check_holds_memory(const gm_broker_t *b, pid_t pid);
/* The tick's audit of processes whose sessions' give-backs were believed on
 * their figure, and of those followed after their session ended (at most
 * GM_AUDIT_SESSIONS_PER_TICK processes, one figure each, each at most every
 * limits.audit_interval_ms). */
void gm_process_check_audit_tick(gm_broker_t *b, uint64_t now_ms);
/* Before s's first hand-out (once): notes its process's own memory, what
 * the audit follows it against once it ends; `fresh`, if noted, is such a
 * note just read (not read again). */
void gm_process_check_baseline(gm_session_t *s, const gm_holder_note_t *fresh);
/* s has just ended (its pieces still listed): where its process's figure
 * still shows more than its own memory and what the daemon accounts for,
 * the process is audited on (what was found of s stays charged to its
 * tenant); else what the audit found of s is no longer charged. */
void gm_process_check_end(gm_session_t *s);
/* Stops following every ended process (the broker is going away). */
void gm_process_check_free_all(gm_broker_t *b);
