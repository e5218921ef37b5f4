/* Check suite for allocator/oom.c: PyTorch's 2.3+ out-of-memory wording with
 * format_size() boundaries, each gpumemd diagnosis, the classifier's order
 * and buffer handling. Expected strings are derived by hand from the
 * reference (pytorch-allocator.md §7). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "oom.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

#define PYTORCH_TAIL                                                                                       \
        "If reserved but unallocated memory is large try setting "                                         \
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for " \
        "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"                         \
        "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf) gpumemd: "

static void assert_message(const gm_oom_report_t *r, const char *expected) {
        char buf[4096];
        int n = gm_oom_format(r, buf, sizeof(buf));
        ck_assert_int_ge(n, 0);
        ck_assert_str_eq(buf, expected);
        ck_assert_int_eq(n, (int) strlen(expected));
}

/* A device with 16 GiB where nothing points at a particular reason. */
static gm_oom_report_t base_report(void) {
        return (gm_oom_report_t){
                .device = 0,
                .alloc_size = 20 * MiB,
                .block_size = 5 * MiB,
                .device_total = 16 * GiB,
                .device_free = 0,
                .broker_reserved = 16 * GiB,
                .broker_live = 16 * GiB,
        };
}

START_TEST(test_quota) {
        gm_oom_report_t r = {
                .reason = GM_OOM_QUOTA,
                .device = 0,
                .alloc_size = 20 * MiB,
                .device_total = 80 * GiB,
                .device_free = 1024,
                .session_allocated = 1 * MiB,
                .session_reserved = 3 * MiB,
                .tenant = "alice",
                .tenant_quota = 4 * GiB,
                .tenant_reserved = 4 * GiB - 10 * MiB, /* 3.990234375 GiB */
                .tenant_live = 3 * GiB,
        };
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_QUOTA);
        /* Told to a non-admin: only what it can do itself. */
        assert_message(&r, "CUDA out of memory: tenant 'alice' is at its gpumemd quota. Tried to allocate 20.00 MiB on "
                           "top of the 3.99 GiB the tenant has reserved, over its quota of 4.00 GiB (3.00 GiB in live "
                           "allocations, 1014.00 MiB cached). GPU 0 itself has 1024 bytes free of 80.00 GiB; this "
                           "process has 1024.00 KiB allocated and 2.00 MiB reserved but unallocated. gpumemd: Free "
                           "tensors the tenant's processes no longer need (`gpumemctl clients` lists them) and release "
                           "their cached memory (torch.cuda.empty_cache() in each), or ask an administrator to raise "
                           "the quota (`gpumemctl quota get alice` shows it).");
        r.caller_admin = true;
        assert_message(&r,
                       "CUDA out of memory: tenant 'alice' is at its gpumemd quota. Tried to allocate 20.00 MiB on "
                       "top of the 3.99 GiB the tenant has reserved, over its quota of 4.00 GiB (3.00 GiB in live "
                       "allocations, 1014.00 MiB cached). GPU 0 itself has 1024 bytes free of 80.00 GiB; this "
                       "process has 1024.00 KiB allocated and 2.00 MiB reserved but unallocated. gpumemd: Raise the "
                       "quota with `gpumemctl quota set alice BYTES`, or free tensors and release cached memory "
                       "(torch.cuda.empty_cache(), `gpumemctl trim --tenant alice`).");
}
END_TEST

