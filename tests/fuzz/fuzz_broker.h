/* For the harnesses that drive a real broker: its checker, as a property. */
#pragma once

#include "broker.h"
#include "fuzz.h"

static inline void fuzz_check_broker(const gm_broker_t *b) {
        char why[512];
        int n = gm_broker_check(b, why, sizeof(why));
        if (n) {
                fprintf(stderr, "broker invariants broken: %s\n", why);
                abort();
        }
}
