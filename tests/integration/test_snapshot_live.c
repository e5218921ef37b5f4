/* Snapshots through a real daemon with real client processes, in both heap
 * modes (GPUMEM_HEAP=local and central legs): local sessions asked for their
 * blocks and trace, a stopped one shown with its segments only, categories
 * and process frames, PyTorch 1.13's format, history kept per process, the
 * non-admin limits, and another client served while a large snapshot is
 * rendered. Files are judged by tests/lib/snapshot_check.py. Needs root (clients
 * of another uid run under setpriv). */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "msg.h"
#include "testutil.h"

#define NOBODY 65534

/* Blocks of the large session: a debug daemon checks every heap after every
 * request, so there it is smaller and the loop's order is not judged (its
 * loop is slow for reasons of its own). */
#ifdef GPUMEMD_DEBUG
#define LARGE_BLOCKS "10000"
#define LARGE_ORDER_JUDGED false
#else
#define LARGE_BLOCKS "150000"
#define LARGE_ORDER_JUDGED true
#endif

static gm_test_daemon_t daemon_;

static bool local_leg(void) {
        const char *heap = getenv("GPUMEM_HEAP");
        return !heap || strcmp(heap, "central") != 0;
}

static void setup(void) {
        gm_test_daemon_start_config(&daemon_, "2G", NULL,
                                    "snapshot_answer_timeout_ms = 500\n"
                                    "snapshot_max_bytes = 256K\n"
                                    "snapshot_max_entries = 200000\n");
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static int ctl(uid_t uid, char *out, size_t len, const char *const *args) {
        const char *argv[16] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path};
        size_t n = 3;
        for (size_t i = 0; args[i] && n < 15; i++)
                argv[n++] = args[i];
        argv[n] = NULL;
        return gm_test_run_as(out, len, uid, argv);
}

static void history_on(const char *max_entries) {
        char out[4096];
        const char *args[] = {"history", "on", "--max-entries", max_entries, NULL};
        ck_assert_int_eq(ctl(0, out, sizeof(out), args), 0);
}

static void spawn_blocks(gm_test_proc_t *p, uid_t uid, const char *n) {
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "blocks", n, "0", NULL};
        char line[128];
        gm_test_spawn(argv, uid, p);
        ck_assert(gm_test_proc_read_line(p, line, sizeof(line)));
        ck_assert_str_eq(line, "ready");
}

/* Asks the client for one more allocation and free; waits until done. */
static void poke(gm_test_proc_t *p, int times) {
        char line[64];
        for (int i = 0; i < times; i++) {
                ck_assert_int_eq(write(p->stdin_fd, "x\n", 2), 2);
                ck_assert(gm_test_proc_read_line(p, line, sizeof(line)));
        }
}

