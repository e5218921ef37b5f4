/* Seeded random workloads (about 100k operations per policy mode, 100k more
 * with page reuse): allocations of every size class on three streams,
 * immediate and deferred frees, completions and empty_cache, on a capacity
 * small enough to drive the retry ladder; with page reuse the streams also
 * turn busy and idle and pass their fences at random. After every step the heap passes
 * gm_heap_check() and, per pool, reserved bytes = allocated + pending +
 * inactive bytes as seen by a walk = the provider's live bytes. */
#include "test_allocator.h"

#define LIVE_MAX 256
#define OPS_PER_MODE 34000

typedef struct live {
        uint64_t id, size;
        bool pending;
} live_t;

static live_t live[LIVE_MAX];
static unsigned n_live;
static bool toggle_busy;     /* page reuse: streams' device work comes and goes, the mode
                          * is switched off and on at run time now and then, and page
                          * creations fail now and then */
static uint64_t limit_bytes; /* gm_heap_set_limit(), 0 = none */
static uint64_t rng;

static uint64_t rnd(void) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        return rng * 0x2545f4914f6cdd1dULL;
}

typedef struct tally {
        int64_t allocated[3], pending[3], inactive[3]; /* by gm_stat_type_t */
} tally_t;

static void tally_block(const gm_segment_info_t *seg, const gm_block_info_t *b, void *userdata) {
        tally_t *t = userdata;
        int type = seg->small_pool ? GM_STAT_SMALL_POOL : GM_STAT_LARGE_POOL;
        int64_t *col = b->state == GM_BLOCK_ACTIVE_ALLOCATED      ? t->allocated
                       : b->state == GM_BLOCK_ACTIVE_PENDING_FREE ? t->pending
                                                                  : t->inactive;

        col[type] += (int64_t) b->size;
        col[GM_STAT_ALL] += (int64_t) b->size;
}

static void invariants(void) {
        tally_t t = {0};
        gm_heap_visitor_t v = {.block_fn = tally_block, .userdata = &t};

        CHECK_HEAP();
        gm_heap_walk(H, &v);
        for (int type = 0; type < _GM_STAT_TYPE_MAX; type++) {
                ck_assert_int_eq(RESERVED(type), t.allocated[type] + t.pending[type] + t.inactive[type]);
                ck_assert_int_eq(cur(STATS->allocated_bytes, type), t.allocated[type]);
                ck_assert_int_eq(cur(STATS->active_bytes, type), t.allocated[type] + t.pending[type]);
                ck_assert_int_eq(SINK.reserved_bytes[type].current, RESERVED(type));
        }
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), F.live_bytes);
        if (limit_bytes)
                ck_assert_int_le(SINK.reserved_bytes[GM_STAT_ALL].current, limit_bytes);
        ck_assert_uint_eq(gm_heap_live_blocks(H), n_live);
}

static uint64_t random_size(void) {
        uint64_t k = rnd() % 100;

        if (k < 55)
                return 1 + rnd() % MiB;
        if (k < 90)
                return MiB + rnd() % (24 * MiB);
        return 24 * MiB + rnd() % (100 * MiB);
}

static void drop_live(unsigned k) {
        live[k] = live[--n_live];
}

static void step(void) {
        uint64_t op = rnd() % 100;
        unsigned k = n_live ? (unsigned) (rnd() % n_live) : 0;
        gm_alloc_result_t res;
        int r;

        if (toggle_busy && rnd() % 8 == 0)
                F.busy[rnd() % 3] ^= true;
        if (toggle_busy && rnd() % 8 == 0)
                fake_progress(&F, rnd() % 3);
        if (toggle_busy && rnd() % 32 == 0)
                F.fail_next = 1; /* the next page creation fails (after any moves): the retry ladder */
        if (toggle_busy && rnd() % 4096 == 0) {
                gm_alloc_config_t c;

                gm_alloc_config_default(&c);
                c.expandable_segments = true;
                c.page_reuse = rnd() % 2; /* off: new large segments get 20 MiB pages again */
                gm_heap_set_config(H, &c);
        }
        if (op < 50 || !n_live) {
                uint64_t size = random_size();

                if (n_live == LIVE_MAX)
                        return;
                r = gm_heap_alloc(H, size, rnd() % 3, &res);
                if (r == -ENOMEM || r == -EDQUOT) /* device full, or the limit of gm_heap_set_limit() */
                        return;
                ck_assert_int_eq(r, 0);
                ck_assert_uint_ge(res.size, size);
                ck_assert_uint_eq(res.size % 512, 0);
                live[n_live++] = (live_t){res.block_id, res.size, false};
        } else if (op < 90) {
                bool deferred = op >= 80;

                if (live[k].pending) {
                        ck_assert_int_eq(gm_heap_free(H, live[k].id, false), -ENOENT);
                        ck_assert_int_eq(gm_heap_free_completed(H, live[k].id), 0);
                        drop_live(k);
                } else {
                        ck_assert_int_eq(gm_heap_free(H, live[k].id, deferred), 0);
                        if (deferred)
                                live[k].pending = true;
                        else
                                drop_live(k);
                }
        } else if (op < 98) {
                if (!live[k].pending) {
                        ck_assert_int_eq(gm_heap_free_completed(H, live[k].id), -ENOENT);
                        return;
                }
                ck_assert_int_eq(gm_heap_free_completed(H, live[k].id), 0);
                drop_live(k);
        } else
                gm_heap_release_cached(H);
}

