/* gpumemd's process: options, the libuv loop, the listener and its
 * connections around one broker. Everything here is touched only from the
 * loop thread, so quota checks and allocator changes need no locks. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "broker.h"
#include "clock.h"
#include "gpumem.pb-c.h"
#include "ipc.h"

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
        mode_t socket_mode; /* of the control socket file */
        bool has_socket_group;
        gid_t socket_group;
        bool has_admin_group;
        gid_t admin_group; /* members may administer the daemon (as may uid 0) */
        int verbosity;
        gm_limits_t limits;
} gm_options_t;

typedef struct gm_daemon gm_daemon_t;
typedef struct gm_local gm_local_t;
typedef struct gm_local_tenant gm_local_tenant_t;

/* One client connection. Its broker session lives as long as it does; both
 * are freed in the poll handle's close callback. */
typedef struct gm_conn {
        gm_daemon_t *daemon;
        uv_poll_t poll; /* poll.data = this connection */
        int fd;
        gm_session_t *session;
        char tenant_name[64]; /* resolved from the kernel-verified identity at connect */
        bool hello_done;
        bool closing; /* no more input is processed; memory is being released */
        uint64_t requests; /* packets received */
        gm_local_t *local; /* a local session (its heap runs in the client: local.h); NULL: central */
        struct gm_parked_alloc *parked_allocs; /* central allocations waiting for local sessions' caches */
        struct gm_conn *prev, *next;
} gm_conn_t;

struct gm_config;

struct gm_daemon {
        uv_loop_t *loop;
        gm_options_t opts;
        struct gm_config *config; /* the configuration file's contents (never NULL after start) */
        gm_backend_t *backend;
        gm_alloc_config_t alloc_config; /* at start; the broker's is the live one */
        gm_broker_t *broker;
        int listen_fd;
        uint8_t *rx_buf;          /* max_packet bytes: every connection's packets are read into it */
        bool listen_fd_inherited; /* from systemd: its path is the socket unit's, never unlink it */
        uv_poll_t listener;
        uv_signal_t sigterm, sigint, sighup;
        uv_timer_t tick;     /* release retries and parked-allocation timeouts */
        uv_timer_t watchdog; /* systemd watchdog pings and STATUS= lines */
        bool watchdog_running;
        gm_conn_t *conns;
        uint32_t n_conns;
        struct gm_metrics *metrics; /* the Prometheus endpoint; NULL when disabled */
        gm_local_tenant_t *local_tenants; /* local sessions' part of tenant statistics */
        gm_stats_t local_device_stats;    /* and of the device's */
        bool shutting_down;
};

/* server.c: the listener and connection lifetimes, the only socket I/O. */
int gm_server_start(gm_daemon_t *d);
void gm_server_stop(gm_daemon_t *d);
/* Ends a connection: its session releases all its memory at once. */
void gm_conn_close(gm_conn_t *c, const char *why);
/* Sends an envelope (with fds) carrying `request_id`; on failure the
 * connection is closed and a negative errno returned. */
int gm_conn_send(gm_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds);
/* Sends an Error: `err` in either sign, the message prefixed "gpumemd: ". */
int gm_conn_send_error(gm_conn_t *c, uint64_t request_id, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
/* Sends a broker refusal as it is (its message is whole). */
int gm_conn_send_refusal(gm_conn_t *c, uint64_t request_id, const gm_outcome_t *out);
/* The broker's host callbacks (release requests, parked answers, fd store, logs, counters). */
gm_broker_ops_t gm_server_broker_ops(gm_daemon_t *d);
/* The broker's limits from the daemon's. */
gm_broker_limits_t gm_daemon_broker_limits(const gm_daemon_t *d);

/* requests.c: one request of a connection. Returns 0, or a negative errno
 * when the connection must be closed (protocol abuse). */
int gm_requests_dispatch(gm_conn_t *c, Gpumem__Envelope *env, int *fds, size_t n_fds);
/* Answers an allocation's outcome (reply with its new pieces, or refusal). */
void gm_requests_answer_alloc(gm_conn_t *c, uint64_t request_id, const gm_outcome_t *out);

/* grant.c, localstats.c: local sessions, whose heap runs in the client (local.h). */
/* At Hello, after the session started: picks the heap mode; for a local
 * session creates its statistics page (*ret_page_fd: send it with the reply,
 * then close it) and fills the reply's local fields. A refusal is sent and
 * returned as a negative errno. */
int gm_local_hello(gm_conn_t *c, uint64_t request_id, const Gpumem__Hello *hello, Gpumem__HelloReply *reply,
                   int *ret_page_fd);
int gm_handle_grant(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_return_pieces(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
int gm_handle_reclaim_ack(gm_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Re-attach of a local session: its pieces only (no blocks). */
int gm_local_reattach(gm_conn_t *c, uint64_t request_id, const Gpumem__Reattach *req);
/* Asks local sessions (of `tenant` only, when not NULL) other than `except`
 * for their cached memory; returns the bytes expected back. */
uint64_t gm_local_reclaim(gm_daemon_t *d, const gm_conn_t *except, const gm_tenant_t *tenant);
/* A central allocation the broker refused for lack of memory: when local
 * sessions hold cached memory they are asked for it and the request waits
 * (true: parked, answered later); false: answer `out` now. */
bool gm_local_park_alloc(gm_conn_t *c, uint64_t request_id, uint64_t size, uint64_t stream, const gm_outcome_t *out);
/* Retries grants (and central allocations) waiting for reclaimed memory. */
void gm_local_retry_parked(gm_daemon_t *d);
/* Periodic: reclaim timeouts, page reads, parked grants. */
void gm_local_tick(gm_daemon_t *d);
/* The connection ends: its figures leave the totals, its page goes. */
void gm_local_end(gm_conn_t *c);
void gm_local_free_all(gm_daemon_t *d);
/* Reads every local session's page (before figures are shown). */
void gm_local_refresh(gm_daemon_t *d);
/* A session's statistics: a central heap's, a local session's figures, or
 * NULL (a central session without a heap). */
const gm_stats_t *gm_conn_stats(const gm_session_t *s);
bool gm_conn_page_invalid(const gm_session_t *s);
/* Sum of statistics (peaks summed: an upper bound). */
void gm_local_stats_add(gm_stats_t *sum, const gm_stats_t *add);
/* A tenant's figures: the broker's (central heaps) plus its local sessions'. */
void gm_local_tenant_stats(const gm_daemon_t *d, const gm_tenant_t *t, gm_stats_t *ret);
void gm_local_device_stats(const gm_daemon_t *d, gm_stats_t *ret);
/* A tenant's local totals, created on first use (NULL: out of memory). */
gm_local_tenant_t *gm_local_tenant(gm_daemon_t *d, const char *name);

/* main.c: applies the config file's tenant quotas to every tenant. */
void gm_daemon_apply_config_quotas(gm_daemon_t *d);

/* GPUMEMD_DEBUG builds: verifies the broker (and every heap) and aborts on a
 * violation, naming `after`. A no-op otherwise. */
void gm_daemon_debug_check(const gm_daemon_t *d, const char *after);
