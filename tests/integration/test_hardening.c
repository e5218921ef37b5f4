/* Issue #17, "nobody in where they don't belong": no squatting on another
 * user's socket (squatters are real processes of other uids listening on real
 * sockets; the victims are libgpumem in this process and gpumemctl), flags
 * that cannot wrap, client text that cannot forge log lines, session limits
 * per uid and for silent connections, and a metrics endpoint one user cannot
 * blind. Needs root (to act as other uids); reports and skips otherwise. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>

#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

#define NOBODY 65534
#define SQUATTER 65533

/* A listener of another uid: it reports every connection it gets. */
typedef struct squatter {
        pid_t pid;
        int done_fd;   /* closed by the test: the squatter takes what waits and exits */
        int report_fd; /* one 'C' per connection it accepted */
        char dir[64];
        char path[96];
} squatter_t;

typedef enum { DROP_BEFORE_BIND, DROP_AFTER_BIND } drop_t;

static void squatter_main(const squatter_t *s, int done_fd, int report_fd, int ready_fd, drop_t drop) {
        if (drop == DROP_BEFORE_BIND &&
            (setresgid(SQUATTER, SQUATTER, SQUATTER) < 0 || setresuid(SQUATTER, SQUATTER, SQUATTER) < 0))
                _exit(2);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
        if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || chmod(s->path, 0777) < 0)
                _exit(3);
        /* SO_PEERCRED names whoever called listen(). */
        if (drop == DROP_AFTER_BIND &&
            (setresgid(SQUATTER, SQUATTER, SQUATTER) < 0 || setresuid(SQUATTER, SQUATTER, SQUATTER) < 0))
                _exit(2);
        if (listen(fd, 16) < 0 || write(ready_fd, "R", 1) != 1)
                _exit(4);
        for (;;) {
                struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = done_fd, .events = POLLIN}};
                if (poll(p, 2, 10000) <= 0)
                        _exit(5); /* bounded: the test never waits this long */
                if (p[0].revents & POLLIN) {
                        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
                        if (c >= 0) {
                                (void) !write(report_fd, "C", 1);
                                close(c); /* the victim sees the daemon gone */
                        }
                        continue;
                }
                _exit(0);
        }
}

/* Directory owned by dir_uid with mode dir_mode, a squatter listening in it. */
static void squatter_start(squatter_t *s, uid_t dir_uid, mode_t dir_mode, drop_t drop) {
        memset(s, 0, sizeof(*s));
        snprintf(s->dir, sizeof(s->dir), "/tmp/gpumem-squat-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(s->dir));
        snprintf(s->path, sizeof(s->path), "%s/gpu0.sock", s->dir);
        ck_assert_int_eq(chown(s->dir, dir_uid, dir_uid), 0);
        ck_assert_int_eq(chmod(s->dir, dir_mode), 0);
        int done[2], report[2], ready[2];
        ck_assert_int_eq(pipe2(done, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(report, O_CLOEXEC | O_NONBLOCK), 0);
        ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
        s->pid = fork();
        ck_assert_int_ge(s->pid, 0);
        if (s->pid == 0) {
                close(done[1]);
                close(report[0]);
                close(ready[0]);
                squatter_main(s, done[0], report[1], ready[1], drop);
        }
        close(done[0]);
        close(report[1]);
        close(ready[1]);
        char ch;
        ck_assert_int_eq(read(ready[0], &ch, 1), 1);
        close(ready[0]);
        s->done_fd = done[1];
        s->report_fd = report[0];
}

/* Stops the squatter; returns how many connections it got. */
static int squatter_finish(squatter_t *s) {
        close(s->done_fd);
        int status;
        ck_assert_int_eq(waitpid(s->pid, &status, 0), s->pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "squatter status %d", status);
        char buf[64];
        ssize_t n = read(s->report_fd, buf, sizeof(buf));
        close(s->report_fd);
        unlink(s->path);
        rmdir(s->dir);
        return n > 0 ? (int) n : 0;
}

/* The exit status of "gpumemctl stats" as uid (for its own tenant), its
 * output and stderr in out. */
static int ctl_status(const char *socket_path, uid_t uid, char *out, size_t len) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "exec '%s' -s '%s' stats --tenant uid:%u 2>&1", GPUMEMCTL_BIN, socket_path,
                 (unsigned) uid);
        const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        return uid ? gm_test_run_as(out, len, uid, argv) : gm_test_run(out, len, argv);
}

/* gpumem_connect(path) is refused with -EPERM, and says `why`. */
static void expect_refused(const char *path, const char *why) {
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect(path, &c), -EPERM);
        ck_assert_ptr_null(c);
        const char *msg = gpumem_last_error(NULL);
        ck_assert_msg(strstr(msg, why) && strstr(msg, path), "%s", msg);
}

START_TEST(test_squatted_directory_refused) {
        /* Another user made the directory (as with /tmp/gpumem-<uid> when
         * XDG_RUNTIME_DIR is unset) and listens in it. */
        squatter_t s;
        squatter_start(&s, SQUATTER, 0755, DROP_BEFORE_BIND);
        expect_refused(s.path, "refusing socket directory");
        expect_refused(s.path, "owned by uid 65533, not by root");

        char out[1024];
        ck_assert_int_ne(ctl_status(s.path, 0, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "refusing socket directory") && strstr(out, s.dir), "%s", out);
        ck_assert_int_ne(ctl_status(s.path, NOBODY, out, sizeof(out)), 0); /* any victim */
        ck_assert_msg(strstr(out, "owned by uid 65533"), "%s", out);
        ck_assert_int_eq(squatter_finish(&s), 0); /* nobody even connected */
}
END_TEST

