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
