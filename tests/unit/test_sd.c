/* daemon/sd.c against a stand-in service manager: a NOTIFY_SOCKET datagram
 * socket with SO_PASSCRED (as systemd binds it) that reads each message, its
 * sender's credentials and attached fds; and socket activation through a
 * child that places fds at 3, 4, ... and sets LISTEN_* as systemd does before
 * it execs this binary again ("--listen-child SCENARIO") to check them. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "sd.h"

#define ck_assert_ok(r)                                                     \
        do {                                                                \
                int _r = (r);                                               \
                ck_assert_msg(_r >= 0, "%s failed: %s", #r, strerror(-_r)); \
        } while (0)

/* ---- the stand-in NOTIFY_SOCKET ---- */

/* An abstract socket ("@name", which sd_notify() supports): nothing to clean
 * up on disk, whatever way a test ends. */
static char notify_name[64];
static int notify_fd = -1;

static void notify_setup(void) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int one = 1;

        snprintf(notify_name, sizeof(notify_name), "@gpumem-test-sd-%d", (int) getpid());
        memcpy(sa.sun_path + 1, notify_name + 1, strlen(notify_name) - 1);
        notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(notify_fd, 0);
        ck_assert_int_eq(setsockopt(notify_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
        ck_assert_int_eq(bind(notify_fd, (struct sockaddr *) &sa,
                              (socklen_t) (offsetof(struct sockaddr_un, sun_path) + strlen(notify_name))),
                         0);
        ck_assert_int_eq(setenv("NOTIFY_SOCKET", notify_name, 1), 0);
}

static void notify_teardown(void) {
        unsetenv("NOTIFY_SOCKET");
        if (notify_fd >= 0)
                close(notify_fd);
        notify_fd = -1;
}

/* Reads the one datagram a call must already have queued (a datagram send to
 * a local socket completes before it returns): its text, the sender's pid
 * from SCM_CREDENTIALS, and its fd (-1 if none). */
static void notify_recv(char *buf, size_t len, pid_t *ret_pid, int *ret_fd) {
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * 4)];
        } control;
        struct iovec iov = {.iov_base = buf, .iov_len = len - 1};
        struct msghdr msg = {
                .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control, .msg_controllen = sizeof(control)};
        ssize_t n = recvmsg(notify_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        ck_assert_msg(n >= 0, "no notification queued: %s", strerror(errno));
        ck_assert_msg(!(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)), "notification truncated");
        buf[n] = '\0';
        *ret_pid = 0;
        *ret_fd = -1;
        int n_fds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
                        struct ucred cred;
                        memcpy(&cred, CMSG_DATA(c), sizeof(cred));
                        *ret_pid = cred.pid;
                } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                        n_fds += (int) ((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                        memcpy(ret_fd, CMSG_DATA(c), sizeof(int));
                }
        }
        ck_assert_int_le(n_fds, 1);
}

/* Asserts that the next notification is exactly `want`, from us, with no fd. */
static void expect_notification(const char *want) {
        char buf[512];
        pid_t pid;
        int fd;
        notify_recv(buf, sizeof(buf), &pid, &fd);
        ck_assert_str_eq(buf, want);
        ck_assert_int_eq(pid, getpid());
        ck_assert_int_eq(fd, -1);
}

static void expect_queue_empty(void) {
        char c;
        ck_assert_int_lt(recv(notify_fd, &c, 1, MSG_DONTWAIT), 0);
        ck_assert_int_eq(errno, EAGAIN);
}

static uint64_t monotonic_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

