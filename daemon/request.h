/* The bottom floor of the request side: what the server gives the handlers
 * (the broker, the settings, the one sender), one connection as the handlers
 * see it, and the reply helpers every handler shares (a reply, an Error, a
 * broker refusal, Ok). Nothing here touches a socket. */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker.h"
#include "gpumem.pb-c.h"

typedef struct gm_request_conn gm_request_conn_t;
typedef struct gm_localstats gm_localstats_t; /* localstats.h: a session whose heap runs in its client */
typedef struct gm_localstats_tenant gm_localstats_tenant_t;
typedef struct gm_localstats_totals gm_localstats_totals_t;
typedef struct gm_snapjobs gm_snapjobs_t; /* req_snapshot.h: snapshots under way */
struct gm_config;

/* The daemon settings the handlers read (kept current by the daemon). */
typedef struct gm_request_config {
        uint32_t max_packet;          /* told to clients in HelloReply */
        uint32_t max_fds;             /* fds in one packet: mappings beyond go in MapSegments packets */
        const char *state_dir;        /* persistent quotas; NULL = none kept */
        const struct gm_config *file; /* the configuration file's contents (tenant rules) */
} gm_request_config_t;

/* What the server gives the handlers. */
typedef struct gm_requests {
        gm_broker_t *broker;
        const gm_request_config_t *config;
        gm_localstats_totals_t *local; /* the local sessions' part of the statistics */
        /* The one way out: sends env (request_id set here) with fds. A negative
         * errno means the connection is closed: nothing more is sent, but its
         * state (session, local heap) stays valid until the loop frees it,
         * never while a handler or callback that sent is on the stack. */
        int (*send)(void *userdata, gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds,
                    size_t n_fds);
        /* Times one request of the kind with table index `op`. */
        void (*observe)(void *userdata, unsigned op, uint64_t ns);
        gm_snapjobs_t *snapjobs; /* NULL: snapshots are refused */
        /* Optional: runs work(arg) off the loop, then done(arg) on it; 0, or
         * a negative errno (nothing queued: the caller runs both itself). */
        int (*queue_work)(void *userdata, void (*work)(void *arg), void (*done)(void *arg), void *arg);
        void *userdata;
} gm_requests_t;

/* One connection as the handlers see it; the server embeds it in its own. */
struct gm_request_conn {
        const gm_requests_t *rq;
        gm_session_t *session;
        char tenant_name[64]; /* resolved from the kernel-verified identity at connect */
        char command[64];     /* the peer's command name at connect, escaped ("" unknown) */
        bool hello_done;
        bool closed;            /* the server closed it: nothing more is sent (its state stays valid) */
        uint64_t requests;      /* packets received */
        gm_localstats_t *local; /* a local session (its heap runs in the client: localstats.h); NULL: central */
};

/* Sends a reply; a failure closes the connection (its state stays valid). */
int gm_request_send(gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds);
/* Sends an Error: `err` in either sign, the message prefixed "gpumemd: ". */
int gm_request_error(gm_request_conn_t *c, uint64_t request_id, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
/* An Error envelope in env (pointing at error and text; `err` in either sign),
 * and the daemon's message prefix before a formatted text (len > the prefix):
 * for refusals the server sends before a connection has a session. */
void gm_request_error_envelope(Gpumem__Envelope *env, Gpumem__Error *error, int err, const char *text);
void gm_request_format_message(char *message, size_t len, const char *fmt, va_list ap);
/* Sends a broker refusal as it is (its message is whole). */
int gm_request_refusal(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out);
/* The Mapping that hands piece p to its client (m initialised here). */
void gm_request_piece_mapping(Gpumem__Mapping *m, const gm_piece_t *p);
/* Replies Ok; 0 (a failed send closes the connection). */
int gm_request_ok(gm_request_conn_t *c, uint64_t request_id);
/* A ClaimReply: the session's claim `claimed` and what it could be given now. */
int gm_request_claim_reply(gm_request_conn_t *c, uint64_t request_id, uint64_t claimed);
/* Answers a re-attach's last report: Ok, or (it re-sent a claim: `claim`
 * set) a ClaimReply with what the new daemon set aside again. */
int gm_request_reattached(gm_request_conn_t *c, uint64_t request_id, bool claim, uint64_t claimed);
