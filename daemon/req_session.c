/* A session's own start: Hello (the heap mode: local.h) and re-attach after
 * a restart (a local session's pieces: local.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "local.h"
#include "hotmsg.h"
#include "log.h"
#include "msg.h"
#include "req_session.h"

/* Mapped pieces one re-attached segment may report. */
#define MAX_REATTACH_PIECES (1u << 16)

/* ---- hello ---- */

int gm_req_session_hello(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Hello *hello = env->hello;
        gm_session_t *s = c->session;
        if (c->hello_done) {
                gm_request_error(c, request_id, EPROTO, "hello sent twice");
                return -EPROTO;
        }
        if (hello->protocol_version != GM_PROTOCOL_VERSION) {
                gm_request_error(c, request_id, EPROTONOSUPPORT, "protocol version %u not supported (daemon speaks %u)",
                                 hello->protocol_version, GM_PROTOCOL_VERSION);
                return -EPROTONOSUPPORT;
        }
        gm_session_describe(s, hello->client_name, hello->admin);
        int r = gm_session_start(s, c->tenant_name, hello->resume_token);
        if (r < 0) {
                gm_request_error(c, request_id, r, "cannot %s session: %s",
                                 hello->resume_token && hello->resume_token[0] ? "re-attach" : "start",
                                 r == -EBUSY    ? "it is attached to another connection"
                                 : r == -EPERM  ? "it belongs to another user"
                                 : r == -EINVAL ? "invalid token"
                                 : r == -ENOENT ? "the ledger knows no such session"
                                                : strerror(-r));
                return r;
        }
        Gpumem__HelloReply reply = GPUMEM__HELLO_REPLY__INIT;
        int page_fd = -1;
        r = gm_local_hello(c, request_id, hello, &reply, &page_fd);
        if (r < 0)
                return r;
        c->hello_done = true;
        gm_session_view_t sv;
        gm_session_view(s, &sv);

        reply.protocol_version = GM_PROTOCOL_VERSION;
        reply.session_id = sv.id;
        reply.backend = (char *) c->rq->broker->backend->ops->name;
        const gm_kind_caps_t *kc = c->rq->broker->backend->ops->caps;
        Gpumem__KindCaps caps = GPUMEM__KIND_CAPS__INIT;
        caps.device_streams = kc->device_streams;
        caps.cpu_accessible = kc->cpu_accessible;
        reply.caps = &caps;
        reply.device = c->rq->broker->backend->device;
        reply.capacity = c->rq->broker->backend->capacity;
        reply.max_packet = c->rq->config->max_packet;
        reply.max_fds = c->rq->config->max_fds;
        reply.tenant = sv.tenant->name;
        reply.granularity = c->rq->broker->backend->granularity;
        reply.session_token = (char *) sv.token;
        reply.device_uuid = c->rq->broker->backend->device_uuid;
        reply.admin = sv.admin;
        reply.client_fences = gm_session_central_client_fences(s);
        reply.carried_frees = !c->local;
        reply.fixed_codec = c->local ? 0 : GM_HOTMSG_VERSION;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_HELLO_REPLY;
        out.hello_reply = &reply;
        log_info("session %llu: pid %d uid %u tenant '%s' client '%s'%s", (unsigned long long) sv.id, (int) sv.pid,
                 (unsigned) sv.uid, sv.tenant->name, sv.name, c->local ? ", local heap" : "");
        if (c->local && c->rq->broker->history) /* its heap records its own trace */
                reply.history_max_entries = c->rq->broker->history_max_entries;
        gm_request_send(c, request_id, &out, page_fd >= 0 ? &page_fd : NULL, page_fd >= 0 ? 1 : 0);
        if (page_fd >= 0)
                close(page_fd);
        return 0;
}

/* ---- re-attach ---- */

