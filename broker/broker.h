/* The broker: gpumemd's state without its loop. It owns sessions, tenants
 * and quotas, every piece of physical memory and its accounting, reclaim and
 * parked allocations, and the restart ledger. No libuv, no sockets, no
 * systemd: what must leave the process (a ReleaseRequest to a client, a
 * parked allocation's answer, an fd for systemd's store, a log line) goes
 * through the gm_broker_ops_t the daemon provides. Calls return outcomes
 * instead of sending. Single-threaded (the daemon's loop). Errors are
 * negative errno. gm_broker_check() verifies every invariant below. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "allocator.h"
#include "backend.h"
#include "history.h"
#include "oom.h"
#include "samples.h"

typedef struct gm_broker gm_broker_t;
typedef struct gm_session gm_session_t;
typedef struct gm_tenant gm_tenant_t;
typedef struct gm_piece gm_piece_t;

/* A session token: 32 hex digits. It names a session's stored segments and
 * lets its client re-attach after a restart. */
#define GM_TOKEN_LEN 32
/* Stored pieces are named GM_STORE_PREFIX + 10 hex digits (the daemon's fd
 * store sorts what it gets back by this prefix). */
#define GM_STORE_PREFIX "seg-"
#define GM_STORE_NAME_MAX 32
/* Most tenants the broker creates on request (a quota for a tenant with no
 * session yet); tenants of sessions and of the config are not limited. */
#define GM_BROKER_MAX_TENANTS 4096

/* ---- tenants and quotas ---- */

/* Where a tenant's quota comes from; the first set one wins. */
typedef enum gm_quota_source {
        GM_QUOTA_RUNTIME,    /* `gpumemctl quota set --runtime`: until restart (kept in the ledger) */
        GM_QUOTA_PERSISTENT, /* `gpumemctl quota set`: kept in the state directory */
        GM_QUOTA_CONFIG,     /* the config file's quota= */
        _GM_QUOTA_SOURCE_MAX,
} gm_quota_source_t;

/* How a tenant's give-backs are checked where the backend cannot answer per
 * piece (cuda: process_check.c). Evidence of a lie (a figure that still
 * holds the memory) is acted on in both modes. */
typedef enum gm_release_check {
        GM_RELEASE_CHECK_VERIFY, /* by its process's driver figure, at the return and audited on the tick; held
                                    charged where nothing can tell */
        GM_RELEASE_CHECK_TRUST,  /* the client's word is taken: released at once, not audited */
        _GM_RELEASE_CHECK_MAX,
} gm_release_check_t;

/* A tenant's limit on the bytes its sessions' pieces of one tagged pool may
 * hold together (the config's tag_quota = kv_cache:40G,weights:20G). */
#define GM_TENANT_MAX_TAG_QUOTAS 16
typedef struct gm_tag_quota {
        char tag[32]; /* a tag name (never the default pool) */
        uint64_t bytes;
} gm_tag_quota_t;

/* Read-only outside the broker. */
struct gm_tenant {
        char name[64];
        gm_stats_t stats;       /* allocator statistics of all its sessions; accumulated ones never reset */
        gm_stats_t shown_base;  /* stats at the last reset_accumulated: what replies subtract (a view offset) */
        uint64_t charged_bytes; /* = the sizes of its sessions' charged pieces and of its shared objects */
        uint64_t quota;         /* effective limit on charged_bytes; 0 = unlimited */
        bool quota_set[_GM_QUOTA_SOURCE_MAX];
        uint64_t quota_by_source[_GM_QUOTA_SOURCE_MAX]; /* 0 = explicitly unlimited */
        uint32_t sessions;
        uint64_t release_unverified_bytes; /* of charged_bytes: released on its clients' word only, held until their
                                              sessions end (process_check.c) */
        bool release_check_set;            /* release_check is its own (the config's tenant section) */
        gm_release_check_t release_check;  /* else the broker's limits.release_check holds */
        uint64_t audited_bytes; /* beyond charged_bytes: memory its sessions gave back that their processes map
                                   again (process_check.c's audit), counted against its quota and the device */
        uint64_t audit_catches; /* audits that found such memory (a counter) */
        uint64_t claimed_bytes; /* = its sessions' unconsumed claims (gm_broker_claim()): beyond charged_bytes,
                                   counted against its quota and the device for every other session */
        gm_tag_quota_t tag_quotas[GM_TENANT_MAX_TAG_QUOTAS]; /* checked at each piece of a pool it names */
        size_t n_tag_quotas;
        struct gm_tenant *next;
};

/* ---- pieces ---- */

/* Where a piece is in its life. Charged (to its session's tenant): LIVE,
 * TO_RELEASE and RELEASING. */
typedef enum gm_piece_state {
        GM_PIECE_ORPHAN,     /* stored by a previous daemon, no session yet, not charged */
        GM_PIECE_ADOPTING,   /* claimed by a resuming session, awaiting its client's report */
        GM_PIECE_LIVE,       /* the session's: held by its heap, or granted to its client */
        GM_PIECE_TO_RELEASE, /* given back by its holder, to be asked back from the client */
        GM_PIECE_RELEASING,  /* asked back, awaiting the client's ReleaseAck */
} gm_piece_state_t;

/* The heap pool of a piece's segment as the restart ledger knows it. */
typedef enum gm_piece_pool {
        GM_POOL_UNKNOWN, /* a local session's (its client's heap knows), an ordinary segment's (its size
                          * tells), or journaled by a daemon that did not record pools */
        GM_POOL_SMALL,
        GM_POOL_LARGE,
} gm_piece_pool_t;

/* One backend allocation: a whole segment, or one page of an expandable
 * segment. Read-only outside the broker. */