START_TEST(test_notify_messages) {
        ck_assert(gm_sd_notify_available());
        ck_assert_int_eq(gm_sd_notify_ready(), 0);
        expect_notification("READY=1");
        ck_assert_int_eq(gm_sd_notify_status("%d sessions, %s reserved", 3, "1.5 GiB"), 0);
        expect_notification("STATUS=3 sessions, 1.5 GiB reserved");
        /* A newline must not smuggle in another assignment. */
        ck_assert_int_eq(gm_sd_notify_status("tenant a\nREADY=1"), 0);
        expect_notification("STATUS=tenant a READY=1");
        ck_assert_int_eq(gm_sd_watchdog_ping(), 0);
        expect_notification("WATCHDOG=1");
        ck_assert_int_eq(gm_sd_notify_stopping(), 0);
        expect_notification("STOPPING=1");

        uint64_t before = monotonic_usec();
        ck_assert_int_eq(gm_sd_notify_reloading(), 0);
        uint64_t after = monotonic_usec();
        char buf[256];
        pid_t pid;
        int fd;
        unsigned long long stamp = 0;
        notify_recv(buf, sizeof(buf), &pid, &fd);
        ck_assert_int_eq(fd, -1);
        ck_assert_int_eq(sscanf(buf, "RELOADING=1\nMONOTONIC_USEC=%llu", &stamp), 1);
        ck_assert_uint_ge(stamp, before);
        ck_assert_uint_le(stamp, after);
        expect_queue_empty();
}
END_TEST

