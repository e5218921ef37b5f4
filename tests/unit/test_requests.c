/* The request table in process: a real broker on the host backend, the
 * handlers' one sender replaced by a recorder. Order rules, one admin
 * refusal, limits before handlers, every kind timed, and an allocation whose
 * reply cannot be built (calloc fails: linked with --wrap=calloc) gives the
 * client an error and the block back. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker-internal.h"
#include "local.h"
#include "msg.h"
#include "requests.h"
#include "testutil.h"

#define MiB (1ull << 20)

/* ---- calloc, failing on demand for one element size ---- */

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
static size_t fail_calloc_of_size_;

void *__wrap_calloc(size_t n, size_t size) {
        if (fail_calloc_of_size_ && size == fail_calloc_of_size_)
                return NULL;
        return __real_calloc(n, size);
}

/* ---- the recorder ---- */

#define MAX_SENT 16

typedef struct sent {
        uint64_t request_id;
        Gpumem__Envelope__BodyCase body;
        int error;
        char message[512];
        size_t n_fds;
        size_t n_mappings;
} sent_t;

static sent_t sent_[MAX_SENT];
static size_t n_sent_;
static unsigned observed_[32];

static int record_send(void *userdata, gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds,
                       size_t n_fds) {
        ck_assert_uint_lt(n_sent_, MAX_SENT);
        sent_t *s = &sent_[n_sent_++];
        *s = (sent_t){.request_id = request_id, .body = env->body_case, .n_fds = n_fds};
        if (env->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                s->error = (int) env->error->code;
                snprintf(s->message, sizeof(s->message), "%s", env->error->message);
        }
        if (env->body_case == GPUMEM__ENVELOPE__BODY_ALLOC_REPLY)
                s->n_mappings = env->alloc_reply->n_new_mappings;
        return 0;
}

static void record_observe(void *userdata, unsigned op, uint64_t ns) {
        ck_assert_uint_lt(op, 32);
        observed_[op]++;
}

static gm_backend_t *backend_;
static gm_broker_t *broker_;
static gm_request_config_t config_ = {.max_packet = 65536, .max_fds = 16};
static gm_localstats_totals_t local_;
static gm_requests_t rq_;
static gm_request_conn_t conn_;

static void setup(void) {
        char err[256];
        gm_backend_options_t bopts = {.kind = "host", .capacity = 256 * MiB};
        ck_assert_int_eq(gm_backend_host_open(&bopts, &backend_, err, sizeof(err)), 0);
        gm_alloc_config_t conf;
        ck_assert_int_eq(gm_alloc_config_parse(NULL, &conf, err, sizeof(err)), 0);
        gm_broker_params_t params = {
                .backend = backend_,
                .alloc_config = &conf,
                .limits = {.max_blocks_per_session = 1000, .max_parked_per_session = 8, .park_timeout_ms = 1000},
        };
        ck_assert_int_eq(gm_broker_new(&params, &broker_), 0);
        rq_ = (gm_requests_t){.broker = broker_,
                              .config = &config_,
                              .local = &local_,
                              .send = record_send,
                              .observe = record_observe};
        gm_session_params_t sp = {.pid = getpid(), .uid = 4242, .admin = false, .userdata = &conn_};
        conn_ = (gm_request_conn_t){.rq = &rq_};
        snprintf(conn_.tenant_name, sizeof(conn_.tenant_name), "t");
        ck_assert_int_eq(gm_session_new(broker_, &sp, &conn_.session), 0);
        n_sent_ = 0;
        memset(observed_, 0, sizeof(observed_));
        fail_calloc_of_size_ = 0;
}

static void teardown(void) {
        gm_local_end(&conn_);
        gm_session_free(conn_.session);
        gm_localstats_free_all(&rq_);
        char why[256];
        ck_assert_msg(gm_broker_check(broker_, why, sizeof(why)) == 0, "%s", why);
        broker_ = gm_broker_free(broker_);
        ck_assert_uint_eq(backend_->in_use, 0);
        backend_ = gm_backend_close(backend_);
}

static int dispatch(Gpumem__Envelope *env, uint64_t request_id) {
        env->request_id = request_id;
        int r = gm_requests_dispatch(&conn_, env, NULL, 0);
        char why[256];
        ck_assert_msg(gm_broker_check(broker_, why, sizeof(why)) == 0, "%s", why);
        return r;
}

