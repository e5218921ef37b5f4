/* gpumemd's state: one device, its backend, its sessions and tenants, on one
 * libuv loop. Everything here is touched only from the loop thread, so quota
 * checks and allocator changes need no locks. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "allocator.h"
#include "history.h"
#include "backend.h"
#include "gpumem.pb-c.h"
#include "ipc.h"
#include "sd.h"

typedef struct gm_limits {
        uint32_t max_sessions;           /* concurrent connections */
        uint64_t max_blocks_per_session; /* live blocks (allocated or pending free) */
        uint32_t max_packet;             /* bytes in one packet, both ways */
        uint32_t max_fds;                /* fds in one packet */
        uint32_t max_parked_per_session; /* allocations waiting for reclaim */
        uint32_t park_timeout_ms;        /* how long an allocation waits for reclaim */
        uint32_t release_timeout_ms;     /* a client's time to acknowledge a release */
        uint32_t reattach_grace_ms;      /* after a restart: how long stored segments wait for their client */
        uint32_t max_reattach_items;     /* segments + blocks one re-attaching session may report */
} gm_limits_t;

typedef struct gm_options {
        const char *config_path;
        int device;
        const char *device_uuid;
        const char *backend;
        uint64_t capacity;
        char socket_path[108];
        const char *metrics_listen;
        const char *alloc_conf;
        const char *state_dir; /* persistent quotas; NULL = none kept */
        char state_dir_buf[256];
        mode_t socket_mode;    /* of the control socket file */
        bool has_socket_group;
        gid_t socket_group;
        bool has_admin_group;
        gid_t admin_group;     /* members may administer the daemon (as may uid 0) */
        int verbosity;
        gm_limits_t limits;
} gm_options_t;

/* Where a tenant's quota comes from; the first set one wins. */
typedef enum gm_quota_source {
        GM_QUOTA_RUNTIME,    /* `gpumemctl quota set --runtime`: until restart */
        GM_QUOTA_PERSISTENT, /* `gpumemctl quota set`: kept in the state directory */
        GM_QUOTA_CONFIG,     /* the config file's quota= */
        _GM_QUOTA_SOURCE_MAX,
} gm_quota_source_t;

typedef struct gm_tenant {
        char name[64];
        gm_stats_t stats;       /* allocator statistics of all its sessions */
        uint64_t charged_bytes; /* physical bytes of its sessions, releases not yet acknowledged included */
        uint64_t quota;         /* effective limit on charged_bytes; 0 = unlimited */
        bool quota_set[_GM_QUOTA_SOURCE_MAX];
        uint64_t quota_by_source[_GM_QUOTA_SOURCE_MAX]; /* 0 = explicitly unlimited */
        uint32_t sessions;
        struct gm_tenant *next;
} gm_tenant_t;

/* One backend allocation made for a session: a whole segment, or one page of
 * an expandable segment. Its address is the allocator's handle for it. */
typedef struct gm_piece {
        uint64_t segment_id;
        uint64_t segment_va_size;
        uint64_t offset;
        bool whole_segment;  /* set at release: the client drops the reservation too */
        bool client_mapped;  /* its fd reached the client, so release needs an ack */
        uint64_t store_id;   /* kept in systemd's fd store as "seg-<store_id>" (0: not kept) */
        gm_phys_t phys;
        struct gm_piece *next;
} gm_piece_t;

/* A ReleaseRequest sent to a client and not yet acknowledged: its pieces stay
 * charged to the tenant and held in the backend until the ack. */
typedef struct gm_release {
        uint64_t id;
        gm_piece_t *pieces;
        uint64_t bytes;
        uint64_t sent_at_ms;
        uint32_t attempts;
        struct gm_release *next;
} gm_release_t;

/* An allocation that failed while reclaimed memory was on its way back; it is
 * retried when releases are acknowledged, and refused after park_timeout_ms. */