START_TEST(test_fdstore) {
        static const char data[] = "segment bytes";
        char buf[512];
        pid_t pid;
        int got;

        int fd = memfd_create("gpumem-test-seg", MFD_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(pwrite(fd, data, sizeof(data), 0), (ssize_t) sizeof(data));
        ck_assert_int_eq(gm_sd_fdstore_add(fd, "seg-42"), 0);
        notify_recv(buf, sizeof(buf), &pid, &got);
        ck_assert_str_eq(buf, "FDSTORE=1\nFDPOLL=0\nFDNAME=seg-42");
        ck_assert_int_eq(pid, getpid());
        ck_assert_int_ge(got, 0);
        ck_assert_int_ne(got, fd);

        /* The same open file: same inode, and what one writes the other reads. */
        struct stat a, b;
        ck_assert_int_eq(fstat(fd, &a), 0);
        ck_assert_int_eq(fstat(got, &b), 0);
        ck_assert_int_eq(a.st_dev, b.st_dev);
        ck_assert_int_eq(a.st_ino, b.st_ino);
        char back[sizeof(data)];
        ck_assert_int_eq(pread(got, back, sizeof(back), 0), (ssize_t) sizeof(back));
        ck_assert_mem_eq(back, data, sizeof(data));
        ck_assert_int_eq(pwrite(got, "S", 1, 0), 1);
        ck_assert_int_eq(pread(fd, back, 1, 0), 1);
        ck_assert_int_eq(back[0], 'S');
        ck_assert_int_ge(fcntl(fd, F_GETFD), 0); /* the caller keeps its fd */
        close(got);

        ck_assert_int_eq(gm_sd_fdstore_remove("seg-42"), 0);
        expect_notification("FDSTOREREMOVE=1\nFDNAME=seg-42");
        expect_queue_empty();
        close(fd);
}
END_TEST

START_TEST(test_fdstore_names) {
        char longest[GM_SD_FDSTORE_NAME_MAX + 2];
        char buf[512], want[512];
        pid_t pid;
        int got;

        int fd = memfd_create("gpumem-test-seg", MFD_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(gm_sd_fdstore_add(-1, "seg-1"), -EBADF);
        ck_assert_int_eq(gm_sd_fdstore_add(fd, ""), -EINVAL);
        ck_assert_int_eq(gm_sd_fdstore_add(fd, NULL), -EINVAL);
        ck_assert_int_eq(gm_sd_fdstore_add(fd, "seg:1"), -EINVAL);
        ck_assert_int_eq(gm_sd_fdstore_add(fd, "seg-1\nREADY=1"), -EINVAL);
        ck_assert_int_eq(gm_sd_fdstore_add(fd, "seg-\x7f"), -EINVAL);
        ck_assert_int_eq(gm_sd_fdstore_remove("a:b"), -EINVAL);
        memset(longest, 'x', sizeof(longest));
        longest[GM_SD_FDSTORE_NAME_MAX + 1] = '\0';
        ck_assert_int_eq(gm_sd_fdstore_add(fd, longest), -ENAMETOOLONG);
        ck_assert_int_eq(gm_sd_fdstore_remove(longest), -ENAMETOOLONG);
        expect_queue_empty(); /* nothing invalid reached the manager */

        longest[GM_SD_FDSTORE_NAME_MAX] = '\0';
        ck_assert_int_eq(gm_sd_fdstore_add(fd, longest), 0);
        notify_recv(buf, sizeof(buf), &pid, &got);
        snprintf(want, sizeof(want), "FDSTORE=1\nFDPOLL=0\nFDNAME=%s", longest);
        ck_assert_str_eq(buf, want);
        ck_assert_int_ge(got, 0);
        close(got);
        ck_assert_int_eq(gm_sd_fdstore_remove(longest), 0);
        snprintf(want, sizeof(want), "FDSTOREREMOVE=1\nFDNAME=%s", longest);
        expect_notification(want);
        close(fd);
}
END_TEST

/* A full store's names fit the one LISTEN_FDNAMES string execve() allows
 * (MAX_ARG_STRLEN, 32 pages of 4 KiB), with "control" and "metrics" too. */
START_TEST(test_fdstore_capacity) {
        size_t env = sizeof("LISTEN_FDNAMES=") + (size_t) GM_SD_FDSTORE_MAX * (GM_SD_FDSTORE_NAME_MAX + 1) +
                     sizeof("control:metrics:");
        ck_assert_uint_le(env, 32u * 4096u);
}
END_TEST

START_TEST(test_without_systemd) {
        unsetenv("NOTIFY_SOCKET");
        unsetenv("WATCHDOG_USEC");
        ck_assert(!gm_sd_notify_available());
        ck_assert_int_eq(gm_sd_notify_ready(), 0);
        ck_assert_int_eq(gm_sd_notify_status("idle"), 0);
        ck_assert_int_eq(gm_sd_notify_stopping(), 0);
        ck_assert_int_eq(gm_sd_notify_reloading(), 0);
        ck_assert_int_eq(gm_sd_watchdog_ping(), 0);
        ck_assert_int_eq(gm_sd_fdstore_add(STDIN_FILENO, "seg-1"), 0);
        ck_assert_int_eq(gm_sd_fdstore_remove("seg-1"), 0);
        uint64_t usec = 12345;
        ck_assert_int_eq(gm_sd_watchdog_interval_usec(&usec), 0);
        ck_assert_uint_eq(usec, 0);
        gm_sd_fds_t fds;
        ck_assert_int_eq(gm_sd_listen_fds(&fds), 0);
        ck_assert_int_eq(fds.control_fd, -1);
        ck_assert_int_eq(fds.metrics_fd, -1);
        ck_assert_uint_eq(fds.n_segments + fds.n_unknown, 0);
        gm_sd_fds_done(&fds);
        gm_sd_fds_done(NULL);
}
END_TEST

START_TEST(test_notify_socket_gone) {
        ck_assert_int_eq(setenv("NOTIFY_SOCKET", "/nonexistent-gpumem-dir/notify", 1), 0);
        ck_assert_int_eq(gm_sd_notify_ready(), -ENOENT);
        ck_assert_int_eq(gm_sd_fdstore_add(STDIN_FILENO, "seg-1"), -ENOENT);
        ck_assert_int_eq(gm_sd_notify_status("x"), -ENOENT);
}
END_TEST

START_TEST(test_watchdog_interval) {
        char pid[32];
        uint64_t usec = 0;

        snprintf(pid, sizeof(pid), "%d", (int) getpid());
        ck_assert_int_eq(setenv("WATCHDOG_USEC", "30000000", 1), 0);
        ck_assert_int_eq(setenv("WATCHDOG_PID", pid, 1), 0);
        ck_assert_int_eq(gm_sd_watchdog_interval_usec(&usec), 1);
        ck_assert_uint_eq(usec, 30000000u);
        /* Meant for another process (e.g. our parent before a fork). */
        ck_assert_int_eq(setenv("WATCHDOG_PID", "1", 1), 0);
        ck_assert_int_eq(gm_sd_watchdog_interval_usec(&usec), 0);
        ck_assert_uint_eq(usec, 0);
        ck_assert_int_eq(setenv("WATCHDOG_PID", pid, 1), 0);
        ck_assert_int_eq(setenv("WATCHDOG_USEC", "soon", 1), 0);
        usec = 7;
        ck_assert_int_lt(gm_sd_watchdog_interval_usec(&usec), 0);
        ck_assert_uint_eq(usec, 7);
        unsetenv("WATCHDOG_USEC");
        unsetenv("WATCHDOG_PID");
}
END_TEST

/* ---- socket activation ---- */

typedef struct scenario {
        const char *name;
        const char *kinds[6]; /* fd 3, 4, ...: "seqpacket", "tcp", "memfd", "pipe" */
        const char *fdnames;  /* LISTEN_FDNAMES; NULL leaves it unset */
        bool foreign_pid;     /* LISTEN_PID names another process */
} scenario_t;

static const scenario_t scenarios[] = {
        {"named", {"tcp", "memfd", "seqpacket", "pipe", "memfd"}, "metrics:seg-7:control:other:seg-8", false},
        /* The control socket named explicitly wins over an earlier unnamed one. */
        {"named-wins", {"seqpacket", "seqpacket"}, "gpumemd@0.socket:control", false},
        {"unnamed", {"tcp", "seqpacket", "memfd"}, NULL, false},
        {"wrong-type", {"tcp", "memfd"}, "control:seg-1", false},
        {"not-listening", {"memfd", "seqpacket-unbound"}, "seg-1:control", false},
        {"duplicate", {"seqpacket", "seqpacket"}, "control:control", false},
        {"names-mismatch", {"seqpacket", "memfd"}, "control", false},
        {"foreign-pid", {"seqpacket"}, "control", true},
};

static const scenario_t *scenario_find(const char *name) {
        for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
                if (strcmp(scenarios[i].name, name) == 0)
                        return &scenarios[i];
        return NULL;
}

static size_t scenario_n_fds(const scenario_t *s) {
        size_t n = 0;
        while (n < 6 && s->kinds[n])
                n++;
        return n;
}

/* Child side helpers: no Check here, a failed expectation exits 1. */
#define expect(cond)                                                                        \
        do {                                                                                \
                if (!(cond)) {                                                              \
                        fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
                        exit(1);                                                            \
                }                                                                           \
        } while (0)

static int make_fd(const char *kind, int target) {
        int fd = -1;
        if (strncmp(kind, "seqpacket", 9) == 0) {
                fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
                struct sockaddr_un sa = {.sun_family = AF_UNIX};
                /* Autobind to an abstract name. */
                if (fd >= 0 && strcmp(kind, "seqpacket") == 0 &&
                    (bind(fd, (struct sockaddr *) &sa, sizeof(sa_family_t)) < 0 || listen(fd, 4) < 0))
                        return -1;
        } else if (strcmp(kind, "tcp") == 0) {
                struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                fd = socket(AF_INET, SOCK_STREAM, 0);
                if (fd >= 0 && (bind(fd, (struct sockaddr *) &sin, sizeof(sin)) < 0 || listen(fd, 4) < 0))
                        return -1;
        } else if (strcmp(kind, "memfd") == 0) {
                char text[32];
                int len = snprintf(text, sizeof(text), "memfd@%d", target);
                fd = memfd_create("gpumem-test-seg", 0);
                if (fd >= 0 && write(fd, text, (size_t) len) != len)
                        return -1;
        } else if (strcmp(kind, "pipe") == 0) {
                int p[2];
                if (pipe(p) < 0)
                        return -1;
                fd = p[0];
        }
        return fd;
}

/* In the forked child: lays out the scenario's fds from 3 up without
 * FD_CLOEXEC, sets LISTEN_* and re-executes this binary to check them. */
static void listen_child_exec(const scenario_t *s) {
        size_t n = scenario_n_fds(s);
        int high[6];
        char value[64];

        for (size_t i = 0; i < n; i++) {
                int fd = make_fd(s->kinds[i], SD_LISTEN_FDS_START + (int) i);
                expect(fd >= 0);
                high[i] = fcntl(fd, F_DUPFD_CLOEXEC, 100);
                expect(high[i] >= 100);
                close(fd);
        }
        for (size_t i = 0; i < n; i++) {
                expect(dup2(high[i], SD_LISTEN_FDS_START + (int) i) == SD_LISTEN_FDS_START + (int) i);
                close(high[i]);
        }
        snprintf(value, sizeof(value), "%d", s->foreign_pid ? (int) getppid() : (int) getpid());
        setenv("LISTEN_PID", value, 1);
        snprintf(value, sizeof(value), "%zu", n);
        setenv("LISTEN_FDS", value, 1);
        if (s->fdnames)
                setenv("LISTEN_FDNAMES", s->fdnames, 1);
        else
                unsetenv("LISTEN_FDNAMES");
        execl("/proc/self/exe", "test_sd", "--listen-child", s->name, (char *) NULL);
        _exit(127);
}

static void run_scenario(const char *name) {
        const scenario_t *s = scenario_find(name);
        ck_assert_ptr_nonnull(s);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0)
                listen_child_exec(s);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "scenario %s: child status %d", name, status);
}

