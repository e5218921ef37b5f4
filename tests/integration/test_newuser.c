/* What a new user meets first, end to end: the socket a client picks by
 * itself, gpumemctl as a non-admin, its messages and argument checks, the
 * out-of-memory counters and the quota refusal's text. Real gpumemd, real
 * gpumemctl, gm-test-client and gpumem-demo processes, some under another uid
 * (setpriv): needs root, and says so. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "ipc.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)
#define NOBODY 65534

static gm_test_daemon_t daemon_;
static char metrics_path_[108]; /* the daemon's metrics endpoint (a unix socket) */

static void setup(void) {
        char listen[128];
        snprintf(metrics_path_, sizeof(metrics_path_), "/tmp/gm-newuser-metrics-%d.sock", (int) getpid());
        unlink(metrics_path_);
        snprintf(listen, sizeof(listen), "unix:%s", metrics_path_);
        const char *args[] = {"--metrics-listen", listen, NULL};
        gm_test_daemon_start(&daemon_, "64M", args);
        unsetenv("GPUMEM_SOCKET");
        unsetenv("GPUMEM_SOCKET_TEMPLATE");
        unsetenv("GPUMEM_SYSTEM_SOCKET_DIR");
        setenv("XDG_RUNTIME_DIR", "/nonexistent-xdg", 1); /* no daemon of the caller's own */
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
        unlink(metrics_path_);
}

/* One series of the daemon's /metrics ("name{labels}"); -1 when absent. */
static long long metric(const char *series) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        memcpy(sa.sun_path, metrics_path_, strlen(metrics_path_) + 1);
        ck_assert_int_eq(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        static const char get[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
        ck_assert_int_eq(write(fd, get, sizeof(get) - 1), (ssize_t) sizeof(get) - 1);
        static char body[1 << 20];
        size_t len = 0;
        ssize_t n;
        while (len + 1 < sizeof(body) && (n = read(fd, body + len, sizeof(body) - 1 - len)) > 0)
                len += (size_t) n;
        body[len] = '\0';
        close(fd);
        size_t k = strlen(series);
        for (const char *p = body; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, series, k) == 0 && p[k] == ' ')
                        return strtoll(p + k + 1, NULL, 10);
        return -1;
}

/* Runs argv (NULL-terminated, at most 12) as `uid` with stdout and stderr
 * together in out; returns the exit status. */
static int run(uid_t uid, char *out, size_t len, const char *const *argv) {
        const char *sh[16] = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
        size_t n = 3;
        for (size_t i = 0; argv[i] && n < 15; i++)
                sh[n++] = argv[i];
        sh[n] = NULL;
        int status = gm_test_run_as(out, len, uid, sh);
        fprintf(stderr, "$ %s ...: %d\n%s", argv[0], status, out);
        return status;
}

#define CTL(uid, out, ...) run(uid, out, sizeof(out), (const char *const[]){GPUMEMCTL_BIN, __VA_ARGS__, NULL})
#define CTL_S(uid, out, ...) CTL(uid, out, "-s", daemon_.socket_path, __VA_ARGS__)

static void assert_has(const char *text, const char *want) {
        ck_assert_msg(strstr(text, want), "expected '%s' in:\n%s", want, text);
}

static void assert_starts(const char *text, const char *prefix) {
        ck_assert_msg(strncmp(text, prefix, strlen(prefix)) == 0, "expected '%s' first in:\n%s", prefix, text);
}

static void assert_lacks(const char *text, const char *unwanted) {
        ck_assert_msg(!strstr(text, unwanted), "did not expect '%s' in:\n%s", unwanted, text);
}

