/* Claims: device memory set aside for one session (gm_broker_claim()). A
 * session's unconsumed claim counts against its tenant's quota and the device
 * for every other session, and is consumed as the session's own pieces are
 * created. The books: a tenant's claimed_bytes = its sessions' claims, the
 * broker's = its tenants'. Calls nothing above the books. */
#include "books.h"

/* s's claim becomes `bytes`, its tenant's and the broker's books with it. */
static void set_books(gm_session_t *s, uint64_t bytes) {
        gm_broker_t *b = s->broker;
        gm_tenant_t *t = s->tenant;
        gm_assert(t && t->claimed_bytes >= s->claim_bytes && b->claimed_bytes >= s->claim_bytes);
        t->claimed_bytes = t->claimed_bytes - s->claim_bytes + bytes;
        b->claimed_bytes = b->claimed_bytes - s->claim_bytes + bytes;
        s->claim_bytes = bytes;
}

void gm_claim_set(gm_session_t *s, uint64_t bytes) {
        if (bytes < s->claim_bytes)
                s->broker->memory_freed = true; /* what it let go of may serve a parked request */
        set_books(s, bytes);
}

void gm_claim_consume(gm_session_t *s, uint64_t bytes) {
        if (s->claim_bytes) /* consumed memory is held, not let go of */
                set_books(s, bytes < s->claim_bytes ? s->claim_bytes - bytes : 0);
}

uint64_t gm_claim_others_of_tenant(const gm_session_t *s) {
        return s->tenant->claimed_bytes - s->claim_bytes;
}

uint64_t gm_claim_others_of_device(const gm_session_t *s) {
        return s->broker->claimed_bytes - s->claim_bytes;
}
