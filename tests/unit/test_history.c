/* gm_history_t: ring overwrite, stack and string interning, the frame-byte
 * limit, shrinking, the disabled mode and fairness between processes. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"

#define MAX_SEEN 64

typedef struct seen {
        gm_history_entry_t e[MAX_SEEN];
        size_t n_frames[MAX_SEEN];
        gm_frame_t first_frame[MAX_SEEN];
        size_t n;
} seen_t;

static void collect(const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames, void *userdata) {
        seen_t *s = userdata;

        ck_assert_uint_lt(s->n, MAX_SEEN);
        ck_assert_int_eq(frames == NULL, n_frames == 0);
        s->e[s->n] = *e;
        s->n_frames[s->n] = n_frames;
        if (n_frames > 0)
                s->first_frame[s->n] = frames[0];
        s->n++;
}

static seen_t walk(const gm_history_t *h) {
        seen_t s = {.n = 0};

        gm_history_foreach(h, collect, &s);
        ck_assert_uint_eq(s.n, gm_history_len(h));
        return s;
}

static gm_history_entry_t entry(uint64_t addr) {
        return (gm_history_entry_t){.action = 0,
                                    .addr = addr,
                                    .size = addr * 512,
                                    .stream = 7,
                                    .time_us = 1000 + addr,
                                    .pid = 42,
                                    .frames_id = 999};
}

static void record(gm_history_t *h, uint64_t addr, const gm_frame_t *frames, size_t n) {
        gm_history_entry_t e = entry(addr);

        ck_assert_int_eq(gm_history_record(h, &e, frames, n), 0);
}

/* Stacks with freshly allocated strings, so interning cannot rely on the
 * caller's pointers. */
typedef struct stack {
        char file[2][32], name[2][32];
        gm_frame_t f[2];
} tstack_t;

static void make_stack(tstack_t *s, const char *tag, uint32_t line) {
        for (int i = 0; i < 2; i++) {
                snprintf(s->file[i], sizeof(s->file[i]), "%s/file%d.py", tag, i);
                snprintf(s->name[i], sizeof(s->name[i]), "%s_fn%d", tag, i);
                s->f[i] = (gm_frame_t){.filename = s->file[i], .line = line + (uint32_t) i, .name = s->name[i]};
        }
}

START_TEST(test_disabled) {
        gm_history_t *h = NULL;
        tstack_t a;

        make_stack(&a, "a", 1);
        ck_assert_int_eq(gm_history_new(0, SIZE_MAX, &h), 0);
        record(h, 1, a.f, 2);
        ck_assert_uint_eq(gm_history_len(h), 0);
        ck_assert_uint_eq(gm_history_frame_bytes(h), 0);
        ck_assert_uint_eq(walk(h).n, 0);
        h = gm_history_free(h);
        ck_assert_ptr_null(h);
        ck_assert_ptr_null(gm_history_free(NULL));
}
END_TEST

START_TEST(test_ring_overwrite) {
        gm_history_t *h;
        seen_t s;

        ck_assert_int_eq(gm_history_new(3, SIZE_MAX, &h), 0);
        for (uint64_t i = 1; i <= 5; i++)
                record(h, i, NULL, 0);
        s = walk(h);
        ck_assert_uint_eq(s.n, 3);
        for (size_t i = 0; i < 3; i++) {
                gm_history_entry_t want = entry(3 + i);

                ck_assert_int_eq(s.e[i].action, want.action);
                ck_assert_uint_eq(s.e[i].addr, want.addr);
                ck_assert_uint_eq(s.e[i].size, want.size);
                ck_assert_uint_eq(s.e[i].stream, want.stream);
                ck_assert_uint_eq(s.e[i].time_us, want.time_us);
                ck_assert_uint_eq(s.e[i].pid, want.pid);
                ck_assert_uint_eq(s.e[i].frames_id, 0); /* assigned, not copied */
        }
        /* many more wrap-arounds */
        for (uint64_t i = 6; i <= 100; i++)
                record(h, i, NULL, 0);
        s = walk(h);
        ck_assert_uint_eq(s.e[0].addr, 98);
        ck_assert_uint_eq(s.e[2].addr, 100);
        gm_history_free(h);
}
END_TEST