/* A JSON number after "key": in text; -1 when absent. */
static long long json_number(const char *text, const char *key) {
        char pat[128];
        snprintf(pat, sizeof(pat), "\"%s\": ", key);
        const char *p = strstr(text, pat);
        return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

START_TEST(test_default_socket_is_the_system_daemons) {
        char out[16384];
        /* The packaged daemon's socket, where a test can put it. */
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", daemon_.dir, 1);
        ck_assert_int_eq(CTL(NOBODY, out, "stats", "--json"), 0);
        assert_has(out, "\"tenant\": \"uid:65534\"");
        ck_assert_int_eq(run(NOBODY, out, sizeof(out), (const char *const[]){GPUMEM_DEMO_BIN, "", "1", "50", NULL}), 0);
        assert_has(out, "demo: 1 client processes done, 0 failed");
        ck_assert_int_eq(CTL(0, out, "clients"), 0); /* root: the system socket always */
        /* No system daemon: the caller's own socket, named when it is not there. */
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", "/nonexistent-system", 1);
        ck_assert_int_eq(CTL(NOBODY, out, "stats"), 3);
        assert_has(out, "gpumemd is not running at '/nonexistent-xdg/gpumem/gpu0.sock'");
        assert_has(out, "systemctl start gpumemd@0");
        /* A system socket in a directory others may write to is not trusted. */
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", daemon_.dir, 1);
        ck_assert_int_eq(chmod(daemon_.dir, 0777), 0);
        ck_assert_int_eq(CTL(NOBODY, out, "stats"), 3);
        assert_has(out, daemon_.dir);
        assert_lacks(out, "not running");
        ck_assert_int_eq(chmod(daemon_.dir, 0755), 0);
}
END_TEST

START_TEST(test_root_daemon_listens_in_the_system_dir) {
        /* The daemon, as root and given no socket, listens where its clients
         * look for the system daemons: $GPUMEM_SYSTEM_SOCKET_DIR moves both. */
        char dir[300], sock[320], conf[320], out[16384];
        snprintf(dir, sizeof(dir), "%s/system", daemon_.dir);
        snprintf(sock, sizeof(sock), "%s/gpu0.sock", dir);
        snprintf(conf, sizeof(conf), "%s/system.conf", daemon_.dir);
        FILE *f = fopen(conf, "we");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "[daemon]\nstate_dir = %s/system-state\n", daemon_.dir);
        fclose(f);
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", dir, 1);
        gm_test_proc_t d;
        gm_test_spawn((const char *const[]){GPUMEMD_BIN, "--backend", gm_test_backend(), "--capacity", "16M",
                                            "--config", conf, "--metrics-listen", "none", NULL},
                      0, &d);
        int fd = -1;
        for (int i = 0; i < 1000 && gm_ipc_connect(sock, &fd) < 0; i++) /* readiness, not timing */
                usleep(10000);
        if (fd < 0) { /* elsewhere (the packaged /run/gpumem): stop it before failing */
                kill(d.pid, SIGTERM);
                gm_test_proc_finish(&d);
                ck_abort_msg("gpumemd did not listen on %s", sock);
        }
        close(fd);
        ck_assert_int_eq(CTL(NOBODY, out, "stats", "--json"), 0);
        assert_has(out, "\"capacity_bytes\": 16777216"); /* this daemon, not the fixture's 64M */
        ck_assert_int_eq(CTL(0, out, "stats", "--json"), 0);
        assert_has(out, "\"capacity_bytes\": 16777216");
        ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
        ck_assert_int_eq(gm_test_proc_finish(&d), 0);
        ck_assert_int_ne(access(sock, F_OK), 0);
}
END_TEST

