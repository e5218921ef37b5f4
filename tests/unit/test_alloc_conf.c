/* PYTORCH_CUDA_ALLOC_CONF parsing: every key, every validation error, the
 * roundup_power2_divisions list rules and the raw string. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_conf.h"

#define MIB (UINT64_C(1) << 20)

static gm_alloc_config_t parse_ok(const char *conf) {
        gm_alloc_config_t c;
        char err[256] = "";
        int r = gm_alloc_config_parse(conf, &c, err, sizeof(err));

        ck_assert_msg(r == 0, "'%s' failed: %d %s", conf ? conf : "(null)", r, err);
        return c;
}

/* Parses a bad string: -EINVAL, *ret_config untouched, and the one-line
 * error mentions `needle`. */
static void parse_bad(const char *conf, const char *needle) {
        gm_alloc_config_t c, before;
        char err[256] = "";

        memset(&c, 0xab, sizeof(c));
        before = c;
        ck_assert_int_eq(gm_alloc_config_parse(conf, &c, err, sizeof(err)), -EINVAL);
        ck_assert_msg(memcmp(&c, &before, sizeof(c)) == 0, "'%s' wrote the config on failure", conf);
        ck_assert_msg(strstr(err, needle) != NULL, "'%s': error '%s' lacks '%s'", conf, err, needle);
        ck_assert_ptr_null(strchr(err, '\n'));
}

static void assert_slots(const gm_alloc_config_t *c, const uint32_t expected[GM_ROUNDUP_SLOTS]) {
        for (int i = 0; i < GM_ROUNDUP_SLOTS; i++)
                ck_assert_msg(c->roundup_power2_divisions[i] == expected[i], "slot %d: %u, expected %u", i,
                              c->roundup_power2_divisions[i], expected[i]);
}

static void assert_default(const gm_alloc_config_t *c) {
        static const uint32_t zeros[GM_ROUNDUP_SLOTS];

        ck_assert_uint_eq(c->max_split_size, UINT64_MAX);
        ck_assert_uint_eq(c->max_non_split_rounding, 20 * MIB);
        assert_slots(c, zeros);
        ck_assert_double_eq(c->garbage_collection_threshold, 0.0);
        ck_assert_double_eq(c->per_process_memory_fraction, 0.0);
        ck_assert(!c->expandable_segments);
        ck_assert(!c->release_lock_on_cudamalloc);
        ck_assert(!c->pinned_use_cuda_host_register);
        ck_assert_uint_eq(c->pinned_num_register_threads, 1);
}

START_TEST(test_defaults) {
        gm_alloc_config_t c;

        memset(&c, 0x7f, sizeof(c));
        gm_alloc_config_default(&c);
        assert_default(&c);
        ck_assert_str_eq(c.raw, "");
        c = parse_ok(NULL);
        assert_default(&c);
        ck_assert_str_eq(c.raw, "");
        c = parse_ok("");
        assert_default(&c);
        c = parse_ok("   ");
        assert_default(&c);
        ck_assert_str_eq(c.raw, "   ");
}
END_TEST

START_TEST(test_every_key) {
        gm_alloc_config_t c;

        c = parse_ok("max_split_size_mb:128");
        ck_assert_uint_eq(c.max_split_size, 128 * MIB);
        c = parse_ok("max_split_size_mb:20");
        ck_assert_uint_eq(c.max_split_size, 20 * MIB);
        c = parse_ok("max_non_split_rounding_mb:40");
        ck_assert_uint_eq(c.max_non_split_rounding, 40 * MIB);
        ck_assert_uint_eq(c.max_split_size, UINT64_MAX);
        c = parse_ok("garbage_collection_threshold:0.6");
        ck_assert_double_eq(c.garbage_collection_threshold, 0.6);
        c = parse_ok("per_process_memory_fraction:0.5");
        ck_assert_double_eq(c.per_process_memory_fraction, 0.5);
        c = parse_ok("per_process_memory_fraction:0");
        ck_assert_double_eq(c.per_process_memory_fraction, 0.0);
        c = parse_ok("per_process_memory_fraction:1");
        ck_assert_double_eq(c.per_process_memory_fraction, 1.0);
        c = parse_ok("expandable_segments:True");
        ck_assert(c.expandable_segments);
        c = parse_ok("expandable_segments:False");
        ck_assert(!c.expandable_segments);
        c = parse_ok("release_lock_on_cudamalloc:True");
        ck_assert(c.release_lock_on_cudamalloc);
        c = parse_ok("release_lock_on_hipmalloc:True");
        ck_assert(c.release_lock_on_cudamalloc);
        c = parse_ok("pinned_use_cuda_host_register:True");
        ck_assert(c.pinned_use_cuda_host_register);
        c = parse_ok("pinned_use_hip_host_register:True");
        ck_assert(c.pinned_use_cuda_host_register);
        c = parse_ok("pinned_num_register_threads:128");
        ck_assert_uint_eq(c.pinned_num_register_threads, 128);
        c = parse_ok("pinned_num_register_threads:1");
        ck_assert_uint_eq(c.pinned_num_register_threads, 1);
        c = parse_ok("pinned_use_background_threads:True");
        assert_default(&c);
        c = parse_ok("backend:native");
        assert_default(&c);
}
END_TEST

