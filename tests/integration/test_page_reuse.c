/* Page reuse (docs/page-reuse.md) through a real gpumemd, with this process
 * as its client, in both heap modes: the moved pages are the same physical
 * memory at the new address, live blocks keep their data, the client's,
 * the daemon's and the tenant's figures all say reserved = mapped pages,
 * the trace shows one segment_unmap per moved range, and a local heap on a
 * device backend moves no page whose stream work is not known complete.
 * Runs on the backend $GPUMEM_TEST_BACKEND names (host, or cuda over the
 * emulated driver). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "msg.h"
#include "testutil.h"
#ifdef GM_TEST_FAKECUDA
#include "fakecuda_check.h"
#endif

#define MiB (1024ull * 1024ull)
#define PAGE (2 * MiB)

static gm_test_daemon_t daemon_;
static const char *const reuse_args[] = {"--alloc-conf", "expandable_segments:True,gpumemd_page_reuse:True", NULL};
#ifdef GM_TEST_FAKECUDA
static char pool_path[64];
#endif

static bool on_cuda(void) {
        return strcmp(gm_test_backend(), "cuda") == 0;
}

static void start_with(const char *const *args) {
#ifdef GM_TEST_FAKECUDA
        if (on_cuda()) {
                gm_fake_new_pool(pool_path, sizeof(pool_path));
                setenv("FAKECUDA_CONTEXT_BYTES", "0", 1);
        }
#endif
        gm_test_daemon_start(&daemon_, "1G", args);
}

static void start(void) {
        start_with(reuse_args);
}

static void stop(void) {
        gm_test_daemon_stop(&daemon_);
#ifdef GM_TEST_FAKECUDA
        if (on_cuda())
                unlink(pool_path);
#endif
}

static gpumem_client *connect_mode(gpumem_heap_mode mode) {
        gpumem_client *c = NULL;
        int r = gpumem_connect_heap(daemon_.socket_path, mode, &c);
        ck_assert_msg(r == 0, "gpumem_connect_heap: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        ck_assert_int_eq(gpumem_heap(c), mode);
        return c;
}

static int64_t stat_of(gpumem_client *c, const char *name) {
        int64_t v = -1;
        ck_assert_int_eq(gpumem_stat(c, name, &v), 0);
        return v;
}

static void *alloc_ok(gpumem_client *c, size_t size) {
        void *p = NULL;
        int r = gpumem_alloc(c, size, 0, &p);
        ck_assert_msg(r == 0, "gpumem_alloc(%zu): %s (%s)", size, gpumem_strerror(r), gpumem_last_error(c));
        return p;
}

/* The first word of every page of [p, +size) says which page it is: the
 * pattern of seed tag + k, written as the suite's blocks are (by an emulated
 * kernel on the cuda backend, where the CPU cannot touch device memory). */
static void tag_pages(void *p, size_t size, uint64_t tag) {
        for (size_t k = 0; k < size / PAGE; k++)
                gm_test_fill((char *) p + k * PAGE, sizeof(uint64_t), tag + k);
}

/* Which of the n tags the page at p carries (read as tag_pages wrote it), or 0. */
static uint64_t page_tag(const void *page, const uint64_t *tags, size_t n) {
        for (size_t t = 0; t < n; t++)
                if (gm_test_verify(page, sizeof(uint64_t), tags[t]))
                        return tags[t];
        return 0;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return (x > y) - (x < y);
}

/* Packets the daemon has received from this process's session, this
 * listing's request included. */
static uint64_t session_requests(gpumem_client *c) {
        gpumem_client_info *list = NULL;
        size_t n = 0;
        uint64_t requests = 0;
        ck_assert_int_eq(gpumem_list_clients(c, &list, &n), 0);
        for (size_t i = 0; i < n; i++)
                if (list[i].pid == (uint32_t) getpid() && !list[i].control)
                        requests = list[i].requests;
        gpumem_buffer_free(list);
        ck_assert_uint_gt(requests, 0);
        return requests;
}