START_TEST(test_fragmentation) {
        gm_oom_report_t r = {
                .reason = GM_OOM_FRAGMENTATION,
                .device = 1,
                .alloc_size = 12 * MiB,
                .block_size = 12 * MiB,
                .device_total = 16 * GiB,
                .device_free = 0,
                .allowed = 8 * GiB,
                .session_allocated = 6 * GiB,
                .session_reserved = 8 * GiB,
                .session_cached = 2 * GiB,
                .largest_free = 10 * MiB,
                .broker_reserved = 16 * GiB,
        };
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_FRAGMENTATION);
        assert_message(&r, "CUDA out of memory. Tried to allocate 12.00 MiB. GPU 1 has a total capacity of 16.00 GiB "
                           "of which 0 bytes is free. 8.00 GiB allowed; Of the allocated memory 6.00 GiB is allocated "
                           "by PyTorch, and 2.00 GiB is reserved by PyTorch but unallocated. " PYTORCH_TAIL
                           "fragmentation: this session's cache holds 2.00 GiB free, enough for the 12.00 MiB block "
                           "requested, but its largest free block is 10.00 MiB. Start gpumemd with --alloc-conf "
                           "expandable_segments:True, or set max_split_size_mb to keep large blocks from being "
                           "split.");
}
END_TEST

START_TEST(test_reclaim) {
        gm_oom_report_t r = base_report();
        r.reason = GM_OOM_RECLAIM;
        r.device_free = 4 * MiB;
        r.others_cached = 512 * MiB;
        r.broker_reserved = 16 * GiB - 4 * MiB;
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_RECLAIM);
        assert_message(&r, "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 16.00 GiB "
                           "of which 4.00 MiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 "
                           "bytes is reserved by PyTorch but unallocated. " PYTORCH_TAIL
                           "512.00 MiB is held in other tenants' caches and could not be reclaimed in time. Retry the "
                           "allocation, or have an administrator run `gpumemctl trim`.");
}
END_TEST

START_TEST(test_external) {
        gm_oom_report_t r = base_report();
        r.reason = GM_OOM_EXTERNAL;
        r.broker_reserved = 10 * GiB;
        r.broker_live = 9 * GiB;
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_EXTERNAL);
        assert_message(&r, "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 16.00 GiB "
                           "of which 0 bytes is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 "
                           "bytes is reserved by PyTorch but unallocated. " PYTORCH_TAIL
                           "6.00 GiB is used outside gpumemd (the driver reports 16.00 GiB used, gpumemd has 10.00 GiB "
                           "reserved). Stop the other processes on this GPU or run them through gpumemd.");
}
END_TEST

START_TEST(test_device_full) {
        gm_oom_report_t r = base_report();
        r.reason = GM_OOM_DEVICE_FULL;
        r.broker_live = 15 * GiB + 512 * MiB;
        r.session_allocated = 2 * GiB + 1;
        r.session_reserved = 2 * GiB + 1 + 1536; /* 1.50 KiB unallocated */
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_DEVICE_FULL);
        assert_message(&r, "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 16.00 GiB "
                           "of which 0 bytes is free. Of the allocated memory 2.00 GiB is allocated by PyTorch, and "
                           "1.50 KiB is reserved by PyTorch but unallocated. " PYTORCH_TAIL
                           "the device is full of live allocations: 15.50 GiB of its 16.00 GiB is allocated by "
                           "gpumemd sessions (16.00 GiB reserved), with no cache left to reclaim. Free tensors or "
                           "reduce the batch size.");
}
END_TEST

/* format_size(): inclusive bounds at 1024, 1 MiB and 1 GiB, two decimals. */
START_TEST(test_format_size_boundaries) {
        static const struct {
                uint64_t size;
                const char *text;
        } cases[] = {
                {0, "0 bytes"},
                {512, "512 bytes"},
                {1024, "1024 bytes"},
                {1025, "1.00 KiB"},
                {1034, "1.01 KiB"}, /* 1.009765625 */
                {2560, "2.50 KiB"},
                {1 * MiB - 1, "1024.00 KiB"}, /* 1023.999 rounds up */
                {1 * MiB, "1024.00 KiB"},
                {1 * MiB + 1, "1.00 MiB"},
                {2 * MiB, "2.00 MiB"},
                {1 * GiB, "1024.00 MiB"},
                {1 * GiB + 1, "1.00 GiB"},
                {80 * GiB, "80.00 GiB"},
                {1536 * GiB, "1536.00 GiB"},
        };
        gm_oom_report_t r = base_report();
        r.reason = GM_OOM_DEVICE_FULL;
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char buf[4096], prefix[128];
                r.alloc_size = cases[i].size;
                ck_assert_int_gt(gm_oom_format(&r, buf, sizeof(buf)), 0);
                snprintf(prefix, sizeof(prefix), "CUDA out of memory. Tried to allocate %s. GPU 0 ", cases[i].text);
                ck_assert_msg(strncmp(buf, prefix, strlen(prefix)) == 0, "size %llu: got \"%.60s\", want \"%s\"",
                              (unsigned long long) cases[i].size, buf, prefix);
        }
}
END_TEST

