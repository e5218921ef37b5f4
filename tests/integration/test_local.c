/* Local heaps end to end: a real gpumemd, real client processes whose heap
 * runs in libgpumem. The daemon's ledger (charged, reserved, segments) must
 * stay exact, the steady state must send nothing, the statistics page must
 * agree with the client and must not be trusted. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

static gm_test_daemon_t daemon_;

static void setup(void) {
        gm_test_daemon_start(&daemon_, "256M", NULL);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static gpumem_client *connect_mode(gpumem_heap_mode mode) {
        gpumem_client *c = NULL;
        int r = gpumem_connect_heap(daemon_.socket_path, mode, &c);
        ck_assert_msg(r == 0, "gpumem_connect_heap: %s", gpumem_strerror(r));
        return c;
}

static int wait_child(pid_t pid) {
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The integer after `"key": ` in `text` from `from` on; -1 if absent. */
static int64_t json_int(const char *text, const char *key) {
        char pat[96];
        snprintf(pat, sizeof(pat), "\"%s\": ", key);
        const char *p = strstr(text, pat);
        return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* `gpumemctl clients --json`, from the entry of `pid` on (NULL if none). */
static const char *client_entry(char *out, size_t len, pid_t pid) {
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, len, argv), 0);
        char pat[48];
        snprintf(pat, sizeof(pat), "\"pid\": %d,", (int) pid);
        return strstr(out, pat);
}

static int64_t session_requests(pid_t pid) {
        char out[16384];
        const char *e = client_entry(out, sizeof(out), pid);
        ck_assert_ptr_nonnull(e);
        return json_int(e, "requests");
}

/* One "training step": a mix of sizes, a third kept across the step. */
static void step(gpumem_client *c, void **keep, size_t n_keep) {
        void *tmp[64];
        for (size_t i = 0; i < 64; i++) {
                size_t size = 512 + (i * 7919) % (3 * MiB);
                int r = gpumem_alloc(c, size, i % 2, &tmp[i]);
                ck_assert_msg(r == 0, "alloc %zu: %s", size, gpumem_last_error(c));
                ((char *) tmp[i])[0] = (char) i;
        }
        for (size_t i = 0; i < n_keep; i++) {
                if (keep[i])
                        ck_assert_int_eq(gpumem_free(c, keep[i]), 0);
                keep[i] = tmp[i];
        }
        for (size_t i = n_keep; i < 64; i++)
                ck_assert_int_eq(gpumem_free(c, tmp[i]), 0);
}

START_TEST(test_steady_state_sends_nothing) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_DEFAULT);
        ck_assert_int_eq(gpumem_heap(c), GPUMEM_HEAP_LOCAL);
        void *keep[20] = {0};
        step(c, keep, 20); /* warm-up: the heap gets its segments */
        step(c, keep, 20);
        int64_t before = session_requests(getpid());
        ck_assert_int_gt(before, 0); /* Hello and the grants */
        for (int i = 0; i < 200; i++)
                step(c, keep, 20);
        ck_assert_int_eq(session_requests(getpid()), before);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
}
END_TEST

/* gpumemctl's figures for the process equal the client's own. */
START_TEST(test_gpumemctl_stats_equal_client) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_LOCAL);
        void *p[10];
        for (int i = 0; i < 10; i++)
                ck_assert_int_eq(gpumem_alloc(c, (size_t) (i + 1) * 300000, 0, &p[i]), 0);
        for (int i = 0; i < 10; i += 3)
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        char out[16384], pid[16];
        snprintf(pid, sizeof(pid), "%d", (int) getpid());
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--json", "--pid", pid, NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        static const char *const names[] = {
                "allocated_bytes.all.current",        "reserved_bytes.all.current",      "active_bytes.all.current",
                "requested_bytes.all.current",        "allocation.all.current",          "segment.all.current",
                "allocated_bytes.large_pool.current", "inactive_split_bytes.all.current"};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                int64_t mine;
                ck_assert_int_eq(gpumem_stat(c, names[i], &mine), 0);
                ck_assert_msg(json_int(out, names[i]) == mine, "%s: gpumemctl %" PRId64 ", client %" PRId64, names[i],
                              json_int(out, names[i]), mine);
        }
        /* The device's figures hold the session's, its reserved bytes exactly. */
        int64_t reserved;
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &reserved), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), reserved);
        uint64_t released = 0;
        for (int i = 0; i < 10; i++)
                if (i % 3)
                        ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_eq(released, (uint64_t) reserved);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), 0);
        gpumem_disconnect(c);
}
END_TEST