START_TEST(test_frames_and_interning) {
        gm_history_t *h;
        tstack_t a, a2, b, c;
        gm_frame_t nulls = {.filename = NULL, .line = 3, .name = NULL};
        size_t one, two;
        uint64_t last_id;
        seen_t s;

        make_stack(&a, "a", 10);
        make_stack(&a2, "a", 10); /* same content, other pointers */
        make_stack(&b, "a", 20);  /* same strings, other lines */
        make_stack(&c, "c", 10);  /* other strings */
        ck_assert_int_eq(gm_history_new(100, SIZE_MAX, &h), 0);

        record(h, 1, a.f, 2);
        one = gm_history_frame_bytes(h);
        ck_assert_uint_gt(one, 0);
        record(h, 2, a2.f, 2);
        record(h, 3, a.f, 2);
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        record(h, 4, b.f, 2);
        two = gm_history_frame_bytes(h);
        /* a new stack over interned strings costs less than the first one */
        ck_assert_uint_gt(two, one);
        ck_assert_uint_lt(two - one, one);
        record(h, 5, c.f, 2);
        ck_assert_uint_eq(gm_history_frame_bytes(h) - two, one);
        record(h, 6, NULL, 0);
        record(h, 7, &nulls, 1);

        s = walk(h);
        ck_assert_uint_eq(s.n, 7);
        ck_assert_uint_ne(s.e[0].frames_id, 0);
        ck_assert_uint_eq(s.e[0].frames_id, s.e[1].frames_id);
        ck_assert_uint_eq(s.e[0].frames_id, s.e[2].frames_id);
        ck_assert_uint_ne(s.e[0].frames_id, s.e[3].frames_id);
        ck_assert_uint_ne(s.e[3].frames_id, s.e[4].frames_id);
        ck_assert_uint_eq(s.e[5].frames_id, 0);
        ck_assert_uint_eq(s.n_frames[5], 0);
        ck_assert_uint_eq(s.n_frames[0], 2);
        ck_assert_str_eq(s.first_frame[0].filename, "a/file0.py");
        ck_assert_str_eq(s.first_frame[0].name, "a_fn0");
        ck_assert_uint_eq(s.first_frame[0].line, 10);
        ck_assert_ptr_ne(s.first_frame[0].filename, a.file[0]); /* a copy */
        /* interned: one copy of each string, shared by stacks */
        ck_assert_ptr_eq(s.first_frame[0].filename, s.first_frame[3].filename);
        ck_assert_uint_eq(s.first_frame[3].line, 20);
        ck_assert_str_eq(s.first_frame[4].filename, "c/file0.py");
        ck_assert_str_eq(s.first_frame[6].filename, "");
        ck_assert_str_eq(s.first_frame[6].name, "");

        last_id = s.e[6].frames_id;
        ck_assert_uint_gt(last_id, s.e[4].frames_id);
        gm_history_clear(h);
        ck_assert_uint_eq(gm_history_len(h), 0);
        ck_assert_uint_eq(gm_history_frame_bytes(h), 0);
        record(h, 8, a.f, 2);
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        s = walk(h);
        ck_assert_uint_gt(s.e[0].frames_id, last_id); /* ids are never reused */
        gm_history_free(h);
}
END_TEST

/* A stack lives while any entry uses it and goes with the last one. */
START_TEST(test_refcount_on_overwrite) {
        gm_history_t *h;
        tstack_t a, b;
        size_t one;

        make_stack(&a, "a", 1);
        make_stack(&b, "b", 1);
        ck_assert_int_eq(gm_history_new(2, SIZE_MAX, &h), 0);
        record(h, 1, a.f, 2);
        one = gm_history_frame_bytes(h);
        record(h, 2, a.f, 2);
        record(h, 3, NULL, 0); /* drops entry 1; entry 2 still holds stack a */
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        record(h, 4, b.f, 2); /* drops entry 2: a goes, b comes */
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        ck_assert_str_eq(walk(h).first_frame[1].filename, "b/file0.py");
        record(h, 5, NULL, 0);
        record(h, 6, NULL, 0);
        ck_assert_uint_eq(gm_history_frame_bytes(h), 0);
        gm_history_free(h);
}
END_TEST

