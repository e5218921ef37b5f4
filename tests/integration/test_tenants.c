/* Tenants, quotas, reclaim across processes and isolation, with real client
 * processes under different uids (setpriv). Needs root; the suite says so and
 * runs nothing otherwise. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)
#define NOBODY 65534

static gm_test_daemon_t daemon_;

static void setup(void) {
        static const char *const args[] = {"--max-sessions", "64", NULL};
        gm_test_daemon_start(&daemon_, "256M", args);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static int ctl(uid_t uid, char *out, size_t len, const char *a1, const char *a2, const char *a3, const char *a4,
               const char *a5) {
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, a1, a2, a3, a4, a5, NULL};
        return gm_test_run_as(out, len, uid, argv);
}

/* The tenant's charged bytes (reserved, releases awaiting ack included). */
static uint64_t tenant_charged(const char *tenant) {
        return gm_test_tenant_charged(daemon_.socket_path, tenant);
}

static uint64_t wait_tenant_charged(const char *tenant, uint64_t want) {
        uint64_t v = tenant_charged(tenant);
        for (int i = 0; i < 1000 && v != want; i++) {
                usleep(10000);
                v = tenant_charged(tenant);
        }
        return v;
}

START_TEST(test_quota_never_exceeded_by_racing_processes) {
        char out[4096];
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "set", "uid:65534", "100M", "--runtime"), 0);
        enum { N = 8 };
        gm_test_proc_t procs[N];
        char size[32];
        snprintf(size, sizeof(size), "%llu", 12 * MiB); /* a 12 MiB segment each: at most 8 fit */
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "race", size, "15", NULL};
        for (int i = 0; i < N; i++)
                gm_test_spawn(argv, NOBODY, &procs[i]);
        uint64_t max_seen = 0;
        for (int i = 0; i < 300; i++) { /* sample while they race */
                uint64_t charged = tenant_charged("uid:65534");
                if (charged > max_seen)
                        max_seen = charged;
                ck_assert_uint_le(charged, 100 * MiB);
        }
        long granted = 0, refused = 0;
        for (int i = 0; i < N; i++) {
                char line[128];
                ck_assert(gm_test_proc_read_line(&procs[i], line, sizeof(line)));
                long g, r;
                ck_assert_int_eq(sscanf(line, "granted=%ld refused=%ld", &g, &r), 2);
                granted += g;
                refused += r;
                ck_assert_int_eq(gm_test_proc_finish(&procs[i]), 0);
        }
        ck_assert_int_gt(granted, 0);
        ck_assert_int_gt(refused, 0);
        ck_assert_uint_le(max_seen, 100 * MiB);
        ck_assert_uint_eq(wait_tenant_charged("uid:65534", 0), 0);
}
END_TEST

START_TEST(test_runtime_quota_applies_to_next_allocation) {
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        void *p[3];
        char out[4096];
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "set", "uid:0", "30M", "--runtime"), 0);
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p[0]), 0);
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p[1]), 0);
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p[2]), -EDQUOT);
        const char *msg = gpumem_last_error(c);
        ck_assert_msg(strstr(msg, "uid:0") && strstr(msg, "quota"), "message: %s", msg);
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "get", "uid:0", NULL, NULL), 0);
        ck_assert_msg(strstr(out, "30.0M") && strstr(out, "runtime"), "quota get: %s", out);
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "set", "uid:0", "0", "--runtime"), 0);
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p[2]), 0);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_non_admin_is_refused_and_sees_own_tenant) {
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0); /* tenant uid:0 exists */
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &p), 0);
        char size[32];
        snprintf(size, sizeof(size), "%llu", 4 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "hold", size, "5", NULL};
        gm_test_proc_t holder;
        gm_test_spawn(argv, NOBODY, &holder);
        char out[8192];
        ck_assert(gm_test_proc_read_line(&holder, out, sizeof(out)));
        ck_assert_str_eq(out, "ready");
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "quota", "set", "uid:65534", "1G", NULL), 1);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "stats", NULL, NULL, NULL, NULL), 0); /* its own tenant's */
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "stats", "--reset-peak", NULL, NULL, NULL), 1);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "trim", NULL, NULL, NULL, NULL), 1);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "stats", "--tenant", "uid:0", NULL, NULL), 1);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "stats", "--tenant", "uid:65534", "--json", NULL), 0);
        ck_assert_msg(strstr(out, "\"allocated_bytes.all.current\": 4194304"), "stats: %s", out);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "quota", "list", NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "uid:65534") && !strstr(out, "uid:0 "), "quota list: %s", out);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "clients", "--json", NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "\"uid\": 65534") && !strstr(out, "\"uid\": 0,"), "clients: %s", out);
        ck_assert_int_eq(ctl(0, out, sizeof(out), "clients", NULL, NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "uid:65534") && strstr(out, "uid:0"), "clients as root: %s", out);
        ck_assert_int_eq(gm_test_proc_finish(&holder), 0); /* its data stayed intact */
        gpumem_disconnect(c);
}
END_TEST

