/* The client's page-reuse fence FIFO (client/fence.c) over an event table of
 * its own: at most GM_FENCE_MARKS marks per stream (newer ones refused, never
 * reported), GM_FENCE_STREAMS streams, completion popped from the head only,
 * queries only while marks are pending, reports only when a stream's highest
 * complete fence rose, every event destroyed once, and a central session's
 * own check before an Alloc (gm_fences_check_freed) keeps no event. */
#include <check.h>
#include <errno.h>

#include "fence.h"
#include "testutil.h"

#define MAX_EVENTS 512

typedef struct events {
        bool live[MAX_EVENTS], done[MAX_EVENTS];
        uint64_t stream[MAX_EVENTS];
        unsigned n, queries, destroyed;
        int fail_record; /* the next record fails with this */
        bool idle;       /* events are complete once recorded (the device is idle) */
} events_t;

static events_t E;

static int ev_record(void *ctx, uint64_t stream, uint64_t *ret_event) {
        events_t *e = ctx;
        if (e->fail_record) {
                int r = e->fail_record;
                e->fail_record = 0;
                return r;
        }
        ck_assert_uint_lt(e->n, MAX_EVENTS);
        e->live[e->n] = true;
        e->done[e->n] = e->idle;
        e->stream[e->n] = stream;
        *ret_event = e->n++;
        return 0;
}

static int ev_query(void *ctx, uint64_t event) {
        events_t *e = ctx;
        ck_assert(e->live[event]);
        e->queries++;
        return e->done[event] ? 1 : 0;
}

static void ev_destroy(void *ctx, uint64_t event) {
        events_t *e = ctx;
        ck_assert(e->live[event]);
        e->live[event] = false;
        e->destroyed++;
}

static gm_fences_t F;

static void setup(void) {
        E = (events_t){0};
        gm_fences_init(&F, &(gm_fence_ops_t){.record = ev_record, .query = ev_query, .destroy = ev_destroy, .ctx = &E});
}

static void teardown(void) {
        gm_fences_clear(&F, true);
        ck_assert_uint_eq(E.destroyed, E.n); /* every event destroyed, once */
}

/* A fifth mark on a stream is refused while four are pending; the refused
 * number is never reported, the kept ones are in order. */
START_TEST(test_bounded_per_stream) {
        for (uint64_t k = 1; k <= GM_FENCE_MARKS; k++)
                ck_assert_int_eq(gm_fences_mark(&F, 5, 10 * k), 0);
        ck_assert_int_eq(gm_fences_mark(&F, 5, 50), -ENOSPC);
        ck_assert_int_eq(gm_fences_mark(&F, 5, 40), 0); /* marked already */
        ck_assert_uint_eq(E.n, GM_FENCE_MARKS);
        gm_fence_done_t out[GM_FENCE_STREAMS];
        ck_assert_uint_eq(gm_fences_report(&F, out), 0); /* none complete */
        E.done[1] = true;                                /* the second, not the head */
        ck_assert_uint_eq(gm_fences_report(&F, out), 0);
        E.done[0] = true;
        ck_assert_uint_eq(gm_fences_report(&F, out), 1);
        ck_assert_uint_eq(out[0].stream, 5);
        ck_assert_uint_eq(out[0].fence, 20);
        ck_assert_uint_eq(gm_fences_report(&F, out), 0); /* no rise, no report */
        ck_assert_int_eq(gm_fences_mark(&F, 5, 50), 0);  /* room again */
        E.done[2] = E.done[3] = E.done[4] = true;
        ck_assert_uint_eq(gm_fences_report(&F, out), 1);
        ck_assert_uint_eq(out[0].fence, 50);
        unsigned queries = E.queries;
        ck_assert_uint_eq(gm_fences_report(&F, out), 0); /* nothing pending: nothing queried */
        ck_assert_uint_eq(E.queries, queries);
}
END_TEST

/* Marks on more than GM_FENCE_STREAMS streams are refused; each stream is
 * reported on its own. */
START_TEST(test_bounded_streams) {
        for (uint64_t s = 0; s < GM_FENCE_STREAMS; s++)
                ck_assert_int_eq(gm_fences_mark(&F, 100 + s, 1 + s), 0);
        ck_assert_int_eq(gm_fences_mark(&F, 7, 1), -ENOSPC);
        E.done[3] = E.done[9] = true;
        gm_fence_done_t out[GM_FENCE_STREAMS];
        ck_assert_uint_eq(gm_fences_report(&F, out), 2);
        ck_assert_uint_eq(out[0].stream, 103);
        ck_assert_uint_eq(out[0].fence, 4);
        ck_assert_uint_eq(out[1].stream, 109);
        ck_assert_uint_eq(out[1].fence, 10);
}
END_TEST

