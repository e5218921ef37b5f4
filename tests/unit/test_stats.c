/* gm_stats_t: update and reset rules, the memory_stats() key set and order,
 * name lookup, and memory_summary() output against hand-written goldens. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

#define N_KEYS 123

typedef struct keys {
        char names[N_KEYS + 8][64];
        int64_t values[N_KEYS + 8];
        size_t n;
} keys_t;

static void collect(const char *name, int64_t value, void *userdata) {
        keys_t *k = userdata;

        if (k->n < N_KEYS + 8) {
                snprintf(k->names[k->n], sizeof(k->names[0]), "%s", name);
                k->values[k->n] = value;
        }
        k->n++;
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(a, b);
}

START_TEST(test_update) {
        gm_stat_t st = {0};

        gm_stat_update(&st, 10);
        gm_stat_update(&st, 5);
        gm_stat_update(&st, -8);
        gm_stat_update(&st, 2);
        ck_assert_int_eq(st.current, 9);
        ck_assert_int_eq(st.peak, 15);
        ck_assert_int_eq(st.allocated, 17);
        ck_assert_int_eq(st.freed, 8);
        gm_stat_update(&st, 0);
        ck_assert_int_eq(st.allocated, 17);
        ck_assert_int_eq(st.freed, 8);
}
END_TEST

START_TEST(test_init_and_resets) {
        gm_stats_t s;

        memset(&s, 0x5a, sizeof(s));
        gm_stats_init(&s);
        ck_assert_int_eq(s.max_split_size, -1);
        ck_assert_int_eq(s.reserved_bytes[GM_STAT_SMALL_POOL].peak, 0);
        ck_assert_int_eq(s.num_device_free, 0);

        gm_stat_update(&s.allocated_bytes[GM_STAT_LARGE_POOL], 100);
        gm_stat_update(&s.allocated_bytes[GM_STAT_LARGE_POOL], -60);
        gm_stat_update(&s.oversize_segments, 3);
        gm_stat_update(&s.oversize_segments, -1);
        gm_stat_update(&s.inactive_split[GM_STAT_SMALL_POOL], 4);
        gm_stat_update(&s.inactive_split[GM_STAT_SMALL_POOL], -4);
        s.num_alloc_retries = 1;
        s.num_ooms = 2;
        s.num_sync_all_streams = 3;
        s.num_device_alloc = 4;
        s.num_device_free = 5;
        s.max_split_size = 128 << 20;

        gm_stats_reset_peak(&s);
        ck_assert_int_eq(s.allocated_bytes[GM_STAT_LARGE_POOL].peak, 40);
        ck_assert_int_eq(s.oversize_segments.peak, 2);
        ck_assert_int_eq(s.inactive_split[GM_STAT_SMALL_POOL].peak, 0);
        ck_assert_int_eq(s.allocated_bytes[GM_STAT_LARGE_POOL].allocated, 100);
        ck_assert_int_eq(s.num_ooms, 2);

        gm_stats_reset_accumulated(&s);
        ck_assert_int_eq(s.allocated_bytes[GM_STAT_LARGE_POOL].allocated, 0);
        ck_assert_int_eq(s.allocated_bytes[GM_STAT_LARGE_POOL].freed, 0);
        ck_assert_int_eq(s.allocated_bytes[GM_STAT_LARGE_POOL].current, 40);
        ck_assert_int_eq(s.allocated_bytes[GM_STAT_LARGE_POOL].peak, 40);
        ck_assert_int_eq(s.oversize_segments.allocated, 0);
        ck_assert_int_eq(s.oversize_segments.freed, 0);
        ck_assert_int_eq(s.oversize_segments.current, 2);
        ck_assert_int_eq(s.inactive_split[GM_STAT_SMALL_POOL].freed, 0);
        ck_assert_int_eq(s.num_alloc_retries, 0);
        ck_assert_int_eq(s.num_ooms, 0);
        ck_assert_int_eq(s.num_sync_all_streams, 0);
        ck_assert_int_eq(s.num_device_alloc, 0);
        ck_assert_int_eq(s.num_device_free, 0);
        ck_assert_int_eq(s.max_split_size, 128 << 20);
}
END_TEST

/* The key set built independently here, then sorted, must equal foreach's
 * sequence exactly. */