/* The pattern (bench/traces/frag_16m_32m.csv): 8 x 16 MiB, every
 * other one freed, then 4 x 32 MiB. Plain expandable segments reserve 260
 * MiB; with page reuse two 32 MiB requests take the 32 pages of the four
 * holes and only two map new memory: 192 MiB. The first two do, in both
 * heap modes and on both backends: on a device backend a local heap's fence
 * after the frees is complete at once, and a central client's Alloc says
 * its stream is past the frees it sent (an event recorded and found
 * complete before it), so its pages move in that very allocation. */
static void frag_pattern(gpumem_heap_mode mode, bool moves_expected) {
        start();
        gpumem_client *c = connect_mode(mode);
        ck_assert_int_eq(gpumem_history(c, true, 100000, NULL), 0);
        void *small[8], *big[4];
        for (int i = 0; i < 8; i++) {
                small[i] = alloc_ok(c, 16 * MiB);
                gm_test_fill(small[i], 16 * MiB, (uint64_t) i);
        }
        uint64_t want[32];
        size_t n_want = 0;
        for (int i = 0; i < 8; i += 2) {
                uint64_t tag = (uint64_t) (i + 1) << 32;
                tag_pages(small[i], 16 * MiB, tag);
                for (uint64_t k = 0; k < 16 * MiB / PAGE; k++)
                        want[n_want++] = tag + k;
                ck_assert_int_eq(gpumem_free(c, small[i]), 0);
        }
        /* The first 32 MiB block takes two holes' pages: a local heap says so in
         * one MovePieces per hole (a run of 8 pages), a central one's is the
         * Alloc itself; the listing is one more. */
        uint64_t before = session_requests(c);
        big[0] = alloc_ok(c, 32 * MiB);
        if (moves_expected)
                ck_assert_uint_eq(session_requests(c) - before, mode == GPUMEM_HEAP_LOCAL ? 3 : 2);
        big[1] = alloc_ok(c, 32 * MiB);
        /* The third maps 16 new pages: a local heap asks for the run in one
         * Grant (one per page before runs were granted at once), a central
         * one's is the Alloc itself; the listing is one more. */
        before = session_requests(c);
        big[2] = alloc_ok(c, 32 * MiB);
        ck_assert_uint_eq(session_requests(c) - before, 2);
        big[3] = alloc_ok(c, 32 * MiB);

        uint64_t reserved = moves_expected ? 192 * MiB : 256 * MiB;
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.peak"), (int64_t) reserved);
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), (int64_t) reserved);
        ck_assert_int_eq(stat_of(c, "requested_bytes.all.peak"), (int64_t) (192 * MiB));
        /* The daemon's books: the device's figures and the tenant's charge. */
        ck_assert_int_eq(
                gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", (int64_t) reserved),
                (int64_t) reserved);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), reserved);

        if (moves_expected) {
                /* The holes' own pages, now under the two 32 MiB blocks that moved them. */
                uint64_t got[32];
                for (int j = 0; j < 2; j++)
                        for (size_t k = 0; k < 32 * MiB / PAGE; k++)
                                got[j * 16 + k] = page_tag((char *) big[j] + k * PAGE, want, n_want);
                qsort(got, 32, sizeof(*got), cmp_u64);
                qsort(want, 32, sizeof(*want), cmp_u64);
                for (size_t k = 0; k < 32; k++)
                        ck_assert_msg(got[k] == want[k], "page %zu of the moving blocks: tag %llx, not a hole's %llx",
                                      k, (unsigned long long) got[k], (unsigned long long) want[k]);
        }
        for (int i = 1; i < 8; i += 2)
                ck_assert_msg(gm_test_verify(small[i], 16 * MiB, (uint64_t) i), "live block %d lost its data", i);
        for (int j = 0; j < 4; j++) {
                gm_test_fill(big[j], 32 * MiB, 100 + (uint64_t) j);
                ck_assert(gm_test_verify(big[j], 32 * MiB, 100 + (uint64_t) j));
        }

        /* Each move's source range is one segment_unmap; nothing else unmaps here. */
        char *snap = NULL;
        size_t len = 0;
        ck_assert_int_eq(gpumem_snapshot(c, GPUMEM_SNAPSHOT_JSON, (uint32_t) getpid(), (void **) &snap, &len), 0);
        ck_assert_uint_eq(gm_test_count(snap, "\"segment_unmap\""), moves_expected ? 4 : 0);
        ck_assert_uint_gt(gm_test_count(snap, "\"segment_map\""), 0);
        gpumem_buffer_free(snap);

        for (int i = 1; i < 8; i += 2)
                ck_assert_int_eq(gpumem_free(c, small[i]), 0);
        for (int j = 0; j < 4; j++)
                ck_assert_int_eq(gpumem_free(c, big[j]), 0);
        /* A local heap gives each mapped range back in one ReturnPieces per 64
         * pages: [16,32) [48,64) [80,96) one each, [112,256) two (96 before
         * runs were given back at once); on cuda (NVML checks returns by the
         * process's figure) each of the four give-backs is announced first by
         * a ReturnIntent, on host none is; the listing is one more. */
        before = session_requests(c);
        ck_assert_int_eq(gpumem_trim(c, NULL), 0);
        if (mode == GPUMEM_HEAP_LOCAL && moves_expected)
                ck_assert_uint_eq(session_requests(c) - before, strcmp(gm_test_backend(), "cuda") == 0 ? 10 : 6);
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 0);
        gpumem_disconnect(c);
        stop();
}