struct gm_piece {
        uint64_t segment_id;
        uint64_t segment_va_size;
        uint64_t offset;
        gm_phys_t phys; /* fd -1: re-registered by its client with no handle here */
        gm_piece_state_t state;
        bool in_heap;          /* its handle is held by the session's heap */
        bool sent;             /* its fd reached the client, so its release needs an ack */
        bool whole_segment;    /* set at release: the client drops the reservation too */
        bool granted;          /* handed to a local session's heap: its client maps it and gives it back unmapped */
        bool unverified;       /* released on the client's unchecked word (held): not counted as mapped by it */
        uint64_t handed_ms;    /* when its fd was last sent or granted to the client (gm_now_ms) */
        uint64_t store_id;     /* kept in the fd store as GM_STORE_PREFIX<store_id> (0: not kept) */
        uint64_t record_id;    /* journaled, with no handle in the fd store: a re-attach may claim it (0: not) */
        gm_piece_pool_t pool;  /* as journaled: restores its segment in that pool after a restart */
        uint8_t tag;           /* its tagged pool: an id of its session's gm_session_tags_t (0: default) */
        gm_session_t *session; /* NULL for orphans */
        struct gm_orphan *orphan;
        struct gm_piece *prev, *next; /* in its owner's list of pieces */
        struct gm_piece *queue;       /* in new, to-release, release or adopting queues */
};

typedef struct gm_piece_spec {
        uint64_t segment_id;
        uint64_t segment_va_size;
        uint64_t offset;
        uint64_t size;
        uint8_t tag; /* the tagged pool it is booked under (gm_session_tags_t id; 0: default) */
} gm_piece_spec_t;

/* Creates `spec->size` bytes of fresh memory for session `s` (no heap
 * needed: this is also how a client-side heap is granted memory), charges
 * them to its tenant and keeps the fd in the store. -EDQUOT when the tenant's
 * quota would be exceeded, -ENOMEM when the device is full. The piece is
 * LIVE, not yet sent; it is listed by gm_session_central_new_pieces() until
 * gm_session_central_pieces_sent() or gm_piece_release(). */
int gm_piece_create(gm_session_t *s, const gm_piece_spec_t *spec, gm_piece_t **ret_piece);
/* n pieces of first->size bytes at first->offset + k * first->size of one
 * segment, as n gm_piece_create() calls would make them, all or nothing:
 * the quota and the device are checked for the run as a whole, and a
 * backend failure part way gives back what was made. On success pieces[k]
 * is piece k; on failure nothing of the run is left (the contents of
 * pieces[] are then meaningless). */
int gm_piece_create_run(gm_session_t *s, const gm_piece_spec_t *first, uint64_t n, gm_piece_t **pieces);
/* The one release path. A piece the client may have mapped (sent, session
 * alive) is queued for a ReleaseRequest (see gm_session_flush_releases());
 * anything else returns to the backend at once. `whole_segment`: this is the
 * segment's last piece (its reservation goes too). */
void gm_piece_release(gm_session_t *s, gm_piece_t *p, bool whole_segment);
/* Page reuse: the piece now lies at `offset` of segment `segment_id`
 * (va_size bytes); its memory, handle, fd and charge are unchanged, the
 * ledger journals the new place. */
void gm_piece_move(gm_broker_t *b, gm_piece_t *p, uint64_t segment_id, uint64_t va_size, uint64_t offset);
/* A LIVE piece of `s` at (segment_id, offset), or NULL. */
gm_piece_t *gm_piece_find(const gm_session_t *s, uint64_t segment_id, uint64_t offset);

/* ---- the broker ---- */

typedef struct gm_broker_limits {
        uint64_t max_blocks_per_session; /* live blocks (allocated or pending free) */
        uint32_t max_parked_per_session; /* allocations waiting for reclaim */
        uint32_t park_timeout_ms;        /* how long an allocation waits for reclaim */
        uint32_t release_timeout_ms;     /* a client's time to acknowledge a release */
        uint32_t reattach_grace_ms;      /* after a restart: how long stored pieces wait for their client */
        uint32_t max_reattach_items;     /* segments + blocks one re-attaching session may report */
        uint32_t max_ranges_per_release; /* ranges in one ReleaseRequest (one packet) */
        /* A client that answers no release request (or Reclaim) for this long
         * is unresponsive: what it owes is no longer waited for (0: never). */
        uint32_t unresponsive_timeout_ms;
        /* How often a session whose give-backs were believed on its process's
         * figure has that figure audited again (0: never; process_check.c). */
        uint32_t audit_interval_ms;
        /* Ended processes whose memory the audit still follows (the oldest
         * dropped past it, logged; 0: none followed; process_check.c). */
        uint32_t max_audited_processes;
        gm_release_check_t release_check; /* of tenants that set none */
        uint32_t max_shared_objects;      /* shared objects at once, staging ones included (0: the default) */
} gm_broker_limits_t;

/* Processes the tick audits at most (one driver call each, for all its sessions, live and ended), oldest audit first. */
#define GM_AUDIT_SESSIONS_PER_TICK 8u

typedef enum gm_reclaim_outcome {
        GM_RECLAIM_REQUESTED,    /* a ReleaseRequest was sent (first attempt) */
        GM_RECLAIM_ACKNOWLEDGED, /* the client acknowledged it */
        GM_RECLAIM_TIMED_OUT,    /* it was not acknowledged within release_timeout_ms */
        _GM_RECLAIM_OUTCOME_MAX,
} gm_reclaim_outcome_t;

/* One range of a ReleaseRequest. */
typedef struct gm_release_range {
        uint64_t segment_id;
        uint64_t offset;
        uint64_t length;
        bool whole_segment;
} gm_release_range_t;

/* Pieces one grant may ask for at once: its reply carries their fds in one
 * packet (the kernel's SCM_RIGHTS cap; the daemon's max_fds may be lower). */
#define GM_MAX_GRANT_PIECES 253u

/* A page the session's heap moved (page reuse) that its client has not been
 * told of yet: the client maps `piece` at from_segment_id/from_offset still.
 * Pending moves go out with the next allocation reply, in order; a piece
 * released meanwhile is released where its client maps it (the move is
 * dropped). */
typedef struct gm_page_move {
        gm_piece_t *piece; /* at its new place */
        uint64_t from_segment_id, from_va_size, from_offset;
        bool from_whole_segment; /* it was the last piece the client maps there */
} gm_page_move_t;

/* Streams a central session tracks fences of (as many as a heap tracks). */
#define GM_SESSION_FENCE_STREAMS 64

/* A stream fence an allocation reply asks the client to record. */
typedef struct gm_fence_mark {
        uint64_t stream;
        uint64_t fence;
} gm_fence_mark_t;

/* What a request comes to. */
typedef enum gm_outcome_kind {
        GM_OUTCOME_REPLY,  /* done: answer it (an allocation: with its new pieces) */
        GM_OUTCOME_PARK,   /* waits for reclaimed memory; answered later through ops->alloc_done */
        GM_OUTCOME_REFUSE, /* answer with `error` and `message` */
} gm_outcome_kind_t;

