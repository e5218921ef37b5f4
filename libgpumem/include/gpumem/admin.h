/* libgpumem's administration connection: the session gpumemctl opens. A
 * gpumem_admin is a control connection to one daemon that holds no memory and
 * runs no heap (the daemon lists it as a control session); it says hello
 * asking for admin rights, which the daemon grants only to uid 0 or the admin
 * group, and carries one request at a time: calls on one handle must not
 * overlap (use one per thread).
 * The calls below are the requests gpumemctl sends; each returns 0 or a
 * negative errno, and on failure the handle says what kind of failure it was
 * (gpumem_admin_failure_kind()) and why (gpumem_admin_error()). Included by
 * <gpumem/gpumem.h>. */
#ifndef GPUMEM_ADMIN_H
#define GPUMEM_ADMIN_H

#include <gpumem/gpumem.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpumem_admin gpumem_admin;

/* The highest GPU index a daemon's socket is looked up for. */
#define GPUMEM_MAX_DEVICE 63

/* What a failed call on a gpumem_admin ran into. */
typedef enum gpumem_admin_failure {
        GPUMEM_ADMIN_OK = 0,          /* no call has failed */
        GPUMEM_ADMIN_UNREACHABLE = 1, /* no connection (the error names the socket and why) */
        GPUMEM_ADMIN_REFUSED = 2,     /* the daemon refused or failed the request (the error is its message) */
        GPUMEM_ADMIN_LOST = 3,        /* the connection broke */
        GPUMEM_ADMIN_UNEXPECTED = 4,  /* the daemon's reply was not of the request's kind */
        GPUMEM_ADMIN_FAILED = 5,      /* anything else here (out of memory, a reply's contents unreadable) */
} gpumem_admin_failure;

/* The socket of the daemon of GPU `device` (0..GPUMEM_MAX_DEVICE) as
 * gpumem_connect_device() finds it without the CUDA driver:
 * $GPUMEM_SOCKET_TEMPLATE's (-EINVAL when it holds no single %d), else GPU
 * `device`'s default socket. Device -1: $GPUMEM_SOCKET, else GPU 0's default
 * socket, as gpumem_connect(NULL) picks it. */
GPUMEM_EXPORT int gpumem_admin_socket(int device, char *buf, size_t len);

/* A handle for the daemon at socket_path, not yet connected; `client_name`
 * is what it calls itself in its hello. Free it with gpumem_admin_free(). */
GPUMEM_EXPORT int gpumem_admin_new(const char *socket_path, const char *client_name, gpumem_admin **ret);
/* Closes the connection and frees the handle. Accepts NULL. */
GPUMEM_EXPORT void gpumem_admin_free(gpumem_admin *a);
/* Connects (with the peer checks of gpumem_connect()) and says hello, unless
 * connected already; every request connects first too. A failed hello leaves
 * it unconnected. */
GPUMEM_EXPORT int gpumem_admin_connect(gpumem_admin *a);
/* The kind and the text of the handle's last failure. */
GPUMEM_EXPORT gpumem_admin_failure gpumem_admin_failure_kind(const gpumem_admin *a);
GPUMEM_EXPORT const char *gpumem_admin_error(const gpumem_admin *a);
/* What the daemon said in its hello reply (connected handles; else -1, ""
 * and false): its device index and backend, the caller's tenant, and whether
 * it granted admin rights. */
GPUMEM_EXPORT int gpumem_admin_device(const gpumem_admin *a);
GPUMEM_EXPORT const char *gpumem_admin_backend(const gpumem_admin *a);
GPUMEM_EXPORT const char *gpumem_admin_tenant(const gpumem_admin *a);
GPUMEM_EXPORT bool gpumem_admin_rights(const gpumem_admin *a);

/* gpumem_stats_get() of a scope other than the session's. */
GPUMEM_EXPORT int gpumem_admin_stats(gpumem_admin *a, gpumem_scope scope, const char *tenant, uint32_t pid,
                                     gpumem_stats **ret);
/* gpumem_admin_stats() of one tagged pool, `tag` ("" the default; docs/tags.md):
 * the figures of that pool summed over the scope's live sessions that named
 * it (gpumem_stats_sessions() counts them; peaks summed: an upper bound), the
 * num_* counters 0. Sessions that ended are not in it. -EINVAL for a
 * malformed tag. */
GPUMEM_EXPORT int gpumem_admin_stats_tag(gpumem_admin *a, gpumem_scope scope, const char *tenant, uint32_t pid,
                                         const char *tag, gpumem_stats **ret);
/* gpumem_reset_stats() of the device, a tenant or a process, as the daemon
 * allows it. */
GPUMEM_EXPORT int gpumem_admin_reset_stats(gpumem_admin *a, gpumem_scope scope, const char *tenant, bool peak,
                                           bool accumulated);
