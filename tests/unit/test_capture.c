/* The process's record of captures in progress (libgpumem/capture.c):
 * declarations nest and an end without a begin is refused; a noted stream
 * counts until its query says it no longer captures (or fails), or its noted
 * blocks are freed, at most GM_CAPTURE_MAX_STREAMS of them; no release starts while a capture is in
 * progress, and a declared begin waits for a release under way; the
 * lock-free "any open?" follows the record; a fork child starts with none. Each test runs in its own process (check forks). */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture.h"
#include "testutil.h"

/* Streams 1 .. 127 the test calls capturing; how many questions came. */
static bool capturing[128];
static unsigned questions;

static int query(void *ctx, uint64_t stream) {
        (void) ctx;
        questions++;
        if (stream >= 128)
                return -EINVAL;
        return capturing[stream] ? 1 : 0;
}

START_TEST(test_declarations_nest) {
        ck_assert(!gm_capture_in_progress(query, NULL));
        ck_assert_int_eq(gm_capture_end(), -EINVAL);
        ck_assert_int_eq(gm_capture_begin(), 0);
        ck_assert_int_eq(gm_capture_begin(), 0);
        ck_assert(gm_capture_in_progress(query, NULL));
        ck_assert(!gm_capture_release_begin(query, NULL)); /* nothing starts */
        ck_assert_int_eq(gm_capture_end(), 0);
        ck_assert(gm_capture_in_progress(query, NULL)); /* one still open */
        ck_assert_int_eq(gm_capture_end(), 0);
        ck_assert(!gm_capture_in_progress(query, NULL));
        ck_assert_int_eq(gm_capture_end(), -EINVAL);
        ck_assert_uint_eq(questions, 0); /* nothing noted: nothing asked */
        gm_capture_check();
}
END_TEST

START_TEST(test_noted_until_the_query_says_ended) {
        capturing[5] = capturing[6] = true;
        ck_assert(gm_capture_note_block(5));
        ck_assert(gm_capture_note_block(5)); /* one stream, two blocks */
        ck_assert(gm_capture_note_block(6));
        ck_assert(gm_capture_note_block(200)); /* its query fails */
        ck_assert(gm_capture_noted());
        ck_assert(gm_capture_in_progress(NULL, NULL)); /* nobody to ask: still noted */
        ck_assert_uint_eq(questions, 0);
        ck_assert(gm_capture_in_progress(query, NULL));
        ck_assert_uint_eq(questions, 3); /* 200 is forgotten */
        capturing[5] = false;
        ck_assert(gm_capture_in_progress(query, NULL));
        capturing[6] = false;
        ck_assert(!gm_capture_in_progress(query, NULL));
        ck_assert(!gm_capture_noted());
        gm_capture_unnote_block(5); /* forgotten since: ignored */
        gm_capture_check();
}
END_TEST

/* A noted stream is asked about only while a block noted on it lives, and
 * one the application passes as not capturing is forgotten at once. */
START_TEST(test_noted_while_its_blocks_live) {
        capturing[7] = capturing[8] = true;
        ck_assert(gm_capture_note_block(7));
        ck_assert(gm_capture_note_block(7));
        gm_capture_unnote_block(7);
        ck_assert(gm_capture_noted()); /* one block left */
        gm_capture_unnote_block(7);
        ck_assert(!gm_capture_noted());
        ck_assert(gm_capture_note_block(8));
        gm_capture_forget_stream(8);
        ck_assert(!gm_capture_noted());
        ck_assert(!gm_capture_in_progress(query, NULL));
        ck_assert_uint_eq(questions, 0); /* never asked: nothing lived when it was looked at */
        gm_capture_check();
}
END_TEST

START_TEST(test_noted_streams_bounded) {
        for (uint64_t s = 1; s <= GM_CAPTURE_MAX_STREAMS + 10; s++) {
                capturing[s] = true;
                ck_assert(gm_capture_note_block(s) == (s <= GM_CAPTURE_MAX_STREAMS)); /* a full record notes none */
        }
        gm_capture_check();
        questions = 0;
        ck_assert(gm_capture_in_progress(query, NULL));
        ck_assert_uint_eq(questions, GM_CAPTURE_MAX_STREAMS);
}
END_TEST

START_TEST(test_release_only_without_capture) {
        capturing[9] = true;
        ck_assert(gm_capture_note_block(9));
        ck_assert(!gm_capture_release_begin(query, NULL));
        capturing[9] = false;
        ck_assert(gm_capture_release_begin(query, NULL));
        ck_assert(gm_capture_release_begin(query, NULL)); /* releases of two sessions */
        gm_capture_release_end();
        gm_capture_release_end();
        gm_capture_check();
}
END_TEST

static void *begin_thread(void *arg) {
        *(int *) arg = gm_capture_begin();
        return NULL;
}

/* A declared begin made while a release is under way returns once that
 * release ended (it does not stay blocked), and then no release starts. */
START_TEST(test_begin_after_release) {
        ck_assert(gm_capture_release_begin(query, NULL));
        int r = 1;
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, begin_thread, &r), 0);
        gm_capture_release_end();
        ck_assert_int_eq(pthread_join(t, NULL), 0);
        ck_assert_int_eq(r, 0);
        ck_assert(!gm_capture_release_begin(query, NULL));
        ck_assert_int_eq(gm_capture_end(), 0);
}
END_TEST

/* gm_capture_any() (an allocation's miss asks it, with no lock) says
 * whether something is open, declared or noted, as the record last had it. */
START_TEST(test_any_follows_the_record) {
        ck_assert(!gm_capture_any());
        ck_assert_int_eq(gm_capture_begin(), 0);
        ck_assert(gm_capture_any());
        ck_assert_int_eq(gm_capture_end(), 0);
        ck_assert(!gm_capture_any());
        capturing[4] = true;
        ck_assert(gm_capture_note_block(4));
        ck_assert(gm_capture_any());
        capturing[4] = false;
        ck_assert(gm_capture_any()); /* not asked yet */
        ck_assert(!gm_capture_in_progress(query, NULL));
        ck_assert(!gm_capture_any()); /* forgotten by the query */
        ck_assert(gm_capture_note_block(4));
        gm_capture_unnote_block(4);
        ck_assert(!gm_capture_any()); /* its last block freed */
        gm_capture_check();
}
END_TEST

START_TEST(test_fork_child_starts_clean) {
        ck_assert_int_eq(gm_capture_begin(), 0);
        ck_assert(gm_capture_note_block(3));
        capturing[3] = true;
        ck_assert(!gm_capture_release_begin(NULL, NULL));
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                bool clean = !gm_capture_any() && !gm_capture_in_progress(query, NULL);
                _exit(clean && gm_capture_release_begin(query, NULL) ? 0 : 1);
        }
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        ck_assert(gm_capture_in_progress(query, NULL)); /* the parent's stay */
        ck_assert_int_eq(gm_capture_end(), 0);
}
END_TEST

int main(void) {
        Suite *s = suite_create("capture");
        TCase *tc = tcase_create("record");
        tcase_add_test(tc, test_declarations_nest);
        tcase_add_test(tc, test_noted_until_the_query_says_ended);
        tcase_add_test(tc, test_noted_while_its_blocks_live);
        tcase_add_test(tc, test_noted_streams_bounded);
        tcase_add_test(tc, test_release_only_without_capture);
        tcase_add_test(tc, test_begin_after_release);
        tcase_add_test(tc, test_any_follows_the_record);
        tcase_add_test(tc, test_fork_child_starts_clean);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