/* An idle process of one tenant holds most of the device in its cache;
 * another tenant's allocation gets it (and the bytes it gets are fresh). */
START_TEST(test_idle_cache_of_another_tenant_is_reclaimed) {
        char size[32];
        snprintf(size, sizeof(size), "%llu", 20 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "cache", size, "10", NULL};
        gm_test_proc_t idle;
        gm_test_spawn(argv, NOBODY, &idle);
        char line[64];
        ck_assert(gm_test_proc_read_line(&idle, line, sizeof(line)));
        ck_assert_uint_eq(tenant_charged("uid:65534"), 200 * MiB);
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        void *p;
        int r = gpumem_alloc(c, 200 * MiB, 0, &p);
        ck_assert_msg(r == 0, "alloc: %s", gpumem_last_error(c));
        size_t dirty = gm_test_first_nonzero(p, 200 * MiB);
        ck_assert_msg(dirty == 200 * MiB, "byte %zu is not fresh", dirty);
        ck_assert_uint_eq(tenant_charged("uid:65534"), 0);
        ck_assert_int_eq(gm_test_proc_finish(&idle), 0);
        gpumem_disconnect(c);
}
END_TEST

/* A client that never acknowledges a release keeps its charge, shows it in
 * `clients`, and does not block the daemon. */
START_TEST(test_unacknowledged_release_keeps_charge) {
        int fd = gm_test_raw_connect(daemon_.socket_path); /* no service thread: never answers */
        gm_test_raw_hello(fd, false);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 100 * MiB;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 3;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        Gpumem__Envelope *reply = gm_test_raw_call(fd, &env);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = reply->alloc_reply->block_id;
        gm_msg_free(reply);
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.request_id = 4;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);

        /* Another tenant needs the memory: the daemon asks, waits, and refuses. */
        char size[32];
        snprintf(size, sizeof(size), "%llu", 200 * MiB);
        char out[8192];
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "zero", size, NULL};
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), NOBODY, argv), 1);
        ck_assert_uint_eq(tenant_charged("uid:0"), 100 * MiB); /* still charged */
        ck_assert_int_eq(ctl(0, out, sizeof(out), "clients", "--json", NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "\"releasing_bytes\": 104857600"), "clients: %s", out);
        /* The daemon serves on. */
        snprintf(size, sizeof(size), "%llu", 16 * MiB);
        const char *small[] = {GM_TEST_CLIENT, daemon_.socket_path, "zero", size, NULL};
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), NOBODY, small), 0);
        /* The release request is there (and asked again); acknowledging it uncharges. */
        uint64_t release_id = 0;
        for (int i = 0; i < 10 && !release_id; i++) {
                Gpumem__Envelope *e = gm_test_raw_recv(fd);
                ck_assert_ptr_nonnull(e);
                if (e->body_case == GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST) {
                        release_id = e->release_request->release_id;
                        ck_assert_uint_eq(e->release_request->n_ranges, 1);
                        ck_assert(e->release_request->ranges[0]->whole_segment);
                }
                gm_msg_free(e);
        }
        ck_assert_uint_ne(release_id, 0);
        Gpumem__ReleaseAck ack = GPUMEM__RELEASE_ACK__INIT;
        ack.release_id = release_id;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_RELEASE_ACK;
        env.release_ack = &ack;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
        if (strcmp(gm_test_backend(), "cuda") == 0) {
                /* This client never mapped it, so no driver figure drops: its
                 * word is not taken, the charge lasts until its session ends. */
                for (int i = 0; i < 100 && !strstr(out, "\"release_unverified_bytes\": 104857600"); i++) {
                        usleep(20000);
                        ck_assert_int_eq(ctl(0, out, sizeof(out), "clients", "--json", NULL, NULL, NULL), 0);
                }
                ck_assert_msg(strstr(out, "\"release_unverified_bytes\": 104857600"), "clients: %s", out);
                ck_assert_uint_eq(tenant_charged("uid:0"), 100 * MiB);
                close(fd);
                ck_assert_uint_eq(wait_tenant_charged("uid:0", 0), 0);
                return;
        }
        ck_assert_uint_eq(wait_tenant_charged("uid:0", 0), 0);
        close(fd);
}
END_TEST