START_TEST(test_frag_local) {
        frag_pattern(GPUMEM_HEAP_LOCAL, true);
}
END_TEST

/* A central session's heap does not see its client's device work: on a
 * device backend its pages move once the client says an event it recorded
 * on the stream after their frees is complete. */
START_TEST(test_frag_central) {
        frag_pattern(GPUMEM_HEAP_CENTRAL, true);
}
END_TEST

/* A block freed on another stream than the request's gives its pages to
 * that very allocation in both heap modes (a central client on a device
 * backend checks every stream it freed on, not only the Alloc's). */
static void other_stream(gpumem_heap_mode mode) {
        start();
        gpumem_client *c = connect_mode(mode);
        void *a = NULL, *b = NULL;
        ck_assert_int_eq(gpumem_alloc(c, 16 * MiB, 1, &a), 0);
        ck_assert_int_eq(gpumem_alloc(c, 16 * MiB, 1, &b), 0);
        gm_test_fill(b, 16 * MiB, 3);
        ck_assert_int_eq(gpumem_free(c, a), 0);
        void *big = alloc_ok(c, 32 * MiB); /* stream 0: a's 8 pages and 8 new ones */
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), (int64_t) (48 * MiB));
        gm_test_fill(big, 32 * MiB, 4);
        ck_assert(gm_test_verify(big, 32 * MiB, 4));
        ck_assert(gm_test_verify(b, 16 * MiB, 3));
        ck_assert_int_eq(gpumem_free(c, b), 0);
        ck_assert_int_eq(gpumem_free(c, big), 0);
        gpumem_disconnect(c);
        stop();
}