/* A driver refusing the record leaves nothing marked; a local heap's
 * stream_fence() marks and polls at once. */
START_TEST(test_local_fence) {
        uint64_t done = 99;
        E.fail_record = -EIO;
        ck_assert_int_eq(gm_fences_mark(&F, 0, 3), -EIO);
        ck_assert_int_eq(gm_fences_fence(&F, 0, 3, &done), 0);
        ck_assert_uint_eq(done, 0); /* marked now, pending */
        E.done[0] = true;
        ck_assert_int_eq(gm_fences_fence(&F, 0, 3, &done), 0);
        ck_assert_uint_eq(done, 3);
        ck_assert_uint_eq(E.n, 1);
}
END_TEST

/* clear() destroys the pending events, and the table starts over. */
START_TEST(test_clear) {
        ck_assert_int_eq(gm_fences_mark(&F, 1, 8), 0);
        ck_assert_int_eq(gm_fences_mark(&F, 2, 9), 0);
        gm_fences_clear(&F, true);
        ck_assert_uint_eq(E.destroyed, 2);
        ck_assert_int_eq(gm_fences_mark(&F, 1, 1), 0); /* numbers start over */
        E.done[2] = true;
        gm_fence_done_t out[GM_FENCE_STREAMS];
        ck_assert_uint_eq(gm_fences_report(&F, out), 1);
        ck_assert_uint_eq(out[0].fence, 1);
}
END_TEST

/* A central session's own check before an Alloc: only the streams freed on
 * since the last check are checked, once (an event recorded and queried at
 * once, none kept), those complete come out; a stream with marks pending
 * is not recorded on; every stream is clean afterwards, whatever the
 * answer; nothing is ever reported for a check. */
START_TEST(test_check_freed) {
        gm_fence_done_t done[GM_FENCE_STREAMS];
        uint64_t out[GM_FENCE_STREAMS];
        ck_assert_uint_eq(gm_fences_check_freed(&F, out), 0); /* no frees: nothing recorded */
        ck_assert_uint_eq(E.n, 0);
        gm_fences_freed(&F, 3);
        gm_fences_freed(&F, 3);
        ck_assert_uint_eq(F.n_freed, 1);
        ck_assert_uint_eq(gm_fences_check_freed(&F, out), 0); /* busy: pending */
        ck_assert_uint_eq(E.n, 1);
        ck_assert_uint_eq(E.destroyed, 1);
        ck_assert_uint_eq(F.n_freed, 0);
        ck_assert_uint_eq(gm_fences_check_freed(&F, out), 0); /* checked once: nothing recorded */
        ck_assert_uint_eq(E.n, 1);
        E.idle = true;
        gm_fences_freed(&F, 3);
        ck_assert_uint_eq(gm_fences_check_freed(&F, out), 1);
        ck_assert_uint_eq(out[0], 3);
        ck_assert_uint_eq(E.destroyed, 2);
        ck_assert_uint_eq(F.n_pending, 0);
        ck_assert_uint_eq(gm_fences_report(&F, done), 0);
        E.idle = false;
        ck_assert_int_eq(gm_fences_mark(&F, 3, 7), 0);
        E.idle = true;
        gm_fences_freed(&F, 3);
        gm_fences_freed(&F, 4);
        unsigned recorded = E.n, queries = E.queries;
        ck_assert_uint_eq(gm_fences_check_freed(&F, out), 1); /* 3 has a mark pending: only 4 */
        ck_assert_uint_eq(out[0], 4);
        ck_assert_uint_eq(E.n, recorded + 1);
        ck_assert_uint_eq(E.queries, queries + 1);
        ck_assert_uint_eq(F.n_freed, 0);
        gm_fences_freed(&F, 4);
        E.fail_record = -EIO;
        ck_assert_uint_eq(gm_fences_check_freed(&F, out), 0); /* refused: not complete */
        ck_assert_uint_eq(F.n_freed, 0);
        ck_assert_uint_eq(F.n_pending, 1);
}
END_TEST

int main(void) {
        Suite *s = suite_create("fence");
        TCase *tc = tcase_create("fifo");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_bounded_per_stream);
        tcase_add_test(tc, test_bounded_streams);
        tcase_add_test(tc, test_local_fence);
        tcase_add_test(tc, test_clear);
        tcase_add_test(tc, test_check_freed);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
