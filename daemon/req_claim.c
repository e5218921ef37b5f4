/* Claims: a Claim sets aside up to its bytes for the caller's own session
 * (or, with `query`, reports the claim that stands) and answers with what
 * is set aside. One number per session: a new claim replaces the old one. */
#include <errno.h>
#include <stdio.h>

#include "req_claim.h"

int gm_req_claim_check(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        uint64_t capacity = c->rq->broker->backend->capacity;
        if (!env->claim->query && env->claim->bytes > capacity)
                return snprintf(why, why_len, "a claim of %llu bytes is more than the capacity of %llu",
                                (unsigned long long) env->claim->bytes, (unsigned long long) capacity),
                       -EINVAL;
        return 0;
}

int gm_req_claim_handle(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Claim *req = env->claim;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        uint64_t claimed = sv.claim_bytes;
        if (!req->query) {
                int r = gm_broker_claim(c->session, req->bytes, &claimed);
                if (r < 0)
                        return gm_request_error(c, request_id, -r, "cannot claim: %s",
                                                r == -ESHUTDOWN ? "the session has ended" : "invalid size"),
                               0;
        }
        return gm_request_claim_reply(c, request_id, claimed);
}
