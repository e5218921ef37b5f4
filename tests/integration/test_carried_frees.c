/* Carried frees (GPUMEM_CARRY_FREES=1, central sessions): a free rides on
 * the next Alloc, or goes before any other message, 64 at most at a time, or
 * by the service thread within one caller grace; the daemon applies carried
 * frees before the allocation that carries them. Real gpumemd. */
#include <check.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "testutil.h"

static gm_test_daemon_t daemon_;

static void setup(void) {
        setenv("GPUMEM_CARRY_FREES", "1", 1);
        gm_test_daemon_start(&daemon_, "256M", NULL);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static gpumem_client *connect_central(void) {
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_CENTRAL, &c), 0);
        return c;
}

static int64_t session_stat(gpumem_client *c, const char *name) {
        int64_t v = -1;
        ck_assert_int_eq(gpumem_stat(c, name, &v), 0);
        return v;
}

/* The carried free's block is the very one the next Alloc gets back, and
 * the session's statistics (a Stats request: carried frees go first) agree. */
START_TEST(test_carried_free_is_reused_by_the_next_alloc) {
        gpumem_client *c = connect_central();
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 1 << 20, 0, &p), 0);
        for (int i = 0; i < 1000; i++) {
                ck_assert_int_eq(gpumem_free(c, p), 0);
                ck_assert_int_eq(gpumem_alloc(c, 1 << 20, 0, &q), 0);
                ck_assert_ptr_eq(q, p);
        }
        ck_assert_int_eq(session_stat(c, "allocation.all.current"), 1);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(session_stat(c, "allocation.all.current"), 0);
        ck_assert_int_eq(session_stat(c, "num_alloc_retries"), 0);
        gpumem_disconnect(c);
}
END_TEST

/* More frees than one message carries: sent 64 at a time, none lost, none twice. */
START_TEST(test_many_frees_in_a_row) {
        gpumem_client *c = connect_central();
        enum { N = 200 };
        void *ptrs[N];
        for (int i = 0; i < N; i++)
                ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &ptrs[i]), 0);
        for (int i = 0; i < N; i++)
                ck_assert_int_eq(gpumem_free(c, ptrs[i]), 0);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &p), 0);
        ck_assert_int_eq(session_stat(c, "allocation.all.current"), 1);
        ck_assert_int_eq(session_stat(c, "allocation.all.freed"), N);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
}
END_TEST

/* Another connection sees a carried free once the service thread sent it
 * (within one caller grace), with no further call from the client. */
START_TEST(test_carried_free_reaches_the_daemon_without_a_call) {
        gpumem_client *c = connect_central();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 2 << 20, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "allocated_bytes.all.current", 0), 0);
        /* Long after the last call, a free is sent at once. */
        ck_assert_int_eq(gpumem_alloc(c, 2 << 20, 0, &p), 0);
        usleep(50000);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "allocated_bytes.all.current", 0), 0);
        gpumem_disconnect(c);
}
END_TEST

/* Carried frees still unsent when the session ends reach the daemon first. */
START_TEST(test_disconnect_sends_carried_frees) {
        gpumem_client *c = connect_central();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "allocation.all.freed", 1), 1);
}
END_TEST

int main(void) {
        Suite *s = suite_create("carried_frees");
        TCase *tc = tcase_create("core");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_carried_free_is_reused_by_the_next_alloc);
        tcase_add_test(tc, test_many_frees_in_a_row);
        tcase_add_test(tc, test_carried_free_reaches_the_daemon_without_a_call);
        tcase_add_test(tc, test_disconnect_sends_carried_frees);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
