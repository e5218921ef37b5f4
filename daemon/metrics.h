/* The Prometheus endpoint: GET /metrics in the text format 0.0.4, served by
 * libmicrohttpd from the daemon's libuv loop (no thread of its own), plus the
 * counters and latency histograms the request handlers feed.
 *
 * Every function accepts m == NULL (metrics disabled) and then does nothing,
 * so call sites need no checks. Loop thread only, like the rest of the daemon. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "oom.h"

typedef struct gm_metrics gm_metrics_t;

typedef enum gm_request_op {
        GM_REQUEST_HELLO,
        GM_REQUEST_ALLOC,
        GM_REQUEST_FREE,
        GM_REQUEST_FREE_COMPLETED,
        GM_REQUEST_TRIM,
        GM_REQUEST_STATS,
        GM_REQUEST_RELEASE_ACK,
        GM_REQUEST_RESET_STATS,
        GM_REQUEST_HISTORY,
        GM_REQUEST_SNAPSHOT,
        GM_REQUEST_ALLOC_CONF,
        _GM_REQUEST_OP_MAX, /* also: not a request */
} gm_request_op_t;

typedef enum gm_reclaim_outcome {
        GM_RECLAIM_REQUESTED,    /* a ReleaseRequest was sent (first attempt) */
        GM_RECLAIM_ACKNOWLEDGED, /* the client acknowledged it */
        GM_RECLAIM_TIMED_OUT,    /* it was not acknowledged within release_timeout_ms */
        _GM_RECLAIM_OUTCOME_MAX,
} gm_reclaim_outcome_t;

/* Starts serving on `listen`: "HOST:PORT" (IPv4 dotted quad, or "[IPv6]:PORT"),
 * "unix:PATH" (a stale socket file is replaced and removed again at stop), NULL
 * for the default "127.0.0.1:<9470 + device>", or "none" / "" to disable: then
 * *ret = NULL and 0 is returned. Port 0 picks a free port (logged). On failure
 * returns a negative errno with the reason in reterr; *ret is untouched. */
int gm_metrics_start(gm_daemon_t *d, const char *listen, gm_metrics_t **ret, char *reterr, size_t reterr_len);
/* The same on an already listening stream socket (socket activation); it is
 * owned by the endpoint from then on, also on failure. */
int gm_metrics_start_fd(gm_daemon_t *d, int fd, gm_metrics_t **ret, char *reterr, size_t reterr_len);
/* Closes every HTTP connection and the listening socket at once; the memory goes
 * when the loop runs the handles' close callbacks. Returns NULL. */
gm_metrics_t *gm_metrics_stop(gm_metrics_t *m);

/* Monotonic clock in nanoseconds, for timing requests. */
uint64_t gm_metrics_now_ns(void);
/* The operation of a request envelope's body; _GM_REQUEST_OP_MAX for what is
 * not a request (those are not observed). */
gm_request_op_t gm_metrics_request_op(Gpumem__Envelope__BodyCase body);
/* Records that serving one request of kind `op` took `ns` nanoseconds. */
void gm_metrics_observe_request(gm_metrics_t *m, gm_request_op_t op, uint64_t ns);
/* Counts one refused allocation of `tenant`. */
void gm_metrics_count_refusal(gm_metrics_t *m, const char *tenant, gm_oom_reason_t reason);
/* Counts one reclaim event. */
void gm_metrics_count_reclaim(gm_metrics_t *m, gm_reclaim_outcome_t outcome);

/* Builds the whole exposition text from d's current state and m's counters
 * (m == NULL: the state only, no counters or histograms). *ret_buf is
 * malloc'd, NUL-terminated, *ret_len excludes the NUL. -ENOMEM on failure. */
int gm_metrics_render(gm_daemon_t *d, const gm_metrics_t *m, char **ret_buf, size_t *ret_len);