/* Runs the test client's "zero" as root, its stderr with its stdout in out;
 * returns its exit status and the seconds it took. */
static int zero_as_root(uint64_t bytes, char *out, size_t len, double *ret_seconds) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "exec '%s' '%s' zero %llu 2>&1", GM_TEST_CLIENT, daemon_.socket_path,
                 (unsigned long long) bytes);
        const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        uint64_t t0 = gm_now_ms();
        int status = gm_test_run(out, len, argv);
        *ret_seconds = (double) (gm_now_ms() - t0) / 1000.0;
        return status;
}

/* Whether pid's session is unresponsive in `gpumemctl clients --json` (left
 * in out): 1 or 0; -1 when it is not listed. Its own entry: the list has
 * other sessions (gpumemctl's own, responsive, among them). */
static int unresponsive_of(pid_t pid, char *out, size_t len) {
        if (ctl(0, out, len, "clients", "--json", NULL, NULL, NULL) != 0)
                return -1;
        char pat[32];
        snprintf(pat, sizeof(pat), "\"pid\": %d,", (int) pid);
        const char *entry = strstr(out, pat);
        const char *end = entry ? strchr(entry, '}') : NULL;
        const char *u = entry ? strstr(entry, "\"unresponsive\": ") : NULL;
        if (!u || !end || u > end)
                return -1;
        return strncmp(u + strlen("\"unresponsive\": "), "true", 4) == 0;
}

/* Polls until pid's session is unresponsive (or responsive) as wanted, or ~15 s pass. */
static bool wait_unresponsive(pid_t pid, bool want, char *out, size_t len) {
        for (int i = 0; i < 300; i++) {
                if (unresponsive_of(pid, out, len) == want)
                        return true;
                usleep(50000);
        }
        return false;
}

/* A stopped (SIGSTOP) client does not keep its cache hostage: once it has
 * answered no release request for unresponsive_timeout_ms, what waits for it
 * is refused at once with its pid named (well before the park timeout), new
 * requests do not wait, its memory stays charged (its process maps it), and
 * after SIGCONT it answers, is responsive again and its cache is reclaimed. */
