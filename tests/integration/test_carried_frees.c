/* Carried frees (GPUMEM_CARRY_FREES=1, central sessions): a free rides on
 * the next Alloc, or goes before any other message, 64 at most at a time, or
 * by the service thread within one caller grace; the daemon applies carried
 * frees before the allocation that carries them. Real gpumemd. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
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

static Gpumem__Envelope *raw_alloc(int fd, uint64_t request_id, uint64_t *freed, size_t n_freed) {
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 4096;
        alloc.freed_block_ids = freed;
        alloc.n_freed_block_ids = n_freed;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        return gm_test_raw_call(fd, &env);
}

/* Over the wire: a carried free is checked as a Free is (a block that is
 * not live refuses the Alloc, the session stays), its block serves the
 * Alloc that carries it, and a list longer than GM_CARRIED_FREES_MAX ends
 * the session. */
START_TEST(test_carried_frees_are_checked) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        Gpumem__Envelope *reply = raw_alloc(fd, 2, NULL, 0);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        uint64_t block = reply->alloc_reply->block_id, offset = reply->alloc_reply->offset;
        gm_msg_free(reply);
        uint64_t unknown = 424242;
        reply = raw_alloc(fd, 3, &unknown, 1);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, EINVAL);
        gm_msg_free(reply);
        reply = raw_alloc(fd, 4, &block, 1);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(reply->alloc_reply->offset, offset); /* the freed block, reused at once */
        block = reply->alloc_reply->block_id;
        gm_msg_free(reply);
        reply = raw_alloc(fd, 5, &block, 1);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        gm_msg_free(reply);
        reply = raw_alloc(fd, 6, &block, 1); /* a double free, carried */
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, EINVAL);
        gm_msg_free(reply);
        uint64_t many[GM_CARRIED_FREES_MAX + 1] = {0};
        reply = raw_alloc(fd, 7, many, GM_CARRIED_FREES_MAX + 1);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, EPROTO);
        gm_msg_free(reply);
        ck_assert_ptr_null(gm_test_raw_recv(fd)); /* the daemon closed the connection */
        close(fd);
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
        tcase_add_test(tc, test_carried_frees_are_checked);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
