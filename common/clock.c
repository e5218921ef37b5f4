#include "clock.h"

#include <time.h>

static uint64_t read_ns(clockid_t id) {
        struct timespec ts;
        clock_gettime(id, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

uint64_t gm_now_ms(void) {
        return read_ns(CLOCK_MONOTONIC) / 1000000u;
}

uint64_t gm_now_ns(void) {
        return read_ns(CLOCK_MONOTONIC);
}

uint64_t gm_realtime_us(void) {
        return read_ns(CLOCK_REALTIME) / 1000u;
}