START_TEST(test_missing_socket_says_the_daemon_is_not_running) {
        char out[4096], path[400], stale[100];
        snprintf(path, sizeof(path), "%s/gpu7.sock", daemon_.dir);
        ck_assert_int_eq(CTL(0, out, "-s", path, "stats"), 3);
        assert_has(out, "gpumemd is not running at '");
        assert_has(out, path);
        assert_lacks(out, "statistic");
        assert_has(out, "gpumemd --socket ");
        /* A socket left behind that nobody listens on. */
        ck_assert_int_lt(snprintf(stale, sizeof(stale), "%s/stale.sock", daemon_.dir), (int) sizeof(stale));
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        memcpy(sa.sun_path, stale, strlen(stale) + 1);
        ck_assert_int_eq(bind(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        ck_assert_int_eq(CTL(0, out, "-s", stale, "clients"), 3);
        assert_has(out, "nothing listens on that socket");
        close(fd);
        /* libgpumem says the same (gpumem-demo prints its message). */
        ck_assert_int_eq(run(0, out, sizeof(out), (const char *const[]){GPUMEM_DEMO_BIN, path, "1", "10", NULL}), 1);
        assert_has(out, "gpumemd is not running at '");
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(path, &c), -ENOENT);
        assert_has(gpumem_last_error(NULL), path);
        assert_lacks(gpumem_strerror(-ENOENT), "no such statistic or object");
}
END_TEST

START_TEST(test_plain_stats_shows_a_non_admin_its_tenant) {
        char size[32], out[16384];
        snprintf(size, sizeof(size), "%llu", 4 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "hold", size, "5", NULL};
        gm_test_proc_t holder;
        gm_test_spawn(argv, NOBODY, &holder);
        ck_assert(gm_test_proc_read_line(&holder, out, sizeof(out)));
        ck_assert_str_eq(out, "ready");
        ck_assert_int_eq(CTL_S(NOBODY, out, "stats"), 0);
        assert_has(out, "statistics of your tenant 'uid:65534'");
        assert_has(out, "PyTorch CUDA memory summary");
        ck_assert_int_eq(CTL_S(NOBODY, out, "stats", "--json"), 0);
        assert_has(out, "\"tenant\": \"uid:65534\"");
        ck_assert_int_eq(json_number(out, "allocated_bytes.all.current"), (long long) (4 * MiB));
        ck_assert_int_eq(CTL_S(0, out, "stats", "--json"), 0); /* an admin: the device */
        assert_lacks(out, "\"tenant\"");
        ck_assert_int_eq(CTL_S(NOBODY, out, "stats", "--tenant", "uid:0"), 1);
        ck_assert_int_eq(gm_test_proc_finish(&holder), 0);
}
END_TEST

START_TEST(test_arguments_that_name_nothing_or_too_much_fail) {
        char out[8192];
        char pid[32];
        snprintf(pid, sizeof(pid), "%d", (int) getpid()); /* a live process without a session */
        ck_assert_int_eq(CTL_S(0, out, "stats", "--pid", pid), 1);
        assert_has(out, "--pid names no session on this daemon");
        ck_assert_int_eq(CTL_S(0, out, "stats", "--tenant", "nosuch"), 1);
        assert_has(out, "no tenant 'nosuch'");
        ck_assert_int_eq(CTL_S(0, out, "trim", "--tenant", "nosuch"), 1);
        assert_has(out, "no tenant 'nosuch'");
        const char *extra[][3] = {{"trim", "extra", NULL},   {"clients", "--json", "extra"}, {"quota", "list", "x"},
                                  {"history", "off", "x"},   {"stats", "extra", NULL},       {"alloc-conf", "a", "b"},
                                  {"history", "status", "x"}};
        for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
                int r = extra[i][2] ? CTL_S(0, out, extra[i][0], extra[i][1], extra[i][2])
                                    : CTL_S(0, out, extra[i][0], extra[i][1]);
                ck_assert_int_eq(r, 2);
                assert_has(out, "unexpected argument");
        }
        ck_assert_int_eq(CTL_S(0, out, "quota", "get", "uid:0", "x"), 2);
        const char *bad_numbers[] = {"-5", "0", "abc", "12x", "", "99999999999999999999999", "100000001"};
        for (size_t i = 0; i < sizeof(bad_numbers) / sizeof(bad_numbers[0]); i++) {
                ck_assert_int_eq(CTL_S(0, out, "history", "on", "--max-entries", bad_numbers[i]), 2);
                assert_has(out, "--max-entries: expected a whole number from 1 to 100000000");
        }
        ck_assert_int_eq(CTL_S(0, out, "stats", "--pid", "-1"), 2);
        assert_has(out, "--pid: expected a whole number");
        ck_assert_int_eq(CTL(0, out, "-d", "x", "stats"), 2);
        assert_has(out, "-d: expected a whole number");
        ck_assert_int_eq(CTL(0, out, "-s", daemon_.socket_path, "-d", "0", "stats"), 2);
        ck_assert_int_eq(CTL(0, out, "--version"), 0);
        ck_assert_str_eq(out, "gpumemctl " GPUMEM_VERSION "\n");
        ck_assert_int_eq(CTL(0, out, "--help"), 0);
        assert_has(out, "history on [--max-entries N] | off | status");
}
END_TEST