START_TEST(test_stopped_client_is_not_waited_for) {
        gm_test_daemon_stop(&daemon_);
        gm_test_daemon_start_config(&daemon_, "256M", NULL,
                                    "unresponsive_timeout_ms = 1000\npark_timeout_ms = 30000\n");
        char size[32], line[64], out[16384];
        snprintf(size, sizeof(size), "%llu", 20 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "cache", size, "10", NULL};
        gm_test_proc_t idle;
        gm_test_spawn(argv, NOBODY, &idle);
        ck_assert(gm_test_proc_read_line(&idle, line, sizeof(line)));
        ck_assert_uint_eq(tenant_charged("uid:65534"), 200 * MiB);
        gm_test_stop_process(idle.pid);

        /* The first request waits for the stopped client, until it is found unresponsive. */
        double seconds;
        ck_assert_int_eq(zero_as_root(200 * MiB, out, sizeof(out), &seconds), 1);
        char pid[32];
        snprintf(pid, sizeof(pid), "pid %d", (int) idle.pid);
        ck_assert_msg(strstr(out, "unresponsive session") && strstr(out, pid), "refusal: %s", out);
        ck_assert_msg(seconds < 20, "waited %.1f s: the park timeout, not the unresponsive bound", seconds);
        ck_assert_msg(wait_unresponsive(idle.pid, true, out, sizeof(out)), "clients: %s", out);
        /* The next one does not wait at all; the memory is still charged. */
        ck_assert_int_eq(zero_as_root(200 * MiB, out, sizeof(out), &seconds), 1);
        ck_assert_msg(strstr(out, "unresponsive session") && strstr(out, pid), "refusal: %s", out);
        ck_assert_msg(seconds < 20, "waited %.1f s", seconds);
        ck_assert_uint_eq(tenant_charged("uid:65534"), 200 * MiB);
        /* Others are served from what is free. */
        ck_assert_int_eq(zero_as_root(16 * MiB, out, sizeof(out), &seconds), 0);

        /* Continued, it answers what it was asked: responsive, its cache given back.
         * Each is waited for on its own: a local heap returns its pieces
         * (uncharged then) before it acknowledges the Reclaim (responsive then). */
        ck_assert_int_eq(kill(idle.pid, SIGCONT), 0);
        ck_assert_uint_eq(wait_tenant_charged("uid:65534", 0), 0);
        ck_assert_msg(wait_unresponsive(idle.pid, false, out, sizeof(out)), "clients: %s", out);
        ck_assert_msg(!strstr(out, "\"unresponsive\": true"), "clients: %s", out);
        ck_assert_int_eq(zero_as_root(200 * MiB, out, sizeof(out), &seconds), 0);
        ck_assert_int_eq(gm_test_proc_finish(&idle), 0);
}
END_TEST

/* Bytes one tenant wrote are never readable by another: not through reuse of
 * its cache, not after it trimmed or disconnected, not after reconnecting. */
START_TEST(test_isolation_between_tenants) {
        char size[32], out[4096];
        snprintf(size, sizeof(size), "%llu", 4 * MiB);
        const char *cache[] = {GM_TEST_CLIENT, daemon_.socket_path, "cache", size, "8", NULL};
        const char *zero[] = {GM_TEST_CLIENT, daemon_.socket_path, "zero", size, NULL};
        gm_test_proc_t a;
        gm_test_spawn(cache, NOBODY, &a); /* writes 0xab.. into 8 blocks, frees them, stays */
        char line[64];
        ck_assert(gm_test_proc_read_line(&a, line, sizeof(line)));
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), 0, zero), 0); /* another tenant, a cache exists */
        ck_assert_int_eq(ctl(0, out, sizeof(out), "trim", NULL, NULL, NULL, NULL), 0);
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), 0, zero), 0); /* after trim */
        ck_assert_int_eq(gm_test_proc_finish(&a), 0);
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), 0, zero), 0);      /* after it left */
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), NOBODY, zero), 0); /* its own reconnect */
}
END_TEST

/* ---- tenants and quotas from the configuration file ---- */

static const char *const TENANT_BATCH = "[tenant batch]\nuser = nobody\nquota = 40M\n";