typedef struct gm_outcome {
        gm_outcome_kind_t kind;
        int error;               /* REFUSE: negative errno */
        char message[2048];      /* REFUSE: the client's text */
        gm_alloc_result_t alloc; /* REPLY to an allocation */
        /* REFUSE for lack of memory after the retry ladder (oom): its class
         * and the bytes asked for, for the diagnosis's record of refusals. */
        bool oom;
        gm_oom_reason_t oom_reason;
        uint64_t oom_size;
        /* REPLY to a grant: its pieces, in order, whose fds the reply carries. */
        const gm_piece_t *pieces[GM_MAX_GRANT_PIECES];
        size_t n_pieces;
        /* REPLY to an allocation, the rest of its reply: the new pieces whose
         * mappings and fds it carries (creation order, linked by ->queue), the
         * pending page moves (applied first) and the stream fences the client
         * is to record. Valid until gm_broker_commit() (the reply was sent) or
         * gm_broker_undo() (it could not be built). */
        const gm_piece_t *new_pieces;
        const gm_page_move_t *moves;
        size_t n_moves;
        gm_fence_mark_t marks[GM_SESSION_FENCE_STREAMS];
        size_t n_marks;
} gm_outcome_t;

/* What a local session's client reports of heaps (its statistics page, as the
 * host last read it): untrusted, used only to choose whom to ask for memory
 * and to explain refusals. */
typedef struct gm_client_view {
        uint64_t session_allocated; /* the session's allocated bytes */
        uint64_t session_active;    /* the session's active bytes (allocated or pending free) */
        uint64_t tenant_active;     /* active bytes of the local sessions of its tenant */
        uint64_t device_active;     /* active bytes of every local session */
} gm_client_view_t;

/* Everything the broker needs from its host (the daemon). userdata is the
 * ops' first argument. Every callback is optional. */
typedef struct gm_broker_ops {
        /* Sends a ReleaseRequest. A negative errno means the client is gone;
         * the callback may have ended the session (gm_session_end()). */
        int (*send_release)(void *userdata, gm_session_t *s, uint64_t release_id, const gm_release_range_t *ranges,
                            size_t n);
        /* Asks a local session's client for `bytes` of its cache (a Reclaim); it
         * answers with ReturnPieces, then gm_reclaim_ack(). A negative
         * errno: not sent (the callback may have ended the session). */
        int (*send_reclaim)(void *userdata, gm_session_t *s, uint64_t reclaim_id, uint64_t bytes);
        /* The allocator settings changed: tells a local session's client (its
         * heap runs there). */
        void (*alloc_conf_changed)(void *userdata, gm_session_t *s, const gm_alloc_config_t *config);
        /* Fills what local sessions' clients report (zeros when unknown). */
        void (*client_view)(void *userdata, const gm_session_t *s, gm_client_view_t *ret);
        /* A parked allocation or grant is decided (REPLY or REFUSE): answer it. */
        void (*alloc_done)(void *userdata, gm_session_t *s, uint64_t request_id, const gm_outcome_t *outcome);
        /* Keeps a duplicate of fd under `name` across restarts; 0 or a negative errno. */
        int (*store_add)(void *userdata, int fd, const char *name);
        void (*store_remove)(void *userdata, const char *name);
        /* One log line (syslog priority). */
        void (*log)(void *userdata, int priority, const char *message);
        void (*count_reclaim)(void *userdata, gm_reclaim_outcome_t outcome);
        void (*count_refusal)(void *userdata, const char *tenant, gm_oom_reason_t reason);
        /* A parked request was decided after waiting `waited_ms` for reclaim. */
        void (*parked_done)(void *userdata, uint64_t waited_ms);
        /* A session was marked unresponsive (true) or answered again (false). */
        void (*unresponsive)(void *userdata, gm_session_t *s, bool unresponsive);
        void *userdata;
} gm_broker_ops_t;

typedef struct gm_broker_params {
        gm_backend_t *backend; /* borrowed; outlives the broker */
        const gm_alloc_config_t *alloc_config;
        gm_broker_limits_t limits;
        gm_broker_ops_t ops;
        uint32_t store_max; /* pieces the fd store may hold; 0 = no store */
} gm_broker_params_t;

/* Read-only outside the broker except where a setter says otherwise. */
struct gm_broker {
        gm_backend_t *backend;
        gm_broker_ops_t ops;
        gm_broker_limits_t limits;
        gm_alloc_config_t alloc_config;
        gm_stats_t device_stats;      /* accumulated figures never reset */
        gm_stats_t device_shown_base; /* device_stats at the last reset_accumulated (a view offset) */
        uint64_t va_cursor;           /* next synthetic segment address (shared by all heaps) */
        gm_session_t *sessions;       /* newest first */
        uint32_t n_sessions;
        uint64_t next_session_id;
        gm_tenant_t *tenants;
        uint32_t n_tenants;
        uint64_t releasing_bytes;        /* = sum of the sessions' releasing_bytes */
        uint64_t unbacked_bytes;         /* pieces with no handle here (re-registered by their clients) */
        bool driver_attributes_mappings; /* an acknowledged release left its process's driver figure (process_check.c) */
        uint64_t audited_bytes;          /* = the tenants' audited_bytes */
        uint64_t claimed_bytes;          /* = the tenants' claimed_bytes */
        uint64_t audit_checks;           /* per-process figures read by the audit (a counter: its cost) */
        bool memory_freed;               /* a session's end freed memory: the next tick retries every parked request */
        uint64_t next_park_seq;          /* parked requests, in order across sessions */
        uint64_t retry_pass;             /* retries of parked requests (reclaim.c) */
        gm_history_t *history;           /* NULL while memory history is off */
        size_t history_max_entries;
        /* restart ledger */
        struct gm_orphan *orphans; /* stored pieces of sessions not yet re-attached */
        uint64_t orphans_deadline_ms;
        bool keep_stored; /* stopping with a store: stored pieces outlive this process */
        uint32_t store_max;
        uint32_t n_stored;
        uint64_t next_store_id;
        int ledger_fd;                  /* append-only journal, or -1 */
        uint64_t ledger_lines;          /* lines in it; compacted when they outnumber the live ones (ledger.c) */
        bool stopping;                  /* the daemon is stopping: ending sessions stay claimable by their clients */
        struct gm_lingering *lingering; /* memory its session let go of that a process still maps: charged */
        struct gm_audited_process *audited_processes; /* ended processes still audited (process_check.c) */
        uint32_t n_audited_processes;
        struct gm_known_token *known_tokens; /* sessions of the previous daemon ("t" lines), until claimed or expired */
        size_t n_known_tokens;
        gm_refusal_ring_t refusals; /* the device's last refusals: written by the daemon's diagnosis (daemon/diag.c) */
        char ledger_path[160];
        struct gm_ledger_entry *ledger; /* read at open, until adoption is done */
        size_t n_ledger;
        struct gm_ledger_entry *records; /* the previous daemon's pieces with no stored handle: each claimable once,
                                            by its session, until the re-attach grace ends */
        size_t n_records;
        uint32_t n_recorded;      /* sessions' pieces with a record_id */
        struct gm_shared *shared; /* the shared registry (shared.c), newest first */
        uint32_t n_shared;
        uint64_t next_shared_id;
        struct gm_ledger_shared *ledger_shared; /* the previous daemon's shared objects, until adoption is done */
        size_t n_ledger_shared;
};