typedef struct gm_parked {
        uint64_t request_id;
        uint64_t size;
        uint64_t stream;
        uint64_t parked_at_ms;
        int error; /* the refusal to send if it times out */
        char message[1024];
        struct gm_parked *next;
} gm_parked_t;

typedef struct gm_daemon gm_daemon_t;
typedef struct gm_local_session gm_local_session_t;

typedef struct gm_session {
        gm_daemon_t *daemon;
        uv_poll_t poll; /* poll.data = this session */
        int fd;
        uint64_t id;
        gm_peer_cred_t cred;
        gm_tenant_t *tenant;
        char name[64];      /* from Hello: logs only, never identity */
        char unit[256];     /* systemd unit from the peer's cgroup ("" if none) */
        char tenant_name[64]; /* resolved from the kernel-verified identity at connect */
        char token[33];       /* session token (hex): names its stored segments, allows re-attach */
        bool reattaching;     /* between a resuming Hello and the last Reattach */
        gm_piece_t *adopting; /* stored pieces of the previous daemon, awaiting this client's claims */
        uint64_t reattach_items;
        bool hello_done;
        bool admin_conn;    /* said it is a control connection (gpumemctl); display only */
        bool admin;         /* kernel-verified right to administer the daemon */
        bool closing;       /* no more input is processed; memory is being released */
        gm_heap_t *heap;    /* created at the first allocation */
        gm_local_session_t *local; /* a local session's ledger and statistics page (grant.c); NULL: central */
        uint64_t last_active_ms;
        uint64_t requests;  /* packets received */
        const gm_frame_t *cur_frames; /* frames of the allocation being served (history) */
        size_t n_cur_frames;
        gm_piece_t *new_pieces;     /* created while serving the current request; sent with its reply */
        gm_piece_t *to_release;     /* released by the allocator, not yet asked back from the client */
        gm_release_t *releases;     /* asked back, awaiting ReleaseAck */
        uint64_t releasing_bytes;   /* bytes in `releases` */
        uint64_t next_release_id;
        gm_parked_t *parked;
        uint32_t n_parked;
        struct gm_session *prev, *next;
} gm_session_t;

struct gm_config;

struct gm_daemon {
        uv_loop_t *loop;
        gm_options_t opts;
        struct gm_config *config; /* the configuration file's contents (never NULL after start) */
        gm_backend_t *backend;
        gm_alloc_config_t alloc_config;
        gm_stats_t device_stats;
        uint64_t va_cursor; /* next synthetic segment address (shared by all heaps) */
        int listen_fd;
        uint8_t *rx_buf; /* max_packet bytes: every session's packets are read into it */
        bool listen_fd_inherited; /* from systemd: its path is the socket unit's, never unlink it */
        uv_poll_t listener;
        uv_signal_t sigterm, sigint, sighup;
        uv_timer_t tick; /* release retries and parked-allocation timeouts */
        uv_timer_t watchdog; /* systemd watchdog pings and STATUS= lines */
        bool watchdog_running;
        bool tick_running;
        gm_session_t *sessions;
        uint32_t n_sessions;
        uint64_t next_session_id;
        uint64_t releasing_bytes; /* over all sessions */
        gm_tenant_t *tenants;
        gm_history_t *history;      /* NULL while memory history is off */
        struct gm_orphan *orphans;  /* stored segments of sessions not yet re-attached after a restart */
        uint64_t orphans_deadline_ms;
        bool keep_stored;           /* stopping under systemd: stored segments outlive this process */
        int ledger_fd;              /* append-only journal of stored pieces and runtime quotas, or -1 */
        char ledger_path[128];
        uint64_t next_store_id;
        uint32_t n_stored;          /* pieces in the fd store (at most GM_SD_FDSTORE_MAX) */
        struct gm_ledger_entry *ledger; /* entries read at start, until adoption is done */
        size_t n_ledger;
        size_t history_max_entries; /* the bound used when it is switched on */
        struct gm_metrics *metrics; /* the Prometheus endpoint; NULL when disabled */
        bool shutting_down;
        uint32_t sigint_count;
};