static void write_config(const char *text) {
        FILE *f = fopen(daemon_.config_path, "we");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "[daemon]\nstate_dir = %s/state\n%s", daemon_.dir, text);
        fclose(f);
}

static void race_once(uid_t uid, const char *expect) {
        char size[32], out[256];
        snprintf(size, sizeof(size), "%llu", 12 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "race", size, "1", NULL};
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), uid, argv), 0);
        ck_assert_msg(strstr(out, expect), "race: %s (expected %s)", out, expect);
}

START_TEST(test_config_rules_pick_tenant_and_quota) {
        gm_test_daemon_start_config(&daemon_, "256M", NULL, TENANT_BATCH);
        race_once(NOBODY, "granted=3 refused=1"); /* 3 x 12 MiB under 40 MiB */
        char out[4096];
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "get", "batch", NULL, NULL), 0);
        ck_assert_msg(strstr(out, "40.0M") && strstr(out, "config"), "quota get: %s", out);
        gm_test_daemon_stop(&daemon_);
}
END_TEST

START_TEST(test_persistent_quota_survives_restart) {
        gm_test_daemon_start(&daemon_, "256M", NULL);
        char out[4096];
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "set", "uid:65534", "30M", NULL), 0);
        daemon_.keep_dir = true;
        gm_test_daemon_stop(&daemon_);
        gm_test_daemon_launch(&daemon_, "256M", NULL);
        daemon_.keep_dir = false;
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "get", "uid:65534", NULL, NULL), 0);
        ck_assert_msg(strstr(out, "30.0M") && strstr(out, "persistent"), "quota get: %s", out);
        race_once(NOBODY, "granted=2 refused=1");
        /* A runtime quota wins over it until the next restart. */
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "set", "uid:65534", "50M", "--runtime"), 0);
        race_once(NOBODY, "granted=4 refused=1");
        gm_test_daemon_stop(&daemon_);
}
END_TEST

START_TEST(test_sighup_reloads_and_keeps_old_on_error) {
        gm_test_daemon_start_config(&daemon_, "256M", NULL, TENANT_BATCH);
        char out[8192];
        write_config("[tenant batch]\nuser = nobody\nquota = 80M\n");
        ck_assert_int_eq(kill(daemon_.pid, SIGHUP), 0);
        bool reloaded = false;
        for (int i = 0; i < 500 && !reloaded; i++) {
                ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "get", "batch", NULL, NULL), 0);
                reloaded = strstr(out, "80.0M") != NULL;
                if (!reloaded)
                        usleep(10000);
        }
        ck_assert_msg(reloaded, "quota after reload: %s", out);
        race_once(NOBODY, "granted=6 refused=1");
        write_config("[tenant batch]\nuser = nobody\nquota = 80M\nquotaa = 1G\n");
        ck_assert_int_eq(kill(daemon_.pid, SIGHUP), 0);
        bool logged = false;
        for (int i = 0; i < 500 && !logged; i++) {
                FILE *f = fopen(daemon_.log_path, "re");
                size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
                if (f)
                        fclose(f);
                out[n] = '\0';
                logged = strstr(out, "keeping the old one") && strstr(out, "quotaa");
                if (!logged)
                        usleep(10000);
        }
        ck_assert_msg(logged, "log: %s", out);
        ck_assert_int_eq(ctl(0, out, sizeof(out), "quota", "get", "batch", NULL, NULL), 0);
        ck_assert_msg(strstr(out, "80.0M"), "quota kept: %s", out);
        gm_test_daemon_stop(&daemon_);
}
END_TEST

START_TEST(test_admin_group_grants_admin) {
        char out[4096];
        gm_test_daemon_start(&daemon_, "256M", NULL);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "quota", "set", "x", "1G", "--runtime"), 1);
        gm_test_daemon_stop(&daemon_);
        gm_test_daemon_start_config(&daemon_, "256M", NULL, "admin_group = nogroup\n");
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "quota", "set", "x", "1G", "--runtime"), 0);
        ck_assert_int_eq(ctl(NOBODY, out, sizeof(out), "stats", "--json", NULL, NULL, NULL), 0);
        gm_test_daemon_stop(&daemon_);
}
END_TEST