START_TEST(test_other_stream_local) {
        other_stream(GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_other_stream_central) {
        other_stream(GPUMEM_HEAP_CENTRAL);
}
END_TEST

/* A run of new pages past the tenant's quota is refused as a whole: a 32 MiB
 * block (16 new pages in one Grant or one central create_run) at a 24 MiB
 * quota with 8 MiB held leaves nothing more charged or reserved, and the
 * same block fits once the quota allows it. */
static void run_past_quota(gpumem_heap_mode mode) {
        start();
        gpumem_client *admin = connect_mode(GPUMEM_HEAP_CENTRAL); /* uid 0: may set quotas */
        gpumem_client *c = connect_mode(mode);
        void *small = alloc_ok(c, 8 * MiB), *big = NULL;
        ck_assert_int_eq(gpumem_quota_set(admin, "uid:0", 24 * MiB, true), 0);
        int r = gpumem_alloc(c, 32 * MiB, 0, &big);
        ck_assert_msg(r == -EDQUOT, "gpumem_alloc: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 8 * MiB);
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), (int64_t) (8 * MiB));
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 8 * MiB), 8 * MiB);
        ck_assert_int_eq(gpumem_quota_set(admin, "uid:0", 40 * MiB, true), 0);
        big = alloc_ok(c, 32 * MiB);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 40 * MiB);
        gm_test_fill(big, 32 * MiB, 3);
        ck_assert(gm_test_verify(big, 32 * MiB, 3));
        ck_assert_int_eq(gpumem_free(c, big), 0);
        ck_assert_int_eq(gpumem_free(c, small), 0);
        ck_assert_int_eq(gpumem_quota_set(admin, "uid:0", 0, true), 0);
        gpumem_disconnect(c);
        gpumem_disconnect(admin);
        stop();
}

START_TEST(test_run_past_quota_local) {
        run_past_quota(GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_run_past_quota_central) {
        run_past_quota(GPUMEM_HEAP_CENTRAL);
}
END_TEST

#ifdef GM_TEST_FAKECUDA
static long event_queries(void) {
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        return u.event_queries;
}

static long event_records(void) {
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        return u.event_records;
}

/* A heap on a device backend, either mode: a freed block whose stream's
 * event has not completed gives no page (new memory is mapped, nothing
 * waits, however often asked); once the event completes, the next
 * allocation takes its pages. Events are recorded only after frees and
 * queried only then or while marks are pending: a central client checks
 * its stream once before an Alloc that follows frees (found pending here,
 * so the daemon asks for a mark), not while a mark there is pending (a
 * later event cannot be complete before it). */
static void refused_while_work_pending(gpumem_heap_mode mode) {
        start();
        char hold[400];
        snprintf(hold, sizeof(hold), "%s/hold-events", daemon_.dir);
        int fd = open(hold, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        setenv("FAKECUDA_HOLD_EVENTS", hold, 1);
        gpumem_client *c = connect_mode(mode);
        ck_assert_int_eq(gpumem_history(c, true, 100000, NULL), 0);
        long records = event_records(), queries = event_queries();
        void *a = alloc_ok(c, 16 * MiB), *b = alloc_ok(c, 16 * MiB);
        ck_assert_int_eq(event_records(), records); /* no frees before them */
        ck_assert_int_eq(event_queries(), queries);
        ck_assert_int_eq(gpumem_free(c, a), 0);
        void *big = alloc_ok(c, 32 * MiB); /* a's fence is marked now, pending: 32 MiB new */
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), (int64_t) (64 * MiB));
        if (mode == GPUMEM_HEAP_CENTRAL) { /* its own check (pending), then the mark the daemon asked for */
                ck_assert_int_eq(event_records(), records + 2);
                ck_assert_int_eq(event_queries(), queries + 1);
        }
        records = event_records();
        void *mid = alloc_ok(c, 32 * MiB); /* still pending: 32 MiB new again */
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), (int64_t) (96 * MiB));
        ck_assert_int_gt(event_queries(), queries + 1);
        if (mode == GPUMEM_HEAP_CENTRAL)
                ck_assert_int_eq(event_records(), records); /* a mark is pending there: no check */
        unlink(hold);
        void *big2 = alloc_ok(c, 32 * MiB); /* a's 8 pages and 8 new ones */
        ck_assert_int_eq(stat_of(c, "reserved_bytes.all.current"), (int64_t) (112 * MiB));
        ck_assert_int_eq(
                gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", (int64_t) (112 * MiB)),
                (int64_t) (112 * MiB));
        gm_test_fill(big2, 32 * MiB, 7);
        ck_assert(gm_test_verify(big2, 32 * MiB, 7));
        /* The mark completed and was popped: a cached allocation with no free
         * before it records and queries nothing. */
        queries = event_queries();
        records = event_records();
        void *small = alloc_ok(c, 1 * MiB);
        ck_assert_int_eq(event_queries(), queries);
        ck_assert_int_eq(event_records(), records);
        /* Nor one after the free of a block smaller than a page (central: not checked). */
        ck_assert_int_eq(gpumem_free(c, small), 0);
        small = alloc_ok(c, 1 * MiB);
        ck_assert_int_eq(event_records(), records);
        char *snap = NULL;
        size_t len = 0;
        ck_assert_int_eq(gpumem_snapshot(c, GPUMEM_SNAPSHOT_JSON, (uint32_t) getpid(), (void **) &snap, &len), 0);
        ck_assert_uint_eq(gm_test_count(snap, "\"segment_unmap\""), 1); /* a's pages, one run */
        gpumem_buffer_free(snap);
        unsetenv("FAKECUDA_HOLD_EVENTS");
        ck_assert_int_eq(gpumem_free(c, small), 0);
        ck_assert_int_eq(gpumem_free(c, b), 0);
        ck_assert_int_eq(gpumem_free(c, big), 0);
        ck_assert_int_eq(gpumem_free(c, mid), 0);
        ck_assert_int_eq(gpumem_free(c, big2), 0);
        gpumem_disconnect(c);
        gm_fake_assert_no_objects();
        stop();
}

