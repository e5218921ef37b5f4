/* Clocks: monotonic for intervals and timeouts, real time for what users see. */
#pragma once

#include <stdint.h>

/* CLOCK_MONOTONIC in milliseconds and nanoseconds. */
uint64_t gm_now_ms(void);
uint64_t gm_now_ns(void);
/* CLOCK_REALTIME in microseconds since the epoch. */
uint64_t gm_realtime_us(void);
