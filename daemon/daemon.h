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
#include "localstats.h"
#include "request.h"
#include "req_snapshot.h"
#include "u64map.h"

typedef struct gm_limits {
        uint32_t max_sessions;           /* concurrent connections */
        uint32_t max_sessions_per_uid;   /* concurrent connections of one uid; 0 = a quarter of max_sessions */
        uint32_t hello_timeout_ms;       /* a connection that has not said Hello by then is closed */
        uint64_t max_blocks_per_session; /* live blocks (allocated or pending free) */
        uint32_t max_packet;             /* bytes in one packet, both ways */
        uint32_t max_fds;                /* fds in one packet */
        uint32_t max_parked_per_session; /* allocations waiting for reclaim */
        uint32_t max_shared_objects;     /* shared objects at once (docs/shared.md) */
        uint32_t park_timeout_ms;        /* how long an allocation waits for reclaim */
        uint32_t release_timeout_ms;     /* a client's time to acknowledge a release */
        uint32_t reattach_grace_ms;      /* after a restart: how long stored segments wait for their client */
        uint32_t max_reattach_items;     /* segments + blocks one re-attaching session may report */

        /* A client that answers no release request for this long is not waited for (0: never). */
        uint32_t unresponsive_timeout_ms;
        uint32_t audit_interval_ms;       /* believed give-backs audited again this often (0: never) */
        uint32_t max_audited_processes;   /* ended processes the audit still follows (0: none) */
        gm_release_check_t release_check; /* of tenants that set none */
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
        bool metrics_tenants; /* tenant labels in /metrics */
        gm_limits_t limits;
} gm_options_t;

typedef struct gm_daemon gm_daemon_t;

/* Back-pressure: while a client's socket buffer is full the daemon reads no
 * more of its requests and keeps what it has to send (replies, release
 * requests) in order, in at most this much per connection; past any of these
 * limits the client is taken to be stuck or abusive and its connection closed. */
#define GM_CONN_MAX_QUEUED_PACKETS 1024u
#define GM_CONN_MAX_QUEUED_BYTES (8u << 20)
#define GM_CONN_MAX_QUEUED_FDS 512u

/* One packet waiting for room in its connection's socket buffer: the packed
 * envelope and its own duplicates of the fds it carries. */
typedef struct gm_outgoing {
        struct gm_outgoing *next;
        size_t len, n_fds;
        int *fds;      /* n_fds, after the struct */
        uint8_t *data; /* len bytes, after the fds */
} gm_outgoing_t;

/* One client connection. Its broker session lives as long as it does; both
 * are freed in the poll handle's close callback. req.closed: no more input
 * is processed, nothing more is sent. */
typedef struct gm_conn {
        gm_daemon_t *daemon;
        uv_poll_t poll; /* poll.data = this connection */
        int fd;
        gm_request_conn_t req;              /* the request handlers' view: session, hello state */
        uint64_t accepted_ms;               /* gm_now_ms() at accept: the hello timeout counts from it */
        gm_outgoing_t *out_head, *out_tail; /* non-empty: the socket was full, reading is paused */
        uint32_t out_packets, out_fds;
        size_t out_bytes;
        bool fixed_codec; /* the client sent a fixed-layout packet (hotmsg.h): hot replies go in it too */
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
        gm_requests_t requests;             /* the request handlers' host */
        gm_request_config_t request_config; /* what they read of the options */
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
        gm_u64map_t conns_per_uid;           /* uid + 1 -> number of its connections (as uintptr_t) */
        struct gm_metrics *metrics;          /* the Prometheus endpoint; NULL when disabled */
        gm_localstats_totals_t local_totals; /* local sessions' part of tenant and device statistics */
        gm_snapjobs_t snapjobs;              /* snapshots under way, their limits and counters */
        bool shutting_down;
};

/* server.c: the listener and connection lifetimes, the only socket I/O. */
int gm_server_start(gm_daemon_t *d);
void gm_server_stop(gm_daemon_t *d);
/* The broker's host callbacks (release requests, parked answers, fd store, logs, counters). */
gm_broker_ops_t gm_server_broker_ops(gm_daemon_t *d);
/* Points the request handlers at the broker and the current options. */
void gm_server_sync_requests(gm_daemon_t *d);

/* GPUMEMD_DEBUG builds: verifies the broker (and every heap) and aborts on a
 * violation, naming `after`. A no-op otherwise. */
void gm_daemon_debug_check(const gm_daemon_t *d, const char *after);