/* A child process with a local session of its own holding one block of
 * `size` (freed into its cache when `cache`). It runs `before` (may be NULL),
 * says it is ready, waits for the go, and exits with `after`'s status (0
 * when NULL); a failed step exits 10..12. */
typedef struct local_child {
        pid_t pid;
        int go;
} local_child_t;

static local_child_t local_child_start(size_t size, bool cache, int (*before)(gpumem_client *),
                                       int (*after)(gpumem_client *)) {
        int ready[2], go[2];
        ck_assert_int_eq(pipe(ready), 0);
        ck_assert_int_eq(pipe(go), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                gpumem_client *cc = NULL;
                void *p;
                if (gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_LOCAL, &cc) < 0 ||
                    gpumem_alloc(cc, size, 0, &p) < 0 || (cache && gpumem_free(cc, p) < 0))
                        _exit(10);
                if (before && before(cc) != 0)
                        _exit(11);
                char b = 1;
                if (write(ready[1], &b, 1) != 1 || read(go[0], &b, 1) != 1)
                        _exit(12);
                _exit(after ? after(cc) : 0);
        }
        close(ready[1]);
        close(go[0]);
        char b;
        ck_assert_int_eq(read(ready[0], &b, 1), 1);
        close(ready[0]);
        return (local_child_t){.pid = pid, .go = go[1]};
}

static int local_child_finish(local_child_t *ch) {
        char b = 1;
        ck_assert_int_eq(write(ch->go, &b, 1), 1);
        close(ch->go);
        return wait_child(ch->pid);
}

/* Overwrites the calling process's statistics page with huge figures whose
 * pools do not add up. */
static int scribble_stats_page(gpumem_client *c) {
        uint8_t *page = gm_test_own_stats_page();
        if (!page)
                return 1;
        memset(page + 64, 0x7f, 4096 - 64);
        return 0;
}

/* A client scribbling over its statistics page changes no other session's
 * figures, no quota and no charge; the daemon flags it. */
START_TEST(test_garbage_stats_page_is_contained) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_LOCAL);
        void *mine;
        ck_assert_int_eq(gpumem_alloc(c, 3 * MiB, 0, &mine), 0);
        int64_t my_reserved;
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &my_reserved), 0);
        local_child_t child = local_child_start(1 * MiB, false, scribble_stats_page, NULL);
        pid_t pid = child.pid;
        char out[16384];
        const char *e = client_entry(out, sizeof(out), pid);
        ck_assert_ptr_nonnull(e);
        ck_assert_ptr_nonnull(strstr(e, "\"stats_page_invalid\": true"));
        ck_assert_int_eq(json_int(e, "allocated_bytes"), 0); /* its block figures count as zero */
        ck_assert_int_eq(json_int(e, "reserved_bytes"),
                         2 * (int64_t) MiB); /* its small segment: the daemon's own figure */
        e = client_entry(out, sizeof(out), getpid());
        ck_assert_ptr_nonnull(strstr(e, "\"stats_page_invalid\": false"));
        ck_assert_int_eq(json_int(e, "allocated_bytes"), 3 * (int64_t) MiB);
        /* Device figures: only this process's blocks; reserved is everyone's, exactly. */
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocated_bytes.all.current"), 3 * (int64_t) MiB);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"),
                         my_reserved + 2 * (int64_t) MiB);
        /* The tenant's charge is what was granted, whatever the page says. */
        char tenant[32];
        snprintf(tenant, sizeof(tenant), "uid:%u", (unsigned) getuid());
        ck_assert_int_eq((int64_t) gm_test_tenant_charged(daemon_.socket_path, tenant),
                         my_reserved + 2 * (int64_t) MiB);
        ck_assert_int_eq(local_child_finish(&child), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", my_reserved),
                         my_reserved);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocated_bytes.all.current"), 3 * (int64_t) MiB);
        gpumem_disconnect(c);
}
END_TEST

/* A SIGKILLed local client leaks nothing: its pieces go back to the device. */
START_TEST(test_sigkilled_local_client_leaks_nothing) {
        /* The baseline after one connection came and went (whatever the daemon opens once). */
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), 0);
        int daemon_fds = gm_test_count_fds(daemon_.pid);
        int ready[2];
        ck_assert_int_eq(pipe(ready), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                gpumem_client *cc = NULL;
                void *p[8];
                if (gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_LOCAL, &cc) < 0)
                        _exit(10);
                for (int i = 0; i < 8; i++)
                        if (gpumem_alloc(cc, (size_t) (i + 1) * 3 * MiB, 0, &p[i]) < 0)
                                _exit(11);
                for (int i = 0; i < 8; i += 2)
                        gpumem_free(cc, p[i]);
                char b = 1;
                if (write(ready[1], &b, 1) != 1)
                        _exit(12);
                pause();
                _exit(0);
        }
        char b;
        ck_assert_int_eq(read(ready[0], &b, 1), 1);
        ck_assert_int_gt(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), 0);
        kill(pid, SIGKILL);
        ck_assert_int_eq(wait_child(pid), 128 + SIGKILL);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocated_bytes.all.current"), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "segment.all.current"), 0);
        int fds = gm_test_count_fds(daemon_.pid);
        for (int i = 0; i < 1000 && fds > daemon_fds; i++) { /* the stat queries' connections close behind us */
                usleep(10000);
                fds = gm_test_count_fds(daemon_.pid);
        }
        ck_assert_int_le(fds, daemon_fds); /* (the baseline may still count a closing connection) */
}
END_TEST