/* Releases idle cached memory of `tenant` ("*": every tenant). */
GPUMEM_EXPORT int gpumem_admin_trim(gpumem_admin *a, const char *tenant, uint64_t *ret_released_bytes);

/* What each block's and trace entry's `category` of a snapshot names. */
typedef enum gpumem_snapshot_category {
        GPUMEM_SNAPSHOT_CATEGORY_NONE = 0,
        GPUMEM_SNAPSHOT_CATEGORY_TENANT = 1,
        GPUMEM_SNAPSHOT_CATEGORY_PID = 2,
        GPUMEM_SNAPSHOT_CATEGORY_TAG = 400, /* the block's tagged pool (docs/tags.md) */
} gpumem_snapshot_category;

typedef struct gpumem_snapshot_info {
        uint64_t size;             /* bytes of the snapshot */
        uint32_t local_asked;      /* local sessions asked for their blocks */
        uint32_t local_unanswered; /* of those, shown with their segments only (late or invalid) */
} gpumem_snapshot_info;

/* gpumem_snapshot() as the daemon sends it: *ret_fd (CLOEXEC, the caller's to
 * close) reads the snapshot's ret_info->size bytes from its start (a sealed
 * memfd or a pipe). */
GPUMEM_EXPORT int gpumem_admin_snapshot(gpumem_admin *a, gpumem_snapshot_format format,
                                        gpumem_snapshot_category category, uint32_t pid, int *ret_fd,
                                        gpumem_snapshot_info *ret_info);

/* gpumem_admin_snapshot() read whole: *ret_data (*ret_len bytes, then a NUL)
 * is the caller's; free it with gpumem_buffer_free(). */
GPUMEM_EXPORT int gpumem_admin_snapshot_data(gpumem_admin *a, gpumem_snapshot_format format,
                                             gpumem_snapshot_category category, uint32_t pid, void **ret_data,
                                             size_t *ret_len);

/* The largest ring gpumem_admin_history() may ask for. */
#define GPUMEM_HISTORY_MAX_ENTRIES 100000000u

typedef enum gpumem_history_op {
        GPUMEM_HISTORY_OFF = 0,    /* stop recording and clear the ring */
        GPUMEM_HISTORY_ON = 1,     /* record (max_entries 0: keep the current bound) */
        GPUMEM_HISTORY_STATUS = 2, /* change nothing */
} gpumem_history_op;

/* gpumem_history() of the daemon's ring, or only its state. */
GPUMEM_EXPORT int gpumem_admin_history(gpumem_admin *a, gpumem_history_op op, uint64_t max_entries,
                                       gpumem_history_state *ret_state);

/* The daemon's PYTORCH_CUDA_ALLOC_CONF-style settings after setting them to
 * `conf` (NULL: only shown); free *ret_conf with gpumem_buffer_free(). */
GPUMEM_EXPORT int gpumem_admin_alloc_conf(gpumem_admin *a, const char *conf, char **ret_conf);

/* A tenant as `gpumemctl quota` shows it. */
typedef struct gpumem_tenant_usage {
        gpumem_tenant_info info;
        uint64_t release_unverified_bytes; /* of charged: released, not verified as unmapped */
        const char *release_check;         /* "verify" or "trust" ("" from an older daemon) */
        uint64_t audited_bytes;            /* beyond charged: given back and mapped again (the daemon's audit) */
        uint64_t claimed_bytes;            /* beyond charged: its sessions' unconsumed claims (gpumem_claim()) */
} gpumem_tenant_usage;

typedef enum gpumem_quota_op {
        GPUMEM_QUOTA_LIST = 0, /* every tenant the caller may see */
        GPUMEM_QUOTA_GET = 1,  /* `tenant` */
        GPUMEM_QUOTA_SET = 2,  /* `tenant`'s quota to `bytes` (0 removes it), persistent unless `runtime` */
} gpumem_quota_op;

/* One quota request; the tenants of its reply in *ret_list (*ret_n entries,
 * one buffer: free it with gpumem_buffer_free()). */
GPUMEM_EXPORT int gpumem_admin_quota(gpumem_admin *a, gpumem_quota_op op, const char *tenant, uint64_t bytes,
                                     bool runtime, gpumem_tenant_usage **ret_list, size_t *ret_n);

/* One tagged pool's charged bytes of a session (docs/tags.md). */
typedef struct gpumem_tag_bytes {
        const char *tag; /* "" the default pool */
        uint64_t bytes;
} gpumem_tag_bytes;