int gm_broker_new(const gm_broker_params_t *params, gm_broker_t **ret_broker);
/* Ends every session, drops orphans (keeping stored ones when keep_stored),
 * frees tenants and history. Accepts NULL; returns NULL. */
gm_broker_t *gm_broker_free(gm_broker_t *b);
void gm_broker_set_limits(gm_broker_t *b, const gm_broker_limits_t *limits);
/* A new allocator configuration for every heap (local sessions' clients are
 * told through ops->alloc_conf_changed); the statistics' max_split_size
 * follows it. */
void gm_broker_set_alloc_config(gm_broker_t *b, const gm_alloc_config_t *config);
/* Physical bytes the broker accounts for: the backend's plus unbacked ones. */
uint64_t gm_piece_reserved(const gm_broker_t *b);
/* Periodic work: re-asks unacknowledged releases, times Reclaims and parked
 * requests out, marks sessions unresponsive, releases orphans whose grace ran
 * out. `now_ms`: a monotonic clock. */
void gm_broker_tick(gm_broker_t *b, uint64_t now_ms);
/* Memory history: on (with max_entries, 0 = keep the last bound) or off (clears it). */
int gm_broker_history(gm_broker_t *b, bool enabled, size_t max_entries);

/* Verifies every invariant: per session its heap (gm_heap_check), its heap's
 * reserved bytes = its in-heap pieces, its releasing bytes = its RELEASING
 * pieces, a local session's granted bytes, pieces and segments = its granted
 * pieces, its parked requests (allocations only in central sessions, grants
 * only in local ones) and Reclaim; per tenant charged bytes = its sessions'
 * charged pieces plus its shared objects, and session count; the shared
 * registry's mapper counts = its sessions' opens (shared.c); its audited bytes = its sessions' (each
 * at most what that session gave back, none once ended) and the broker's =
 * its tenants'; the backend's in-use = every piece with a
 * handle and every shared object, unbacked bytes = those without, the store count, the broker's
 * releasing bytes, parked counts. Returns the number of violations (0 =
 * consistent); never modifies anything. With `why`, the first violation is
 * described there. */
int gm_broker_check(const gm_broker_t *b, char *why, size_t why_len);

/* ---- tenants ---- */

gm_tenant_t *gm_tenant_find(const gm_broker_t *b, const char *name);
/* Finds or creates; NULL on -ENOMEM. */
gm_tenant_t *gm_tenant_get(gm_broker_t *b, const char *name);
/* Replaces a tenant's tag quotas (n 0: none; at most GM_TENANT_MAX_TAG_QUOTAS). */
void gm_tenant_set_tag_quotas(gm_tenant_t *t, const gm_tag_quota_t *quotas, size_t n);
/* Parses "TAG:SIZE[,TAG:SIZE...]" (sizes as 40G, each positive, tags
 * distinct and well formed): -EINVAL, or -E2BIG past GM_TENANT_MAX_TAG_QUOTAS. */
int gm_tag_quotas_parse(const char *text, gm_tag_quota_t *ret_quotas, size_t *ret_n);
/* The bytes the pieces of tenant t's sessions charge to pool `tag`. */
uint64_t gm_tenant_tag_charged(const gm_broker_t *b, const gm_tenant_t *t, const char *tag);
/* Sets (has = true) or clears one source of a tenant's quota. */
void gm_tenant_set_quota(gm_tenant_t *t, gm_quota_source_t source, bool has, uint64_t bytes);
/* "runtime", "persistent", "config" or "none". */
const char *gm_tenant_quota_source(const gm_tenant_t *t);
/* Sets (has = true) or clears the tenant's own release check. */
void gm_tenant_set_release_check(gm_tenant_t *t, bool has, gm_release_check_t check);
/* The tenant's release check: its own, else the broker's default. */
gm_release_check_t gm_tenant_release_check(const gm_broker_t *b, const gm_tenant_t *t);
/* "verify" or "trust"; parse: 0, or -EINVAL for another word. */
const char *gm_release_check_name(gm_release_check_t check);
int gm_release_check_parse(const char *name, gm_release_check_t *ret_check);
/* A quota set by an admin (bytes 0: removed), creating the tenant: a runtime
 * one is journalled in the ledger (it lasts until restart), a persistent one
 * saved in state_dir; a failed save keeps the old one. 0, -ENOSPC (already
 * GM_BROKER_MAX_TENANTS tenants), -ENOMEM, or the save's error. */
int gm_broker_set_quota(gm_broker_t *b, const char *tenant, bool runtime, uint64_t bytes, const char *state_dir);
/* Persistent quotas: <state_dir>/quotas ("TENANT BYTES" lines), written
 * atomically. Load applies them (creating tenants). */
int gm_tenant_quotas_load(gm_broker_t *b, const char *state_dir);
int gm_tenant_quotas_save(const gm_broker_t *b, const char *state_dir);

/* ---- claims ---- */