START_TEST(test_move_refused_while_work_pending_local) {
        refused_while_work_pending(GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_move_refused_while_work_pending_central) {
        refused_while_work_pending(GPUMEM_HEAP_CENTRAL);
}
END_TEST

/* Without page reuse a central client on a device backend records and
 * queries no event for its frees (plain frees, then allocations). */
START_TEST(test_no_fences_without_page_reuse) {
        static const char *const plain_args[] = {"--alloc-conf", "expandable_segments:True", NULL};
        start_with(plain_args);
        gpumem_client *c = connect_mode(GPUMEM_HEAP_CENTRAL);
        long records = event_records(), queries = event_queries();
        void *a = alloc_ok(c, 16 * MiB), *b = alloc_ok(c, 16 * MiB);
        ck_assert_int_eq(gpumem_free(c, a), 0);
        void *big = alloc_ok(c, 32 * MiB);
        ck_assert_int_eq(gpumem_free(c, b), 0);
        void *small = alloc_ok(c, 1 * MiB);
        ck_assert_int_eq(event_records(), records);
        ck_assert_int_eq(event_queries(), queries);
        ck_assert_int_eq(gpumem_free(c, big), 0);
        ck_assert_int_eq(gpumem_free(c, small), 0);
        gpumem_disconnect(c);
        stop();
}
END_TEST
#endif

/* A raw central client's allocation of `size` on stream 0 (request `id`),
 * reporting fence `fence` of `fence_stream` complete when `report`, and its
 * stream past its frees when `fenced`: its reply, the fds it carried closed. */
static Gpumem__Envelope *raw_alloc_claim(int fd, uint64_t id, uint64_t size, bool report, uint64_t fence_stream,
                                         uint64_t fence, bool fenced) {
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = size;
        alloc.frees_fenced = fenced;
        Gpumem__StreamFence done = GPUMEM__STREAM_FENCE__INIT, *done_ptr = &done;
        done.stream = fence_stream;
        done.fence = fence;
        if (report) {
                alloc.n_fences_done = 1;
                alloc.fences_done = &done_ptr;
        }
        gm_test_raw_send_body(fd, id, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        for (;;) {
                Gpumem__Envelope *e = gm_test_raw_recv(fd);
                if (!e || (e->request_id == id && e->body_case != GPUMEM__ENVELOPE__BODY_MAP_SEGMENTS))
                        return e;
                gm_msg_free(e);
        }
}

static Gpumem__Envelope *raw_alloc_report(int fd, uint64_t id, uint64_t size, bool report, uint64_t fence_stream,
                                          uint64_t fence) {
        return raw_alloc_claim(fd, id, size, report, fence_stream, fence, false);
}

static Gpumem__Envelope *raw_alloc(int fd, uint64_t id, uint64_t size) {
        return raw_alloc_report(fd, id, size, false, 0, 0);
}

/* Asserts that the daemon refuses the report (EPROTO) and closes. */
static void assert_report_refused(int fd, Gpumem__Envelope *e) {
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error->code, EPROTO);
        ck_assert_msg(strstr(e->error->message, "stream fences"), "%s", e->error->message);
        gm_msg_free(e);
        ck_assert_ptr_null(gm_test_raw_recv(fd));
        close(fd);
}

/* A raw central session with two 16 MiB blocks, the first freed: its fd;
 * *ret_fences whether its HelloReply says the client marks fences. */
static int raw_session_with_hole(bool *ret_fences) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        Gpumem__Envelope *e = gm_test_raw_hello_reply(fd, false, "page-reuse-test", NULL);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        *ret_fences = e->hello_reply->client_fences;
        gm_msg_free(e);
        e = raw_alloc(fd, 2, 16 * MiB);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = e->alloc_reply->block_id;
        gm_msg_free(e);
        gm_msg_free(raw_alloc(fd, 3, 16 * MiB));
        gm_test_raw_send_body(fd, 4, GPUMEM__ENVELOPE__BODY_FREE, &f);
        return fd;
}

