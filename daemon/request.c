/* The bottom floor of the request side: sending a reply, an Error or a
 * broker refusal on one connection, and the pieces of a reply the handlers
 * share. Every send goes through the one sender the server provides. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"
#include "request.h"

/* Every error message the daemon writes starts so; the broker's are whole already. */
#define MESSAGE_PREFIX "gpumemd: "

int gm_request_send(gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds, size_t n_fds) {
        if (c->closed)
                return -ECONNRESET;
        return c->rq->send(c->rq->userdata, c, request_id, env, fds, n_fds);
}

void gm_request_error_envelope(Gpumem__Envelope *env, Gpumem__Error *error, int err, const char *text) {
        gpumem__error__init(error);
        error->code = err < 0 ? -err : err;
        error->message = (char *) text;
        gpumem__envelope__init(env);
        env->body_case = GPUMEM__ENVELOPE__BODY_ERROR;
        env->error = error;
}

void gm_request_format_message(char *message, size_t len, const char *fmt, va_list ap) {
        size_t prefix = strlen(MESSAGE_PREFIX);
        memcpy(message, MESSAGE_PREFIX, prefix + 1);
        vsnprintf(message + prefix, len - prefix, fmt, ap);
}

static int send_error_text(gm_request_conn_t *c, uint64_t request_id, int err, const char *text) {
        Gpumem__Error error;
        Gpumem__Envelope env;
        gm_request_error_envelope(&env, &error, err, text);
        return gm_request_send(c, request_id, &env, NULL, 0);
}

int gm_request_error(gm_request_conn_t *c, uint64_t request_id, int err, const char *fmt, ...) {
        char message[2048];
        va_list ap;
        va_start(ap, fmt);
        gm_request_format_message(message, sizeof(message), fmt, ap);
        va_end(ap);
        return send_error_text(c, request_id, err, message);
}

void gm_request_piece_mapping(Gpumem__Mapping *m, const gm_piece_t *p) {
        gpumem__mapping__init(m);
        m->segment_id = p->segment_id;
        m->segment_va_size = p->segment_va_size;
        m->offset = p->offset;
        m->length = p->phys.size;
}

int gm_request_refusal(gm_request_conn_t *c, uint64_t request_id, const gm_outcome_t *out) {
        gm_diag_note_refusal(c, out);
        return send_error_text(c, request_id, out->error, out->message);
}

int gm_request_ok(gm_request_conn_t *c, uint64_t request_id) {
        Gpumem__Ok ok = GPUMEM__OK__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_OK;
        env.ok = &ok;
        gm_request_send(c, request_id, &env, NULL, 0);
        return 0;
}

int gm_request_claim_reply(gm_request_conn_t *c, uint64_t request_id, uint64_t claimed) {
        Gpumem__ClaimReply reply = GPUMEM__CLAIM_REPLY__INIT;
        reply.claimed = claimed;
        reply.available = gm_broker_room(c->session);
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_CLAIM_REPLY;
        env.claim_reply = &reply;
        gm_request_send(c, request_id, &env, NULL, 0);
        return 0;
}

int gm_request_reattached(gm_request_conn_t *c, uint64_t request_id, bool claim, uint64_t claimed) {
        return claim ? gm_request_claim_reply(c, request_id, claimed) : gm_request_ok(c, request_id);
}