static bool fd_open(int fd) {
        return fcntl(fd, F_GETFD) >= 0;
}

static bool fd_cloexec(int fd) {
        int flags = fcntl(fd, F_GETFD);
        return flags >= 0 && (flags & FD_CLOEXEC);
}

static bool memfd_is(int fd, int origin) {
        char want[32], got[32] = "";
        snprintf(want, sizeof(want), "memfd@%d", origin);
        ssize_t n = pread(fd, got, sizeof(got) - 1, 0);
        return n == (ssize_t) strlen(want) && memcmp(got, want, (size_t) n) == 0;
}

static bool env_cleared(void) {
        return !getenv("LISTEN_PID") && !getenv("LISTEN_FDS") && !getenv("LISTEN_FDNAMES");
}

static void expect_all_closed(size_t n) {
        for (size_t i = 0; i < n; i++)
                expect(!fd_open(SD_LISTEN_FDS_START + (int) i));
}

/* In the re-executed child: runs gm_sd_listen_fds() and checks the scenario. */
static int listen_child_check(const char *name) {
        const scenario_t *s = scenario_find(name);
        expect(s);
        size_t n = scenario_n_fds(s);
        for (size_t i = 0; i < n; i++)
                expect(fd_open(SD_LISTEN_FDS_START + (int) i) && !fd_cloexec(SD_LISTEN_FDS_START + (int) i));

        gm_sd_fds_t f = {.control_fd = -2, .metrics_fd = -2};
        int r = gm_sd_listen_fds(&f);
        if (strcmp(name, "named") == 0) {
                expect(r == 5);
                expect(f.metrics_fd == 3 && f.control_fd == 5);
                expect(f.n_segments == 2 && f.n_unknown == 1);
                expect(f.segments[0].fd == 4 && strcmp(f.segments[0].name, "seg-7") == 0 && memfd_is(4, 4));
                expect(f.segments[1].fd == 7 && strcmp(f.segments[1].name, "seg-8") == 0 && memfd_is(7, 7));
                expect(f.unknown[0].fd == 6 && strcmp(f.unknown[0].name, "other") == 0);
                for (int fd = 3; fd <= 7; fd++)
                        expect(fd_cloexec(fd));
                /* Passed in blocking mode; the loop needs non-blocking listeners. */
                expect((fcntl(3, F_GETFL) & O_NONBLOCK) && (fcntl(5, F_GETFL) & O_NONBLOCK));
                /* The caller takes one fd; done closes the rest but not that one. */
                int taken = f.control_fd;
                f.control_fd = -1;
                gm_sd_fds_done(&f);
                expect(fd_open(taken));
                for (int fd = 3; fd <= 7; fd++)
                        expect(fd == taken || !fd_open(fd));
                close(taken);
        } else if (strcmp(name, "named-wins") == 0) {
                expect(r == 2 && f.control_fd == 4 && f.metrics_fd == -1);
                expect(f.n_unknown == 1 && f.unknown[0].fd == 3 && strcmp(f.unknown[0].name, "gpumemd@0.socket") == 0);
                gm_sd_fds_done(&f);
        } else if (strcmp(name, "unnamed") == 0) {
                expect(r == 3 && f.metrics_fd == 3 && f.control_fd == 4);
                expect((fcntl(3, F_GETFL) & O_NONBLOCK) && (fcntl(4, F_GETFL) & O_NONBLOCK));
                expect(f.n_segments == 0 && f.n_unknown == 1);
                expect(f.unknown[0].fd == 5 && strcmp(f.unknown[0].name, "unknown") == 0 && memfd_is(5, 5));
                gm_sd_fds_done(&f);
        } else if (strcmp(name, "wrong-type") == 0 || strcmp(name, "not-listening") == 0) {
                expect(r == -EPROTOTYPE && f.control_fd == -2);
                expect_all_closed(n);
        } else if (strcmp(name, "duplicate") == 0) {
                expect(r == -EEXIST && f.control_fd == -2);
                expect_all_closed(n);
        } else if (strcmp(name, "names-mismatch") == 0) {
                expect(r == -EINVAL && f.control_fd == -2);
                expect_all_closed(n);
        } else if (strcmp(name, "foreign-pid") == 0) {
                /* Not for us: nothing taken, nothing closed. */
                expect(r == 0 && f.control_fd == -1 && f.metrics_fd == -1);
                expect(fd_open(3));
                gm_sd_fds_done(&f);
                expect(fd_open(3));
        } else {
                expect(!"unknown scenario");
        }
        expect(env_cleared());
        /* The variables are gone, so a second call finds nothing. */
        expect(gm_sd_listen_fds(&f) == 0 && f.control_fd == -1 && f.n_segments == 0);
        return 0;
}