/* The operator requires central heaps of a tenant: a default connection gets
 * one, an explicit local one is refused with the reason. */
START_TEST(test_tenant_required_central) {
        gm_test_daemon_stop(&daemon_);
        gm_test_daemon_start_config(&daemon_, "256M", NULL, "[tenant ops]\nuser = root\nheap = central\n");
        gpumem_client *c = connect_mode(GPUMEM_HEAP_DEFAULT);
        ck_assert_int_eq(gpumem_heap(c), GPUMEM_HEAP_CENTRAL);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &p), 0);
        char out[16384];
        const char *e = client_entry(out, sizeof(out), getpid());
        ck_assert_ptr_nonnull(e);
        ck_assert_ptr_nonnull(strstr(e, "\"heap\": \"central\""));
        gpumem_client *l = NULL;
        ck_assert_int_eq(gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_LOCAL, &l), -EPERM);
        gpumem_free(c, p);
        gpumem_disconnect(c);
}
END_TEST

/* A raw local session (its statistics page's fd closed); its max_fds. */
static int raw_local_session(uint32_t *ret_max_fds) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        Gpumem__Envelope *reply = gm_test_raw_hello_mode(fd, false, "raw", NULL, GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        ck_assert_int_eq(reply->hello_reply->heap_mode, GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL);
        ck_assert(reply->hello_reply->grant_runs);
        *ret_max_fds = reply->hello_reply->max_fds;
        gm_msg_free(reply);
        return fd;
}

/* Grants n 2 MiB pages of segment 7 (64 MiB) from `offset`: the answer,
 * with the fds it carried counted (each checked to be a 2 MiB piece) and
 * closed. */
static Gpumem__Envelope *raw_grant(int fd, uint64_t request_id, uint64_t offset, uint32_t n, size_t *ret_n_fds) {
        Gpumem__Grant g = GPUMEM__GRANT__INIT;
        g.segment_id = 7;
        g.segment_va_size = 64 * MiB;
        g.offset = offset;
        g.size = 2 * MiB;
        g.n_pieces = n;
        gm_test_raw_send_body(fd, request_id, GPUMEM__ENVELOPE__BODY_GRANT, &g);
        for (;;) {
                static uint8_t buf[GM_IPC_MAX_PACKET_DEFAULT];
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len, n_fds;
                Gpumem__Envelope *env = NULL;
                ck_assert_int_eq(gm_ipc_recv(fd, buf, sizeof(buf), fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds), 0);
                for (size_t i = 0; i < n_fds; i++) {
                        struct stat st;
                        ck_assert_int_eq(fstat(fds[i], &st), 0);
                        ck_assert_int_eq(st.st_size, (off_t) (2 * MiB));
                }
                gm_close_fds(fds, n_fds);
                ck_assert_int_eq(gm_msg_unpack(buf, len, &env), 0);
                if (env->request_id == request_id) {
                        *ret_n_fds = n_fds;
                        return env;
                }
                gm_msg_free(env);
        }
}

/* A Grant's error code (asserting it is one). */
static int grant_error(int fd, uint64_t request_id, uint64_t offset, uint32_t n) {
        size_t n_fds;
        Gpumem__Envelope *e = raw_grant(fd, request_id, offset, n, &n_fds);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_uint_eq(n_fds, 0);
        int code = (int) e->error->code;
        gm_msg_free(e);
        return code;
}

/* A run of pages in one Grant, on the wire: its reply carries every piece
 * and fd in one packet; more pieces than max_fds, a run over a granted
 * piece and a run past the quota are refused with nothing charged. */