/* The client's claim that its stream is past its frees (Alloc.frees_fenced):
 * on a device backend the hole's pages move in that very allocation and no
 * mark is asked for; the number it stands for is the last it may report
 * (one above is refused). On the host backend (frees are synchronous, the
 * HelloReply asks for no such claim) it changes nothing. */
START_TEST(test_central_frees_fenced) {
        start();
        bool fences;
        int fd = raw_session_with_hole(&fences);
        ck_assert(fences == on_cuda());
        Gpumem__Envelope *e = raw_alloc_claim(fd, 5, 32 * MiB, false, 0, 0, true);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(e->alloc_reply->n_page_moves, 8);
        ck_assert_uint_eq(e->alloc_reply->n_fence_marks, 0);
        gm_msg_free(e);
        if (on_cuda()) {
                /* Frees so far: 1 (the hole), so fence 1 is the most it may report. */
                e = raw_alloc_report(fd, 6, 1 * MiB, true, 0, 1);
                ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
                gm_msg_free(e);
                assert_report_refused(fd, raw_alloc_report(fd, 7, 1 * MiB, true, 0, 2));
        } else {
                close(fd);
        }
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);

        /* More streams than a session tracks: refused, on either backend. */
        fd = raw_session_with_hole(&fences);
        uint64_t streams[65] = {0};
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 1 * MiB;
        alloc.n_other_frees_fenced = 65;
        alloc.other_frees_fenced = streams;
        gm_test_raw_send_body(fd, 5, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        e = gm_test_raw_recv(fd);
        while (e && e->request_id != 5) {
                gm_msg_free(e);
                e = gm_test_raw_recv(fd);
        }
        assert_report_refused(fd, e);
        stop();
}
END_TEST

/* The client's report of complete fences is untrusted: a fence it was never
 * asked to mark (nor marked on its own, see test_central_frees_fenced) ends
 * its session (its memory goes); an honest report is taken. On the host backend no
 * fence is ever asked for. */