START_TEST(test_usage_errors_need_no_daemon) {
        /* Arguments are checked before the daemon is reached: a usage error is
         * one (exit 2, with the usage) with no daemon running too. */
        char out[8192];
        const char *none = "/nonexistent-gpumemd/gpu0.sock";
        ck_assert_int_eq(CTL(0, out, "-s", none, "stats", "--bogus"), 2);
        assert_has(out, "Usage: gpumemctl");
        assert_lacks(out, "not running");
        const char *bad[][4] = {{"trim", "extra", NULL},           {"history", "on", "--max-entries", "0"},
                                {"quota", "set", "uid:0", "lots"}, {"top", "--interval", "soon", NULL},
                                {"diagnose", "--pid", "x", NULL},  {"status", "extra", NULL}};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                ck_assert_int_eq(run(0, out, sizeof(out),
                                     (const char *const[]){GPUMEMCTL_BIN, "-s", none, bad[i][0], bad[i][1], bad[i][2],
                                                           bad[i][3], NULL}),
                                 2);
                assert_lacks(out, "not running");
        }
        ck_assert_int_eq(CTL(0, out, "-s", none, "stats"), 3); /* well formed: then the daemon is missed */
        assert_has(out, "gpumemd is not running at '/nonexistent-gpumemd/gpu0.sock'");
}
END_TEST

START_TEST(test_device_flag_picks_that_gpus_daemon) {
        char out[8192], tmpl[400], other[400];
        snprintf(tmpl, sizeof(tmpl), "%s/gpu%%d.sock", daemon_.dir);
        snprintf(other, sizeof(other), "%s/gpu1.sock", daemon_.dir);
        setenv("GPUMEM_SOCKET", "/nonexistent/elsewhere.sock", 1); /* -d names the daemon, not this */
        setenv("GPUMEM_SOCKET_TEMPLATE", tmpl, 1);
        ck_assert_int_eq(CTL(0, out, "-d", "0", "clients"), 0);
        ck_assert_int_eq(CTL(0, out, "--device", "1", "clients"), 3);
        assert_has(out, other);
        unsetenv("GPUMEM_SOCKET_TEMPLATE");
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", daemon_.dir, 1); /* GPU N's default socket */
        unsetenv("GPUMEM_SOCKET");
        ck_assert_int_eq(CTL(NOBODY, out, "-d", "0", "stats", "--json"), 0);
        ck_assert_int_eq(CTL(NOBODY, out, "-d", "1", "stats"), 3); /* no system daemon of GPU 1: the caller's own */
        assert_has(out, "gpumemd is not running at '/nonexistent-xdg/gpumem/gpu1.sock'");
}
END_TEST

START_TEST(test_history_status_and_quota_json) {
        char out[8192];
        ck_assert_int_eq(CTL_S(0, out, "history", "status"), 0);
        assert_has(out, "history off");
        ck_assert_int_eq(CTL_S(0, out, "history", "on", "--max-entries", "1000"), 0);
        ck_assert_int_eq(CTL_S(0, out, "history", "status"), 0);
        assert_has(out, "history on (max 1000 entries");
        ck_assert_int_eq(CTL_S(NOBODY, out, "history", "status"), 1); /* the device's ring: admins' */
        ck_assert_int_eq(CTL_S(0, out, "history", "off"), 0);
        ck_assert_int_eq(CTL_S(0, out, "quota", "set", "training", "1G", "--runtime"), 0);
        ck_assert_int_eq(CTL_S(0, out, "quota", "list", "--json"), 0);
        assert_has(out, "{\"tenant\": \"training\", \"quota_bytes\": 1073741824, \"quota_source\": \"runtime\", "
                        "\"reserved_bytes\": 0");
        ck_assert_int_eq(out[0], '[');
        ck_assert_int_eq(CTL_S(0, out, "quota", "get", "training", "--json"), 0);
        assert_starts(out, "[{\"tenant\": \"training\"");
        ck_assert_int_eq(CTL_S(NOBODY, out, "quota", "list", "--json"), 0);
        assert_lacks(out, "training");
}
END_TEST

