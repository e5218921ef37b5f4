/* The real gpumemd under socket activation: systemd-socket-activate (from
 * Debian's systemd package, no running systemd needed) listens on the control
 * socket, execs gpumemd on the first connection with the socket as fd 3
 * (LISTEN_FDS=1, LISTEN_FDNAMES=control, as gpumemd@.socket passes it), and a
 * stand-in NOTIFY_SOCKET collects the daemon's READY=1 and STOPPING=1. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "testutil.h"

static char dir[64], notify_path[96], socket_path[96], log_path[128];
static int notify_fd = -1;
static pid_t daemon_pid;

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

static void dump_log(void) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "tail -n 30 %s >&2", log_path);
        gm_test_shell(cmd);
}

static void assert_daemon_running(void) {
        int status;
        if (waitpid(daemon_pid, &status, WNOHANG) == daemon_pid) {
                daemon_pid = 0;
                dump_log();
                ck_abort_msg("socket-activated gpumemd exited (status %d); log above", status);
        }
}

/* The directory lives in the test runner, so it goes even when a test fails. */
static void dir_setup(void) {
        snprintf(dir, sizeof(dir), "/tmp/gpumem-sda-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(notify_path, sizeof(notify_path), "%s/notify", dir);
        snprintf(socket_path, sizeof(socket_path), "%s/gpu0.sock", dir);
        snprintf(log_path, sizeof(log_path), "%s/gpumemd.log", dir);
}

static void dir_teardown(void) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        gm_test_shell(cmd);
}

static void notify_setup(void) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int one = 1;

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", notify_path);
        notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(notify_fd, 0);
        ck_assert_int_eq(setsockopt(notify_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
        ck_assert_int_eq(bind(notify_fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
}

/* Waits (a failure guard, not a timing assertion) for a notification that
 * contains the line `line`, sent by the daemon's pid. */
static void expect_notification_line(const char *line) {
        for (int waited_ms = 0; waited_ms < 60000; waited_ms += 100) {
                struct pollfd p = {.fd = notify_fd, .events = POLLIN};
                if (poll(&p, 1, 100) <= 0) {
                        assert_daemon_running();
                        continue;
                }
                char buf[1024];
                union {
                        struct cmsghdr h;
                        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * 8)];
                } control;
                struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
                struct msghdr msg = {
                        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control, .msg_controllen = sizeof(control)};
                ssize_t n = recvmsg(notify_fd, &msg, MSG_CMSG_CLOEXEC);
                ck_assert_int_ge(n, 0);
                buf[n] = '\0';
                pid_t sender = 0;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
                                struct ucred cred;
                                memcpy(&cred, CMSG_DATA(c), sizeof(cred));
                                sender = cred.pid;
                        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                                int fds[8];
                                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                                memcpy(fds, CMSG_DATA(c), k * sizeof(int));
                                for (size_t i = 0; i < k; i++)
                                        close(fds[i]);
                        }
                }
                ck_assert_int_eq(sender, daemon_pid);
                for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
                        if (strcmp(l, line) == 0)
                                return;
        }
        dump_log();
        ck_abort_msg("no %s from gpumemd", line);
}

START_TEST(test_socket_activation) {
        char notify_env[160];
        snprintf(notify_env, sizeof(notify_env), "NOTIFY_SOCKET=%s", notify_path);
        daemon_pid = fork();
        ck_assert_int_ge(daemon_pid, 0);
        if (daemon_pid == 0) {
                /* Dies with the test, also when an assertion ends it early. */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                int log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (log >= 0) {
                        dup2(log, STDOUT_FILENO);
                        dup2(log, STDERR_FILENO);
                }
                execl(SOCKET_ACTIVATE_BIN, SOCKET_ACTIVATE_BIN, "--seqpacket", "-l", socket_path, "--fdname=control",
                      "-E", notify_env, "--", GPUMEMD_BIN, "--backend", "host", "--capacity", "64M", "--socket",
                      socket_path, "--metrics-listen", "none", "-v", (char *) NULL);
                _exit(127);
        }

        /* systemd-socket-activate binds, then listens: wait for the socket file. */
        struct stat before;
        for (int i = 0; stat(socket_path, &before) < 0; i++) {
                ck_assert_msg(i < 6000, "systemd-socket-activate did not create %s", socket_path);
                assert_daemon_running();
                sleep_ms(10);
        }
        ck_assert(S_ISSOCK(before.st_mode));

        /* The first connection starts gpumemd, which must serve it on the
         * inherited socket instead of binding its own. */
        gpumem_client *c = NULL;
        int r;
        for (int i = 0; (r = gpumem_connect(socket_path, &c)) == -ECONNREFUSED; i++) {
                ck_assert_msg(i < 6000, "nobody listens on %s", socket_path);
                sleep_ms(10);
        }
        if (r < 0)
                dump_log();
        ck_assert_msg(r == 0, "gpumem_connect: %s", strerror(-r));
        void *p = NULL;
        ck_assert_int_eq(gpumem_alloc(c, 1 << 20, 0, &p), 0);
        memset(p, 0x5a, 1 << 20);
        ck_assert_int_eq(((unsigned char *) p)[(1 << 20) - 1], 0x5a);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
        expect_notification_line("READY=1");

        /* Still systemd's socket: gpumemd neither replaced nor removed it. */
        struct stat now;
        ck_assert_int_eq(stat(socket_path, &now), 0);
        ck_assert_int_eq(now.st_ino, before.st_ino);

        ck_assert_int_eq(kill(daemon_pid, SIGTERM), 0);
        expect_notification_line("STOPPING=1");
        int status;
        ck_assert_int_eq(waitpid(daemon_pid, &status, 0), daemon_pid);
        daemon_pid = 0;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                dump_log();
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gpumemd exit status %d", status);
        /* The socket belongs to the socket unit, which keeps listening for the
         * next start: the daemon must leave the file in place. */
        ck_assert_int_eq(stat(socket_path, &now), 0);
        ck_assert_int_eq(now.st_ino, before.st_ino);
}
END_TEST

int main(void) {
        Suite *s = suite_create("sd_activation");
        TCase *tc = tcase_create("activation");
        tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown);
        tcase_add_checked_fixture(tc, notify_setup, NULL);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, test_socket_activation);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