START_TEST(test_world_writable_directory_refused) {
        /* Root's directory, but anyone may create names in it. */
        squatter_t s;
        squatter_start(&s, 0, 0777, DROP_BEFORE_BIND);
        expect_refused(s.path, "writable by other users (mode 0777)");
        ck_assert_int_eq(squatter_finish(&s), 0);
}
END_TEST

START_TEST(test_daemon_of_untrusted_uid_refused) {
        /* The directory is fine, the listener is not: SO_PEERCRED names uid
         * 65533, neither root, the caller nor the service user. */
        squatter_t s;
        squatter_start(&s, 0, 0755, DROP_AFTER_BIND);
        expect_refused(s.path, "refusing the daemon: it runs as uid 65533");
        char out[1024];
        ck_assert_int_ne(ctl_status(s.path, NOBODY, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "runs as uid 65533"), "%s", out);
        /* Connected (the check needs the connection), but never spoke. */
        ck_assert_int_eq(squatter_finish(&s), 2);

        /* Named as the daemon's user, the same listener is trusted: the
         * connection gets past the check and then finds the daemon gone. */
        squatter_start(&s, 0, 0755, DROP_AFTER_BIND);
        setenv("GPUMEM_DAEMON_USER", "65533", 1);
        gpumem_client *c = NULL;
        int r = gpumem_connect(s.path, &c);
        unsetenv("GPUMEM_DAEMON_USER");
        ck_assert_int_eq(r, -ECONNRESET);
        ck_assert_int_eq(squatter_finish(&s), 1);
}
END_TEST

START_TEST(test_own_daemon_accepted) {
        /* The ordinary case for every user: a daemon of root in root's 0755
         * directory, reached by root and by another uid. */
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        char out[4096];
        ck_assert_int_eq(ctl_status(d.socket_path, 0, out, sizeof(out)), 0);
        ck_assert_int_eq(ctl_status(d.socket_path, NOBODY, out, sizeof(out)), 0);
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect(d.socket_path, &c), 0);
        gpumem_disconnect(c);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- the daemon's own checks ---- */

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

/* Runs gpumemd with args (NULL-terminated, after --backend host --capacity
 * 64M --config /dev/null) expecting it to exit at once; returns its status
 * with stderr in out. */
static int daemon_refuses(char *out, size_t len, const char *const *args) {
        char cmd[1024];
        int n = snprintf(cmd, sizeof(cmd), "exec '%s' --backend host --capacity 64M --config /dev/null", GPUMEMD_BIN);
        for (size_t i = 0; args[i]; i++)
                n += snprintf(cmd + n, sizeof(cmd) - (size_t) n, " '%s'", args[i]);
        snprintf(cmd + n, sizeof(cmd) - (size_t) n, " 2>&1 </dev/null");
        const char *argv[] = {"/usr/bin/timeout", "20", "/bin/sh", "-c", cmd, NULL};
        return gm_test_run(out, len, argv);
}

START_TEST(test_numeric_flags_range_checked) {
        /* Each once wrapped: 4294967296 sessions became 0 (every client
         * refused), -5 became 4294967291, '' fell back to the default path. */
        static const struct {
                const char *flag, *value, *says;
        } cases[] = {
                {"--max-sessions", "4294967296",
                 "Invalid --max-sessions '4294967296': a whole number from 1 to 1048576"},
                {"--max-sessions", "-5", "Invalid --max-sessions '-5': a whole number from 1 to 1048576"},
                {"--max-sessions", "0", "Invalid --max-sessions '0'"},
                {"--max-sessions", " 8", "Invalid --max-sessions ' 8'"},
                {"--max-blocks", "18446744073709551617",
                 "Invalid --max-blocks '18446744073709551617': a whole number from 1 to 4294967296"},
                {"--max-sessions-per-uid", "0x10", "Invalid --max-sessions-per-uid '0x10'"},
                {"--unresponsive-timeout", "86400001",
                 "Invalid --unresponsive-timeout '86400001': a whole number from 0 to 86400000"},
                {"--unresponsive-timeout", "-1", "Invalid --unresponsive-timeout '-1'"},
                {"--device", "4294967296", "Invalid --device '4294967296'"},
                {"--device", "-1", "Invalid --device '-1'"},
                {"--socket", "", "Invalid --socket '': an absolute path"},
                {"--socket", "relative.sock", "Invalid --socket 'relative.sock': an absolute path"},
                {"--capacity", "1e3G", "Invalid --capacity '1e3G'"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char out[2048];
                const char *args[] = {cases[i].flag, cases[i].value, NULL};
                int status = daemon_refuses(out, sizeof(out), args);
                ck_assert_msg(status == 1, "%s '%s': status %d: %s", cases[i].flag, cases[i].value, status, out);
                ck_assert_msg(strstr(out, cases[i].says), "%s '%s': %s", cases[i].flag, cases[i].value, out);
        }
}
END_TEST

/* Starts gpumemd on socket `path` (its own config in dir) and waits until it
 * answers; returns its pid. */
static pid_t daemon_at(const char *dir, const char *path, const char *const *extra) {
        char conf[160], log[160];
        snprintf(conf, sizeof(conf), "%s/gpumemd.conf", dir);
        snprintf(log, sizeof(log), "%s/gpumemd.log", dir);
        FILE *f = fopen(conf, "we");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "[daemon]\nstate_dir = %s/state\n", dir);
        fclose(f);
        const char *argv[16] = {GPUMEMD_BIN, "--backend", "host",     "--capacity", "64M",
                                "--socket",  path,        "--config", conf};
        size_t n = 9;
        for (size_t i = 0; extra && extra[i] && n < 15; i++)
                argv[n++] = extra[i];
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (fd >= 0)
                        dup2(fd, STDERR_FILENO);
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        for (int i = 0; i < 1000; i++) {
                int fd;
                if (gm_ipc_connect(path, &fd) == 0) {
                        close(fd);
                        return pid;
                }
                int status;
                if (waitpid(pid, &status, WNOHANG) == pid)
                        ck_abort_msg("gpumemd exited during start (status %d); see %s", status, log);
                sleep_ms(10);
        }
        ck_abort_msg("gpumemd did not come up at %s", path);
        return -1;
}