START_TEST(test_clients_names_each_processs_command) {
        char size[32], out[16384];
        snprintf(size, sizeof(size), "%llu", MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "hold", size, "5", NULL};
        gm_test_proc_t holder;
        gm_test_spawn(argv, NOBODY, &holder);
        ck_assert(gm_test_proc_read_line(&holder, out, sizeof(out)));
        /* A process may name itself anything: shown escaped. */
        int ready[2], done[2];
        ck_assert_int_eq(pipe(ready), 0);
        ck_assert_int_eq(pipe(done), 0);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                prctl(PR_SET_NAME, "evil\x1b[2J\n");
                gpumem_client *c;
                char ch = gpumem_connect(daemon_.socket_path, &c) == 0 ? 'y' : 'n';
                if (write(ready[1], &ch, 1) != 1 || read(done[0], &ch, 1) < 0)
                        _exit(1);
                _exit(0);
        }
        char ch;
        ck_assert_int_eq(read(ready[0], &ch, 1), 1);
        ck_assert_int_eq(ch, 'y');
        ck_assert_int_eq(CTL_S(0, out, "clients"), 0);
        assert_has(out, "COMMAND");
        assert_has(out, " gm-test-client");
        ck_assert_int_eq(CTL_S(0, out, "clients", "--json"), 0);
        assert_has(out, "\"command\": \"gm-test-client\"");
        assert_has(out, "\"command\": \"gpumemctl\"");
        assert_has(out, "\"command\": \"evil\\\\x1b[2J\\\\x0a\"");
        ck_assert_int_eq(CTL_S(NOBODY, out, "clients", "--json"), 0);
        assert_has(out, "\"command\": \"gm-test-client\"");
        assert_lacks(out, "evil"); /* another tenant's process */
        ck_assert_int_eq(write(done[1], "x", 1), 1);
        ck_assert_int_eq(waitpid(child, NULL, 0), child);
        ck_assert_int_eq(gm_test_proc_finish(&holder), 0);
}
END_TEST

START_TEST(test_demo_help_prints_usage) {
        char out[4096];
        setenv("GPUMEM_SOCKET", "/nonexistent/gpu0.sock", 1);
        ck_assert_int_eq(run(0, out, sizeof(out), (const char *const[]){GPUMEM_DEMO_BIN, "--help", NULL}), 0);
        assert_starts(out, "Usage: gpumem-demo");
        assert_lacks(out, "demo[");
        ck_assert_int_eq(run(0, out, sizeof(out), (const char *const[]){GPUMEM_DEMO_BIN, "-x", NULL}), 2);
        ck_assert_int_eq(run(0, out, sizeof(out), (const char *const[]){GPUMEM_DEMO_BIN, "", "many", NULL}), 2);
        assert_has(out, "PROCESSES: expected a whole number");
}
END_TEST

START_TEST(test_quota_refusal_speaks_to_who_hit_it) {
        char out[8192];
        ck_assert_int_eq(CTL_S(0, out, "quota", "set", "uid:65534", "8M", "--runtime"), 0);
        char size[32];
        snprintf(size, sizeof(size), "%llu", 12 * MiB);
        ck_assert_int_eq(run(NOBODY, out, sizeof(out),
                             (const char *const[]){GM_TEST_CLIENT, daemon_.socket_path, "try", size, "1", NULL}),
                         0);
        assert_starts(out, "refused 122 CUDA out of memory: tenant 'uid:65534' is at its gpumemd quota.");
        assert_has(out, "over its quota of 8.00 MiB");
        assert_has(out, "ask an administrator to raise the quota");
        assert_lacks(out, "trim --tenant");
        assert_lacks(out, "quota set");
        assert_lacks(out, "Tried to allocate 12.00 MiB. GPU 0 has a total capacity");
        /* One refusal seen, one counted (a local heap's ladder asks up to three times). */
        ck_assert_int_eq(metric("gpumem_oom_refusals_total{device=\"0\",tenant=\"uid:65534\",reason=\"quota\"}"), 1);
        /* An admin is told what an admin can do. */
        ck_assert_int_eq(CTL_S(0, out, "quota", "set", "uid:0", "8M", "--runtime"), 0);
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), -EDQUOT);
        const char *msg = gpumem_last_error(c);
        assert_starts(msg, "CUDA out of memory: tenant 'uid:0' is at its gpumemd quota.");
        assert_has(msg, "`gpumemctl quota set uid:0 BYTES`");
        gpumem_disconnect(c);
}
END_TEST