START_TEST(test_grant_run_on_the_wire) {
        uint32_t max_fds;
        int fd = raw_local_session(&max_fds);
        ck_assert_uint_ge(max_fds, 4);
        size_t n_fds;

        ck_assert_int_eq(grant_error(fd, 2, 0, max_fds + 1), E2BIG);
        Gpumem__Envelope *e = raw_grant(fd, 3, 0, 4, &n_fds);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        ck_assert_uint_eq(n_fds, 4);
        ck_assert_uint_eq(e->grant_reply->n_more_mappings, 3);
        for (size_t k = 0; k < 4; k++) {
                const Gpumem__Mapping *m = k ? e->grant_reply->more_mappings[k - 1] : e->grant_reply->mapping;
                ck_assert_uint_eq(m->segment_id, 7);
                ck_assert_uint_eq(m->offset, k * 2 * MiB);
                ck_assert_uint_eq(m->length, 2 * MiB);
        }
        gm_msg_free(e);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 8 * MiB);

        ck_assert_int_eq(grant_error(fd, 4, 6 * MiB, 2), EINVAL); /* over the granted piece at 6 MiB */
        gpumem_client *admin = connect_mode(GPUMEM_HEAP_CENTRAL); /* uid 0: may set quotas */
        ck_assert_int_eq(gpumem_quota_set(admin, "uid:0", 16 * MiB, true), 0);
        ck_assert_int_eq(grant_error(fd, 5, 8 * MiB, 8), EDQUOT); /* 16 MiB more at 8 of 16 */
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 8 * MiB);
        e = raw_grant(fd, 6, 8 * MiB, 4, &n_fds); /* what fits is granted */
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        ck_assert_uint_eq(n_fds, 4);
        gm_msg_free(e);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 16 * MiB);
        close(fd);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 0);
        ck_assert_int_eq(gpumem_quota_set(admin, "uid:0", 0, true), 0);
        gpumem_disconnect(admin);
}
END_TEST

/* Out of memory in a local heap: the heap's ladder runs in the client and
 * the daemon's diagnosis reaches the application. */
START_TEST(test_local_refusal_explained) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_LOCAL);
        void *a, *b;
        ck_assert_int_eq(gpumem_alloc(c, 200 * MiB, 0, &a), 0);
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, 0, &b), -ENOMEM);
        const char *msg = gpumem_last_error(c);
        ck_assert_msg(strstr(msg, "Tried to allocate") != NULL, "%s", msg);
        ck_assert_int_eq(gpumem_alloc(c, 1ull << 40, 0, &b), -ENOMEM);
        ck_assert_ptr_nonnull(strstr(gpumem_last_error(c), "capacity"));
        ck_assert_int_eq(gpumem_free(c, a), 0);
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, 0, &b), 0); /* the cached 200 MiB segment serves it */
        ck_assert_int_eq(gpumem_free(c, b), 0);
        gpumem_disconnect(c);
}
END_TEST

/* Cached memory of a local session is reclaimed for another session's
 * allocation, local or central: the client's heap gives idle segments back. */
/* Whether the heap gave its cached segment back. */
static int reserved_nothing(gpumem_client *c) {
        int64_t reserved = -1;
        gpumem_stat(c, "reserved_bytes.all.current", &reserved);
        return reserved == 0 ? 0 : 13;
}

static void reclaim_for(gpumem_heap_mode requester) {
        local_child_t child = local_child_start(200 * MiB, true, NULL, reserved_nothing);
        gpumem_client *c = connect_mode(requester);
        void *p;
        int r = gpumem_alloc(c, 200 * MiB, 0, &p);
        ck_assert_msg(r == 0, "alloc after reclaim: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        gm_test_fill(p, 200 * MiB, 5);
        ck_assert(gm_test_verify(p, 200 * MiB, 5));
        ck_assert_int_eq(local_child_finish(&child), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
}

START_TEST(test_local_cache_reclaimed_for_local) {
        reclaim_for(GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_local_cache_reclaimed_for_central) {
        reclaim_for(GPUMEM_HEAP_CENTRAL);
}
END_TEST

static Suite *local_suite(void) {
        Suite *s = suite_create("local");
        TCase *tc = tcase_create("local");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_steady_state_sends_nothing);
        tcase_add_test(tc, test_gpumemctl_stats_equal_client);
        tcase_add_test(tc, test_garbage_stats_page_is_contained);
        tcase_add_test(tc, test_sigkilled_local_client_leaks_nothing);
        tcase_add_test(tc, test_tenant_required_central);
        tcase_add_test(tc, test_local_refusal_explained);
        tcase_add_test(tc, test_grant_run_on_the_wire);
        tcase_add_test(tc, test_local_cache_reclaimed_for_local);
        tcase_add_test(tc, test_local_cache_reclaimed_for_central);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        unsetenv("GPUMEM_HEAP");
        SRunner *sr = srunner_create(local_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