START_TEST(test_central_lying_report) {
        start();
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        assert_report_refused(fd, raw_alloc_report(fd, 2, 16 * MiB, true, 0, 1)); /* nothing was ever marked */

        bool fences;
        fd = raw_session_with_hole(&fences);
        Gpumem__Envelope *e = raw_alloc(fd, 5, 32 * MiB); /* the hole's fence is asked for on a device backend */
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(e->alloc_reply->n_fence_marks, on_cuda() ? 1 : 0);
        uint64_t fence = on_cuda() ? e->alloc_reply->fence_marks[0]->fence : 0;
        ck_assert_uint_eq(e->alloc_reply->n_page_moves, on_cuda() ? 0 : 8); /* host: frees are synchronous */
        if (on_cuda()) {
                ck_assert_uint_eq(e->alloc_reply->fence_marks[0]->stream, 0);
                ck_assert_uint_gt(fence, 0);
        }
        gm_msg_free(e);
        if (on_cuda()) {
                assert_report_refused(fd,
                                      raw_alloc_report(fd, 6, 32 * MiB, true, 7, fence)); /* a stream never marked */
                ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
                stop();
                return;
        }
        assert_report_refused(fd, raw_alloc_report(fd, 6, 32 * MiB, true, 0, 1));
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        stop();
}
END_TEST

#ifdef GM_TEST_FAKECUDA
/* On a device backend: the fence number asked for is taken once reported
 * (the hole's pages move), again is fine, a number below it is stale and
 * changes nothing, a number above it is refused. */
static int raw_session_with_fence(uint64_t *ret_fence) {
        bool fences;
        int fd = raw_session_with_hole(&fences);
        Gpumem__Envelope *e = raw_alloc(fd, 5, 32 * MiB);
        ck_assert_uint_eq(e->alloc_reply->n_fence_marks, 1);
        *ret_fence = e->alloc_reply->fence_marks[0]->fence;
        gm_msg_free(e);
        return fd;
}

START_TEST(test_central_report_bounds) {
        start();
        uint64_t fence;
        int fd = raw_session_with_fence(&fence);
        assert_report_refused(fd, raw_alloc_report(fd, 6, 32 * MiB, true, 0, fence + 1)); /* above what was asked */

        fd = raw_session_with_fence(&fence);
        Gpumem__Envelope *e = raw_alloc_report(fd, 6, 32 * MiB, true, 0, fence); /* honest: the hole's 8 pages move */
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(e->alloc_reply->n_page_moves, 8);
        gm_msg_free(e);
        e = raw_alloc_report(fd, 7, 1 * MiB, true, 0, fence); /* the same number again */
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        gm_msg_free(e);
        e = raw_alloc_report(fd, 8, 1 * MiB, true, 0, fence - 1); /* below: stale, it changes nothing */
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        gm_msg_free(e);
        assert_report_refused(fd, raw_alloc_report(fd, 9, 1 * MiB, true, 0, fence + 1)); /* still above */
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        stop();
}
END_TEST
#endif

int main(void) {
        Suite *s = suite_create("page_reuse");
        TCase *tc = tcase_create("daemon");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_frag_local);
        tcase_add_test(tc, test_frag_central);
        tcase_add_test(tc, test_other_stream_local);
        tcase_add_test(tc, test_other_stream_central);
        tcase_add_test(tc, test_central_lying_report);
        tcase_add_test(tc, test_central_frees_fenced);
        tcase_add_test(tc, test_run_past_quota_local);
        tcase_add_test(tc, test_run_past_quota_central);
#ifdef GM_TEST_FAKECUDA
        if (on_cuda()) {
                tcase_add_test(tc, test_move_refused_while_work_pending_local);
                tcase_add_test(tc, test_move_refused_while_work_pending_central);
                tcase_add_test(tc, test_no_fences_without_page_reuse);
                tcase_add_test(tc, test_central_report_bounds);
        }
#endif
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