static void hello(void) {
        Gpumem__Hello h = GPUMEM__HELLO__INIT;
        h.protocol_version = GM_PROTOCOL_VERSION;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &h;
        ck_assert_int_eq(dispatch(&env, 1), 0);
        ck_assert_int_eq(sent_[n_sent_ - 1].body, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
}

static void alloc(uint64_t size, uint64_t request_id) {
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        a.size = size;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &a;
        ck_assert_int_eq(dispatch(&env, request_id), 0);
}

START_TEST(test_order_admin_and_limits) {
        /* Nothing before Hello. */
        Gpumem__Clients cl = GPUMEM__CLIENTS__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_CLIENTS;
        env.clients = &cl;
        ck_assert_int_eq(dispatch(&env, 2), -EPROTO);
        ck_assert_int_eq(sent_[0].error, EPROTO);
        ck_assert_str_eq(sent_[0].message, "gpumemd: the first request must be Hello");
        hello();

        /* An admin-only request of a non-admin: refused once, in one phrasing, and still timed. */
        Gpumem__Quota q = GPUMEM__QUOTA__INIT;
        q.op = GPUMEM__QUOTA_OP__QUOTA_OP_SET;
        q.tenant = "t";
        q.bytes = MiB;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_QUOTA;
        env.quota = &q;
        ck_assert_int_eq(dispatch(&env, 3), 0);
        ck_assert_int_eq(sent_[n_sent_ - 1].error, EPERM);
        ck_assert_str_eq(sent_[n_sent_ - 1].message,
                         "gpumemd: setting quotas needs admin rights (uid 0 or the admin group)");
        ck_assert_uint_eq(gm_tenant_find(broker_, "t")->quota, 0);
        ck_assert_uint_eq(observed_[gm_requests_index(GPUMEM__ENVELOPE__BODY_QUOTA)], 1);

        /* A limit refused before the handler; history needs admin first. */
        gm_session_t *s = conn_.session;
        s->admin = true; /* as the server would have decided at connect */
        Gpumem__HistoryControl h = GPUMEM__HISTORY_CONTROL__INIT;
        h.enabled = true;
        h.max_entries = 200000000;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HISTORY_CONTROL;
        env.history_control = &h;
        ck_assert_int_eq(dispatch(&env, 4), 0);
        ck_assert_int_eq(sent_[n_sent_ - 1].error, EINVAL);
        ck_assert_ptr_null(broker_->history); /* the handler never ran */

        /* Asking for more statistic names than the limit is refused before the handler. */
        static char *names[1025];
        for (size_t i = 0; i < 1025; i++)
                names[i] = "allocated_bytes.all.current";
        Gpumem__Stats st = GPUMEM__STATS__INIT;
        st.n_names = 1025;
        st.names = names;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        env.stats = &st;
        ck_assert_int_eq(dispatch(&env, 6), 0);
        ck_assert_int_eq(sent_[n_sent_ - 1].error, E2BIG);
        st.n_names = 1;
        ck_assert_int_eq(dispatch(&env, 7), 0);
        ck_assert_int_eq(sent_[n_sent_ - 1].body, GPUMEM__ENVELOPE__BODY_STATS_REPLY);

        /* A Reattach without a resuming Hello ends the connection. */
        Gpumem__Reattach ra = GPUMEM__REATTACH__INIT;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_REATTACH;
        env.reattach = &ra;
        ck_assert_int_eq(dispatch(&env, 5), -EPROTO);
        ck_assert_uint_eq(observed_[gm_requests_index(GPUMEM__ENVELOPE__BODY_REATTACH)], 1);
        ck_assert_uint_eq(observed_[gm_requests_index(GPUMEM__ENVELOPE__BODY_HELLO)], 1);
        ck_assert_uint_eq(observed_[gm_requests_index(GPUMEM__ENVELOPE__BODY_CLIENTS)], 0); /* refused by order */
}
END_TEST

/* The reply of an allocation cannot be built: the client hears -ENOMEM, the
 * block is back in the heap, and the segment reaches the client with the
 * next reply. */
START_TEST(test_unbuildable_reply_gives_an_error_and_the_block_back) {
        hello();
        fail_calloc_of_size_ = sizeof(Gpumem__Mapping);
        alloc(1 * MiB, 10);
        fail_calloc_of_size_ = 0;
        sent_t *e = &sent_[n_sent_ - 1];
        ck_assert_uint_eq(e->request_id, 10);
        ck_assert_int_eq(e->body, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error, ENOMEM);
        ck_assert_ptr_nonnull(strstr(e->message, "out of memory"));
        const gm_stats_t *st = gm_heap_stats(conn_.session->heap);
        ck_assert_int_eq(st->allocated_bytes[GM_STAT_ALL].current, 0);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_ALL].current, 2 * (int64_t) MiB);

        alloc(1 * MiB, 11);
        e = &sent_[n_sent_ - 1];
        ck_assert_int_eq(e->body, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(e->n_mappings, 1); /* the segment made for request 10 */
        ck_assert_uint_eq(e->n_fds, 1);
        ck_assert_int_eq(st->allocated_bytes[GM_STAT_ALL].current, 1 * (int64_t) MiB);
        ck_assert_uint_eq(observed_[gm_requests_index(GPUMEM__ENVELOPE__BODY_ALLOC)], 2);
}
END_TEST

int main(void) {
        Suite *s = suite_create("requests");
        TCase *tc = tcase_create("table");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_order_admin_and_limits);
        tcase_add_test(tc, test_unbuildable_reply_gives_an_error_and_the_block_back);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