/* num_ooms counts the refusals a caller saw (as PyTorch's does); an
 * allocation served after waiting for another process's cache is a reclaim
 * wait, not an out-of-memory. */
START_TEST(test_num_ooms_counts_only_refusals_seen) {
        char size[32], out[16384], pid[32];
        snprintf(size, sizeof(size), "%llu", 20 * MiB);
        const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "cache", size, "2", NULL};
        gm_test_proc_t hoarder; /* 40 MiB idle in its cache, of 64 */
        gm_test_spawn(argv, 0, &hoarder);
        ck_assert(gm_test_proc_read_line(&hoarder, out, sizeof(out)));
        ck_assert_str_eq(out, "ready");
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 40 * MiB, 0, &p), 0); /* after the hoarder's cache came back */
        snprintf(pid, sizeof(pid), "%d", (int) getpid());
        ck_assert_int_eq(CTL_S(0, out, "stats", "--pid", pid, "--json"), 0);
        ck_assert_int_eq(json_number(out, "num_ooms"), 0);
        ck_assert_int_eq(json_number(out, "num_reclaim_waits"), 1);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "num_ooms", &v), 0);
        ck_assert_int_eq(v, 0);
        ck_assert_int_eq(gpumem_alloc(c, 40 * MiB, 0, &q), -ENOMEM); /* nothing left to reclaim */
        ck_assert_int_eq(gpumem_stat(c, "num_ooms", &v), 0);
        ck_assert_int_eq(v, 1);
        ck_assert_int_eq(CTL_S(0, out, "stats", "--pid", pid, "--json"), 0);
        ck_assert_int_eq(json_number(out, "num_ooms"), 1);
        ck_assert_int_eq(json_number(out, "num_reclaim_waits"), 1);
        ck_assert_int_eq(CTL_S(0, out, "stats"), 0);
        assert_has(out, "CUDA OOMs: 1 ");
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_proc_finish(&hoarder), 0);
}
END_TEST

static Suite *newuser_suite(void) {
        Suite *s = suite_create("newuser");
        TCase *tc = tcase_create("newuser");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_default_socket_is_the_system_daemons);
        tcase_add_test(tc, test_root_daemon_listens_in_the_system_dir);
        tcase_add_test(tc, test_missing_socket_says_the_daemon_is_not_running);
        tcase_add_test(tc, test_plain_stats_shows_a_non_admin_its_tenant);
        tcase_add_test(tc, test_arguments_that_name_nothing_or_too_much_fail);
        tcase_add_test(tc, test_usage_errors_need_no_daemon);
        tcase_add_test(tc, test_device_flag_picks_that_gpus_daemon);
        tcase_add_test(tc, test_history_status_and_quota_json);
        tcase_add_test(tc, test_clients_names_each_processs_command);
        tcase_add_test(tc, test_demo_help_prints_usage);
        tcase_add_test(tc, test_quota_refusal_speaks_to_who_hit_it);
        tcase_add_test(tc, test_num_ooms_counts_only_refusals_seen);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        if (geteuid() != 0) {
                /* setpriv to other uids needs root: report it, and fail loudly in CI. */
                fprintf(stderr, "test_newuser: needs root to run clients as other users\n");
                return getenv("CI") ? EXIT_FAILURE : 77;
        }
        return gm_test_run_suite(newuser_suite());
}