/* A snapshot shows a tenant its own memory only; an admin sees every session
 * and can narrow it to one pid. */
START_TEST(test_snapshot_shows_own_tenant_only) {
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0); /* tenant uid:0 */
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        char size[32], out[8192], file[400], cmd[1024];
        snprintf(size, sizeof(size), "%llu", 4 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "hold", size, "5", NULL};
        gm_test_proc_t holder;
        gm_test_spawn(argv, NOBODY, &holder);
        ck_assert(gm_test_proc_read_line(&holder, out, sizeof(out)));
        struct {
                uid_t uid;
                const char *pid;
                const char *expect; /* tenants of the segments, sorted, comma-separated */
        } cases[] = {
                {NOBODY, NULL, "uid:65534"},
                {0, NULL, "uid:0,uid:65534"},
                {0, "self", "uid:0"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                snprintf(file, sizeof(file), "%s/snap-%zu.json", daemon_.dir, i);
                char pid[16];
                snprintf(pid, sizeof(pid), "%d", (int) getpid());
                const char *snap[] = {GPUMEMCTL_BIN, "-s",   daemon_.socket_path,           "snapshot", "-o", "-",
                                      "--format",    "json", cases[i].pid ? "--pid" : NULL, pid,        NULL};
                static char json[1 << 20];
                ck_assert_int_eq(gm_test_run_as(json, sizeof(json), cases[i].uid, snap), 0);
                FILE *f = fopen(file, "we");
                ck_assert_ptr_nonnull(f);
                fputs(json, f);
                fclose(f);
                snprintf(cmd, sizeof(cmd),
                         "python3 -c \"import json,sys; d=json.load(open('%s')); "
                         "t=','.join(sorted({s['tenant'] for s in d['segments']})); "
                         "sys.exit(0 if t == '%s' else print(t) or 1)\"",
                         file, cases[i].expect);
                ck_assert_msg(system(cmd) == 0, "case %zu: snapshot tenants differ", i);
        }
        ck_assert_int_eq(gm_test_proc_finish(&holder), 0);
        gpumem_disconnect(c);
}
END_TEST

static Suite *tenants_suite(void) {
        Suite *s = suite_create("tenants");
        TCase *tc = tcase_create("tenants");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, test_quota_never_exceeded_by_racing_processes);
        tcase_add_test(tc, test_runtime_quota_applies_to_next_allocation);
        tcase_add_test(tc, test_non_admin_is_refused_and_sees_own_tenant);
        tcase_add_test(tc, test_idle_cache_of_another_tenant_is_reclaimed);
        tcase_add_test(tc, test_unacknowledged_release_keeps_charge);
        tcase_add_test(tc, test_stopped_client_is_not_waited_for);
        tcase_add_test(tc, test_isolation_between_tenants);
        tcase_add_test(tc, test_snapshot_shows_own_tenant_only);
        suite_add_tcase(s, tc);
        TCase *conf = tcase_create("config");
        tcase_set_timeout(conf, 180);
        tcase_add_test(conf, test_config_rules_pick_tenant_and_quota);
        tcase_add_test(conf, test_persistent_quota_survives_restart);
        tcase_add_test(conf, test_sighup_reloads_and_keeps_old_on_error);
        tcase_add_test(conf, test_admin_group_grants_admin);
        suite_add_tcase(s, conf);
        return s;
}

int main(void) {
        if (geteuid() != 0) {
                /* setpriv to other uids needs root: report it, and fail loudly in CI. */
                fprintf(stderr, "test_tenants: needs root to run clients as other users\n");
                return getenv("CI") ? EXIT_FAILURE : 77;
        }
        SRunner *sr = srunner_create(tenants_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