static void workload(const gm_alloc_config_t *config, uint64_t limit, uint64_t seed, unsigned ops) {
        heap_open(config, 512 * MiB);
        if (limit)
                gm_heap_set_limit(H, limit, &SINK);
        limit_bytes = limit;
        n_live = 0;
        rng = seed;
        for (unsigned i = 0; i < ops; i++) {
                step();
                invariants();
        }
        ck_assert_int_gt(STATS->num_ooms, 0); /* the ladder was exercised */
        ck_assert_int_gt(STATS->num_device_free, 0);
}

START_TEST(test_random_native) {
        gm_alloc_config_t c;

        gm_alloc_config_default(&c);
        workload(&c, 0, 0x9e3779b97f4a7c15ULL, OPS_PER_MODE);
}
END_TEST

START_TEST(test_random_native_tuned) {
        gm_alloc_config_t c;

        gm_alloc_config_default(&c);
        c.max_split_size = 40 * MiB;
        c.garbage_collection_threshold = 0.6;
        for (int i = 0; i < GM_ROUNDUP_SLOTS; i++)
                c.roundup_power2_divisions[i] = 4;
        workload(&c, 384 * MiB, 0x1234567887654321ULL, OPS_PER_MODE);
        ck_assert_int_gt(STATS->oversize_segments.allocated, 0);
}
END_TEST

START_TEST(test_random_expandable) {
        gm_alloc_config_t c;

        gm_alloc_config_default(&c);
        c.expandable_segments = true;
        workload(&c, 0, 0xdeadbeefcafef00dULL, OPS_PER_MODE);
        ck_assert_int_eq(STATS->segment[GM_STAT_ALL].allocated, 0);
}
END_TEST

/* 100k operations with the checker after each, quota on (the limits see
 * only created memory), streams busy at random, the mode switched at run
 * time now and then (segments of both page sizes side by side). */
START_TEST(test_random_page_reuse) {
        gm_alloc_config_t c;
        gm_page_reuse_info_t info;

        gm_alloc_config_default(&c);
        c.expandable_segments = c.page_reuse = true;
        toggle_busy = true;
        workload(&c, 448 * MiB, 0x5eed0f9a9e5eedULL, 100000);
        toggle_busy = false;
        gm_heap_page_reuse(H, &info);
        ck_assert_uint_gt(F.remaps, 1000);
        ck_assert_uint_eq(info.pages_moved, F.remaps);
        ck_assert_uint_gt(info.refused_busy, 0);
        ck_assert_uint_gt(info.allocs_with_moves, 0);
        ck_assert_uint_le(info.ranges_moved, info.pages_moved);
        ck_assert_uint_eq(F.errors, 0);
}
END_TEST

static void setup(void) {
        H = NULL;
        toggle_busy = false;
}

static void teardown(void) {
        if (H)
                heap_close();
}

Suite *allocator_random_suite(void) {
        Suite *s = suite_create("allocator_random");
        TCase *tc = tcase_create("workload");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_random_native);
        tcase_add_test(tc, test_random_native_tuned);
        tcase_add_test(tc, test_random_expandable);
        suite_add_tcase(s, tc);
        /* three times the steps, and slow under the sanitizers */
        tc = tcase_create("page_reuse_workload");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_random_page_reuse);
        suite_add_tcase(s, tc);
        return s;
}