static void daemon_stop(pid_t pid) {
        kill(pid, SIGTERM);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gpumemd status %d", status);
}

START_TEST(test_socket_directory_made_before_ledger) {
        /* The socket's directory does not exist yet: the ledger next to the
         * socket was once opened before it was made, and silently not kept. */
        char dir[64], path[160], ledger[192];
        snprintf(dir, sizeof(dir), "/tmp/gpumemd-test-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
        ck_assert_int_eq(chmod(dir, 0755), 0);
        snprintf(path, sizeof(path), "%s/run/gpumem/gpu0.sock", dir);
        snprintf(ledger, sizeof(ledger), "%s.ledger", path);
        pid_t pid = daemon_at(dir, path, NULL);
        struct stat st;
        ck_assert_msg(stat(ledger, &st) == 0, "no ledger at %s", ledger);
        ck_assert(S_ISREG(st.st_mode));
        daemon_stop(pid);
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_daemon_refuses_squatted_directory) {
        char dir[64], path[128], out[2048];
        snprintf(dir, sizeof(dir), "/tmp/gpumemd-test-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/gpu0.sock", dir);
        const char *args[] = {"--socket", path, NULL};

        ck_assert_int_eq(chown(dir, SQUATTER, SQUATTER), 0); /* another user's directory */
        ck_assert_int_eq(chmod(dir, 0755), 0);
        ck_assert_int_eq(daemon_refuses(out, sizeof(out), args), 1);
        ck_assert_msg(strstr(out, "Refusing to start: refusing socket directory") && strstr(out, "owned by uid 65533"),
                      "%s", out);

        ck_assert_int_eq(chown(dir, 0, 0), 0); /* root's, but anyone may write */
        ck_assert_int_eq(chmod(dir, 0777), 0);
        ck_assert_int_eq(daemon_refuses(out, sizeof(out), args), 1);
        ck_assert_msg(strstr(out, "writable by other users (mode 0777)"), "%s", out);
        struct stat st;
        ck_assert_int_ne(stat(path, &st), 0); /* nothing was created there */
        char ledger[160];
        snprintf(ledger, sizeof(ledger), "%s.ledger", path);
        ck_assert_int_ne(stat(ledger, &st), 0);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* ---- client text ---- */

START_TEST(test_client_name_cannot_forge_log_lines) {
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        int fd = gm_test_raw_connect(d.socket_path);
        gm_test_raw_hello_named(fd, false, "evil\n<0>gpumemd: FORGED\x1b[2J\x7f\xc2\x9b\xff\\x");

        char out[16384];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", d.socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        /* Escaped by the daemon, then once more as JSON. */
        ck_assert_msg(strstr(out, "\"evil\\\\x0a<0>gpumemd: FORGED\\\\x1b[2J\\\\x7f\\\\xc2\\\\x9b\\\\xff"
                                  "\\\\\\\\x\""),
                      "%s", out);
        ck_assert_ptr_null(strchr(out, '\x1b'));
        close(fd);

        FILE *f = fopen(d.log_path, "re");
        ck_assert_ptr_nonnull(f);
        char line[1024];
        bool seen = false;
        while (fgets(line, sizeof(line), f)) {
                ck_assert_msg(strncmp(line, "<0>", 3) != 0, "forged line: %s", line);
                ck_assert_ptr_null(strchr(line, '\x1b'));
                seen = seen || strstr(line, "client 'evil\\x0a<0>gpumemd: FORGED\\x1b[2J");
        }
        fclose(f);
        ck_assert(seen);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- fair limits ---- */

START_TEST(test_sessions_per_uid_limited) {
        gm_test_daemon_t d;
        static const char *const args[] = {"--max-sessions", "16", "--max-sessions-per-uid", "4", NULL};
        gm_test_daemon_start(&d, "64M", args);
        int fds[4];
        for (int i = 0; i < 4; i++) { /* root takes its four */
                fds[i] = gm_test_raw_connect(d.socket_path);
                gm_test_raw_hello(fds[i], false);
        }
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect(d.socket_path, &c), -EUSERS);
        const char *msg = gpumem_last_error(NULL);
        ck_assert_msg(strstr(msg, "session limit for uid 0 reached (4 sessions)"), "%s", msg);
        char out[4096];
        ck_assert_int_ne(ctl_status(d.socket_path, 0, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "session limit for uid 0 reached"), "%s", out);
        /* Others are not locked out. */
        ck_assert_int_eq(ctl_status(d.socket_path, NOBODY, out, sizeof(out)), 0);
        /* A slot given back is taken again. */
        close(fds[0]);
        int r = -EUSERS;
        for (int i = 0; i < 500 && r == -EUSERS; i++) {
                r = gpumem_connect(d.socket_path, &c);
                if (r == -EUSERS)
                        sleep_ms(10);
        }
        ck_assert_int_eq(r, 0);
        gpumem_disconnect(c);
        for (int i = 1; i < 4; i++)
                close(fds[i]);
        gm_test_daemon_stop(&d);
}
END_TEST

START_TEST(test_silent_connections_closed) {
        /* Connections that never say Hello once held their slots forever. */
        gm_test_daemon_t d;
        static const char *const args[] = {"--max-sessions", "16", "--max-sessions-per-uid", "16", NULL};
        gm_test_daemon_start_config(&d, "64M", args, "hello_timeout_ms = 300\n");
        int fds[8];
        for (int i = 0; i < 8; i++)
                fds[i] = gm_test_raw_connect(d.socket_path);
        /* Each is told why and closed; poll is bounded (10 s). */
        for (int i = 0; i < 8; i++) {
                Gpumem__Envelope *env = NULL;
                struct pollfd p = {.fd = fds[i], .events = POLLIN};
                ck_assert_int_eq(poll(&p, 1, 10000), 1);
                env = gm_test_raw_recv(fds[i]);
                ck_assert_ptr_nonnull(env);
                ck_assert_int_eq(env->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
                ck_assert_int_eq(env->error->code, ETIMEDOUT);
                ck_assert_ptr_nonnull(strstr(env->error->message, "no Hello within 300 ms"));
                gm_msg_free(env);
                ck_assert_ptr_null(gm_test_raw_recv(fds[i])); /* then closed */
                close(fds[i]);
        }
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect(d.socket_path, &c), 0);
        gpumem_disconnect(c);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- metrics ---- */

static unsigned metrics_port(const gm_test_daemon_t *d) {
        unsigned port = 0;
        char line[512];
        for (int i = 0; i < 1000 && !port; i++) {
                FILE *f = fopen(d->log_path, "re");
                ck_assert_ptr_nonnull(f);
                while (!port && fgets(line, sizeof(line), f))
                        if (sscanf(line, "<%*d>metrics: serving http://127.0.0.1:%u/metrics", &port) != 1)
                                port = 0;
                fclose(f);
                if (!port)
                        sleep_ms(10);
        }
        ck_assert_uint_gt(port, 0);
        return port;
}

static int connect_tcp(unsigned port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd >= 0 && connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0)
                return fd;
        if (fd >= 0)
                close(fd);
        return -1;
}

/* One scrape within 2 s: its body (malloc'd) on 200, else NULL. */
static char *scrape_tcp(unsigned port) {
        int fd = connect_tcp(port);
        if (fd < 0)
                return NULL;
        static const char req[] = "GET /metrics HTTP/1.1\r\nHost: gpumemd\r\nConnection: close\r\n\r\n";
        size_t cap = 1 << 20, len = 0;
        char *buf = malloc(cap);
        if (write(fd, req, sizeof(req) - 1) != (ssize_t) sizeof(req) - 1)
                len = 0;
        for (;;) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                if (poll(&p, 1, 2000) != 1)
                        break;
                ssize_t n = read(fd, buf + len, cap - 1 - len);
                if (n <= 0)
                        break;
                len += (size_t) n;
        }
        close(fd);
        buf[len] = '\0';
        if (strncmp(buf, "HTTP/1.1 200", 12) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}

/* Slowloris as uid SQUATTER: `n` connections that each trickle a header byte
 * every 200 ms, reopened when closed, for `seconds`. */
static pid_t slowloris(unsigned port, int n, int seconds) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid)
                return pid;
        if (setresgid(SQUATTER, SQUATTER, SQUATTER) < 0 || setresuid(SQUATTER, SQUATTER, SQUATTER) < 0)
                _exit(2);
        int fds[1024];
        for (int i = 0; i < n; i++)
                fds[i] = -1;
        for (int round = 0; round < seconds * 5; round++) {
                for (int i = 0; i < n; i++) {
                        if (fds[i] < 0 && (fds[i] = connect_tcp(port)) >= 0)
                                (void) !write(fds[i], "GET /metrics HTTP/1.1\r\n", 23);
                        if (fds[i] >= 0 && write(fds[i], "X", 1) != 1) {
                                close(fds[i]);
                                fds[i] = -1;
                        }
                }
                sleep_ms(200);
        }
        _exit(0);
}