/* A session as `gpumemctl clients` shows it. */
typedef struct gpumem_session_info {
        gpumem_client_info info;
        const char *command;               /* the process's command name when it connected; "" if unknown */
        bool unresponsive;                 /* owes an answer to a release request (stopped or hung) */
        uint64_t unresponsive_ms;          /* for how long */
        uint64_t release_unverified_bytes; /* released, not verified as unmapped */
        uint64_t claimed_bytes;            /* its unconsumed claim (gpumem_claim()) */
        const gpumem_tag_bytes *tags;      /* its tagged pools ("" first), none until it names one */
        size_t n_tags;
} gpumem_session_info;

/* gpumem_list_clients() with the fields above. One buffer, as there. */
GPUMEM_EXPORT int gpumem_admin_list_clients(gpumem_admin *a, gpumem_session_info **ret_list, size_t *ret_n);

/* A session that maps a shared object. */
typedef struct gpumem_shared_mapper {
        uint64_t session_id;
        uint32_t pid;
        const char *tenant;
        uint32_t opens; /* its handles of the object */
} gpumem_shared_mapper;

/* A shared object as `gpumemctl shared` shows it (docs/shared.md). */
typedef struct gpumem_shared_info {
        uint64_t object_id;
        const char *name;
        uint64_t version;   /* 0 while staging */
        const char *tenant; /* the publisher's: charged for it */
        uint64_t size;
        const char *state; /* "staging", "published" or "withdrawn" */
        uint32_t mappers;
        uint64_t created_unix_ms;   /* published: when it was published */
        uint32_t retention_s;       /* 0: until unpublished */
        const char *const *readers; /* "*": every tenant; none: the publisher's tenant only */
        size_t n_readers;
        uint64_t meta_len;
        const gpumem_shared_mapper *sessions; /* only when a name was asked for */
        size_t n_sessions;
} gpumem_shared_info;

/* The shared objects the caller may see (an admin: all; others: those their
 * tenant published or may open), newest first; with `name` only that name's
 * (version 0: every version) and the sessions that map each. One buffer in
 * *ret_list (free it with gpumem_buffer_free()); *ret_truncated when the
 * daemon's reply left the oldest out (one packet). */
GPUMEM_EXPORT int gpumem_admin_shared_list(gpumem_admin *a, const char *name, uint64_t version,
                                           gpumem_shared_info **ret_list, size_t *ret_n, bool *ret_truncated);
/* Unpublishes name@version (0: every version): its publisher's tenant or an
 * admin (gpumem_shared_unpublish()). */
GPUMEM_EXPORT int gpumem_admin_shared_unpublish(gpumem_admin *a, const char *name, uint64_t version);

/* One session's sample ring, as `gpumemctl top` and `diagnose` read it. */
typedef struct gpumem_session_samples {
        uint64_t session_id;
        uint32_t pid;
        const char *tenant;
        const char *unit;
        const char *name;      /* what the client says it is (escaped) */
        const char *heap_mode; /* "local" or "central" */
        uint32_t stride;       /* values per sample, in the order of the daemon's sample record */
        const uint64_t *samples;
        size_t n_samples;         /* values (stride per sample), oldest sample first */
        uint64_t last_refusal_ms; /* the daemon's clock at its last refusal (0: none) */
} gpumem_session_samples;

/* A refusal of memory the daemon recorded. */
typedef struct gpumem_refusal {
        uint64_t t_ms;
        uint64_t session_id; /* 0, with pid 0 and tenant "", for another tenant's (non-admin view) */
        uint32_t pid;
        const char *tenant;
        const char *reason; /* quota, fragmentation, device, reclaim, external */
        uint64_t size;
} gpumem_refusal;

/* The daemon's samples and last refusals at one moment. */
typedef struct gpumem_sample_set {
        uint64_t now_ms;    /* the daemon's monotonic clock */
        uint32_t period_ms; /* the sampling period */
        uint64_t capacity;
        uint64_t device_free;    /* free as refusals see it */
        uint64_t reserved;       /* the device's, or (device_scope false) the caller's tenant's */
        uint64_t allocated;      /* likewise */
        uint64_t refusals_total; /* refusals since the daemon started (device-wide) */
        bool device_scope;
        const gpumem_session_samples *sessions;
        size_t n_sessions;
        const gpumem_refusal *refusals; /* within the window, oldest first */
        size_t n_refusals;
} gpumem_sample_set;

/* The sample rings of the sessions the caller may see (its tenant's; every
 * one for an admin), narrowed to process `pid` unless 0 or to `tenant` unless
 * NULL, with the samples and refusals of the last window_ms (0: all kept).
 * Free *ret with gpumem_sample_set_free(). */
GPUMEM_EXPORT int gpumem_admin_samples(gpumem_admin *a, uint32_t pid, const char *tenant, uint64_t window_ms,
                                       gpumem_sample_set **ret);
/* Accepts NULL. */
GPUMEM_EXPORT void gpumem_sample_set_free(gpumem_sample_set *set);

#ifdef __cplusplus
}
#endif

#endif