/* Sets aside up to `bytes` of the device for session s, replacing its claim:
 * *ret_claimed = min(bytes, what s could be given now: the device's capacity
 * less what others hold or have claimed, and what its tenant's quota leaves
 * less its other sessions' claims). Nothing is reclaimed for it: idle cache
 * of others stays theirs. The claim is consumed as s's pieces are created,
 * counts against the quota and the device for every other session, and
 * lapses when s ends or claims 0. -EINVAL: more than the capacity;
 * -ESHUTDOWN: s has ended. A smaller claim retries parked requests. */
int gm_broker_claim(gm_session_t *s, uint64_t bytes, uint64_t *ret_claimed);
/* What s could be given now, its own claim included (what a claim of the
 * capacity would set aside). */
uint64_t gm_broker_room(const gm_session_t *s);

/* ---- sessions ---- */

typedef struct gm_session_params {
        pid_t pid;
        uid_t uid;
        const char *unit; /* the peer's systemd unit, "" if none */
        bool admin;       /* kernel-verified right to administer */
        void *userdata;   /* the daemon's connection */
} gm_session_params_t;

/* Pieces one local session may hold (each is an fd in the daemon; grants walk them). */
#define GM_MAX_GRANTED_PIECES 65536u

/* What a local session's heap holds of the daemon's memory. */
typedef struct gm_session_grants {
        gm_stat_t bytes;    /* of its granted pieces (current, peak, ever granted and returned) */
        gm_stat_t segments; /* segments with a granted piece */
        uint64_t pieces;    /* granted pieces (at most GM_MAX_GRANTED_PIECES) */
        uint64_t returned;  /* pieces given back or released, ever */
} gm_session_grants_t;

/* A local session asleep (docs/sleep.md): its client gave back the pieces
 * under its blocks and keeps their address ranges; bytes is what a wake
 * needs, never more than granted_bytes, what it held granted as it fell
 * asleep (segments: its granted segments then). All zero while awake. */
typedef struct gm_session_sleep {
        bool asleep;
        uint64_t bytes;
        uint64_t granted_bytes;
        uint64_t segments;
} gm_session_sleep_t;

/* Tagged pools (docs/tags.md): a session's pool names and their charged
 * bytes. Id 0 is the default pool ""; ids 1 .. GM_SESSION_MAX_TAGS are
 * named on first use and keep their name while the session lives (a local
 * session's ids are its client's, a central one's the broker's). bytes[id]
 * is the charge of its pieces booked under id; over all ids it is the
 * session's charge (gm_broker_check()). */
#define GM_SESSION_MAX_TAGS 16
typedef struct gm_session_tags {
        char names[GM_SESSION_MAX_TAGS + 1][32];
        uint64_t bytes[GM_SESSION_MAX_TAGS + 1];
        unsigned n; /* ids 1 .. n may be named (the highest named) */
} gm_session_tags_t;

/* Names id `id` `name` (a client's numbering): -EINVAL for a malformed name
 * or one other than the id already has, -E2BIG for an id past
 * GM_SESSION_MAX_TAGS; id 0 takes only "". */
int gm_session_tags_name(gm_session_tags_t *t, unsigned id, const char *name);
/* The id of `name`, named with the next free id if new: -EINVAL, -E2BIG
 * past GM_SESSION_MAX_TAGS names. */
int gm_session_tags_intern(gm_session_tags_t *t, const char *name, unsigned *ret_id);

/* What the daemon reads of a session (gm_session_t is opaque outside the
 * broker): plain fields, copied at the call; the pointers are the broker's
 * and stay valid while the session does. */
typedef struct gm_session_view {
        uint64_t id;
        pid_t pid;
        uid_t uid;
        const char *name; /* what the client says of itself, escaped (gm_session_describe()) */
        const char *unit; /* its systemd unit, "" if none */
        const char *token;
        bool admin;                        /* kernel-verified right to administer */
        bool admin_conn;                   /* an administration tool's connection (Hello) */
        gm_tenant_t *tenant;               /* NULL until it starts */
        bool local;                        /* its heap runs in its client */
        bool ended;                        /* memory released; no request is served any more */
        bool reattaching;                  /* between a resuming start and the last re-attach report */
        bool lied;                         /* acknowledged a release it had not done: the caller ends it */
        bool unresponsive;                 /* answered nothing it owes for unresponsive_timeout_ms */
        uint64_t owing_since_ms;           /* since when it owes an answer (0: nothing) */
        uint64_t releasing_bytes;          /* asked back with release requests, not yet acknowledged */
        uint64_t reclaim_bytes;            /* asked back with its pending Reclaim (0: none) */
        uint64_t release_unverified_bytes; /* released on its word only: held until it ends */
        uint64_t claim_bytes;              /* its unconsumed claim (gm_broker_claim()) */
        gm_heap_t *heap;                   /* central: created at its first allocation (NULL before) */
        gm_session_grants_t grants;        /* local: what its client's heap holds */
        gm_session_sleep_t sleep;          /* local: asleep, and what its wake needs */
        const gm_piece_t *pieces;          /* every piece it owns (any state), linked by ->next */
        void *userdata;                    /* gm_session_params_t's */
        void *owned;                       /* the daemon's block in gm_session_owned() (NULL: none yet) */
        const gm_history_t *history;       /* its own history (gm_session_history()); NULL while off */
        size_t history_max_entries;        /* its bound, while on */
        const gm_session_tags_t *tags;     /* its tagged pools and their charged bytes */
} gm_session_view_t;

void gm_session_view(const gm_session_t *s, gm_session_view_t *ret);
/* gm_session_params_t's userdata (the daemon's connection). */
void *gm_session_userdata(const gm_session_t *s);
/* The next session of the broker's list (b->sessions, newest first), or NULL. */
gm_session_t *gm_session_next(const gm_session_t *s);
/* The one slot the daemon may hang a malloc'd block of its own on (its
 * diagnosis samples): NULL at first, opaque to the broker, freed with the
 * session. */
void **gm_session_owned(gm_session_t *s);

/* A session for a new connection (no tenant yet). */
int gm_session_new(gm_broker_t *b, const gm_session_params_t *params, gm_session_t **ret_session);
/* Starts it in `tenant_name` with a fresh token, or, with `resume_token`,
 * claims the previous daemon's stored pieces of that session: -EBUSY (a live
 * session has it), -EPERM (another uid's), -EINVAL (bad token), -ENOMEM. */
int gm_session_start(gm_session_t *s, const char *tenant_name, const char *resume_token);
/* Releases everything it holds at once (the client is gone). Idempotent. */
void gm_session_end(gm_session_t *s);
/* What the client says of itself (Hello): for display only, kept with its
 * control characters escaped (gm_text_escape). */
