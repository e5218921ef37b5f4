/* Assertions, in three tiers by cost:
 *  - gm_assert(expr): always on, in every build type. A broken invariant
 *    aborts with its place instead of corrupting memory accounting.
 *  - gm_dassert(expr): cheap checks (a few compares on data at hand, O(1))
 *    on the invariants of hot paths: block sizes, neighbours, set membership,
 *    counts. On in every build but CMake's Release (the top CMakeLists.txt
 *    defines GM_DASSERT_OFF there), and always in GPUMEMD_DEBUG builds. When
 *    off, `expr` is not evaluated, so it must have no side effects.
 *  - GM_DEBUG (1 in GPUMEMD_DEBUG builds): the expensive tier, O(n) walks
 *    such as the integrity checkers (gm_heap_check, gm_broker_check) after
 *    every operation. Never put an O(n) check in gm_dassert. */
#pragma once

#ifdef GPUMEMD_DEBUG
#define GM_DEBUG 1
#else
#define GM_DEBUG 0
#endif

#if GM_DEBUG || !defined(GM_DASSERT_OFF)
#define GM_DASSERT 1
#else
#define GM_DASSERT 0
#endif

_Noreturn void gm_assert_fail(const char *expr, const char *file, int line, const char *func);

#define gm_assert(expr) ((expr) ? (void) 0 : gm_assert_fail(#expr, __FILE__, __LINE__, __func__))

#if GM_DASSERT
#define gm_dassert(expr) gm_assert(expr)
#else
#define gm_dassert(expr) ((void) sizeof(!(expr))) /* type-checked, never evaluated */
#endif