START_TEST(test_combined_and_whitespace) {
        const char *conf = " expandable_segments : True ,max_split_size_mb:\t256,\n"
                           "garbage_collection_threshold:0.8, pinned_num_register_threads:8,";
        gm_alloc_config_t c = parse_ok(conf);

        ck_assert(c.expandable_segments);
        ck_assert_uint_eq(c.max_split_size, 256 * MIB);
        ck_assert_double_eq(c.garbage_collection_threshold, 0.8);
        ck_assert_uint_eq(c.pinned_num_register_threads, 8);
        ck_assert_str_eq(c.raw, conf);
        /* whitespace inside a word is dropped too, as PyTorch's lexer does */
        c = parse_ok("max_split _size_mb:1 28");
        ck_assert_uint_eq(c.max_split_size, 128 * MIB);
        /* the last occurrence of a key wins */
        c = parse_ok("max_split_size_mb:64,max_split_size_mb:32");
        ck_assert_uint_eq(c.max_split_size, 32 * MIB);
}
END_TEST

/* Every parse starts from the defaults, not from the previous result. */
START_TEST(test_parse_resets) {
        gm_alloc_config_t c = parse_ok("max_split_size_mb:128,roundup_power2_divisions:4,expandable_segments:True");

        ck_assert_int_eq(gm_alloc_config_parse("garbage_collection_threshold:0.5", &c, NULL, 0), 0);
        ck_assert_uint_eq(c.max_split_size, UINT64_MAX);
        ck_assert_uint_eq(c.roundup_power2_divisions[3], 0);
        ck_assert(!c.expandable_segments);
        ck_assert_str_eq(c.raw, "garbage_collection_threshold:0.5");
}
END_TEST

START_TEST(test_errors) {
        parse_bad("foo:1", "'foo'");
        parse_bad("expandable_segments:True,bogus_key:True", "'bogus_key'");
        parse_bad("max_split_size_mb:19", "max_split_size_mb too small, must be >= 20");
        parse_bad("max_split_size_mb:0", "too small");
        parse_bad("max_non_split_rounding_mb:19", "max_non_split_rounding_mb too small, must be >= 20");
        parse_bad("max_split_size_mb:-5", "max_split_size_mb");
        parse_bad("max_split_size_mb:12abc", "'12abc'");
        parse_bad("max_split_size_mb:99999999999999999999999", "max_split_size_mb");
        parse_bad("max_split_size_mb", "expected :");
        parse_bad("max_split_size_mb:", "expecting max_split_size_mb value");
        parse_bad("max_split_size_mb:,", "expecting max_split_size_mb value");
        parse_bad("max_split_size_mb:128:", "expected ,");
        parse_bad("roundup_power2_divisions:3", "power of 2");
        parse_bad("roundup_power2_divisions:0", "power of 2");
        parse_bad("garbage_collection_threshold:0", "(0.0, 1.0)");
        parse_bad("garbage_collection_threshold:1", "(0.0, 1.0)");
        parse_bad("garbage_collection_threshold:1.5", "(0.0, 1.0)");
        parse_bad("garbage_collection_threshold:-0.5", "(0.0, 1.0)");
        parse_bad("garbage_collection_threshold:abc", "'abc'");
        parse_bad("garbage_collection_threshold:nan", "garbage_collection_threshold");
        parse_bad("expandable_segments:true", "True/False argument for expandable_segments");
        parse_bad("expandable_segments:1", "True/False");
        parse_bad("release_lock_on_cudamalloc:yes", "release_lock_on_cudamalloc");
        parse_bad("pinned_use_cuda_host_register:TRUE", "pinned_use_cuda_host_register");
        parse_bad("pinned_use_background_threads:false", "pinned_use_background_threads");
        parse_bad("expandable_segments:True max_split_size_mb:20", "True/False");
        parse_bad("pinned_num_register_threads:3", "power of 2");
        parse_bad("pinned_num_register_threads:0", "power of 2");
        parse_bad("pinned_num_register_threads:256", "less than or equal to 128");
        parse_bad("per_process_memory_fraction:1.5", "Allowed range: 0~1");
        parse_bad("per_process_memory_fraction:-0.1", "Allowed range: 0~1");
        parse_bad("backend:cudaMallocAsync", "cudaMallocAsync");
        parse_bad("backend:hipMallocAsync", "hipMallocAsync");
        parse_bad("backend:other", "Unknown allocator backend");
        parse_bad(",", "','");
        parse_bad(":", "':'");
}
END_TEST