/* Every condition holds at first; each step takes one away and the next
 * reason in the order quota > fragmentation > reclaim > external > full wins. */
START_TEST(test_classify_order) {
        gm_oom_report_t r = {
                .alloc_size = 20 * MiB,
                .block_size = 20 * MiB,
                .device_total = 16 * GiB,
                .device_free = 0,
                .session_cached = 64 * MiB,
                .largest_free = 2 * MiB,
                .tenant_quota = 1 * GiB,
                .tenant_reserved = 1 * GiB - 10 * MiB,
                .broker_reserved = 15 * GiB,
                .broker_live = 14 * GiB,
                .others_cached = 100 * MiB,
        };
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_QUOTA);
        r.tenant_reserved = 1 * GiB - 20 * MiB; /* exactly at the quota: still allowed */
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_FRAGMENTATION);
        r.tenant_quota = 0;
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_FRAGMENTATION);
        r.largest_free = 20 * MiB; /* a fitting block exists: not fragmentation */
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_RECLAIM);
        r.largest_free = 2 * MiB;
        r.session_cached = 20 * MiB - 1;
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_RECLAIM);
        r.others_cached = 20 * MiB - 1; /* not enough even if reclaimed */
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_EXTERNAL);
        r.others_cached = 0;
        r.broker_reserved = 16 * GiB - 20 * MiB; /* exactly the request outside: external */
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_EXTERNAL);
        r.broker_reserved = 16 * GiB - 20 * MiB + 1;
        ck_assert_int_eq(gm_oom_classify(&r), GM_OOM_DEVICE_FULL);
}
END_TEST

START_TEST(test_buffer_and_args) {
        gm_oom_report_t r = base_report();
        char big[4096], small[4096];

        r.reason = GM_OOM_DEVICE_FULL;
        int n = gm_oom_format(&r, big, sizeof(big));
        ck_assert_int_gt(n, 0);
        ck_assert_int_eq(gm_oom_format(&r, small, (size_t) n), -ENOSPC);
        ck_assert_int_eq(gm_oom_format(&r, small, 10), -ENOSPC);
        ck_assert_int_eq(gm_oom_format(&r, small, 0), -ENOSPC);
        ck_assert_int_eq(gm_oom_format(&r, small, (size_t) n + 1), n);
        ck_assert_str_eq(small, big);

        r.reason = _GM_OOM_REASON_MAX;
        ck_assert_int_eq(gm_oom_format(&r, big, sizeof(big)), -EINVAL);

        /* A quota refusal without a tenant name still reads. */
        r.reason = GM_OOM_QUOTA;
        r.tenant_quota = 1 * GiB;
        ck_assert_int_gt(gm_oom_format(&r, big, sizeof(big)), 0);
        ck_assert_ptr_nonnull(strstr(big, "CUDA out of memory: tenant '(unknown)' is at its gpumemd quota."));
}
END_TEST

static Suite *oom_suite(void) {
        Suite *s = suite_create("oom");
        TCase *tc = tcase_create("format");
        tcase_set_timeout(tc, 30);
        tcase_add_test(tc, test_quota);
        tcase_add_test(tc, test_fragmentation);
        tcase_add_test(tc, test_reclaim);
        tcase_add_test(tc, test_external);
        tcase_add_test(tc, test_device_full);
        tcase_add_test(tc, test_format_size_boundaries);
        tcase_add_test(tc, test_classify_order);
        tcase_add_test(tc, test_buffer_and_args);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(oom_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? 0 : 1;
}
