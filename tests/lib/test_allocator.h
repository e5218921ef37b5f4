/* Shared fixture of the allocator suites: one heap on a fake provider, checked
 * after every step, torn down to zero live handles. */
#pragma once

#include <check.h>
#include <errno.h>
#include <string.h>

#include "allocator.h"
#include "fake_provider.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

extern gm_heap_t *H;
extern fake_provider_t F;
extern gm_stats_t SINK; /* extra sink of H */

/* Replaces the current heap (if any, closing it first) by a fresh one. */
void heap_open(const gm_alloc_config_t *config, uint64_t capacity);
/* Checks, destroys and verifies that everything came back. */
void heap_close(void);
void config_default(gm_alloc_config_t *ret_config);

/* Allocation / free that must succeed, followed by gm_heap_check(). */
gm_alloc_result_t alloc_ok(uint64_t size, uint64_t stream);
void free_ok(uint64_t block_id, bool deferred);
int64_t cur(const gm_stat_t *stat_array, int type);

#define STATS (gm_heap_stats(H))
#define RESERVED(type) cur(STATS->reserved_bytes, type)
#define CHECK_HEAP() ck_assert_int_eq(gm_heap_check(H), 0)

Suite *allocator_random_suite(void);
Suite *allocator_reuse_suite(void);
Suite *allocator_tags_suite(void);
