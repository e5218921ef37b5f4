/* libgpumem's bottom floor: the connection to gpumemd and its service thread.
 *
 * Threads: application threads send requests (each sendmsg is one atomic
 * packet) and wait for the reply with their request id. Whoever holds
 * read_lock reads the socket and dispatches every packet in order: a
 * calling thread reads until its own reply is in, then hands over to the
 * next waiting caller; the service thread reads only when no call was in
 * flight for a short grace period (so it is not woken by every reply).
 *
 * The daemon's pushes (ReleaseRequest, Reclaim, SnapshotQuery, HistoryPush,
 * AllocConfUpdate...) and the replies that bring memory are dispatched
 * through the handlers table the floors above fill (gm_conn_handlers_t):
 * the one deliberate way this floor reaches theirs. Not installed. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#include "client_state.h"

/* What one body case of a packet from the daemon does. */
typedef struct gm_conn_push {
        Gpumem__Envelope__BodyCase body_case;
        /* Optional: runs first, with no lock held (e.g. waiting for streams). */
        void (*before)(gpumem_client *c, const Gpumem__Envelope *env);
        /* Runs holding lock and consumes fds. Returns true when it consumed
         * env too; false hands env to w (its waiter, or NULL) as the reply. */
        bool (*handle)(gpumem_client *c, Gpumem__Envelope *env, waiter_t *w, int *fds, size_t n_fds);
} gm_conn_push_t;

/* The callback table of the floors above; every function is set. */
typedef struct gm_conn_handlers {
        const gm_conn_push_t *pushes; /* body cases with no entry: replies, their first fd to the waiter */
        size_t n_pushes;
        /* Holding lock, after every packet and on every idle turn of the
         * service thread: true while work waits on a poll (stream events). */
        bool (*poll)(gpumem_client *c);
        /* The service thread's chores on each turn, holding no lock: true
         * while one waits (a busy heap). */
        bool (*serve)(gpumem_client *c);
        /* The daemon went away: true once the session is back. */
        bool (*reconnect)(gpumem_client *c);
        /* Holding lock, before a request, a post or an answer is sent: what
         * the heaps held back goes first (central sessions' carried frees).
         * NULL: nothing is held back. */
        void (*before_send)(gpumem_client *c, const Gpumem__Envelope *env);
} gm_conn_handlers_t;

/* The service thread keeps off the socket while calls are in flight and for
 * this long after the last; it wakes when it ends (its poll handler runs). */
#define GM_CONN_CALLER_GRACE_MS 10

/* Milliseconds since the last call ended (CLOCK_MONOTONIC_COARSE): 0 while
 * one is in flight, UINT64_MAX when none was ever made. */
uint64_t gm_conn_idle_ms(const gpumem_client *c);

/* How one request is sent, and what follows when memory its reply brought
 * could not be mapped here (the reply is freed after). NULL members: the
 * plain send, nothing. */
typedef struct gm_conn_request_ops {
        int (*send)(gpumem_client *c, Gpumem__Envelope *env);
        void (*unmapped)(gpumem_client *c, const Gpumem__Envelope *reply);
} gm_conn_request_ops_t;

/* Records the calling thread's detailed message for c and returns err. */
int gm_conn_set_error(const gpumem_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The calling thread's last message if it concerns c, else "". */
const char *gm_conn_last_error(const gpumem_client *c);
/* Whether the calling thread's last message concerns c. */
bool gm_conn_error_is_for(const gpumem_client *c);
/* The calling thread's last message concerns no client (c is going away). */
void gm_conn_error_forget(void);

/* A send failing this way means the daemon went away: the service thread
 * decides whether the session re-attaches (and requests are sent again) or
 * is lost. */
static inline bool gm_conn_lost(int r) {
        return r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN;
}

/* Sends on the current connection (which the service thread may replace). */
int gm_conn_send(gpumem_client *c, const Gpumem__Envelope *env);
/* Receives one envelope on a blocking socket the service thread does not
 * read yet. The packet's first fd goes to *ret_fd (-1 if none) when ret_fd is
 * not NULL; every other fd is closed. */
int gm_conn_recv(gpumem_client *c, int fd, Gpumem__Envelope **ret_env, int *ret_fd);
/* Wakes the service thread. */
void gm_conn_wake(gpumem_client *c);
/* Makes the receive buffer fit the daemon's packets. Caller holds read_lock
 * or is the only thread. */
int gm_conn_fit_rx(gpumem_client *c);
/* Starts the service thread on c->fd. */
int gm_conn_start_service(gpumem_client *c);

/* Sends `env` and waits for its reply. On success *ret_reply is the reply
 * (an Error body is turned into its negative code and message) and, when
 * ret_fd is not NULL, *ret_fd the first fd it carried or -1 (the caller's to
 * close); fds nobody asked for are closed. ops may be NULL. */
int gm_conn_call_fd(gpumem_client *c, Gpumem__Envelope *env, const gm_conn_request_ops_t *ops,
                    Gpumem__Envelope **ret_reply, int *ret_fd);
/* gm_conn_call_fd() without fds, whose reply must have body `want`. */
int gm_conn_call_expect(gpumem_client *c, Gpumem__Envelope *env, const gm_conn_request_ops_t *ops,
                        Gpumem__Envelope__BodyCase want, Gpumem__Envelope **ret_reply);
/* Fire-and-forget request (a free): the daemon answers only when it
 * refuses. gm_conn_post_locked: caller holds lock. */
int gm_conn_post(gpumem_client *c, Gpumem__Envelope *env);
int gm_conn_post_locked(gpumem_client *c, Gpumem__Envelope *env);
/* Sends a daemon-initiated exchange's packet (an answer), in order. */
int gm_conn_answer(gpumem_client *c, Gpumem__Envelope *env);