START_TEST(test_slowloris_cannot_blind_metrics) {
        gm_test_daemon_t d;
        static const char *const args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
        gm_test_daemon_start(&d, "64M", args);
        unsigned port = metrics_port(&d);
        pid_t attacker = slowloris(port, 300, 6);
        sleep_ms(1500); /* it holds what it can get */
        int answered = 0;
        for (int i = 0; i < 20; i++) {
                char *body = scrape_tcp(port);
                answered += body != NULL;
                free(body);
                sleep_ms(100);
        }
        kill(attacker, SIGKILL);
        waitpid(attacker, NULL, 0);
        ck_assert_int_eq(answered, 20);
        gm_test_daemon_stop(&d);
}
END_TEST

START_TEST(test_metrics_can_leave_tenants_out) {
        for (int hide = 0; hide < 2; hide++) {
                gm_test_daemon_t d;
                static const char *const args[] = {"--metrics-listen", "127.0.0.1:0", NULL};
                gm_test_daemon_start_config(&d, "64M", args, hide ? "metrics_tenants = false\n" : "");
                unsigned port = metrics_port(&d);
                gpumem_client *c = NULL;
                ck_assert_int_eq(gpumem_connect(d.socket_path, &c), 0);
                void *p;
                ck_assert_int_eq(gpumem_alloc(c, 1 << 20, 0, &p), 0);
                char *body = scrape_tcp(port);
                ck_assert_ptr_nonnull(body);
                ck_assert_ptr_nonnull(strstr(body, "gpumem_device_in_use_bytes{device=\"0\"}"));
                if (hide)
                        ck_assert_msg(!strstr(body, "tenant=") && !strstr(body, "uid:0"), "%s", body);
                else
                        ck_assert_ptr_nonnull(strstr(body, "tenant=\"uid:0\""));
                free(body);
                gpumem_free(c, p);
                gpumem_disconnect(c);
                gm_test_daemon_stop(&d);
        }
}
END_TEST