void gm_session_describe(gm_session_t *s, const char *name, bool admin_conn);
/* The client was heard from: reclaim picks the least recently active first. */
void gm_session_touch(gm_session_t *s, uint64_t now_ms);
/* Ends it if needed and frees it. Accepts NULL. */
void gm_session_free(gm_session_t *s);
/* The session's own allocation history, which any session may record
 * (PyTorch's is per process): on (max_entries bounded by
 * GM_SESSION_HISTORY_MAX_ENTRIES; 0 keeps the last bound, at first the
 * device's default) or off (clears it). While it is on, its central heap's
 * events go to it instead of the device's ring; a local heap records its
 * own trace, so it stays empty. Freed when the session ends. -ENOMEM. */
#define GM_SESSION_HISTORY_MAX_ENTRIES 1000000u
int gm_session_history(gm_session_t *s, bool enabled, size_t max_entries);
/* The session's heap, created on first use. */
int gm_session_central_heap(gm_session_t *s, gm_heap_t **ret_heap);

/* An allocation: REPLY (with gm_session_central_new_pieces() to map), PARK or REFUSE. */
void gm_broker_alloc(gm_session_t *s, uint64_t request_id, uint64_t size, uint64_t stream, const gm_frame_t *frames,
                     size_t n_frames, gm_outcome_t *ret);
/* gm_broker_alloc() from tagged pool `tag` (NULL or "": the default),
 * refused -EINVAL for a malformed name, -E2BIG past GM_SESSION_MAX_TAGS.
 * `capturing`: the client captures `stream` into a CUDA graph (on a kind
 * with device streams, the heap then releases and moves none of the
 * session's cache for it, parked or not: the allocation gets new memory,
 * reclaimed from other sessions if need be, or is refused). */
void gm_broker_alloc_tagged(gm_session_t *s, uint64_t request_id, uint64_t size, uint64_t stream, const char *tag,
                            bool capturing, const gm_frame_t *frames, size_t n_frames, gm_outcome_t *ret);
/* The reply built from allocation outcome `out` was sent: its pieces are
 * the client's (their releases need acks from now on), its moves and fence
 * marks are done. */
void gm_broker_commit(gm_session_t *s, const gm_outcome_t *out);
/* The reply of allocation outcome `out` could not be built: the block goes
 * back to the heap; its new pieces stay listed for the next reply. */
void gm_broker_undo(gm_session_t *s, const gm_outcome_t *out);
/* An allocation's refusal reaches its client: num_ooms (its heap's, when the
 * heap refused it; the heap does not count refusals that may still wait). */
void gm_session_central_count_refusal(gm_session_t *s);
/* An allocation waits for reclaimed memory: num_reclaim_waits. */
void gm_session_central_count_reclaim_wait(gm_session_t *s);
/* The first piece to send with the current reply (creation order: ->queue). */
const gm_piece_t *gm_session_central_new_pieces(const gm_session_t *s);
/* The reply carrying them (and the pending page moves and fence marks) was
 * sent: their releases need acks from now on. */
void gm_session_central_pieces_sent(gm_session_t *s);
/* The client reports fence `fence` on `stream` complete (page reuse): its
 * heap's stream_fence() answers from it. -EPROTO for a claim that cannot be
 * true (a stream or number it was never asked to mark, nor marked on its
 * own): the caller ends the connection. A number below one known complete
 * is stale (its own later mark was complete at once) and changes nothing. A
 * false claim within these bounds only lets the session's own pages move
 * early (they never leave it): it hurts no one but the liar. */
int gm_session_central_fence_done(gm_session_t *s, uint64_t stream, uint64_t fence);
/* Whether the session's client marks fences on its own (HelloReply
 * client_fences): a central session whose heap moves pages behind stream
 * fences (page reuse on a device backend). */
bool gm_session_central_client_fences(const gm_session_t *s);
/* The client found complete an event it recorded on `stream` after every
 * free it sent before this allocation (Alloc.frees_fenced): a fence at the
 * heap's free count now is marked, sent and done at once (asked >= sent >=
 * done stay true), so the frees' pages may move in this very allocation. */
void gm_session_central_frees_fenced(gm_session_t *s, uint64_t stream);
/* The reply for `block_id` could not be built: the block goes back to the
 * heap; its new pieces stay listed for the next reply. */
void gm_session_central_alloc_undo(gm_session_t *s, uint64_t block_id);
/* 0, or -ENOENT: not an allocated block of this session. */
int gm_session_central_free_block(gm_session_t *s, uint64_t block_id, bool deferred);
int gm_session_central_free_completed(gm_session_t *s, uint64_t block_id);
/* A ReleaseAck: the pieces return to the backend and parked allocations are
 * retried. The pieces named in `not_released` (by segment and offset: the
 * client could not unmap them) stay charged, in a held release that is never
 * asked again, until the session ends. -ENOENT: no such release pending. */
int gm_broker_release_ack(gm_session_t *s, uint64_t release_id, const gm_release_range_t *not_released,
                          size_t n_not_released);
/* Releases the session's cached memory; the bytes. */
uint64_t gm_session_central_trim(gm_session_t *s);
/* Releases cached memory of every session of `tenant` (NULL: all): central
 * heaps release theirs, local sessions are asked (Reclaim); the bytes. */
uint64_t gm_reclaim_trim(gm_broker_t *b, const char *tenant);
/* Sends ReleaseRequests for everything queued (ops->send_release). */
void gm_session_flush_releases(gm_session_t *s);
/* The device as refusals describe it: what the broker may use of it (its
 * capacity within the driver's total), and what is free of that. */
void gm_reclaim_device_view(gm_broker_t *b, uint64_t *ret_free, uint64_t *ret_total);

/* ---- local sessions: the heap runs in the client ---- */

/* A request for physical memory for the client's heap: one piece, or a run
 * of n_pieces consecutive pieces of piece.size bytes from piece.offset (the
 * pages of an expandable segment), granted all or nothing. */