START_TEST(test_frame_byte_limit) {
        gm_history_t *h;
        tstack_t a, b;
        size_t one;
        seen_t s;

        make_stack(&a, "a", 1);
        make_stack(&b, "b", 1);
        ck_assert_int_eq(gm_history_new(10, SIZE_MAX, &h), 0);
        record(h, 1, a.f, 2);
        one = gm_history_frame_bytes(h);
        gm_history_free(h);

        ck_assert_int_eq(gm_history_new(10, one, &h), 0);
        record(h, 1, a.f, 2);
        record(h, 2, b.f, 2); /* would pass the limit: kept without frames */
        record(h, 3, a.f, 2); /* already interned: free */
        ck_assert_uint_eq(gm_history_len(h), 3);
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        s = walk(h);
        ck_assert_uint_eq(s.n_frames[0], 2);
        ck_assert_uint_eq(s.n_frames[1], 0);
        ck_assert_uint_eq(s.e[1].frames_id, 0);
        ck_assert_uint_eq(s.e[1].addr, 2);
        ck_assert_uint_eq(s.n_frames[2], 2);
        /* a huge stack is refused outright */
        {
                static gm_frame_t many[4096];

                for (size_t i = 0; i < 4096; i++)
                        many[i] = (gm_frame_t){"x.py", (uint32_t) i, "f"};
                record(h, 4, many, 4096);
                ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        }
        gm_history_clear(h);
        record(h, 5, b.f, 2); /* room again */
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        ck_assert_uint_eq(walk(h).n_frames[0], 2);
        gm_history_free(h);

        ck_assert_int_eq(gm_history_new(10, 0, &h), 0);
        record(h, 1, a.f, 2);
        ck_assert_uint_eq(gm_history_frame_bytes(h), 0);
        ck_assert_uint_eq(gm_history_len(h), 1);
        gm_history_free(h);
}
END_TEST

START_TEST(test_set_max) {
        gm_history_t *h;
        tstack_t a, b;
        size_t one;
        seen_t s;

        make_stack(&a, "a", 1);
        make_stack(&b, "b", 1);
        ck_assert_int_eq(gm_history_new(10, SIZE_MAX, &h), 0);
        for (uint64_t i = 1; i <= 12; i++) /* wraps: holds 3..12 */
                record(h, i, i <= 9 ? a.f : b.f, 2);
        one = gm_history_frame_bytes(h) / 2;

        ck_assert_int_eq(gm_history_set_max(h, 3), 0);
        s = walk(h);
        ck_assert_uint_eq(s.n, 3);
        ck_assert_uint_eq(s.e[0].addr, 10);
        ck_assert_uint_eq(s.e[2].addr, 12);
        ck_assert_uint_eq(gm_history_frame_bytes(h), one); /* stack a is gone */
        record(h, 13, NULL, 0);
        s = walk(h);
        ck_assert_uint_eq(s.n, 3);
        ck_assert_uint_eq(s.e[0].addr, 11);
        ck_assert_uint_eq(s.e[2].addr, 13);

        /* growing keeps everything */
        ck_assert_int_eq(gm_history_set_max(h, 5), 0);
        record(h, 14, NULL, 0);
        record(h, 15, NULL, 0);
        record(h, 16, NULL, 0);
        s = walk(h);
        ck_assert_uint_eq(s.n, 5);
        ck_assert_uint_eq(s.e[0].addr, 12);

        ck_assert_int_eq(gm_history_set_max(h, 0), 0);
        ck_assert_uint_eq(gm_history_len(h), 0);
        ck_assert_uint_eq(gm_history_frame_bytes(h), 0);
        record(h, 17, a.f, 2);
        ck_assert_uint_eq(gm_history_len(h), 0);

        ck_assert_int_eq(gm_history_set_max(h, SIZE_MAX), 0);
        for (uint64_t i = 0; i < 1000; i++)
                record(h, i, i % 2 ? a.f : NULL, i % 2 ? 2 : 0);
        ck_assert_uint_eq(gm_history_len(h), 1000);
        ck_assert_uint_eq(gm_history_frame_bytes(h), one);
        ck_assert_int_eq(gm_history_set_max(h, 1), 0);
        s = walk(h);
        ck_assert_uint_eq(s.e[0].addr, 999);
        ck_assert_uint_eq(s.n_frames[0], 2);
        gm_history_free(h);
}
END_TEST

