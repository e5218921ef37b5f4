/* Parsers of untrusted input, on the cases the fuzz harnesses (tests/fuzz)
 * found: sizes written with an exponent, "inf" or a hex float, and envelopes
 * carrying field number 0. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "msg.h"
#include "size.h"

static int parse(const char *s, uint64_t *v) {
        *v = 12345;
        return gm_parse_size(s, v);
}

START_TEST(test_size_accepts_users_forms) {
        uint64_t v;
        ck_assert_int_eq(parse("4096", &v), 0);
        ck_assert_uint_eq(v, 4096);
        ck_assert_int_eq(parse("512M", &v), 0);
        ck_assert_uint_eq(v, 512ull << 20);
        ck_assert_int_eq(parse("1.5GiB", &v), 0);
        ck_assert_uint_eq(v, 3ull << 29);
        ck_assert_int_eq(parse("0.25k", &v), 0);
        ck_assert_uint_eq(v, 256);
        ck_assert_int_eq(parse("18446744073709551615", &v), 0);
        ck_assert_uint_eq(v, UINT64_MAX);
}
END_TEST

START_TEST(test_size_refuses_float_syntax) {
        /* strtod's wider syntax once slipped through as the fraction: 1.5e3G
         * was 1.5 TiB, 1.6e370k undefined behaviour (a double past u64). */
        static const char *const bad[] = {"1.5e3G", "1.6487e370k", "1.e5", "1.inf", "1.0x10M", "1.nanK", "1.",  "1.G",
                                          ".5G",    "1.5",         "-1",   " 1",    "1 G",     "1GG",    "0x10"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                uint64_t v;
                ck_assert_msg(parse(bad[i], &v) == -EINVAL, "'%s' accepted", bad[i]);
                ck_assert_uint_eq(v, 12345); /* untouched on failure */
        }
        uint64_t v;
        ck_assert_int_eq(parse("16384P", &v), -ERANGE);
        ck_assert_int_eq(parse("99999999999999999999", &v), -ERANGE);
}
END_TEST

START_TEST(test_envelope_with_field_zero_refused) {
        /* request_id 2, then release_request (field 20) whose body holds a
         * field-0 varint written in two tag bytes (0x80 0x00), then release_id 7. */
        static const uint8_t pkt[] = {0x08, 0x02, 0xa2, 0x01, 0x05, 0x80, 0x00, 0x01, 0x08, 0x07};
        Gpumem__Envelope *env = NULL;
        ck_assert_int_eq(gm_msg_unpack(pkt, sizeof(pkt), &env), -EBADMSG);
        ck_assert_ptr_null(env);

        /* The same with the field number a real one (release_id, 0x88 0x00 = field 1). */
        static const uint8_t ok[] = {0x08, 0x02, 0xa2, 0x01, 0x03, 0x88, 0x00, 0x07};
        ck_assert_int_eq(gm_msg_unpack(ok, sizeof(ok), &env), 0);
        ck_assert_int_eq(env->body_case, GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST);
        ck_assert_uint_eq(env->release_request->release_id, 7);
        gm_msg_free(env);
}
END_TEST

static Suite *input_suite(void) {
        Suite *s = suite_create("input");
        TCase *tc = tcase_create("parsers");
        tcase_add_test(tc, test_size_accepts_users_forms);
        tcase_add_test(tc, test_size_refuses_float_syntax);
        tcase_add_test(tc, test_envelope_with_field_zero_refused);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(input_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