static int check(const char *file, const char *args) {
        char cmd[2048];
        snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' %s", GM_PYTHON3, GM_SNAPSHOT_CHECK, file, args);
        int status = system(cmd);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* Runs a Python expression over the JSON snapshot `file` as `d`; its truth. */
static bool json_holds(const char *file, const char *expr) {
        char cmd[4096];
        snprintf(cmd, sizeof(cmd),
                 "%s -c \"import json,sys; d=json.load(open('%s')); "
                 "segs=d['segments']; tr=d['device_traces'][-1]; sys.exit(0 if (%s) else 1)\"",
                 GM_PYTHON3, file, expr);
        return system(cmd) == 0;
}

static void snapshot(uid_t uid, const char *file, const char *format, const char *category) {
        char out[4096];
        const char *args[] = {"snapshot", "-o", file, "--format", format, "--category", category, NULL};
        ck_assert_int_eq(ctl(uid, out, sizeof(out), args), 0);
}

/* Every process on the device is in a device-wide snapshot, with its
 * blocks, its stack frames, its category and a frame naming it; in the
 * local leg these came from the clients themselves. */
START_TEST(test_device_snapshot_has_every_session) {
        char file[400], expr[1024];
        gm_test_proc_t a, b;
        history_on("10000");
        spawn_blocks(&a, 0, "40");
        spawn_blocks(&b, NOBODY, "25");
        snprintf(file, sizeof(file), "%s/all.json", daemon_.dir);
        snapshot(0, file, "json", "pid");
        ck_assert_int_eq(check(file, "--device 0 --categories --states active_allocated,inactive"), 0);
        snprintf(expr, sizeof(expr),
                 "{s['pid'] for s in segs} == {%d, %d} and "
                 "sum(1 for e in tr if e['action'] == 'alloc' and e['pid'] == %d) == 40 and "
                 "sum(1 for e in tr if e['action'] == 'alloc' and e['pid'] == %d) == 25 and "
                 "sum(1 for s in segs if s['pid'] == %d for x in s['blocks'] if x['state'] == 'active_allocated') "
                 "== 26 and "
                 "any(f['filename'] == 'model.py' for s in segs for x in s['blocks'] for f in x['frames']) and "
                 "any(f['filename'].startswith('[pid %d gm-test-client') for s in segs for x in s['blocks'] "
                 "for f in x['frames']) and "
                 "{x['category'] for s in segs for x in s['blocks'] if x['state'] != 'inactive'} == "
                 "{'pid %d', 'pid %d'} and not any(s.get('gpumemd_blocks_unknown') for s in segs)",
                 (int) a.pid, (int) b.pid, (int) a.pid, (int) b.pid, (int) a.pid, (int) a.pid, (int) a.pid,
                 (int) b.pid);
        ck_assert_msg(json_holds(file, expr), "snapshot %s: %s", file, expr);

        /* The same through the other formats, and by tenant. */
        snprintf(file, sizeof(file), "%s/all.pickle", daemon_.dir);
        snapshot(0, file, "pickle", "tenant");
        ck_assert_int_eq(check(file, "--device 0 --categories"), 0);
        snprintf(file, sizeof(file), "%s/all-1.13.pickle", daemon_.dir);
        snapshot(0, file, "pickle-1.13", "none");
        ck_assert_int_eq(check(file, "--legacy"), 0);

        /* A non-admin sees its own tenant's process only. */
        snprintf(file, sizeof(file), "%s/nobody", daemon_.dir);
        ck_assert_int_eq(mkdir(file, 0777), 0);
        ck_assert_int_eq(chmod(file, 0777), 0);
        snprintf(file, sizeof(file), "%s/nobody/nobody.json", daemon_.dir);
        snapshot(NOBODY, file, "json", "tenant");
        ck_assert_int_eq(check(file, "--device 0 --categories"), 0);
        snprintf(expr, sizeof(expr), "{s['pid'] for s in segs} == {%d} and {e['pid'] for e in tr} <= {%d, 0}",
                 (int) b.pid, (int) b.pid);
        ck_assert_msg(json_holds(file, expr), "snapshot %s: %s", file, expr);
        ck_assert_int_eq(gm_test_proc_finish(&a), 0);
        ck_assert_int_eq(gm_test_proc_finish(&b), 0);
}
END_TEST

/* A local session that cannot answer (stopped) appears with its granted
 * segments only, marked; the snapshot still comes, the late answer is
 * dropped, and the next snapshot has its blocks again. */
START_TEST(test_stopped_session_shows_its_segments) {
        char file[400], expr[1024];
        gm_test_proc_t a, b;
        spawn_blocks(&a, 0, "30");
        spawn_blocks(&b, 0, "12");
        gm_test_stop_process(b.pid);
        snprintf(file, sizeof(file), "%s/stopped.json", daemon_.dir);
        snapshot(0, file, "json", "pid");
        ck_assert_int_eq(check(file, "--device 0 --categories"), 0);
        if (local_leg())
                snprintf(expr, sizeof(expr),
                         "all(bool(s.get('gpumemd_blocks_unknown')) == (s['pid'] == %d) for s in segs) and "
                         "all(len(s['blocks']) == 1 for s in segs if s['pid'] == %d) and "
                         "any(s['pid'] == %d for s in segs)",
                         (int) b.pid, (int) b.pid, (int) b.pid);
        else /* the daemon holds central blocks itself */
                snprintf(expr, sizeof(expr), "not any(s.get('gpumemd_blocks_unknown') for s in segs)");
        ck_assert_msg(json_holds(file, expr), "snapshot %s: %s", file, expr);
        ck_assert_int_eq(kill(b.pid, SIGCONT), 0);
        poke(&b, 1); /* its service thread ran: the late answer went to the daemon */
        snprintf(file, sizeof(file), "%s/resumed.json", daemon_.dir);
        snapshot(0, file, "json", "pid");
        ck_assert_int_eq(check(file, "--device 0 --categories"), 0);
        snprintf(expr, sizeof(expr),
                 "not any(s.get('gpumemd_blocks_unknown') for s in segs) and "
                 "sum(1 for s in segs if s['pid'] == %d for x in s['blocks'] if x['state'] == 'active_allocated') "
                 "== 8",
                 (int) b.pid);
        ck_assert_msg(json_holds(file, expr), "snapshot %s: %s", file, expr);
        ck_assert_int_eq(gm_test_proc_finish(&a), 0);
        ck_assert_int_eq(gm_test_proc_finish(&b), 0);
}
END_TEST

/* History is kept per process: a busy one evicts its own entries, not the
 * 20 allocations of a quiet one (central: the daemon's ring; local: each
 * heap's own ring). */
START_TEST(test_busy_process_keeps_others_history) {
        char file[400], expr[512];
        gm_test_proc_t quiet, busy;
        history_on("200");
        spawn_blocks(&quiet, 0, "20");
        spawn_blocks(&busy, 0, "20");
        poke(&busy, 300); /* 900 entries of its own */
        snprintf(file, sizeof(file), "%s/history.json", daemon_.dir);
        snapshot(0, file, "json", "pid");
        ck_assert_int_eq(check(file, "--device 0 --categories"), 0);
        snprintf(expr, sizeof(expr),
                 "sum(1 for e in tr if e['action'] == 'alloc' and e['pid'] == %d) == 20 and "
                 "sum(1 for e in tr if e['pid'] == %d) <= 200",
                 (int) quiet.pid, (int) busy.pid);
        ck_assert_msg(json_holds(file, expr), "snapshot %s: %s", file, expr);
        ck_assert_int_eq(gm_test_proc_finish(&quiet), 0);
        ck_assert_int_eq(gm_test_proc_finish(&busy), 0);
}
END_TEST

/* A non-admin's snapshot is bounded (snapshot_max_bytes, _entries in the
 * config); an admin's is not; refusals say which limit. */
START_TEST(test_non_admin_limits) {
        char out[4096], file[400];
        gm_test_proc_t p;
        spawn_blocks(&p, NOBODY, "6000");
        snprintf(file, sizeof(file), "%s/big.json", daemon_.dir);
        const char *args[] = {"snapshot", "-o", file, "--format", "json", NULL};
        int r = ctl(NOBODY, out, sizeof(out), args);
        ck_assert_int_ne(r, 0);
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "test ! -s '%s'", file);
        ck_assert_int_eq(system(cmd), 0);
        ck_assert_int_eq(ctl(0, out, sizeof(out), args), 0);
        ck_assert_int_eq(check(file, "--device 0"), 0);
        /* The bytes came through a pipe: the daemon keeps no file of them. */
        int fds = gm_test_count_fds(daemon_.pid);
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(ctl(0, out, sizeof(out), args), 0);
        for (int i = 0; i < 100 && gm_test_count_fds(daemon_.pid) != fds; i++)
                usleep(50000); /* a pipe's write end closes once its worker ends */
        ck_assert_int_eq(gm_test_count_fds(daemon_.pid), fds);
        ck_assert_int_eq(gm_test_proc_finish(&p), 0);
}
END_TEST

