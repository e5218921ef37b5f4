/* Assertions. gm_assert() is always on, in every build type: a broken
 * invariant aborts with its place instead of corrupting memory accounting.
 * GM_DEBUG is 1 in GPUMEMD_DEBUG builds, where the expensive tier runs too:
 * the integrity checkers (gm_heap_check, gm_broker_check) after every
 * operation. */
#pragma once

#ifdef GPUMEMD_DEBUG
#define GM_DEBUG 1
#else
#define GM_DEBUG 0
#endif

_Noreturn void gm_assert_fail(const char *expr, const char *file, int line, const char *func);

#define gm_assert(expr) ((expr) ? (void) 0 : gm_assert_fail(#expr, __FILE__, __LINE__, __func__))