START_TEST(test_listen_named) {
        run_scenario("named");
}
END_TEST

START_TEST(test_listen_named_wins) {
        run_scenario("named-wins");
}
END_TEST

START_TEST(test_listen_unnamed) {
        run_scenario("unnamed");
}
END_TEST

START_TEST(test_listen_errors) {
        run_scenario("wrong-type");
        run_scenario("not-listening");
        run_scenario("duplicate");
        run_scenario("names-mismatch");
}
END_TEST

START_TEST(test_listen_foreign_pid) {
        run_scenario("foreign-pid");
}
END_TEST

static Suite *sd_suite(void) {
        Suite *s = suite_create("sd");
        TCase *tc = tcase_create("notify");
        tcase_add_checked_fixture(tc, notify_setup, notify_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_notify_messages);
        tcase_add_test(tc, test_fdstore);
        tcase_add_test(tc, test_fdstore_names);
        tcase_add_test(tc, test_fdstore_capacity);
        tcase_add_test(tc, test_without_systemd);
        tcase_add_test(tc, test_notify_socket_gone);
        tcase_add_test(tc, test_watchdog_interval);
        suite_add_tcase(s, tc);

        tc = tcase_create("listen");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_listen_named);
        tcase_add_test(tc, test_listen_named_wins);
        tcase_add_test(tc, test_listen_unnamed);
        tcase_add_test(tc, test_listen_errors);
        tcase_add_test(tc, test_listen_foreign_pid);
        suite_add_tcase(s, tc);
        return s;
}

int main(int argc, char **argv) {
        if (argc == 3 && strcmp(argv[1], "--listen-child") == 0)
                return listen_child_check(argv[2]);
        SRunner *sr = srunner_create(sd_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