int gm_req_session_check_reattach(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const Gpumem__Reattach *req = env->reattach;
        if (!sv.reattaching)
                return snprintf(why, why_len, "Reattach without a resuming Hello"), -EPROTO;
        int r = gm_reattach_count(c->session, req->n_segments + req->n_blocks + req->n_shared);
        if (r < 0)
                return snprintf(why, why_len, "re-attach reports too much"), r;
        for (size_t i = 0; i < req->n_segments; i++)
                if (req->segments[i]->n_mapped == 0 || req->segments[i]->n_mapped > MAX_REATTACH_PIECES)
                        return snprintf(why, why_len, "re-attach refused: %s", strerror(EINVAL)), -EINVAL;
        if (req->sleeping_bytes && (!c->local || req->sleeping_bytes > c->rq->broker->backend->capacity))
                return snprintf(why, why_len, "re-attach refused: %s",
                                c->local ? "asleep needing more than the capacity" : "a central session never sleeps"),
                       -EINVAL;
        return 0;
}

static int reattach_segment(gm_session_t *s, const Gpumem__ReattachSegment *seg, const char **ret_why) {
        gm_reattach_range_t *ranges = calloc(seg->n_mapped, sizeof(*ranges));
        if (!ranges)
                return -ENOMEM;
        for (size_t i = 0; i < seg->n_mapped; i++)
                ranges[i] = (gm_reattach_range_t){.offset = seg->mapped[i]->offset, .length = seg->mapped[i]->length};
        int r = gm_reattach_segment(s, seg->segment_id, seg->va_size, seg->stream, ranges, seg->n_mapped, ret_why);
        free(ranges);
        return r;
}

/* The shared objects the client still maps: each the registry knows (an
 * adopted one) counts it as a mapper again; one it does not is left
 * uncounted (its memory did not come back, or the report is wrong). */
static int reattach_shared(gm_session_t *s, const Gpumem__Reattach *req) {
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        for (size_t i = 0; i < req->n_shared; i++) {
                const Gpumem__ReattachShared *o = req->shared[i];
                int r = gm_reattach_shared(s, o->object_id, o->name, o->version, o->size);
                if (r == -ENOENT || r == -EACCES || r == -EINVAL)
                        gm_log(LOG_NOTICE,
                               "session %" PRIu64 " re-attaches shared object '%s' version %" PRIu64
                               ": %s, not counted",
                               sv.id, o->name, o->version,
                               r == -EACCES ? "its tenant is not admitted" : "no such adopted object");
                else if (r < 0)
                        return r;
        }
        return 0;
}

int gm_req_session_reattach(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Reattach *req = env->reattach;
        gm_session_t *s = c->session;
        int shared = reattach_shared(s, req);
        if (shared < 0) {
                gm_request_error(c, request_id, shared, "re-attach refused: shared objects: %s", strerror(-shared));
                return shared;
        }
        if (c->local)
                return gm_local_reattach(c, request_id, req);
        int r = 0;
        for (size_t i = 0; i < req->n_segments && r == 0; i++) {
                const char *why = NULL;
                r = reattach_segment(s, req->segments[i], &why);
                if (r < 0 && why) {
                        gm_request_error(c, request_id, -r, "re-attach refused: segment %" PRIu64 ": %s",
                                         req->segments[i]->segment_id, why);
                        return r;
                }
                if (r == -ENOENT) {
                        gm_request_error(c, request_id, ENOENT,
                                         "re-attach refused: the ledger has no record of segment %" PRIu64
                                         " (offset and size as reported) for this session",
                                         req->segments[i]->segment_id);
                        return r;
                }
        }
        for (size_t i = 0; i < req->n_blocks && r == 0; i++) {
                const Gpumem__ReattachBlock *b = req->blocks[i];
                r = gm_reattach_block(s, b->block_id, b->segment_id, b->offset, b->size, b->requested_size,
                                      b->pending_free);
        }
        uint64_t claimed = 0;
        if (r == 0 && req->last)
                r = gm_reattach_finish(s, &(gm_reattach_state_t){.claim_bytes = req->claim_bytes}, &claimed);
        if (r < 0) {
                /* A report that contradicts itself ends the session; its memory
                 * is released (the client starts over). */
                gm_request_error(c, request_id, r, "re-attach refused: %s", strerror(-r));
                return r;
        }
        return req->last ? gm_request_reattached(c, request_id, req->claim_bytes != 0, claimed) : 0;
}
