/* Issue #17, "nobody in where they don't belong": no squatting on another
 * user's socket. Squatters are real processes of other uids listening on real
 * sockets; the victims are libgpumem (in this process) and gpumemctl. Needs
 * root (to act as other uids); reports and skips otherwise. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
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
        if (drop == DROP_BEFORE_BIND && (setresgid(SQUATTER, SQUATTER, SQUATTER) < 0 ||
                                         setresuid(SQUATTER, SQUATTER, SQUATTER) < 0))
                _exit(2);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
        if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || chmod(s->path, 0777) < 0)
                _exit(3);
        /* SO_PEERCRED names whoever called listen(). */
        if (drop == DROP_AFTER_BIND && (setresgid(SQUATTER, SQUATTER, SQUATTER) < 0 ||
                                        setresuid(SQUATTER, SQUATTER, SQUATTER) < 0))
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

static Suite *hardening_suite(void) {
        Suite *s = suite_create("hardening");
        TCase *squat = tcase_create("squatting");
        tcase_set_timeout(squat, 60);
        tcase_add_test(squat, test_squatted_directory_refused);
        tcase_add_test(squat, test_world_writable_directory_refused);
        tcase_add_test(squat, test_daemon_of_untrusted_uid_refused);
        tcase_add_test(squat, test_own_daemon_accepted);
        suite_add_tcase(s, squat);
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
