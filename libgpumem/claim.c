/* Claims: a session sets device memory aside for itself in one request (the
 * daemon answers "how much may I take" and sets it aside in the same step),
 * so that engines started together size their caches without taking the same
 * memory twice. */
#include <errno.h>

#include "claim.h"
#include "client-internal.h"
#include "msg.h"

/* One Claim request: sets the claim to `bytes` unless `query`. */
static int claim_call(gpumem_client *c, uint64_t bytes, bool query, uint64_t *ret_claimed, uint64_t *ret_available) {
        Gpumem__Claim req = GPUMEM__CLAIM__INIT;
        req.bytes = bytes;
        req.query = query;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_CLAIM;
        env.claim = &req;
        Gpumem__Envelope *reply;
        int r = gm_client_call(c, &env, GPUMEM__ENVELOPE__BODY_CLAIM_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        *ret_claimed = reply->claim_reply->claimed;
        if (ret_available)
                *ret_available = reply->claim_reply->available;
        gm_msg_free(reply);
        return 0;
}

int gpumem_claim(gpumem_client *c, uint64_t bytes, uint64_t *ret_claimed) {
        if (!c || !ret_claimed)
                return -EINVAL;
        return claim_call(c, bytes, false, ret_claimed, NULL);
}

int gm_claim_query(gpumem_client *c, uint64_t *ret_claimed, uint64_t *ret_available) {
        return claim_call(c, 0, true, ret_claimed, ret_available);
}