/* Many distinct stacks and strings make the interning tables grow and then
 * empty out again. */
START_TEST(test_many_stacks) {
        gm_history_t *h;
        tstack_t st;

        ck_assert_int_eq(gm_history_new(64, SIZE_MAX, &h), 0);
        for (uint32_t i = 0; i < 5000; i++) {
                char tag[16];

                snprintf(tag, sizeof(tag), "t%u", i % 300);
                make_stack(&st, tag, i % 7);
                record(h, i, st.f, 2);
        }
        ck_assert_uint_eq(gm_history_len(h), 64);
        ck_assert_uint_eq(walk(h).e[63].addr, 4999);
        gm_history_clear(h);
        ck_assert_uint_eq(gm_history_frame_bytes(h), 0);
        gm_history_free(h);
}
END_TEST

static void record_pid(gm_history_t *h, uint64_t addr, uint32_t pid) {
        gm_history_entry_t e = entry(addr);
        e.pid = pid;
        ck_assert_int_eq(gm_history_record(h, &e, NULL, 0), 0);
}

/* One busy process evicts its own entries, not the others': with 10 slots,
 * pid 2's three entries survive pid 1 recording a thousand, and the walk
 * keeps the order of recording across processes. */
START_TEST(test_busy_process_evicts_its_own) {
        gm_history_t *h;
        ck_assert_int_eq(gm_history_new(10, SIZE_MAX, &h), 0);
        record_pid(h, 1, 1);
        record_pid(h, 2, 2);
        record_pid(h, 3, 2);
        record_pid(h, 4, 2);
        for (uint64_t i = 100; i < 1100; i++)
                record_pid(h, i, 1);
        seen_t s = walk(h);
        ck_assert_uint_eq(s.n, 10);
        size_t of2 = 0;
        for (size_t i = 0; i < s.n; i++) {
                of2 += s.e[i].pid == 2;
                if (i > 0 && s.e[i].pid == 1 && s.e[i - 1].pid == 1)
                        ck_assert_uint_eq(s.e[i].addr, s.e[i - 1].addr + 1);
        }
        ck_assert_uint_eq(of2, 3);
        ck_assert_uint_eq(s.e[0].addr, 2); /* pid 2's, recorded before pid 1's kept ones */
        ck_assert_uint_eq(s.e[9].addr, 1099);
        /* Equal shares: a third process takes slots from the one holding most
         * (pid 0, a key like any other). */
        for (uint64_t i = 0; i < 20; i++)
                record_pid(h, 2000 + i, 0);
        s = walk(h);
        size_t per[4] = {0};
        for (size_t i = 0; i < s.n; i++)
                per[s.e[i].pid]++;
        ck_assert_uint_ge(per[1], 3);
        ck_assert_uint_le(per[1], 4);
        ck_assert_uint_eq(per[2], 3);
        ck_assert_uint_ge(per[0], 3);
        ck_assert_uint_le(per[0], 4);
        /* Shrinking drops from the largest too. */
        ck_assert_int_eq(gm_history_set_max(h, 3), 0);
        s = walk(h);
        ck_assert_uint_eq(s.n, 3);
        ck_assert_uint_ne(s.e[0].pid, s.e[1].pid);
        ck_assert_uint_ne(s.e[1].pid, s.e[2].pid);
        ck_assert_uint_ne(s.e[0].pid, s.e[2].pid);
        gm_history_clear(h);
        ck_assert_uint_eq(gm_history_len(h), 0);
        record_pid(h, 5, 5);
        ck_assert_uint_eq(walk(h).e[0].addr, 5);
        gm_history_free(h);
}
END_TEST

static Suite *history_suite(void) {
        Suite *s = suite_create("history");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_disabled);
        tcase_add_test(tc, test_ring_overwrite);
        tcase_add_test(tc, test_frames_and_interning);
        tcase_add_test(tc, test_refcount_on_overwrite);
        tcase_add_test(tc, test_frame_byte_limit);
        tcase_add_test(tc, test_set_max);
        tcase_add_test(tc, test_many_stacks);
        tcase_add_test(tc, test_busy_process_evicts_its_own);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(history_suite());
        int failed;

        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