typedef struct gm_grant {
        gm_piece_spec_t piece; /* the first */
        uint64_t n_pieces;     /* 0 or 1: one; at most GM_MAX_GRANT_PIECES */
        uint64_t block_size;   /* the block the heap needs it for (diagnosis only) */
        uint64_t largest_free; /* the heap's largest free block (diagnosis only) */
        bool will_retry;       /* the client's heap retries a refusal: the application does not see it */
        /* A wake's grant: parks until memory comes back even when none is
         * asked back, for wait_ms (0: park_timeout_ms), then is refused. */
        bool wait_for_memory;
        uint32_t wait_ms;
        const char *tag; /* the tagged pool it is for (NULL or "": default), the client's id ... */
        unsigned tag_id; /* ... of it (0 with the default) */
} gm_grant_t;

/* The longest a wake's grant may wait (Grant.wait_ms). */
#define GM_MAX_GRANT_WAIT_MS 3600000u

/* Makes a started session local (at Hello): -EBUSY when it already has a
 * heap or memory. */
int gm_session_local_enable(gm_session_t *s);
/* A grant: REPLY (out->pieces: hand their fds over), PARK or REFUSE
 * (malformed against what the session holds, quota, device: for a run, as
 * a whole, and nothing of it is then charged), as gm_broker_alloc(). */
void gm_broker_grant(gm_session_t *s, uint64_t request_id, const gm_grant_t *g, gm_outcome_t *ret);
/* The client unmapped and gives back these pieces (ReturnPieces), checked as
 * a ReleaseAck is (process_check.c): shown gone, they go back to the backend
 * at once and parked requests are retried; shown still mapped, they stay
 * charged and s->lied is set (the caller ends the session); where nothing can
 * tell, they stay charged until the session ends. Returns how many ranges
 * name no granted piece of that length (left alone); the index of the first
 * in *ret_first_bad. */
size_t gm_broker_return_pieces(gm_session_t *s, const gm_release_range_t *ranges, size_t n, size_t *ret_first_bad);
/* The client is about to unmap pieces and return them (ReturnIntent): the
 * reference its returns are checked against is noted now, before its figure
 * drops, and stands until gm_session_local_close_return_intent() (its closing
 * ReturnPieces): neither a Reclaim nor another intent renews it meanwhile.
 * -EPROTO for a central session, -EBUSY while one is open, -ESHUTDOWN once
 * ended. A client that never closes its intent only hurts itself: its later
 * returns are judged against that old reference. */
int gm_session_local_open_return_intent(gm_session_t *s);
void gm_session_local_close_return_intent(gm_session_t *s);
/* Whether its returns are checked against its process's device memory
 * figure (cuda with NVML), so that a give-back needs a ReturnIntent first. */
bool gm_process_check_needs_intent(const gm_session_t *s);
/* Page reuse in the client's heap: the granted piece at (from_segment_id,
 * from_offset) now lies at `to` (its size: the piece's), checked as a grant
 * there; memory, fd and charge unchanged. -EINVAL with the reason in *ret_why. */
int gm_session_local_move_granted(gm_session_t *s, uint64_t from_segment_id, uint64_t from_offset,
                                  const gm_piece_spec_t *to, const char **ret_why);
/* The client's heap falls asleep (asleep: sleeping_bytes, what its wake
 * needs, at most what the session holds granted now) or is awake again
 * (asleep false: the record goes). -EPROTO for a central session, -EINVAL
 * for more bytes than granted, -EBUSY when it is asleep already,
 * -ESHUTDOWN once ended. */
int gm_session_local_sleep_state(gm_session_t *s, bool asleep, uint64_t sleeping_bytes);
/* The client answered Reclaim `reclaim_id` (what it gave back came before,
 * with ReturnPieces): parked requests are retried. -ENOENT: none pending. */
int gm_reclaim_ack(gm_session_t *s, uint64_t reclaim_id, uint64_t released_bytes);

/* ---- restarts: the ledger ---- */

/* A random session token. */
void gm_ledger_token_new(char token[GM_TOKEN_LEN + 1]);
/* Reads and compacts the journal at `path` and opens it for appending;
 * applies the runtime quotas it holds. */
int gm_ledger_open(gm_broker_t *b, const char *path);
void gm_ledger_close(gm_broker_t *b);
/* Journals a runtime quota (bytes 0: removed). */
void gm_ledger_runtime_quota(gm_broker_t *b, const char *tenant, uint64_t bytes);
/* Takes one stored fd systemd handed back (consumed in any case); after the
 * last, gm_orphan_adopt_done() forgets journal entries whose fd did not come
 * back and starts the re-attach grace. */
void gm_orphan_adopt(gm_broker_t *b, const char *name, int fd);
void gm_orphan_adopt_done(gm_broker_t *b, uint64_t now_ms);
/* Releases orphans whose grace ran out (all of them when `all`). */
void gm_orphan_expire(gm_broker_t *b, uint64_t now_ms, bool all);

/* What a re-attaching client reports, piece by piece. */
typedef struct gm_reattach_range {
        uint64_t offset;
        uint64_t length;
} gm_reattach_range_t;
/* A central session's segment: each range must be a piece the ledger gives
 * the session (-ENOENT), and the segment is restored in the pool its journal
 * records name (inferred from the page size where they name none; -EINVAL
 * with the reason in *ret_why where they name both). */
int gm_reattach_segment(gm_session_t *s, uint64_t segment_id, uint64_t va_size, uint64_t stream,
                        const gm_reattach_range_t *mapped, size_t n_mapped, const char **ret_why);
/* A re-attaching local session reports a piece it maps: checked as a grant
 * (-EINVAL), it is LIVE again, charged, granted, and released at once by
 * gm_piece_release() (its client gives pieces back unmapped). */
int gm_reattach_grant(gm_session_t *s, const gm_piece_spec_t *spec, gm_piece_t **ret_piece);
int gm_reattach_block(gm_session_t *s, uint64_t block_id, uint64_t segment_id, uint64_t offset, uint64_t size,
                      uint64_t requested_size, bool pending_free);
/* What a re-attaching session says of itself in its last report: a local
 * session asleep, what its wake needs (0: awake; at most the capacity), and
 * the unconsumed claim it held (0: none). */
typedef struct gm_reattach_state {
        uint64_t sleeping_bytes;
        uint64_t claim_bytes;
} gm_reattach_state_t;
/* The last report: the heap is checked, unclaimed stored pieces released;
 * the sleep record comes back (-EINVAL for a central session's or more than
 * the capacity), and the claim is set aside again as gm_broker_claim() sets a
 * fresh one (at most the capacity, and what is free now less the journal's
 * records of sessions still to re-attach: *ret_claimed, less than claim_bytes
 * when the new daemon cannot give it all). */