/* ---- re-attach ---- */

START_TEST(test_made_up_token_claims_nothing) {
        /* Without an fd store a resumed session once believed every segment
         * the client named: now the token must be one the ledger journaled. */
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        int fd = gm_test_raw_connect(d.socket_path);
        Gpumem__Envelope *reply = gm_test_raw_hello_reply(fd, false, "thief", "0123456789abcdef0123456789abcdef");
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, ENOENT);
        ck_assert_msg(strstr(reply->error->message, "cannot re-attach session: the ledger knows no such session"), "%s",
                      reply->error->message);
        gm_msg_free(reply);
        close(fd);
        ck_assert_int_eq(gm_test_device_stat(d.socket_path, "reserved_bytes.all.current"), 0);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- charges end only when the memory is gone ---- */

/* Maps a segment's fd (consumed) and fills it with `byte`; it is charged to uid:0. */
static char *map_filled(const char *socket_path, int seg_fd, size_t length, int byte) {
        ck_assert_int_ge(seg_fd, 0);
        char *p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
        ck_assert_ptr_ne(p, MAP_FAILED);
        close(seg_fd);
        memset(p, byte, length);
        ck_assert_uint_eq(gm_test_tenant_charged(socket_path, "uid:0"), length);
        return p;
}

/* After a lying session is gone: its memory is still charged until this
 * process unmaps it, then the charge goes. Its contents are gone at once
 * (`byte` no longer reads back): a client that says it unmapped loses them. */
static void charged_until_unmapped(const char *socket_path, char *p, size_t length, int byte) {
        sleep_ms(500);
        ck_assert_uint_eq(gm_test_tenant_charged(socket_path, "uid:0"), length);
        ck_assert_int_ne(p[length - 1], byte);
        ck_assert_int_eq(p[0], 0);
        munmap(p, length);
        uint64_t charged = length;
        for (int i = 0; i < 500 && charged; i++) {
                sleep_ms(20);
                charged = gm_test_tenant_charged(socket_path, "uid:0");
        }
        ck_assert_uint_eq(charged, 0);
}