/* The snapshot is rendered off the loop: while a large one is made, another
 * client's request is answered first (on a daemon that renders on its loop
 * the snapshot's reply would come before it). */
START_TEST(test_loop_serves_others_during_a_large_snapshot) {
        gm_test_proc_t p;
        spawn_blocks(&p, 0, LARGE_BLOCKS);
        int admin = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(admin, true);
        int other = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(other, false);
        Gpumem__Snapshot snap = GPUMEM__SNAPSHOT__INIT;
        snap.format = GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_JSON;
        snap.category = GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_PID;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 7;
        env.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT;
        env.snapshot = &snap;
        ck_assert_int_eq(gm_msg_send(admin, &env, NULL, 0, 65536), 0);
        usleep(20000); /* the daemon has the snapshot request in hand */
        Gpumem__Stats stats = GPUMEM__STATS__INIT;
        Gpumem__Envelope senv = GPUMEM__ENVELOPE__INIT;
        senv.request_id = 8;
        senv.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        senv.stats = &stats;
        Gpumem__Envelope *reply = gm_test_raw_call(other, &senv);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_STATS_REPLY);
        gm_msg_free(reply);
        struct pollfd pfd = {.fd = admin, .events = POLLIN};
        ck_assert_msg(!LARGE_ORDER_JUDGED || poll(&pfd, 1, 0) == 0,
                      "the snapshot was answered before another client's stats");
        reply = gm_test_raw_recv(admin);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_SNAPSHOT_REPLY);
        ck_assert_uint_gt(reply->snapshot_reply->size, strtoull(LARGE_BLOCKS, NULL, 10) * 100);
        gm_msg_free(reply);
        close(admin);
        close(other);
        ck_assert_int_eq(gm_test_proc_finish(&p), 0);
}
END_TEST

int main(void) {
        Suite *s = suite_create("snapshot_live");
        TCase *tc = tcase_create("core");
        tcase_set_timeout(tc, 300);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_device_snapshot_has_every_session);
        tcase_add_test(tc, test_stopped_session_shows_its_segments);
        tcase_add_test(tc, test_busy_process_keeps_others_history);
        tcase_add_test(tc, test_non_admin_limits);
        tcase_add_test(tc, test_loop_serves_others_during_a_large_snapshot);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