/* server.c: the listener and session lifetimes. */
int gm_server_start(gm_daemon_t *d);
void gm_server_stop(gm_daemon_t *d);
/* Ends a session: releases all its memory at once and closes it. */
void gm_session_close(gm_session_t *s, const char *why);
/* Sends an envelope (with fds) to the session's client; on failure the
 * session is closed and a negative errno returned. */
int gm_session_send(gm_session_t *s, const Gpumem__Envelope *env, const int *fds, size_t n_fds);
int gm_session_send_error(gm_session_t *s, uint64_t request_id, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

/* The session's heap, created on first use. */
int gm_session_heap(gm_session_t *s, gm_heap_t **ret_heap);
/* Sends a reply envelope carrying `request_id`. */
int gm_session_reply(gm_session_t *s, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds);
/* Replies Ok; always returns 0 (a failed send closes the session). */
int gm_session_reply_ok(gm_session_t *s, uint64_t request_id);

/* admin.c: statistics, snapshots, history and settings requests. Return 0,
 * or a negative errno when the session must be closed. */
int gm_admin_stats(gm_session_t *s, uint64_t request_id, const Gpumem__Stats *req);
int gm_admin_reset_stats(gm_session_t *s, uint64_t request_id, const Gpumem__ResetStats *req);
int gm_admin_history(gm_session_t *s, uint64_t request_id, const Gpumem__HistoryControl *req);
int gm_admin_snapshot(gm_session_t *s, uint64_t request_id, const Gpumem__Snapshot *req);
int gm_admin_alloc_conf(gm_session_t *s, uint64_t request_id, const Gpumem__AllocConf *req);

/* session.c: request handling. Returns 0, or a negative errno when the
 * session must be closed (protocol abuse). */
int gm_session_handle(gm_session_t *s, Gpumem__Envelope *env, int *fds, size_t n_fds);
/* Asks the client for every piece the allocator released since the last call. */
void gm_session_flush_releases(gm_session_t *s);
/* Releases everything the session holds, without asking (the client is gone). */
void gm_session_release_all(gm_session_t *s);
/* Periodic work: re-asks unacknowledged releases, times parked allocations out. */
void gm_daemon_tick(gm_daemon_t *d);
/* Gives one piece back to the backend and uncharges it (the client unmapped it or is gone). */
void gm_piece_release(gm_session_t *s, gm_piece_t *p);
/* Retries parked allocations of every session (memory came back). */
void gm_session_retry_parked(gm_daemon_t *d);
/* Asks sessions other than `requester` (of `tenant` only, when not NULL),
 * least recently active first, for their cached memory until `need` bytes are
 * on their way back; returns the bytes asked for. */
uint64_t gm_daemon_reclaim(gm_daemon_t *d, gm_session_t *requester, gm_tenant_t *tenant, uint64_t need);

/* grant.c: local sessions, whose heap runs in the client. The daemon grants
 * and takes back pieces, reads the statistics page, asks for reclaim. */
/* At Hello: picks the session's heap mode and, for a local one, creates its
 * statistics page (*ret_page_fd, to send with the reply and close). A
 * refusal is sent and returned as a negative errno. */
int gm_local_hello(gm_session_t *s, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd);
int gm_local_grant(gm_session_t *s, uint64_t request_id, const Gpumem__Grant *grant);
int gm_local_return(gm_session_t *s, uint64_t request_id, const Gpumem__ReturnPieces *ret);
int gm_local_reclaim_ack(gm_session_t *s, uint64_t request_id, const Gpumem__ReclaimAck *ack);
/* Sends a local session a Reclaim for its cached bytes (none while one is
 * outstanding); returns the bytes expected back. */
uint64_t gm_local_reclaim(gm_session_t *s);
/* Reads every local session's statistics page into its figures and folds
 * them into tenant and device statistics. */
void gm_local_refresh(gm_daemon_t *d);
void gm_local_retry_parked(gm_daemon_t *d, bool timed_out_only);
void gm_local_tick(gm_daemon_t *d);
void gm_local_release_all(gm_session_t *s);
/* Re-attach after a restart: a stored piece the local session's client still
 * maps becomes one of its pieces again (charged). 0, or -EINVAL when it does
 * not fit what the session already holds (the caller keeps the piece). */
int gm_local_adopt(gm_session_t *s, gm_piece_t *p);
/* A session's statistics (central: its heap's; local: the page's last valid
 * figures with the daemon's exact ones); NULL for a central session without a heap. */
const gm_stats_t *gm_session_stats(const gm_session_t *s);
bool gm_local_page_invalid(const gm_session_t *s);
/* Reserved minus active bytes of a session. */
uint64_t gm_session_cached_bytes(const gm_session_t *s);
/* Bytes cached by every session but `s`, or on their way back. */
uint64_t gm_daemon_others_cached(const gm_daemon_t *d, const gm_session_t *s);

/* restart.c: surviving restarts. Segments are kept in systemd's fd store
 * under names that say whose they are; after a restart they wait for their
 * session's client to re-attach (Hello.resume_token + Reattach) and are
 * released if none comes within reattach_grace_ms. */
#define GM_TOKEN_LEN 32
void gm_session_new_token(char token[GM_TOKEN_LEN + 1]);
/* Stores / unstores a session's piece in the fd store (no-ops outside systemd). */
void gm_piece_store(const gm_session_t *s, gm_piece_t *p);
void gm_piece_unstore(const gm_session_t *s, gm_piece_t *p);
/* Reads and compacts the ledger journal (<socket>.ledger) and opens it for
 * appending; applies the runtime quotas it holds. */
int gm_ledger_open(gm_daemon_t *d);
void gm_ledger_close(gm_daemon_t *d);
/* Journals a runtime quota (bytes 0: removed). */
void gm_ledger_runtime_quota(gm_daemon_t *d, const char *tenant, uint64_t bytes);
/* Takes the segment fds systemd handed back (consumes them). */
void gm_restart_adopt(gm_daemon_t *d, gm_sd_named_fd_t *segments, size_t n);
/* A resuming Hello: claims the orphan with that token (same uid). 0, or
 * -EBUSY (a live session has it), -EPERM (another uid's), -EINVAL (bad token). */
int gm_restart_claim(gm_session_t *s, const char *token);
int gm_restart_reattach(gm_session_t *s, uint64_t request_id, const Gpumem__Reattach *req);
/* Releases orphans whose grace ran out (all of them when `all`). */
void gm_restart_expire(gm_daemon_t *d, bool all);

/* main.c: applies the config file's tenant quotas to every tenant. */
void gm_daemon_apply_config_quotas(gm_daemon_t *d);

/* tenant.c */
gm_tenant_t *gm_tenant_get(gm_daemon_t *d, const char *name);
gm_tenant_t *gm_tenant_find(gm_daemon_t *d, const char *name);
void gm_tenants_free(gm_daemon_t *d);
/* Sets (has = true) or clears one source of a tenant's quota and recomputes it. */
void gm_tenant_set_quota(gm_tenant_t *t, gm_quota_source_t source, bool has, uint64_t bytes);
const char *gm_quota_source_name(const gm_tenant_t *t);
/* Persistent quotas in <state_dir>/quotas ("TENANT BYTES" lines), written
 * atomically. Load applies them to (new) tenants. */
int gm_quotas_load(gm_daemon_t *d);
int gm_quotas_save(const gm_daemon_t *d);
int gm_admin_quota(gm_session_t *s, uint64_t request_id, const Gpumem__Quota *req);
int gm_admin_clients(gm_session_t *s, uint64_t request_id, const Gpumem__Clients *req);

uint64_t gm_now_ms(void);