START_TEST(test_foreach_sorted_complete) {
        static const char *const arrays[] = {
                "allocation",      "segment",        "active",       "inactive_split",
                "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                "requested_bytes"};
        static const char *const pools[] = {"all", "small_pool", "large_pool"};
        static const char *const fields[] = {"current", "peak", "allocated", "freed"};
        static const char *const scalars[] = {"num_alloc_retries", "num_ooms",        "num_sync_all_streams",
                                              "num_device_alloc",  "num_device_free", "max_split_size",
                                              "num_reclaim_waits"};
        static char expected[N_KEYS][64];
        static keys_t got;
        size_t n = 0;
        gm_stats_t s;

        for (size_t a = 0; a < 9; a++)
                for (size_t p = 0; p < 3; p++)
                        for (size_t f = 0; f < 4; f++)
                                snprintf(expected[n++], 64, "%s.%s.%s", arrays[a], pools[p], fields[f]);
        for (size_t f = 0; f < 4; f++) {
                snprintf(expected[n++], 64, "oversize_allocations.%s", fields[f]);
                snprintf(expected[n++], 64, "oversize_segments.%s", fields[f]);
        }
        for (size_t i = 0; i < 7; i++)
                snprintf(expected[n++], 64, "%s", scalars[i]);
        ck_assert_uint_eq(n, N_KEYS);
        qsort(expected, n, sizeof(expected[0]), cmp_str);

        gm_stats_init(&s);
        gm_stats_foreach(&s, collect, &got);
        ck_assert_uint_eq(got.n, N_KEYS);
        for (size_t i = 0; i < N_KEYS; i++) {
                ck_assert_str_eq(got.names[i], expected[i]);
                if (i > 0)
                        ck_assert_int_lt(strcmp(got.names[i - 1], got.names[i]), 0);
                ck_assert_int_eq(got.values[i], strcmp(got.names[i], "max_split_size") == 0 ? -1 : 0);
        }
        ck_assert_str_eq(got.names[0], "active.all.allocated");
        ck_assert_str_eq(got.names[N_KEYS - 1], "segment.small_pool.peak");
}
END_TEST

/* Every key names its own storage: give each a distinct value by name and
 * read all of them back, by name and through foreach. */
START_TEST(test_get_set_roundtrip) {
        static keys_t names, after;
        gm_stats_t s;
        int64_t v;

        gm_stats_init(&s);
        gm_stats_foreach(&s, collect, &names);
        for (size_t i = 0; i < names.n; i++)
                ck_assert_int_eq(gm_stats_set(&s, names.names[i], 1000 + (int64_t) i), 0);
        gm_stats_foreach(&s, collect, &after);
        for (size_t i = 0; i < names.n; i++) {
                ck_assert_int_eq(gm_stats_get(&s, names.names[i], &v), 0);
                ck_assert_int_eq(v, 1000 + (int64_t) i);
                ck_assert_int_eq(after.values[i], 1000 + (int64_t) i);
        }

        ck_assert_int_eq(gm_stats_set(&s, "requested_bytes.large_pool.freed", 77), 0);
        ck_assert_int_eq(s.requested_bytes[GM_STAT_LARGE_POOL].freed, 77);
        ck_assert_int_eq(gm_stats_set(&s, "allocation.small_pool.peak", 78), 0);
        ck_assert_int_eq(s.allocation[GM_STAT_SMALL_POOL].peak, 78);
        ck_assert_int_eq(gm_stats_set(&s, "oversize_segments.current", 79), 0);
        ck_assert_int_eq(s.oversize_segments.current, 79);
        ck_assert_int_eq(gm_stats_set(&s, "num_sync_all_streams", 80), 0);
        ck_assert_int_eq(s.num_sync_all_streams, 80);
        s.reserved_bytes[GM_STAT_ALL].current = 81;
        ck_assert_int_eq(gm_stats_get(&s, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 81);

        v = 5;
        ck_assert_int_eq(gm_stats_get(&s, "reserved_bytes.all", &v), -ENOENT);
        ck_assert_int_eq(gm_stats_get(&s, "reserved_bytes.all.current.x", &v), -ENOENT);
        ck_assert_int_eq(gm_stats_get(&s, "", &v), -ENOENT);
        ck_assert_int_eq(gm_stats_get(&s, "num_oom_rejections", &v), -ENOENT);
        ck_assert_int_eq(v, 5);
        ck_assert_int_eq(gm_stats_set(&s, "oversize_segments.all.current", 1), -ENOENT);
}
END_TEST

#define EQ "|===========================================================================|\n"
#define DASH "|---------------------------------------------------------------------------|\n"
#define HEADER "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"

START_TEST(test_summary_golden) {
        static const char expected[] =
                EQ "|                  PyTorch CUDA memory summary, device ID 1                 |\n" DASH
                   "|            CUDA OOMs: 3            |        cudaMalloc retries: 12345     |\n" EQ HEADER DASH
                   "| Allocated memory      |   1024 MiB |    768 KiB | 786431 B   |   3072 PiB |\n"
                   "|       from large pool |   1021 MiB |    767 KiB | 786431 B   |   3071 PiB |\n"
                   "|       from small pool |      3 MiB |      0 KiB |      0 B   |      0 PiB |\n" DASH
                   "| Active memory         |   2048 KiB |      0 B   |      0 B   |      0 B   |\n"
                   "|       from large pool |      0 KiB |      0 B   |      0 B   |      0 B   |\n"
                   "|       from small pool |     -1 KiB |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"
                   "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
                   "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| GPU reserved memory   | 786431 B   |  20480 KiB |      0 B   |      0 B   |\n"
                   "|       from large pool |      0 B   |  20480 KiB |      0 B   |      0 B   |\n"
                   "|       from small pool | 786431 B   |      0 KiB |      0 B   |      0 B   |\n" DASH
                   "| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |\n"
                   "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
                   "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| Allocations           |     750 K  |  749999    |    2000 M  |       0    |\n"
                   "|       from large pool |     749 K  |       0    |       0 M  |       0    |\n"
                   "|       from small pool |       0 K  |       0    |       0 M  |       0    |\n" DASH
                   "| Active allocs         |       0    |       0    |       0    |       0    |\n"
                   "|       from large pool |       0    |       0    |       0    |       0    |\n"
                   "|       from small pool |       0    |       0    |       0    |       0    |\n" DASH
                   "| GPU reserved segments |       0    |       0    |       0    |       0    |\n"
                   "|       from large pool |       0    |       0    |       0    |       0    |\n"
                   "|       from small pool |       0    |       0    |       0    |       0    |\n" DASH
                   "| Non-releasable allocs |       0    |       0    |       0    |       0    |\n"
                   "|       from large pool |       0    |       0    |       0    |       0    |\n"
                   "|       from small pool |       0    |       0    |       0    |       0    |\n" DASH
                   "| Oversize allocations  |     750 K  |       0    |       0    |       0    |\n" DASH
                   "| Oversize GPU segments |       0    |      12    |       0    |       0    |\n" EQ;
        gm_stats_t s;
        char buf[8192];
        int n;

        gm_stats_init(&s);
        s.num_ooms = 3;
        s.num_alloc_retries = 12345;
        /* bytes: 1 GiB prints as 1024 MiB; the 768 KiB threshold on the all
         * row decides the unit of the pool rows; floor division; PiB is the
         * last unit */
        s.allocated_bytes[GM_STAT_ALL] = (gm_stat_t){1073741824, 786432, 786431, INT64_C(3458764513820540928)};
        s.allocated_bytes[GM_STAT_LARGE_POOL] = (gm_stat_t){1070596096, 786431, 786431, INT64_C(3458764513820540927)};
        s.allocated_bytes[GM_STAT_SMALL_POOL] = (gm_stat_t){3146728, 1, 0, 0};
        s.active_bytes[GM_STAT_ALL].current = 2097152;
        s.active_bytes[GM_STAT_SMALL_POOL].current = -1; /* Python's // floors */
        s.reserved_bytes[GM_STAT_ALL] = (gm_stat_t){786431, 20971520, 0, 0};
        s.reserved_bytes[GM_STAT_LARGE_POOL].peak = 20971520;
        s.reserved_bytes[GM_STAT_SMALL_POOL].current = 786431;
        /* counts: 750 K threshold, K then M */
        s.allocation[GM_STAT_ALL] = (gm_stat_t){750000, 749999, 2000000000, 0};
        s.allocation[GM_STAT_LARGE_POOL].current = 749999;
        s.allocation[GM_STAT_SMALL_POOL].current = 1;
        s.oversize_allocations.current = 750000;
        s.oversize_segments.peak = 12;
        /* not shown by memory_summary() */
        s.num_device_alloc = 99;
        s.max_split_size = 1 << 30;

        n = gm_stats_summary(&s, 1, false, buf, sizeof(buf));
        ck_assert_str_eq(buf, expected);
        ck_assert_int_eq(n, (int) strlen(expected));
        for (const char *line = buf; *line; line = strchr(line, '\n') + 1)
                ck_assert_int_eq(strchr(line, '\n') - line, 77);

        /* the exact size fits; one byte less does not */
        ck_assert_int_eq(gm_stats_summary(&s, 1, false, buf, (size_t) n + 1), n);
        ck_assert_int_eq(gm_stats_summary(&s, 1, false, buf, (size_t) n), -ENOSPC);
        ck_assert_int_eq(gm_stats_summary(&s, 1, false, NULL, 0), -ENOSPC);
}
END_TEST

START_TEST(test_summary_abbreviated) {
        static const char expected[] =
                EQ "|                  PyTorch CUDA memory summary, device ID 0                 |\n" DASH
                   "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n" EQ HEADER DASH
                   "| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| Active memory         |      0 B   |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| GPU reserved memory   |  20480 KiB |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |\n" DASH
                   "| Allocations           |       0    |       0    |       0    |       0    |\n" DASH
                   "| Active allocs         |       0    |       0    |       0    |       0    |\n" DASH
                   "| GPU reserved segments |       1    |       0    |       0    |       0    |\n" DASH
                   "| Non-releasable allocs |       0    |       0    |       0    |       0    |\n" DASH
                   "| Oversize allocations  |       0    |       0    |       0    |       0    |\n" DASH
                   "| Oversize GPU segments |       0    |       0    |       0    |       0    |\n" EQ;
        gm_stats_t s;
        char buf[4096];

        gm_stats_init(&s);
        s.reserved_bytes[GM_STAT_ALL].current = 20 << 20;
        s.reserved_bytes[GM_STAT_LARGE_POOL].current = 20 << 20;
        s.segment[GM_STAT_ALL].current = 1;
        ck_assert_int_eq(gm_stats_summary(&s, 0, true, buf, sizeof(buf)), (int) strlen(expected));
        ck_assert_str_eq(buf, expected);
}
END_TEST

/* Values wider than the cell widen the row, as Python's format does. */
START_TEST(test_summary_wide_values) {
        gm_stats_t s;
        char buf[8192];

        gm_stats_init(&s);
        s.num_ooms = INT64_C(1234567890123);
        s.allocation[GM_STAT_ALL].peak = INT64_C(7500000000000);
        ck_assert_int_gt(gm_stats_summary(&s, 12, true, buf, sizeof(buf)), 0);
        ck_assert_ptr_nonnull(
                strstr(buf, "|                  PyTorch CUDA memory summary, device ID 12                |\n"));
        ck_assert_ptr_nonnull(
                strstr(buf, "|            CUDA OOMs: 1234567890123 |        cudaMalloc retries: 0         |\n"));
        ck_assert_ptr_nonnull(strstr(buf, "| Allocations           |       0    | 7500000 M  |"));
}
END_TEST

static Suite *stats_suite(void) {
        Suite *s = suite_create("stats");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_update);
        tcase_add_test(tc, test_init_and_resets);
        tcase_add_test(tc, test_foreach_sorted_complete);
        tcase_add_test(tc, test_get_set_roundtrip);
        tcase_add_test(tc, test_summary_golden);
        tcase_add_test(tc, test_summary_abbreviated);
        tcase_add_test(tc, test_summary_wide_values);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(stats_suite());
        int failed;

        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