START_TEST(test_lying_release_ack_keeps_charge) {
        /* A client that acknowledges a release while it keeps the mapping once
         * held 480 MiB charged 0. Host backend: the daemon asks the kernel. */
        if (strcmp(gm_test_backend(), "host") != 0)
                return;
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        int fd = gm_test_raw_connect(d.socket_path);
        gm_test_raw_hello(fd, false);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 1 << 20;
        gm_test_raw_send_body(fd, 2, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        int seg_fd;
        Gpumem__Envelope *reply = gm_test_raw_recv_fd(fd, &seg_fd);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        uint64_t block = reply->alloc_reply->block_id, length = reply->alloc_reply->new_mappings[0]->length;
        gm_msg_free(reply);
        char *p = map_filled(d.socket_path, seg_fd, length, 0x5a);

        gm_test_raw_lying_release(fd, block); /* and closed */
        close(fd);
        charged_until_unmapped(d.socket_path, p, length, 0x5a);
        gm_test_daemon_stop(&d);
}
END_TEST

START_TEST(test_lying_return_keeps_charge) {
        /* A local session gives back memory it still maps (ReturnPieces): its
         * word is checked as a ReleaseAck's, on the host backend per piece. */
        if (strcmp(gm_test_backend(), "host") != 0)
                return;
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        int fd = gm_test_raw_connect(d.socket_path);
        gm_test_raw_hello_local(fd);
        const size_t length = 2 << 20;
        int seg_fd;
        Gpumem__Envelope *reply = gm_test_raw_grant(fd, 2, 1, length, &seg_fd);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        gm_msg_free(reply);
        char *p = map_filled(d.socket_path, seg_fd, length, 0x3c);

        gm_test_raw_return(fd, 3, 1, length); /* "unmapped", and it is not */
        gm_test_raw_assert_caught(fd);        /* and closed */
        close(fd);
        charged_until_unmapped(d.socket_path, p, length, 0x3c);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- re-attach, piece by piece ---- */

/* A raw session holding one allocation of `size`; *ret_token its token,
 * *ret_mapping the memory's coordinates, *ret_seg_fd its fd. */
static int raw_session_with_memory(const char *socket_path, uint64_t size, char ret_token[64],
                                   Gpumem__Mapping *ret_mapping, int *ret_seg_fd) {
        int fd = gm_test_raw_connect(socket_path);
        Gpumem__Envelope *reply = gm_test_raw_hello_reply(fd, false, "holder", NULL);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        snprintf(ret_token, 64, "%s", reply->hello_reply->session_token);
        gm_msg_free(reply);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = size;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
        reply = gm_test_raw_recv_fd(fd, ret_seg_fd);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(reply->alloc_reply->n_new_mappings, 1);
        *ret_mapping = *reply->alloc_reply->new_mappings[0];
        gm_msg_free(reply);
        return fd;
}

/* Resumes `token` and reports one segment as held, with what it says of
 * itself (Reattach.sleeping_bytes, .claim_bytes); the daemon's answer. */
static Gpumem__Envelope *reattach_one_told(const char *socket_path, const char *token, const Gpumem__Mapping *m,
                                           uint64_t sleeping_bytes, uint64_t claim_bytes) {
        int fd = gm_test_raw_connect(socket_path);
        Gpumem__Envelope *reply = gm_test_raw_hello_reply(fd, false, "resumer", token);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        gm_msg_free(reply);
        Gpumem__Range range = GPUMEM__RANGE__INIT;
        range.offset = m->offset;
        range.length = m->length;
        Gpumem__Range *ranges[] = {&range};
        Gpumem__ReattachSegment seg = GPUMEM__REATTACH_SEGMENT__INIT;
        seg.segment_id = m->segment_id;
        seg.va_size = m->segment_va_size;
        seg.n_mapped = 1;
        seg.mapped = ranges;
        Gpumem__ReattachSegment *segs[] = {&seg};
        Gpumem__Reattach req = GPUMEM__REATTACH__INIT;
        req.n_segments = 1;
        req.segments = segs;
        req.last = true;
        req.sleeping_bytes = sleeping_bytes;
        req.claim_bytes = claim_bytes;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_REATTACH;
        env.reattach = &req;
        reply = gm_test_raw_call(fd, &env);
        ck_assert_ptr_nonnull(reply);
        if (reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                int ignored;
                ck_assert_ptr_null(gm_test_raw_recv_fd(fd, &ignored)); /* and closed */
        }
        close(fd);
        return reply;
}

static Gpumem__Envelope *reattach_one(const char *socket_path, const char *token, const Gpumem__Mapping *m) {
        return reattach_one_told(socket_path, token, m, 0, 0);
}

/* A daemon on 64 MiB with two raw central sessions holding memory (A a
 * 2 MiB allocation, B a 4 MiB one: their tokens, segments and fds), then
 * SIGKILLed and started again without an fd store: both may re-attach. */
static void restarted_with_two_sessions(gm_test_daemon_t *d, char *token_a, char *token_b, Gpumem__Mapping *mine,
                                        Gpumem__Mapping *theirs, int *seg_a, int *seg_b) {
        gm_test_daemon_start(d, "64M", NULL);
        int fd_a = raw_session_with_memory(d->socket_path, 2 << 20, token_a, mine, seg_a);
        int fd_b = raw_session_with_memory(d->socket_path, 4 << 20, token_b, theirs, seg_b);
        ck_assert_int_eq(kill(d->pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(d->pid, NULL, 0), d->pid);
        close(fd_a);
        close(fd_b);
        gm_test_daemon_launch(d, "64M", NULL);
}

START_TEST(test_reattach_sleep_and_claim_bounded) {
        /* What a re-attach says of itself is checked: a claim is bounded as
         * a fresh one is (the capacity, less what others hold), less what
         * sessions still to re-attach hold by the journal, and answered with
         * what was set aside; a central session never sleeps (refused, the
         * connection closed). */
        gm_test_daemon_t d;
        char token_a[64], token_b[64];
        Gpumem__Mapping mine, theirs;
        int seg_a, seg_b;
        restarted_with_two_sessions(&d, token_a, token_b, &mine, &theirs, &seg_a, &seg_b);
        Gpumem__Envelope *e = reattach_one_told(d.socket_path, token_b, &theirs, 0, UINT64_MAX);
        ck_assert_msg(e->body_case == GPUMEM__ENVELOPE__BODY_CLAIM_REPLY, "kind %d", (int) e->body_case);
        ck_assert_uint_eq(e->claim_reply->claimed,
                          (64u << 20) - theirs.length - mine.length); /* A's is still to come */
        gm_msg_free(e);
        e = reattach_one_told(d.socket_path, token_a, &mine, 1 << 20, 0);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error->code, EINVAL);
        ck_assert_msg(strstr(e->error->message, "a central session never sleeps"), "%s", e->error->message);
        gm_msg_free(e);
        close(seg_a);
        close(seg_b);
        gm_test_daemon_stop(&d);
}
END_TEST

START_TEST(test_made_up_segment_claims_nothing) {
        /* Without an fd store a resumed session's report was believed segment
         * by segment: under a real token any made-up segment was charged and
         * counted as in use. Now each must be one the ledger recorded for that
         * very session. */
        gm_test_daemon_t d;
        char token_a[64], token_b[64];
        Gpumem__Mapping mine, theirs;
        int seg_a, seg_b;
        restarted_with_two_sessions(&d, token_a, token_b, &mine, &theirs, &seg_a, &seg_b);
        d.keep_dir = true;

        /* A made-up segment, and B's real one, under A's real token. */
        Gpumem__Mapping made_up = mine;
        made_up.segment_id = mine.segment_id + theirs.segment_id + 1000;
        made_up.segment_va_size = made_up.length = 32 << 20;
        Gpumem__Envelope *e = reattach_one(d.socket_path, token_a, &made_up);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error->code, ENOENT);
        ck_assert_msg(strstr(e->error->message, "the ledger has no record of segment"), "%s", e->error->message);
        gm_msg_free(e);
        ck_assert_uint_eq(gm_test_tenant_charged(d.socket_path, "uid:0"), 0);
        ck_assert_int_eq(gm_test_device_stat(d.socket_path, "reserved_bytes.all.current"), 0);

        /* B claims what it holds: believed, and charged. */
        e = reattach_one(d.socket_path, token_b, &theirs);
        ck_assert_msg(e->body_case == GPUMEM__ENVELOPE__BODY_OK, "kind %d: %s", (int) e->body_case,
                      e->body_case == GPUMEM__ENVELOPE__BODY_ERROR ? e->error->message : "");
        gm_msg_free(e);
        close(seg_a);
        close(seg_b);
        d.keep_dir = false;
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- what a non-admin learns ---- */

START_TEST(test_stats_pid_hides_other_tenants) {
        /* "stats --pid P" of another tenant's pid once answered "pid P belongs
         * to another tenant": it now reads as a pid without a session, in
         * both output formats (the holder's heap mode is the leg's). */
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect(d.socket_path, &c), 0);
        void *ptr;
        ck_assert_int_eq(gpumem_alloc(c, 1 << 20, 0, &ptr), 0);
        const char *formats[] = {"", "--json"};
        for (size_t i = 0; i < 2; i++) {
                char out_held[8192], out_free[8192], cmd[512];
                snprintf(cmd, sizeof(cmd), "exec '%s' -s '%s' stats --pid %d %s 2>&1", GPUMEMCTL_BIN, d.socket_path,
                         (int) getpid(), formats[i]);
                const char *held[] = {"/bin/sh", "-c", cmd, NULL};
                int status_held = gm_test_run_as(out_held, sizeof(out_held), NOBODY, held);
                snprintf(cmd, sizeof(cmd), "exec '%s' -s '%s' stats --pid 1 %s 2>&1", GPUMEMCTL_BIN, d.socket_path,
                         formats[i]);
                const char *none[] = {"/bin/sh", "-c", cmd, NULL};
                int status_free = gm_test_run_as(out_free, sizeof(out_free), NOBODY, none);
                ck_assert_int_eq(status_held, status_free);
                ck_assert_ptr_null(strstr(out_held, "another tenant"));
                ck_assert_str_eq(out_held, out_free);
        }
        /* The admin still sees it. */
        char mine[32], admin_out[8192];
        snprintf(mine, sizeof(mine), "%d", (int) getpid());
        const char *admin[] = {GPUMEMCTL_BIN, "-s", d.socket_path, "stats", "--pid", mine, "--json", NULL};
        ck_assert_int_eq(gm_test_run(admin_out, sizeof(admin_out), admin), 0);
        ck_assert_msg(strstr(admin_out, "\"allocated_bytes.all.current\": 1048576"), "%s", admin_out);
        gpumem_free(c, ptr);
        gpumem_disconnect(c);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- back-pressure ---- */

#define PIPELINED 2000

typedef struct pipeliner {
        int fd;
        volatile int sent;
} pipeliner_t;

/* Sends PIPELINED requests without reading a reply: session statistics, and
 * every 100th an allocation (a reply with an fd). */
static void *pipeline_requests(void *arg) {
        pipeliner_t *p = arg;
        Gpumem__Stats st = GPUMEM__STATS__INIT;
        st.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION;
        char *names[] = {"allocated_bytes.all.current"};
        st.n_names = 1;
        st.names = names;
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 1 << 20;
        for (int i = 0; i < PIPELINED; i++) {
                Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                env.request_id = 100 + (uint64_t) i;
                if (i % 100 == 99) {
                        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
                        env.alloc = &alloc;
                } else {
                        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
                        env.stats = &st;
                }
                if (gm_msg_send(p->fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT) < 0)
                        break;
                p->sent = i + 1;
        }
        return NULL;
}

/* The pipelining client process: writes "<sent before reading>\n" to
 * report_fd, waits for a byte on go_fd, reads every reply in order and exits
 * 0 only if all PIPELINED came, each the answer to its request (10 + the
 * failing step otherwise). */
static int pipeliner_main(const char *socket_path, int report_fd, int go_fd) {
        int fd;
        if (gm_ipc_connect(socket_path, &fd) < 0)
                return 10;
        gm_test_raw_hello(fd, false);
        pipeliner_t p = {.fd = fd};
        pthread_t writer;
        if (pthread_create(&writer, NULL, pipeline_requests, &p) != 0)
                return 11;
        sleep_ms(1000); /* both socket buffers fill up */
        dprintf(report_fd, "%d\n", p.sent);
        char go;
        if (read(go_fd, &go, 1) != 1)
                return 12;
        static uint8_t buf[GM_IPC_MAX_PACKET_DEFAULT];
        size_t fds_received = 0;
        for (int i = 0; i < PIPELINED; i++) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len = 0, n_fds = 0;
                if (gm_ipc_recv(fd, buf, sizeof(buf), fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds) < 0)
                        return dprintf(report_fd, "reply %d: connection closed\n", i), 13;
                gm_close_fds(fds, n_fds);
                Gpumem__Envelope *e = NULL;
                if (gm_msg_unpack(buf, len, &e) < 0)
                        return 14;
                bool alloc = i % 100 == 99;
                Gpumem__Envelope__BodyCase want =
                        alloc ? GPUMEM__ENVELOPE__BODY_ALLOC_REPLY : GPUMEM__ENVELOPE__BODY_STATS_REPLY;
                if (e->request_id != 100 + (uint64_t) i || e->body_case != want ||
                    (alloc && n_fds != e->alloc_reply->n_new_mappings)) {
                        dprintf(report_fd, "reply %d: request %llu, kind %d, %zu fds\n", i,
                                (unsigned long long) e->request_id, (int) e->body_case, n_fds);
                        return 15;
                }
                fds_received += n_fds;
                gm_msg_free(e);
        }
        if (fds_received == 0)
                return 16;
        pthread_join(writer, NULL);
        dprintf(report_fd, "all %d\n", PIPELINED);
        close(fd);
        return 0;
}

START_TEST(test_unread_replies_keep_session) {
        /* A client with more than about 256 unread replies once lost its
         * session: a full socket buffer was taken for a dead client. Now the
         * daemon stops reading it until it reads, and serves the others. */
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        int report[2], go[2];
        ck_assert_int_eq(pipe(report), 0);
        ck_assert_int_eq(pipe(go), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                close(report[0]);
                close(go[1]);
                _exit(pipeliner_main(d.socket_path, report[1], go[0]));
        }
        close(report[1]);
        close(go[0]);
        FILE *from = fdopen(report[0], "r");
        char line[256];
        ck_assert_ptr_nonnull(fgets(line, sizeof(line), from));
        int sent_before_reading = atoi(line);
        /* Its requests wait in the socket: it is blocked, the daemon is not. */
        ck_assert_int_lt(sent_before_reading, PIPELINED);
        for (int i = 0; i < 20; i++) {
                gpumem_client *other = NULL;
                ck_assert_int_eq(gpumem_connect(d.socket_path, &other), 0);
                void *ptr;
                ck_assert_int_eq(gpumem_alloc(other, 1 << 20, 0, &ptr), 0);
                gpumem_free(other, ptr);
                gpumem_disconnect(other);
        }
        ck_assert_int_eq(write(go[1], "g", 1), 1);
        ck_assert_ptr_nonnull(fgets(line, sizeof(line), from));
        ck_assert_msg(strncmp(line, "all ", 4) == 0, "pipelining client: %s", line);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pipelining client exited %d", status);
        fclose(from);
        close(go[1]);
        gm_test_daemon_stop(&d);
}
END_TEST

static Suite *hardening_suite(void) {
        Suite *s = suite_create("hardening");
        TCase *squat = tcase_create("squatting");
        tcase_set_timeout(squat, 60);
        tcase_add_test(squat, test_squatted_directory_refused);
        tcase_add_test(squat, test_world_writable_directory_refused);
        tcase_add_test(squat, test_daemon_of_untrusted_uid_refused);
        tcase_add_test(squat, test_own_daemon_accepted);
        suite_add_tcase(s, squat);
        TCase *daemon = tcase_create("daemon");
        tcase_set_timeout(daemon, 120);
        tcase_add_test(daemon, test_numeric_flags_range_checked);
        tcase_add_test(daemon, test_socket_directory_made_before_ledger);
        tcase_add_test(daemon, test_daemon_refuses_squatted_directory);
        tcase_add_test(daemon, test_client_name_cannot_forge_log_lines);
        tcase_add_test(daemon, test_sessions_per_uid_limited);
        tcase_add_test(daemon, test_silent_connections_closed);
        tcase_add_test(daemon, test_slowloris_cannot_blind_metrics);
        tcase_add_test(daemon, test_metrics_can_leave_tenants_out);
        tcase_add_test(daemon, test_made_up_token_claims_nothing);
        tcase_add_test(daemon, test_made_up_segment_claims_nothing);
        tcase_add_test(daemon, test_reattach_sleep_and_claim_bounded);
        tcase_add_test(daemon, test_lying_release_ack_keeps_charge);
        tcase_add_test(daemon, test_lying_return_keeps_charge);
        suite_add_tcase(s, daemon);
        /* Run again with GPUMEM_HEAP=local (hardening.cmake's second leg). */
        TCase *sessions = tcase_create("sessions");
        tcase_set_timeout(sessions, 120);
        tcase_add_test(sessions, test_stats_pid_hides_other_tenants);
        tcase_add_test(sessions, test_unread_replies_keep_session);
        suite_add_tcase(s, sessions);
        return s;
}

int main(void) {
        if (geteuid() != 0) {
                fprintf(stderr, "test_hardening: needs root to act as other users\n");
                return getenv("CI") ? EXIT_FAILURE : 77;
        }
        SRunner *sr = srunner_create(hardening_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