int gm_reattach_finish(gm_session_t *s, const gm_reattach_state_t *told, uint64_t *ret_claimed);
/* Counts `n` more reported items: -E2BIG past the limit. */
int gm_reattach_count(gm_session_t *s, uint64_t n);
/* A shared object the re-attaching client still maps (gm_shared_reattach():
 * -ENOENT when the adopted registry has no such object, which is then not
 * counted; -EACCES; -ENOSPC). */
int gm_reattach_shared(gm_session_t *s, uint64_t client_id, const char *name, uint64_t version, uint64_t size);

/* ---- snapshots for metrics and listings ---- */

typedef struct gm_tenant_view {
        const gm_tenant_t *tenant;
        uint64_t releasing_bytes; /* over its sessions */
        uint64_t largest_free;    /* largest free cached block over its sessions */
        uint32_t unresponsive;    /* its sessions marked unresponsive */
} gm_tenant_view_t;

/* One row per tenant, sorted by name (malloc'd). -ENOMEM. */
int gm_broker_tenant_views(const gm_broker_t *b, gm_tenant_view_t **ret_views, size_t *ret_n);

/* ---- shared objects ---- */

/* A shared object: named, versioned, read-only memory one session filled and
 * published for the sessions of the tenants its readers admit. The broker's
 * shared registry (shared.c) owns it, not a session: it is charged once, to
 * the publishing tenant, from its creation until it is withdrawn (unpublished
 * or its retention ended) and its last mapper closed it. Opaque outside the
 * broker (gm_shared_view()). */
typedef struct gm_shared gm_shared_t;

#define GM_SHARED_NAME_MAX 127           /* [A-Za-z0-9_.:/-]{1,127} */
#define GM_SHARED_META_MAX (1u << 20)    /* bytes of the opaque blob kept with it */
#define GM_SHARED_MAX_READERS 64         /* tenant names one publish may admit */
#define GM_SHARED_OPENS_PER_SESSION 1024 /* opens (and stagings) one session may hold */
#define GM_SHARED_DEFAULT_MAX_OBJECTS 256

typedef enum gm_shared_state {
        GM_SHARED_STAGING,   /* created, writable by its session only, not openable */
        GM_SHARED_PUBLISHED, /* immutable, openable by admitted tenants */
        GM_SHARED_WITHDRAWN, /* unpublished or retention over: released when its last mapper closes it */
} gm_shared_state_t;

/* What the daemon (and listings, metrics, snapshots) read of one object;
 * the pointers are the broker's, valid while the object is. */
typedef struct gm_shared_view {
        uint64_t id; /* the registry's handle of it (the wire's object_id) */
        const char *name;
        uint64_t version; /* 0 while staging */
        const char *tenant;
        uint64_t size;
        gm_shared_state_t state;
        uint32_t mappers;           /* opens by live sessions */
        uint64_t created_unix_ms;   /* when it was created (published: when published) */
        uint32_t retention_s;       /* 0: until unpublished */
        const char *const *readers; /* admitted tenants ("*": all); none: the publisher's only */
        size_t n_readers;
        const void *meta;
        size_t meta_len;
        int fd; /* its memory's exportable fd (the daemon's; send a copy) */
} gm_shared_view_t;

/* "staging", "published" or "withdrawn". */
const char *gm_shared_state_name(gm_shared_state_t state);
/* Whether `name` is a valid object name. */
bool gm_shared_name_valid(const char *name);
/* A staging object of `size` bytes (rounded up to the backend's granularity)
 * for session s to fill, charged to its tenant at once: -EINVAL (name,
 * size 0), -EEXIST (s stages that name already), -EDQUOT, -ENOMEM (device),
 * -ENOSPC (limits.max_shared_objects or the session's opens),
 * -EFBIG (larger than its tenant's quota or the device). */
int gm_shared_create(gm_session_t *s, const char *name, uint64_t size, gm_shared_view_t *ret_view);
/* Commits s's staging object `id` (its client unmapped its writable
 * mapping): sealed read-only where the backend can (-EBUSY while a writable
 * mapping remains: it stays staging), versioned (the name's highest + 1),
 * stored for restarts, and opened for s. readers: tenant names ("*": all;
 * none: the publisher's tenant only). -ENOENT (not s's staging object),
 * -EINVAL (a reader's name, too many), -EMSGSIZE (meta). */
int gm_shared_publish(gm_session_t *s, uint64_t id, const char *const *readers, size_t n_readers, const void *meta,
                      size_t meta_len, uint32_t retention_s, gm_shared_view_t *ret_view);
/* Opens published `name` at `version` (0: the newest) for s: its mappers
 * grow by one. -ENOENT, -EACCES (s's tenant not admitted), -ENOSPC (s's
 * opens). */
int gm_shared_open(gm_session_t *s, const char *name, uint64_t version, gm_shared_view_t *ret_view);
/* s's mapping of object `id` is gone (an open, or its own staging object
 * abandoned). -ENOENT when s holds none. */
int gm_shared_close(gm_session_t *s, uint64_t id);
/* Withdraws name@version (0: every version): nobody opens it any more; its
 * memory goes back once its last mapper closes it. The publisher's tenant or
 * an admin (-EPERM); -ENOENT. */
int gm_shared_unpublish(gm_session_t *s, const char *name, uint64_t version);
/* Iterates the registry (NULL: the first), newest first; NULL at the end. */
const gm_shared_t *gm_shared_next(const gm_broker_t *b, const gm_shared_t *prev);
void gm_shared_view(const gm_shared_t *o, gm_shared_view_t *ret);
/* Whether tenant t may open o: its publisher's tenant, or one its readers
 * name ("*": every tenant). Listings show an object to them (and admins). */
bool gm_shared_admits(const gm_shared_t *o, const gm_tenant_t *t);
/* The sessions that map o, each once (NULL: the first; NULL after the
 * last), with its opens of o in *ret_opens (its staging object: 1). */
const gm_session_t *gm_shared_mapper_next(const gm_shared_t *o, const gm_session_t *prev, uint32_t *ret_opens);
/* Shared objects' bytes and count (for the device's figures). */
uint64_t gm_shared_bytes(const gm_broker_t *b);