START_TEST(test_divisions_list_errors) {
        parse_bad("roundup_power2_divisions:[256:3]", "power of 2 or 0");
        parse_bad("roundup_power2_divisions:[300:2]", "intervals have to be power of 2");
        parse_bad("roundup_power2_divisions:[0:2]", "intervals have to be power of 2");
        parse_bad("roundup_power2_divisions:[256:1", "expected ,");
        parse_bad("roundup_power2_divisions:[256:1,", "closing bracket");
        parse_bad("roundup_power2_divisions:[", "closing bracket");
        parse_bad("roundup_power2_divisions:[256]", "expected :");
        parse_bad("roundup_power2_divisions:[256:]", "expecting roundup_power2_divisions value");
        parse_bad("roundup_power2_divisions:[>:3]", "power of 2 or 0");
        parse_bad("roundup_power2_divisions:", "expecting roundup_power2_divisions value");
}
END_TEST

START_TEST(test_divisions) {
        gm_alloc_config_t c;

        c = parse_ok("roundup_power2_divisions:4");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4});
        /* the reference example: 256 MB is slot 8 and, as the first key, also
         * fills slots 0..7; '>' fills from the slot after the last key */
        c = parse_ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8});
        c = parse_ok("roundup_power2_divisions:[ 1:2 , 65536:4 ]");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4});
        /* keys past 32 GB clamp to the last slot */
        c = parse_ok("roundup_power2_divisions:[4:16,1048576:2]");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2});
        /* '>' with no key before it fills from slot 1 */
        c = parse_ok("roundup_power2_divisions:[>:2]");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2});
        /* 0 disables a slot; only the first key fills lower slots; ">" follows
         * the last key in the list, not the highest one */
        c = parse_ok("roundup_power2_divisions:[64:0,16:4,>:16]");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){0, 0, 0, 0, 4, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16});
        c = parse_ok("roundup_power2_divisions:[]");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){0});
        c = parse_ok("roundup_power2_divisions:[2:8],expandable_segments:True");
        assert_slots(&c, (const uint32_t[GM_ROUNDUP_SLOTS]){8, 8});
        ck_assert(c.expandable_segments);
}
END_TEST

START_TEST(test_raw_and_reterr_bounds) {
        char conf[600], err[16];
        gm_alloc_config_t c;

        memset(conf, ' ', sizeof(conf));
        memcpy(conf, "expandable_segments:True", 24);
        conf[511] = '\0';
        c = parse_ok(conf);
        ck_assert_uint_eq(strlen(c.raw), 511);
        ck_assert(c.expandable_segments);

        conf[511] = ' ';
        conf[512] = '\0';
        parse_bad(conf, "511");
        /* a short reterr is cut, still terminated; a NULL one is fine */
        memset(err, 'x', sizeof(err));
        ck_assert_int_eq(gm_alloc_config_parse("foo:1", &c, err, sizeof(err)), -EINVAL);
        ck_assert_uint_eq(strlen(err), sizeof(err) - 1);
        ck_assert_int_eq(gm_alloc_config_parse("foo:1", &c, NULL, 0), -EINVAL);
        ck_assert_int_eq(gm_alloc_config_parse("foo:1", &c, err, 0), -EINVAL);
}
END_TEST

static Suite *config_suite(void) {
        Suite *s = suite_create("alloc_config");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_defaults);
        tcase_add_test(tc, test_every_key);
        tcase_add_test(tc, test_combined_and_whitespace);
        tcase_add_test(tc, test_parse_resets);
        tcase_add_test(tc, test_errors);
        tcase_add_test(tc, test_divisions_list_errors);
        tcase_add_test(tc, test_divisions);
        tcase_add_test(tc, test_raw_and_reterr_bounds);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(config_suite());
        int failed;

        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
