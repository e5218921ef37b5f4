/* Check suite for ipc/: transport over real AF_UNIX SOCK_SEQPACKET sockets
 * (socketpairs, a listener in a temp dir, forked peers), the envelope codec,
 * and the host memory backend. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "ipc.h"
#include "testutil.h"
#include "msg.h"

#define MiB (1ull << 20)

#define ck_assert_ok(expr)                                                     \
        do {                                                                   \
                int _r = (expr);                                               \
                ck_assert_msg(_r >= 0, "%s failed: %s", #expr, strerror(-_r)); \
        } while (0)

/* ---- helpers ---- */

static bool is_open(int fd) {
        return fcntl(fd, F_GETFD) >= 0 || errno != EBADF;
}

static bool has_cloexec(int fd) {
        int flags = fcntl(fd, F_GETFD);
        ck_assert_int_ge(flags, 0);
        return flags & FD_CLOEXEC;
}

static bool has_nonblock(int fd) {
        int flags = fcntl(fd, F_GETFL);
        ck_assert_int_ge(flags, 0);
        return flags & O_NONBLOCK;
}

/* errno of a failed call, 0 when it succeeded. */
static int fails_with(int ret) {
        return ret < 0 ? errno : 0;
}

static int make_memfd(off_t size) {
        int fd = memfd_create("test", MFD_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, size), 0);
        return fd;
}

static void seqpair(int sv[2], int extra_flags) {
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | extra_flags, 0, sv), 0);
}

static off_t fd_size(int fd) {
        struct stat st;
        ck_assert_int_eq(fstat(fd, &st), 0);
        return st.st_size;
}

static char tmpdir[64];

static void tmpdir_setup(void) {
        strcpy(tmpdir, "/tmp/gm-test-ipc-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
        return remove(path);
}

static void tmpdir_teardown(void) {
        nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void tmp_path(char *buf, size_t len, const char *rel) {
        ck_assert_int_lt(snprintf(buf, len, "%s/%s", tmpdir, rel), (int) len);
}

/* Waits (without a deadline of its own: the tcase timeout bounds it) until fd is readable. */
static void wait_readable(int fd) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r;
        do
                r = poll(&p, 1, -1);
        while (r < 0 && errno == EINTR);
        ck_assert_int_eq(r, 1);
}

static void wait_child_ok(pid_t pid) {
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed, status 0x%x", status);
}

/* ---- transport: framing ---- */

START_TEST(test_send_refuses_empty_and_too_many_fds) {
        int sv[2];
        seqpair(sv, SOCK_NONBLOCK);
        ck_assert_int_eq(gm_ipc_send(sv[0], "x", 0, NULL, 0), -EMSGSIZE);
        int fds[GM_IPC_MAX_FDS_LIMIT + 1];
        for (size_t i = 0; i < GM_IPC_MAX_FDS_LIMIT + 1; i++)
                fds[i] = sv[0];
        ck_assert_int_eq(gm_ipc_send(sv[0], "x", 1, fds, GM_IPC_MAX_FDS_LIMIT + 1), -EMSGSIZE);

        /* Neither reached the peer. */
        char buf[8];
        size_t len, n_fds;
        ck_assert_int_eq(gm_ipc_recv(sv[1], buf, sizeof(buf), NULL, 0, &len, &n_fds), -EAGAIN);
}
END_TEST

START_TEST(test_framing_preserves_packet_boundaries) {
        int sv[2];
        seqpair(sv, 0);
        const size_t sizes[] = {1, 7, 1000, GM_IPC_MAX_PACKET_DEFAULT};
        static unsigned char out[GM_IPC_MAX_PACKET_DEFAULT], in[GM_IPC_MAX_PACKET_DEFAULT + 16];
        for (size_t i = 0; i < 4; i++) {
                memset(out, 'a' + (int) i, sizes[i]);
                ck_assert_ok(gm_ipc_send(sv[0], out, sizes[i], NULL, 0));
        }
        for (size_t i = 0; i < 4; i++) {
                size_t len = 0, n_fds = 99;
                ck_assert_ok(gm_ipc_recv(sv[1], in, sizeof(in), NULL, 0, &len, &n_fds));
                ck_assert_uint_eq(len, sizes[i]);
                ck_assert_uint_eq(n_fds, 0);
                for (size_t k = 0; k < len; k++)
                        ck_assert_int_eq(in[k], 'a' + (int) i);
        }
}
END_TEST

START_TEST(test_packet_exactly_buffer_size_is_accepted) {
        int sv[2];
        seqpair(sv, 0);
        static unsigned char buf[GM_IPC_MAX_PACKET_DEFAULT];
        memset(buf, 0x5a, sizeof(buf));
        ck_assert_ok(gm_ipc_send(sv[0], buf, sizeof(buf), NULL, 0));
        memset(buf, 0, sizeof(buf));
        size_t len, n_fds;
        ck_assert_ok(gm_ipc_recv(sv[1], buf, sizeof(buf), NULL, 0, &len, &n_fds));
        ck_assert_uint_eq(len, sizeof(buf));
        ck_assert_int_eq(buf[0], 0x5a);
        ck_assert_int_eq(buf[sizeof(buf) - 1], 0x5a);
}
END_TEST

START_TEST(test_truncated_packet_refused_and_fds_closed) {
        int sv[2];
        seqpair(sv, 0);
        int fds[3] = {make_memfd(4096), make_memfd(4096), make_memfd(4096)};
        char big[100];
        memset(big, 'b', sizeof(big));
        ck_assert_ok(gm_ipc_send(sv[0], big, sizeof(big), fds, 3));
        ck_assert_ok(gm_ipc_send(sv[0], "next", 4, NULL, 0));

        int before = gm_test_count_fds(getpid());
        char buf[50];
        int got[8];
        size_t len = 777, n_fds = 777;
        ck_assert_int_eq(gm_ipc_recv(sv[1], buf, sizeof(buf), got, 8, &len, &n_fds), -EMSGSIZE);
        ck_assert_int_eq(gm_test_count_fds(getpid()), before);
        ck_assert_uint_eq(len, 777); /* out-parameters untouched on failure */
        ck_assert_uint_eq(n_fds, 777);

        /* The refused packet was consumed whole: the next one arrives intact. */
        ck_assert_ok(gm_ipc_recv(sv[1], buf, sizeof(buf), got, 8, &len, &n_fds));
        ck_assert_uint_eq(len, 4);
        ck_assert_int_eq(memcmp(buf, "next", 4), 0);
        gm_close_fds(fds, 3);
}
END_TEST

START_TEST(test_eof_is_connreset_and_send_to_gone_peer_is_epipe) {
        int sv[2];
        seqpair(sv, 0);
        ck_assert_ok(gm_ipc_send(sv[1], "last", 4, NULL, 0));
        close(sv[1]);
        char buf[16];
        size_t len, n_fds;
        /* Data queued before the close is still delivered, then EOF. */
        ck_assert_ok(gm_ipc_recv(sv[0], buf, sizeof(buf), NULL, 0, &len, &n_fds));
        ck_assert_uint_eq(len, 4);
        ck_assert_int_eq(gm_ipc_recv(sv[0], buf, sizeof(buf), NULL, 0, &len, &n_fds), -ECONNRESET);
        ck_assert_int_eq(gm_ipc_send(sv[0], "x", 1, NULL, 0), -EPIPE);
}
END_TEST

START_TEST(test_nonblocking_empty_socket_is_eagain) {
        int sv[2];
        seqpair(sv, SOCK_NONBLOCK);
        char buf[16];
        size_t len, n_fds;
        ck_assert_int_eq(gm_ipc_recv(sv[0], buf, sizeof(buf), NULL, 0, &len, &n_fds), -EAGAIN);
}
END_TEST

/* ---- transport: fd passing ---- */

START_TEST(test_fds_arrive_in_order_and_cloexec) {
        int sv[2];
        seqpair(sv, 0);
        int fds[3] = {make_memfd(4096), make_memfd(8192), make_memfd(12288)};
        ck_assert_ok(gm_ipc_send(sv[0], "fds", 3, fds, 3));

        char buf[16];
        int got[3] = {-1, -1, -1};
        size_t len, n_fds;
        ck_assert_ok(gm_ipc_recv(sv[1], buf, sizeof(buf), got, 3, &len, &n_fds));
        ck_assert_uint_eq(n_fds, 3);
        for (int i = 0; i < 3; i++) {
                ck_assert_int_ne(got[i], fds[i]); /* a new descriptor of the same file */
                ck_assert_int_eq(fd_size(got[i]), 4096 * (i + 1));
                ck_assert(has_cloexec(got[i]));
        }
        gm_close_fds(got, 3);
        gm_close_fds(fds, 3);
}
END_TEST

START_TEST(test_fd_passing_to_forked_child) {
        int sv[2];
        seqpair(sv, 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* Child: receive the memfd, write through it, acknowledge. */
                close(sv[0]);
                char buf[16];
                int fd = -1;
                size_t len, n_fds;
                if (gm_ipc_recv(sv[1], buf, sizeof(buf), &fd, 1, &len, &n_fds) < 0 || n_fds != 1)
                        _exit(1);
                if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
                        _exit(2);
                char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p == MAP_FAILED)
                        _exit(3);
                strcpy(p + 100, "written by the child");
                munmap(p, 4096);
                close(fd);
                _exit(gm_ipc_send(sv[1], "ok", 2, NULL, 0) < 0 ? 4 : 0);
        }
        close(sv[1]); /* a child that dies gives EOF, not a hang */
        int memfd = make_memfd(4096);
        ck_assert_ok(gm_ipc_send(sv[0], "fd", 2, &memfd, 1));
        char buf[16];
        size_t len, n_fds;
        ck_assert_ok(gm_ipc_recv(sv[0], buf, sizeof(buf), NULL, 0, &len, &n_fds));
        ck_assert_uint_eq(len, 2);
        wait_child_ok(pid);

        char back[32] = "";
        ck_assert_int_eq(pread(memfd, back, sizeof(back) - 1, 100), sizeof(back) - 1);
        ck_assert_str_eq(back, "written by the child");
        close(memfd);
}
END_TEST

/* Sends n_sent fds (dups of one memfd) and expects a receiver allowing max_fds
 * to refuse the packet, close everything it carried and stay in sync. */
static void check_fd_cap(size_t n_sent, size_t max_fds) {
        int sv[2];
        seqpair(sv, 0);
        int memfd = make_memfd(4096);
        int fds[GM_IPC_MAX_FDS_LIMIT];
        for (size_t i = 0; i < n_sent; i++)
                fds[i] = memfd;
        ck_assert_ok(gm_ipc_send(sv[0], "many", 4, fds, n_sent));
        ck_assert_ok(gm_ipc_send(sv[0], "one", 3, &memfd, 1));

        int before = gm_test_count_fds(getpid());
        char buf[16];
        int got[GM_IPC_MAX_FDS_LIMIT];
        size_t len, n_fds;
        ck_assert_int_eq(gm_ipc_recv(sv[1], buf, sizeof(buf), got, max_fds, &len, &n_fds), -EMSGSIZE);
        ck_assert_int_eq(gm_test_count_fds(getpid()), before);

        ck_assert_ok(gm_ipc_recv(sv[1], buf, sizeof(buf), got, 1, &len, &n_fds));
        ck_assert_uint_eq(len, 3);
        ck_assert_uint_eq(n_fds, 1);
        ck_assert_int_eq(gm_test_count_fds(getpid()), before + 1);
        close(got[0]);
        close(memfd);
}

START_TEST(test_fd_cap_one_over) {
        check_fd_cap(5, 4);
}
END_TEST

START_TEST(test_fd_cap_kernel_maximum) {
        check_fd_cap(GM_IPC_MAX_FDS_LIMIT, GM_IPC_MAX_FDS_DEFAULT);
}
END_TEST

START_TEST(test_fd_to_receiver_accepting_none) {
        check_fd_cap(1, 0);
}
END_TEST

START_TEST(test_foreign_control_message_refused) {
        int sv[2];
        seqpair(sv, 0);
        /* With SO_PASSCRED the kernel adds SCM_CREDENTIALS next to SCM_RIGHTS. */
        int on = 1;
        ck_assert_int_eq(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
        int memfd = make_memfd(4096);
        ck_assert_ok(gm_ipc_send(sv[0], "cred", 4, &memfd, 1));

        int before = gm_test_count_fds(getpid());
        char buf[16];
        int got[4];
        size_t len, n_fds;
        ck_assert_int_eq(gm_ipc_recv(sv[1], buf, sizeof(buf), got, 4, &len, &n_fds), -EMSGSIZE);
        ck_assert_int_eq(gm_test_count_fds(getpid()), before);
        close(memfd);
}
END_TEST

START_TEST(test_close_fds) {
        int fds[3] = {make_memfd(0), -1, make_memfd(0)};
        int a = fds[0], c = fds[2];
        gm_close_fds(fds, 3);
        ck_assert(!is_open(a));
        ck_assert(!is_open(c));
        ck_assert_int_eq(fds[0], -1);
        ck_assert_int_eq(fds[2], -1);
}
END_TEST

/* ---- transport: listener, connect, credentials ---- */

START_TEST(test_listen_creates_parents_and_applies_mode) {
        char path[256], dir[256];
        tmp_path(path, sizeof(path), "a/b/gpu0.sock");
        umask(077); /* the directories are 0755 whatever the umask */
        int lfd;
        ck_assert_ok(gm_ipc_listen(path, 0660, 16, &lfd));

        struct stat st;
        for (const char *rel = "a"; rel; rel = strcmp(rel, "a") == 0 ? "a/b" : NULL) {
                tmp_path(dir, sizeof(dir), rel);
                ck_assert_int_eq(stat(dir, &st), 0);
                ck_assert(S_ISDIR(st.st_mode));
                ck_assert_int_eq(st.st_mode & 07777, 0755);
        }
        ck_assert_int_eq(lstat(path, &st), 0);
        ck_assert(S_ISSOCK(st.st_mode));
        ck_assert_int_eq(st.st_mode & 07777, 0660);

        ck_assert(has_cloexec(lfd));
        ck_assert(has_nonblock(lfd));
        int cfd;
        ck_assert_int_eq(gm_ipc_accept(lfd, &cfd), -EAGAIN);
        close(lfd);
}
END_TEST

START_TEST(test_connect_accept_flags_and_data) {
        char path[256];
        tmp_path(path, sizeof(path), "gpu0.sock");
        int lfd, cfd, afd;
        ck_assert_ok(gm_ipc_listen(path, 0600, 16, &lfd));
        ck_assert_ok(gm_ipc_connect(path, &cfd));
        ck_assert_ok(gm_ipc_accept(lfd, &afd));

        ck_assert(has_cloexec(cfd));
        ck_assert(!has_nonblock(cfd)); /* clients block */
        ck_assert(has_cloexec(afd));
        ck_assert(has_nonblock(afd)); /* the daemon polls */

        ck_assert_ok(gm_ipc_send(cfd, "ping", 4, NULL, 0));
        char buf[8];
        size_t len, n_fds;
        ck_assert_ok(gm_ipc_recv(afd, buf, sizeof(buf), NULL, 0, &len, &n_fds));
        ck_assert_uint_eq(len, 4);
        ck_assert_int_eq(gm_ipc_recv(afd, buf, sizeof(buf), NULL, 0, &len, &n_fds), -EAGAIN);
        close(afd);
        close(cfd);
        close(lfd);
}
END_TEST

START_TEST(test_peer_cred_and_groups_of_forked_child) {
        char path[256];
        tmp_path(path, sizeof(path), "gpu0.sock");
        int lfd;
        ck_assert_ok(gm_ipc_listen(path, 0600, 16, &lfd));

        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* As root, give the child distinctive groups; either way it
                 * reports the groups it connects with. */
                const gid_t mine[] = {100, 200, 300};
                if (geteuid() == 0)
                        setgroups(3, mine);
                gid_t groups[64];
                int n = getgroups(64, groups);
                int fd;
                if (n < 0 || gm_ipc_connect(path, &fd) < 0)
                        _exit(1);
                if (gm_ipc_send(fd, groups, n > 0 ? n * sizeof(gid_t) : 1, NULL, 0) < 0)
                        _exit(2);
                char buf[4];
                size_t len, n_fds;
                _exit(gm_ipc_recv(fd, buf, sizeof(buf), NULL, 0, &len, &n_fds) < 0 ? 3 : 0);
        }

        wait_readable(lfd);
        int afd;
        ck_assert_ok(gm_ipc_accept(lfd, &afd));
        gm_peer_cred_t cred;
        ck_assert_ok(gm_ipc_peer_cred(afd, &cred));
        ck_assert_int_eq(cred.pid, pid);
        ck_assert_int_eq(cred.uid, geteuid());
        ck_assert_int_eq(cred.gid, getegid());

        wait_readable(afd);
        gid_t reported[64];
        size_t len, n_fds;
        ck_assert_ok(gm_ipc_recv(afd, reported, sizeof(reported), NULL, 0, &len, &n_fds));
        size_t n_reported = len == 1 ? 0 : len / sizeof(gid_t);

        gid_t groups[64];
        size_t n = 0;
        int r = gm_ipc_peer_groups(afd, groups, 64, &n);
        if (r != -ENOPROTOOPT) {
                ck_assert_ok(r);
                ck_assert_uint_eq(n, n_reported);
                for (size_t i = 0; i < n; i++)
                        ck_assert_uint_eq(groups[i], reported[i]);
                if (n > 0) {
                        /* Fewer slots than groups: the first ones are stored. */
                        gid_t few[64];
                        size_t n_few = 99;
                        ck_assert_ok(gm_ipc_peer_groups(afd, few, n - 1, &n_few));
                        ck_assert_uint_eq(n_few, n - 1);
                        for (size_t i = 0; i < n_few; i++)
                                ck_assert_uint_eq(few[i], reported[i]);
                }
        }
        ck_assert_ok(gm_ipc_send(afd, "ok", 2, NULL, 0));
        wait_child_ok(pid);
        close(afd);
        close(lfd);
}
END_TEST

START_TEST(test_listen_replaces_stale_socket) {
        char path[256];
        tmp_path(path, sizeof(path), "gpu0.sock");
        /* A socket file left by a listener that died. */
        int old = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        strcpy(sa.sun_path, path);
        ck_assert_int_eq(bind(old, (struct sockaddr *) &sa, sizeof(sa)), 0);
        ck_assert_int_eq(listen(old, 1), 0);
        close(old);
        struct stat st;
        ck_assert_int_eq(lstat(path, &st), 0);

        int lfd, cfd, afd;
        ck_assert_ok(gm_ipc_listen(path, 0600, 16, &lfd));
        ck_assert_ok(gm_ipc_connect(path, &cfd));
        ck_assert_ok(gm_ipc_accept(lfd, &afd));
        close(afd);
        close(cfd);
        close(lfd);
}
END_TEST

START_TEST(test_listen_refuses_live_socket) {
        char path[256];
        tmp_path(path, sizeof(path), "gpu0.sock");
        int lfd, lfd2 = -1, cfd, afd;
        ck_assert_ok(gm_ipc_listen(path, 0600, 16, &lfd));
        ck_assert_int_eq(gm_ipc_listen(path, 0600, 16, &lfd2), -EADDRINUSE);
        ck_assert_int_eq(lfd2, -1);
        /* The live listener was left alone and still serves. */
        ck_assert_ok(gm_ipc_connect(path, &cfd));
        ck_assert_ok(gm_ipc_accept(lfd, &afd));
        close(afd);
        close(cfd);
        close(lfd);
}
END_TEST

START_TEST(test_listen_refuses_live_listener_of_another_type) {
        char path[256];
        tmp_path(path, sizeof(path), "gpu0.sock");
        int other = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        strcpy(sa.sun_path, path);
        ck_assert_int_eq(bind(other, (struct sockaddr *) &sa, sizeof(sa)), 0);
        ck_assert_int_eq(listen(other, 1), 0);
        int lfd;
        ck_assert_int_eq(gm_ipc_listen(path, 0600, 16, &lfd), -EADDRINUSE);
        close(other);
}
END_TEST

START_TEST(test_listen_never_removes_a_non_socket) {
        char path[256];
        tmp_path(path, sizeof(path), "gpu0.sock");
        int f = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(f, 0);
        close(f);
        int lfd;
        ck_assert_int_eq(gm_ipc_listen(path, 0600, 16, &lfd), -EADDRINUSE);
        struct stat st;
        ck_assert_int_eq(lstat(path, &st), 0);
        ck_assert(S_ISREG(st.st_mode));
}
END_TEST

START_TEST(test_path_checks) {
        char path[256];
        memset(path, 'p', sizeof(path) - 1);
        path[0] = '/';
        path[sizeof(path) - 1] = '\0';
        int fd;
        ck_assert_int_eq(gm_ipc_listen(path, 0600, 16, &fd), -ENAMETOOLONG);
        ck_assert_int_eq(gm_ipc_connect(path, &fd), -ENAMETOOLONG);

        tmp_path(path, sizeof(path), "nobody.sock");
        ck_assert_int_eq(gm_ipc_connect(path, &fd), -ENOENT);
}
END_TEST

START_TEST(test_default_socket_path) {
        char buf[256], want[256], dir[200];
        unsetenv("GPUMEM_SOCKET");
        unsetenv("GPUMEM_SYSTEM_SOCKET_DIR");
        setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
        ck_assert_ok(gm_ipc_default_socket_path(3, true, buf, sizeof(buf)));
        if (geteuid() == 0)
                ck_assert_str_eq(buf, "/run/gpumem/gpu3.sock");
        else
                ck_assert_str_eq(buf, "/run/user/4242/gpumem/gpu3.sock");

        unsetenv("XDG_RUNTIME_DIR");
        ck_assert_ok(gm_ipc_default_socket_path(0, false, buf, sizeof(buf)));
        if (geteuid() == 0)
                snprintf(want, sizeof(want), "/run/gpumem/gpu0.sock");
        else
                snprintf(want, sizeof(want), "/tmp/gpumem-%u/gpu0.sock", (unsigned) geteuid());
        ck_assert_str_eq(buf, want);

        /* $GPUMEM_SOCKET names a socket; it is no default (peer_check reads it). */
        setenv("GPUMEM_SOCKET", "/srv/custom.sock", 1);
        ck_assert_ok(gm_ipc_default_socket_path(0, true, buf, sizeof(buf)));
        ck_assert_str_ne(buf, "/srv/custom.sock");
        unsetenv("GPUMEM_SOCKET");

        /* The system directory moves for the daemon (as root) and its clients
         * alike; a client that is not root takes a system socket that exists. */
        tmp_path(dir, sizeof(dir), "system");
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", dir, 1);
        snprintf(want, sizeof(want), "%s/gpu1.sock", dir);
        ck_assert_ok(gm_ipc_default_socket_path(1, false, buf, sizeof(buf)));
        if (geteuid() == 0)
                ck_assert_str_eq(buf, want);
        int lfd;
        ck_assert_ok(gm_ipc_listen(want, 0600, 16, &lfd));
        ck_assert_ok(gm_ipc_default_socket_path(1, true, buf, sizeof(buf)));
        ck_assert_str_eq(buf, want);
        close(lfd);
        unlink(want);
        setenv("GPUMEM_SYSTEM_SOCKET_DIR", "relative/dir", 1); /* not absolute: the packaged one */
        ck_assert_ok(gm_ipc_default_socket_path(1, true, buf, sizeof(buf)));
        ck_assert_ptr_null(strstr(buf, "relative"));
        unsetenv("GPUMEM_SYSTEM_SOCKET_DIR");

        ck_assert_int_eq(gm_ipc_default_socket_path(0, true, buf, 5), -ENAMETOOLONG);
        ck_assert_int_eq(gm_ipc_default_socket_path(-1, false, buf, sizeof(buf)), -EINVAL);
}
END_TEST

/* ---- msg ---- */

/* Sends env over a fresh pair and returns the unpacked copy, with any fds
 * received stored in fds (capacity 8). */
static Gpumem__Envelope *roundtrip(const Gpumem__Envelope *env, const int *send_fds, size_t n_send, int *fds,
                                   size_t *ret_n_fds) {
        int sv[2];
        seqpair(sv, 0);
        ck_assert_ok(gm_msg_send(sv[0], env, send_fds, n_send, GM_IPC_MAX_PACKET_DEFAULT));
        static uint8_t buf[GM_IPC_MAX_PACKET_DEFAULT];
        size_t len;
        ck_assert_ok(gm_ipc_recv(sv[1], buf, sizeof(buf), fds, 8, &len, ret_n_fds));
        /* The codec frames the envelope itself: the bytes are protobuf-c's. */
        size_t want_len = gpumem__envelope__get_packed_size(env);
        uint8_t *want = malloc(want_len ? want_len : 1);
        gpumem__envelope__pack(env, want);
        ck_assert_uint_eq(len, want_len);
        ck_assert_int_eq(memcmp(buf, want, len), 0);
        free(want);
        Gpumem__Envelope *got = NULL;
        ck_assert_ok(gm_msg_unpack(buf, len, &got));
        close(sv[0]);
        close(sv[1]);
        return got;
}

/* Packed bytes equal: every field survived the trip. */
static void assert_same_envelope(const Gpumem__Envelope *a, const Gpumem__Envelope *b) {
        size_t la = gpumem__envelope__get_packed_size(a), lb = gpumem__envelope__get_packed_size(b);
        ck_assert_uint_eq(la, lb);
        uint8_t *pa = malloc(la), *pb = malloc(lb);
        gpumem__envelope__pack(a, pa);
        gpumem__envelope__pack(b, pb);
        ck_assert_int_eq(memcmp(pa, pb, la), 0);
        free(pa);
        free(pb);
}

START_TEST(test_msg_roundtrip_every_body) {
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = "trainer-7";
        hello.admin = 1;
        Gpumem__HelloReply hello_reply = GPUMEM__HELLO_REPLY__INIT;
        hello_reply.protocol_version = 1;
        hello_reply.session_id = 99;
        hello_reply.backend = "host";
        hello_reply.device = 2;
        hello_reply.capacity = 8ull << 30;
        hello_reply.max_packet = GM_IPC_MAX_PACKET_DEFAULT;
        hello_reply.max_fds = GM_IPC_MAX_FDS_DEFAULT;
        hello_reply.tenant = "uid:1000";
        hello_reply.granularity = 2 * MiB;
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 12345;
        alloc.stream = 7;
        Gpumem__Mapping m0 = GPUMEM__MAPPING__INIT, m1 = GPUMEM__MAPPING__INIT;
        m0.segment_id = 1, m0.segment_va_size = 20 * MiB, m0.offset = 0, m0.length = 2 * MiB;
        m1.segment_id = 1, m1.segment_va_size = 20 * MiB, m1.offset = 2 * MiB, m1.length = 2 * MiB;
        Gpumem__Mapping *mappings[] = {&m0, &m1};
        Gpumem__AllocReply alloc_reply = GPUMEM__ALLOC_REPLY__INIT;
        alloc_reply.block_id = 5, alloc_reply.segment_id = 1, alloc_reply.offset = 512, alloc_reply.block_size = 4096;
        alloc_reply.n_new_mappings = 2;
        alloc_reply.new_mappings = mappings;
        Gpumem__Free free_ = GPUMEM__FREE__INIT;
        free_.block_id = 5;
        free_.deferred = 1;
        Gpumem__FreeCompleted free_completed = GPUMEM__FREE_COMPLETED__INIT;
        free_completed.block_id = 5;
        Gpumem__Trim trim = GPUMEM__TRIM__INIT;
        trim.tenant = "team-a";
        Gpumem__TrimReply trim_reply = GPUMEM__TRIM_REPLY__INIT;
        trim_reply.released_bytes = 64 * MiB;
        Gpumem__Stats stats = GPUMEM__STATS__INIT;
        stats.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_PID;
        stats.pid = 4321;
        char *names[] = {"num_ooms", "reserved_bytes.all.peak"};
        stats.n_names = 2, stats.names = names;
        Gpumem__StatEntry e0 = GPUMEM__STAT_ENTRY__INIT, e1 = GPUMEM__STAT_ENTRY__INIT;
        e0.name = "allocated_bytes.all.current", e0.value = 4096;
        e1.name = "num_ooms", e1.value = -1;
        Gpumem__StatEntry *entries[] = {&e0, &e1};
        Gpumem__StatsReply stats_reply = GPUMEM__STATS_REPLY__INIT;
        stats_reply.n_stats = 2, stats_reply.stats = entries;
        stats_reply.device = 1, stats_reply.capacity = 1 << 30, stats_reply.sessions = 3;
        Gpumem__Range r0 = GPUMEM__RANGE__INIT;
        r0.segment_id = 4, r0.offset = 2 * MiB, r0.length = 4 * MiB, r0.whole_segment = 1;
        Gpumem__Range *ranges[] = {&r0};
        Gpumem__ReleaseRequest release_request = GPUMEM__RELEASE_REQUEST__INIT;
        release_request.release_id = 11, release_request.n_ranges = 1, release_request.ranges = ranges;
        Gpumem__ReleaseAck release_ack = GPUMEM__RELEASE_ACK__INIT;
        release_ack.release_id = 11;
        Gpumem__Error error = GPUMEM__ERROR__INIT;
        error.code = ENOMEM;
        error.message = "out of memory: tenant quota";

        Gpumem__MapSegments map_segments = GPUMEM__MAP_SEGMENTS__INIT;
        map_segments.n_mappings = 2, map_segments.mappings = mappings;

        enum { N_BODIES = 14 };
        Gpumem__Envelope envs[N_BODIES];
        for (int i = 0; i < N_BODIES; i++) {
                gpumem__envelope__init(&envs[i]);
                envs[i].request_id = 1000 + (uint64_t) i;
                envs[i].body_case = GPUMEM__ENVELOPE__BODY_HELLO + i;
        }
        envs[0].hello = &hello;
        envs[1].hello_reply = &hello_reply;
        envs[2].alloc = &alloc;
        envs[3].alloc_reply = &alloc_reply;
        envs[4].free = &free_;
        envs[5].free_completed = &free_completed;
        envs[6].trim = &trim;
        envs[7].trim_reply = &trim_reply;
        envs[8].stats = &stats;
        envs[9].stats_reply = &stats_reply;
        envs[10].release_request = &release_request;
        envs[11].release_ack = &release_ack;
        envs[12].error = &error;
        envs[13].map_segments = &map_segments;
        ck_assert_int_eq(envs[N_BODIES - 1].body_case, GPUMEM__ENVELOPE__BODY_MAP_SEGMENTS);

        for (int i = 0; i < N_BODIES; i++) {
                int fds[8];
                size_t n_fds;
                Gpumem__Envelope *got = roundtrip(&envs[i], NULL, 0, fds, &n_fds);
                ck_assert_uint_eq(n_fds, 0);
                ck_assert_int_eq(got->body_case, envs[i].body_case);
                ck_assert_uint_eq(got->request_id, 1000 + (uint64_t) i);
                assert_same_envelope(got, &envs[i]);
                got = gm_msg_free(got);
                ck_assert_ptr_null(got);
        }
}
END_TEST

START_TEST(test_msg_alloc_reply_with_fds) {
        Gpumem__Mapping m = GPUMEM__MAPPING__INIT;
        m.segment_id = 3, m.segment_va_size = 2 * MiB, m.length = 2 * MiB;
        Gpumem__Mapping *mappings[] = {&m, &m};
        Gpumem__AllocReply reply = GPUMEM__ALLOC_REPLY__INIT;
        reply.block_id = 1, reply.n_new_mappings = 2, reply.new_mappings = mappings;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 8;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &reply;

        int send_fds[2] = {make_memfd(4096), make_memfd(8192)};
        int fds[8];
        size_t n_fds;
        Gpumem__Envelope *got = roundtrip(&env, send_fds, 2, fds, &n_fds);
        ck_assert_uint_eq(n_fds, 2);
        ck_assert_uint_eq(got->alloc_reply->n_new_mappings, 2);
        ck_assert_uint_eq(got->alloc_reply->new_mappings[1]->segment_id, 3);
        ck_assert_int_eq(fd_size(fds[0]), 4096);
        ck_assert_int_eq(fd_size(fds[1]), 8192);
        gm_msg_free(got);
        gm_close_fds(fds, 2);
        gm_close_fds(send_fds, 2);
}
END_TEST

/* A StatsReply of n entries (entry storage is static: one live reply at a time). */
static Gpumem__Envelope *stats_reply_envelope(size_t n) {
        static Gpumem__Envelope env;
        static Gpumem__StatsReply reply;
        static Gpumem__StatEntry entries[5000];
        static Gpumem__StatEntry *ptrs[5000];
        ck_assert_uint_le(n, 5000);
        gpumem__envelope__init(&env);
        gpumem__stats_reply__init(&reply);
        for (size_t i = 0; i < n; i++) {
                gpumem__stat_entry__init(&entries[i]);
                entries[i].name = "reserved_bytes.large_pool.peak";
                entries[i].value = (int64_t) i;
                ptrs[i] = &entries[i];
        }
        reply.n_stats = n;
        reply.stats = ptrs;
        env.request_id = 77;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS_REPLY;
        env.stats_reply = &reply;
        return &env;
}

START_TEST(test_msg_large_envelope_roundtrip) {
        Gpumem__Envelope *env = stats_reply_envelope(1000);
        ck_assert_uint_gt(gpumem__envelope__get_packed_size(env), 4096); /* past the stack buffer */
        ck_assert_uint_le(gpumem__envelope__get_packed_size(env), GM_IPC_MAX_PACKET_DEFAULT);
        int fds[8];
        size_t n_fds;
        Gpumem__Envelope *got = roundtrip(env, NULL, 0, fds, &n_fds);
        ck_assert_uint_eq(got->stats_reply->n_stats, 1000);
        ck_assert_int_eq(got->stats_reply->stats[999]->value, 999);
        assert_same_envelope(got, env);
        gm_msg_free(got);
}
END_TEST

START_TEST(test_msg_pack_into_caller_buffer_or_heap) {
        /* gm_msg_pack writes protobuf-c's bytes into the caller's buffer when
         * they fit, else into a buffer of its own; past max_packet, nothing. */
        Gpumem__Envelope *env = stats_reply_envelope(100);
        size_t want_len = gpumem__envelope__get_packed_size(env);
        uint8_t *want = malloc(want_len);
        gpumem__envelope__pack(env, want);
        static uint8_t buf[GM_MSG_STACK_PACK_MAX];
        uint8_t *data = NULL;
        size_t len = 0;
        ck_assert_ok(gm_msg_pack(env, GM_IPC_MAX_PACKET_DEFAULT, buf, sizeof(buf), &data, &len));
        ck_assert_ptr_eq(data, buf);
        ck_assert_uint_eq(len, want_len);
        ck_assert_int_eq(memcmp(data, want, len), 0);

        ck_assert_ok(gm_msg_pack(env, GM_IPC_MAX_PACKET_DEFAULT, buf, want_len - 1, &data, &len));
        ck_assert_ptr_ne(data, buf);
        ck_assert_uint_eq(len, want_len);
        ck_assert_int_eq(memcmp(data, want, len), 0);
        free(data);

        uint8_t *untouched = (uint8_t *) &untouched;
        data = untouched;
        ck_assert_int_eq(gm_msg_pack(env, want_len - 1, buf, sizeof(buf), &data, &len), -EMSGSIZE);
        ck_assert_ptr_eq(data, untouched);
        free(want);
}
END_TEST

START_TEST(test_msg_oversize_refused_and_nothing_sent) {
        int sv[2];
        seqpair(sv, SOCK_NONBLOCK);
        Gpumem__Envelope *env = stats_reply_envelope(5000);
        ck_assert_uint_gt(gpumem__envelope__get_packed_size(env), GM_IPC_MAX_PACKET_DEFAULT);
        ck_assert_int_eq(gm_msg_send(sv[0], env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), -EMSGSIZE);

        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.client_name = "a name longer than eight bytes";
        Gpumem__Envelope small = GPUMEM__ENVELOPE__INIT;
        small.request_id = 1;
        small.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        small.hello = &hello;
        ck_assert_int_eq(gm_msg_send(sv[0], &small, NULL, 0, 8), -EMSGSIZE);

        uint8_t buf[64];
        size_t len, n_fds;
        ck_assert_int_eq(gm_ipc_recv(sv[1], buf, sizeof(buf), NULL, 0, &len, &n_fds), -EAGAIN);
}
END_TEST

START_TEST(test_msg_garbage_is_ebadmsg) {
        Gpumem__Envelope *sentinel = (Gpumem__Envelope *) &sentinel, *got = sentinel;
        const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
        ck_assert_int_eq(gm_msg_unpack(garbage, sizeof(garbage), &got), -EBADMSG);
        ck_assert_int_eq(gm_msg_unpack(garbage, 0, &got), -EBADMSG);

        /* A valid envelope cut short. */
        Gpumem__Trim trim = GPUMEM__TRIM__INIT;
        trim.tenant = "some-tenant-name";
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 3;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        env.trim = &trim;
        uint8_t packed[64];
        size_t len = gpumem__envelope__pack(&env, packed);
        ck_assert_ok(gm_msg_unpack(packed, len, &got));
        got = gm_msg_free(got);
        got = sentinel;
        ck_assert_int_eq(gm_msg_unpack(packed, len - 3, &got), -EBADMSG);

        /* Well-formed but without a body. */
        Gpumem__Envelope bodiless = GPUMEM__ENVELOPE__INIT;
        bodiless.request_id = 3;
        len = gpumem__envelope__pack(&bodiless, packed);
        ck_assert_uint_gt(len, 0);
        ck_assert_int_eq(gm_msg_unpack(packed, len, &got), -EBADMSG);
        ck_assert_ptr_eq(got, sentinel);
        ck_assert_ptr_null(gm_msg_free(NULL));
}
END_TEST

/* Hand-made envelope bytes: request_id and a Free body {block_id: 5}, with
 * `extra` (a field or a broken one) in front. */
static size_t envelope_with(const uint8_t *extra, size_t n_extra, uint8_t *out) {
        static const uint8_t tail[] = {0x08, 42, 14 << 3 | 2, 2, 0x08, 5}; /* request_id 42, free{block_id 5} */
        if (n_extra) /* extra may be NULL then: memcpy's arguments must not be */
                memcpy(out, extra, n_extra);
        memcpy(out + n_extra, tail, sizeof(tail));
        return n_extra + sizeof(tail);
}

START_TEST(test_msg_envelope_framing) {
        uint8_t buf[64];
        Gpumem__Envelope *got = NULL;
        /* Fields of numbers this build does not know are skipped, of every wire type. */
        static const uint8_t unknown[] = {7 << 3 | 0, 0x96, 0x01,       9 << 3 | 2, 3, 1, 2, 3, 8 << 3 | 5, 1, 2,
                                          3,          4,    6 << 3 | 1, 1,          2, 3, 4, 5, 6,          7, 8};
        ck_assert_ok(gm_msg_unpack(buf, envelope_with(unknown, sizeof(unknown), buf), &got));
        ck_assert_int_eq(got->body_case, GPUMEM__ENVELOPE__BODY_FREE);
        ck_assert_uint_eq(got->request_id, 42);
        ck_assert_uint_eq(got->free->block_id, 5);
        got = gm_msg_free(got);
        /* The last request_id counts, wherever it stands. */
        static const uint8_t late_id[] = {0x08, 7};
        size_t n = envelope_with(late_id, sizeof(late_id), buf);
        buf[n++] = 0x08, buf[n++] = 9;
        ck_assert_ok(gm_msg_unpack(buf, n, &got));
        ck_assert_uint_eq(got->request_id, 9);
        got = gm_msg_free(got);

        Gpumem__Envelope *sentinel = (Gpumem__Envelope *) &sentinel;
        static const uint8_t id_as_bytes[] = {1 << 3 | 2, 1, 0};  /* request_id with the wrong wire type */
        static const uint8_t second_body[] = {16 << 3 | 2, 0};    /* a Trim before the Free */
        static const uint8_t body_as_varint[] = {16 << 3 | 0, 1}; /* a body that is no message */
        static const uint8_t field_zero[] = {0x80, 0x00, 0};      /* number 0, written in two bytes */
        static const uint8_t group[] = {9 << 3 | 3, 9 << 3 | 4};  /* groups: protobuf-c refuses them too */
        static const uint8_t reserved_wire[] = {9 << 3 | 6, 0};   /* no such wire type */
        static const uint8_t cut_length[] = {9 << 3 | 2, 100};    /* longer than the packet */
        static const uint8_t long_varint[] = {7 << 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1};
        const struct {
                const uint8_t *bytes;
                size_t len;
        } refused[] = {{id_as_bytes, sizeof(id_as_bytes)},
                       {second_body, sizeof(second_body)},
                       {body_as_varint, sizeof(body_as_varint)},
                       {field_zero, sizeof(field_zero)},
                       {group, sizeof(group)},
                       {reserved_wire, sizeof(reserved_wire)},
                       {cut_length, sizeof(cut_length)},
                       {long_varint, sizeof(long_varint)}};
        for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
                got = sentinel;
                ck_assert_msg(gm_msg_unpack(buf, envelope_with(refused[i].bytes, refused[i].len, buf), &got) ==
                                      -EBADMSG,
                              "case %zu accepted", i);
                ck_assert_ptr_eq(got, sentinel);
        }
        /* A body cut inside (its length says more than the packet has). */
        static const uint8_t nothing[1];
        n = envelope_with(nothing, 0, buf);
        ck_assert_int_eq(gm_msg_unpack(buf, n - 1, &got), -EBADMSG);
}
END_TEST

/* A body whose unpacked form is far larger than its bytes (empty entries:
 * two bytes each) overflows the envelope's arena: the rest is allocated on
 * its own and freed with the envelope (ASan checks both). */
START_TEST(test_msg_unpack_beyond_arena) {
        Gpumem__Envelope *env = stats_reply_envelope(3000);
        for (size_t i = 0; i < 3000; i++) {
                env->stats_reply->stats[i]->name = "";
                env->stats_reply->stats[i]->value = i == 2999 ? -5 : 0;
        }
        ck_assert_uint_lt(gpumem__envelope__get_packed_size(env), 7000);
        int fds[8];
        size_t n_fds;
        Gpumem__Envelope *got = roundtrip(env, NULL, 0, fds, &n_fds);
        ck_assert_uint_eq(got->stats_reply->n_stats, 3000);
        ck_assert_int_eq(got->stats_reply->stats[2999]->value, -5);
        ck_assert_str_eq(got->stats_reply->stats[1]->name, "");
        assert_same_envelope(got, env);
        gm_msg_free(got);
}
END_TEST

/* ---- backends ---- */

static gm_backend_t *open_host(uint64_t capacity) {
        gm_backend_options_t opts = {.kind = "host", .device = 0, .capacity = capacity};
        gm_backend_t *b = NULL;
        char err[256] = "";
        int r = gm_backend_open(&opts, &b, err, sizeof(err));
        ck_assert_msg(r == 0, "open host: %s (%s)", strerror(-r), err);
        return b;
}

START_TEST(test_host_capacity_enforced) {
        gm_backend_t *b = open_host(8 * MiB);
        ck_assert_str_eq(b->ops->name, "host");
        ck_assert_uint_eq(b->capacity, 8 * MiB);
        ck_assert_uint_eq(b->granularity, 2 * MiB);

        gm_phys_t a, c, d;
        ck_assert_ok(gm_backend_create(b, 2 * MiB, &a));
        ck_assert_ok(gm_backend_create(b, 6 * MiB, &c));
        ck_assert_uint_eq(b->in_use, 8 * MiB);
        uint64_t free_, total;
        ck_assert_ok(b->ops->mem_info(b, &free_, &total));
        ck_assert_uint_eq(free_, 0);
        ck_assert_uint_eq(total, 8 * MiB);

        int before = gm_test_count_fds(getpid());
        ck_assert_int_eq(gm_backend_create(b, 2 * MiB, &d), -ENOMEM);
        ck_assert_int_eq(gm_test_count_fds(getpid()), before); /* nothing was created */
        ck_assert_uint_eq(b->in_use, 8 * MiB);

        int fd = a.fd;
        gm_backend_release(b, &a);
        ck_assert(!is_open(fd));
        ck_assert_int_eq(a.fd, -1);
        ck_assert_uint_eq(b->in_use, 6 * MiB);
        ck_assert_ok(b->ops->mem_info(b, &free_, &total));
        ck_assert_uint_eq(free_, 2 * MiB);
        ck_assert_uint_eq(total, 8 * MiB);

        ck_assert_ok(gm_backend_create(b, 2 * MiB, &d));
        gm_backend_release(b, &c);
        gm_backend_release(b, &d);
        ck_assert_uint_eq(b->in_use, 0);
        ck_assert_ptr_null(gm_backend_close(b));
}
END_TEST

START_TEST(test_host_segment_is_sealed_memfd) {
        gm_backend_t *b = open_host(64 * MiB);
        gm_phys_t p;
        ck_assert_ok(gm_backend_create(b, 4 * MiB, &p));
        ck_assert_uint_eq(p.size, 4 * MiB);
        ck_assert_int_eq(fd_size(p.fd), 4 * MiB);
        ck_assert(has_cloexec(p.fd));
        /* Not F_SEAL_SEAL: F_SEAL_WRITE is how the daemon learns whether a
         * client still maps the memory (below); not F_SEAL_SHRINK: released
         * memory is cut to size 0 (test_host_check_empties_every_copy). */
        ck_assert_int_eq(fcntl(p.fd, F_GET_SEALS), F_SEAL_GROW);
        ck_assert_int_eq(fails_with(ftruncate(p.fd, 6 * MiB)), EPERM);

        /* Shared memory: a write through one mapping shows in another. */
        char *w = mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
        char *r = mmap(NULL, p.size, PROT_READ, MAP_SHARED, p.fd, 0);
        ck_assert_ptr_ne(w, MAP_FAILED);
        ck_assert_ptr_ne(r, MAP_FAILED);
        w[p.size - 1] = 42;
        ck_assert_int_eq(r[p.size - 1], 42);
        /* Mapped somewhere (even PROT_READ: a mapping of a writable fd may be
         * made writable): the backend says so, the kernel refusing to seal
         * writes; once the last mapping is gone, it does not. */
        ck_assert_int_eq(b->ops->mapped(b, &p), 1);
        munmap(w, p.size);
        ck_assert_int_eq(b->ops->mapped(b, &p), 1);
        munmap(r, p.size);
        ck_assert_int_eq(b->ops->mapped(b, &p), 0);
        gm_backend_release(b, &p);
        gm_backend_close(b);
}
END_TEST

/* A published shared object's memfd (freeze): refused while a writable
 * mapping is left; once frozen nobody maps it writable or writes it, a
 * read-only mapping sees the bytes, and it still adopts after a restart. */
START_TEST(test_host_freeze_is_read_only_for_every_holder) {
        gm_backend_t *b = open_host(64 * MiB);
        gm_phys_t p;
        ck_assert_ok(gm_backend_create(b, 2 * MiB, &p));
        char *w = mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
        ck_assert_ptr_ne(w, MAP_FAILED);
        memset(w, 0x3c, p.size);
        ck_assert_int_eq(b->ops->freeze(b, &p), -EBUSY);
        munmap(w, p.size);
        ck_assert_int_eq(b->ops->freeze(b, &p), 0);
        ck_assert_ptr_eq(mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0), MAP_FAILED);
        ck_assert_int_eq(errno, EPERM);
        ck_assert_int_lt(pwrite(p.fd, "x", 1, 0), 0);
        ck_assert_int_lt(ftruncate(p.fd, 0), 0);
        ck_assert_int_lt(fcntl(p.fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0); /* sealed for good */
        char *r = mmap(NULL, p.size, PROT_READ, MAP_SHARED, p.fd, 0);
        ck_assert_ptr_ne(r, MAP_FAILED);
        ck_assert_int_eq(r[p.size - 1], 0x3c);
        munmap(r, p.size);
        gm_phys_t adopted;
        ck_assert_ok(b->ops->adopt(b, dup(p.fd), p.size, &adopted));
        gm_backend_release(b, &adopted);
        gm_backend_release(b, &p);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_host_check_empties_every_copy) {
        /* The check is made only when the memory is on its way out: what a
         * client kept of it (the fd, a private mapping) reads zeros and holds
         * no pages, a lying writable mapping included, and once sealed
         * nobody can map it writable again. */
        gm_backend_t *b = open_host(64 * MiB);
        gm_phys_t p;
        ck_assert_ok(gm_backend_create(b, 4 * MiB, &p));
        int kept = dup(p.fd);
        char *w = mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
        char *priv = mmap(NULL, p.size, PROT_READ, MAP_PRIVATE, p.fd, 0);
        ck_assert_ptr_ne(w, MAP_FAILED);
        ck_assert_ptr_ne(priv, MAP_FAILED);
        memset(w, 0x5a, p.size);
        ck_assert_int_eq(priv[0], 0x5a);
        struct stat st;
        ck_assert_int_eq(b->ops->mapped(b, &p), 1); /* the liar's mapping: its data gone all the same */
        ck_assert_int_eq(fstat(kept, &st), 0);
        ck_assert_int_eq(st.st_blocks, 0);
        ck_assert_int_eq(w[p.size - 1], 0);
        munmap(w, p.size);
        ck_assert_int_eq(b->ops->mapped(b, &p), 0);
        ck_assert_int_eq(fstat(kept, &st), 0);
        ck_assert_int_eq(st.st_blocks, 0);
        ck_assert_int_eq(st.st_size, 0); /* cut to nothing: */
        pid_t child = fork();            /* a kept mapping's touch is SIGBUS, not a new page */
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                signal(SIGBUS, SIG_DFL); /* the fault, not a sanitizer's report of it, ends the child */
                volatile char c = priv[0];
                (void) c;
                _exit(0);
        }
        int status;
        ck_assert_int_eq(waitpid(child, &status, 0), child);
        ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS);
        ck_assert_ptr_eq(mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, kept, 0), MAP_FAILED);
        ck_assert_int_eq(fails_with(write(kept, "x", 1)), EPERM);
        ck_assert_int_eq(fails_with(fallocate(kept, 0, 0, (off_t) p.size)), EPERM); /* nor grown back */
        ck_assert_int_eq(fails_with(ftruncate(kept, (off_t) p.size)), EPERM);
        munmap(priv, p.size);
        close(kept);
        gm_backend_release(b, &p);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_host_sizes_must_be_granules) {
        gm_backend_t *b = open_host(64 * MiB);
        gm_phys_t p = {.fd = -7};
        int before = gm_test_count_fds(getpid());
        ck_assert_int_eq(gm_backend_create(b, 0, &p), -EINVAL);
        ck_assert_int_eq(gm_backend_create(b, 1 * MiB, &p), -EINVAL);
        ck_assert_int_eq(gm_backend_create(b, 3 * MiB, &p), -EINVAL);
        ck_assert_int_eq(gm_backend_create(b, 2 * MiB + 4096, &p), -EINVAL);
        ck_assert_int_eq(gm_backend_create(b, 128 * MiB, &p), -ENOMEM);
        ck_assert_int_eq(p.fd, -7);
        ck_assert_uint_eq(b->in_use, 0);
        ck_assert_int_eq(gm_test_count_fds(getpid()), before);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_host_capacity_defaults_and_rounding) {
        uint64_t quarter = (uint64_t) sysconf(_SC_PHYS_PAGES) / 4 * (uint64_t) sysconf(_SC_PAGESIZE);
        uint64_t want = quarter < (8ull << 30) ? quarter : (8ull << 30);
        want -= want % (2 * MiB);
        gm_backend_t *b = open_host(0);
        ck_assert_uint_eq(b->capacity, want);
        gm_backend_close(b);

        b = open_host(3 * MiB);
        ck_assert_uint_eq(b->capacity, 2 * MiB);
        gm_backend_close(b);

        gm_backend_options_t opts = {.kind = "host", .capacity = 1 * MiB};
        gm_backend_t *none = NULL;
        char err[128] = "";
        ck_assert_int_eq(gm_backend_open(&opts, &none, err, sizeof(err)), -EINVAL);
        ck_assert_ptr_null(none);
        ck_assert_ptr_nonnull(strstr(err, "granularity"));
}
END_TEST

START_TEST(test_backend_open_kinds) {
        gm_backend_options_t opts = {.kind = "floppy", .device = 0, .capacity = 64 * MiB};
        gm_backend_t *b = NULL;
        char err[512] = "";
        ck_assert_int_eq(gm_backend_open(&opts, &b, err, sizeof(err)), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "floppy"));
        ck_assert_ptr_null(b);

        /* auto: whichever it picks, it says so. */
        opts.kind = "auto";
        err[0] = '\0';
        ck_assert_ok(gm_backend_open(&opts, &b, err, sizeof(err)));
        ck_assert_ptr_nonnull(strstr(err, b->ops->name));
        b = gm_backend_close(b);

#ifndef GPUMEM_HAVE_CUDA
        opts.kind = "cuda";
        err[0] = '\0';
        ck_assert_int_eq(gm_backend_open(&opts, &b, err, sizeof(err)), -ENOSYS);
        ck_assert_ptr_nonnull(strstr(err, "without the cuda backend"));
        ck_assert_ptr_null(b);

        opts.kind = NULL; /* auto */
        err[0] = '\0';
        ck_assert_ok(gm_backend_open(&opts, &b, err, sizeof(err)));
        ck_assert_str_eq(b->ops->name, "host");
        ck_assert_ptr_nonnull(strstr(err, "without the cuda backend"));
        ck_assert_ptr_nonnull(strstr(err, "using host"));
        b = gm_backend_close(b);
#endif
        ck_assert_ptr_null(gm_backend_close(NULL));
}
END_TEST

START_TEST(test_round_up) {
        ck_assert_uint_eq(gm_round_up(0, 2 * MiB), 0);
        ck_assert_uint_eq(gm_round_up(1, 2 * MiB), 2 * MiB);
        ck_assert_uint_eq(gm_round_up(2 * MiB, 2 * MiB), 2 * MiB);
        ck_assert_uint_eq(gm_round_up(2 * MiB + 1, 2 * MiB), 4 * MiB);
        ck_assert_uint_eq(gm_round_up(10, 3), 12);
        ck_assert_uint_eq(gm_round_up(12, 3), 12);
        ck_assert_uint_eq(gm_round_up(UINT64_MAX, 2), 0);
        ck_assert_uint_eq(gm_round_up(UINT64_MAX - 5, 1024), 0);
        ck_assert_uint_eq(gm_round_up(UINT64_MAX, 1), UINT64_MAX);
}
END_TEST

static Suite *ipc_suite(void) {
        Suite *s = suite_create("ipc");

        TCase *tc = tcase_create("transport");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_send_refuses_empty_and_too_many_fds);
        tcase_add_test(tc, test_framing_preserves_packet_boundaries);
        tcase_add_test(tc, test_packet_exactly_buffer_size_is_accepted);
        tcase_add_test(tc, test_truncated_packet_refused_and_fds_closed);
        tcase_add_test(tc, test_eof_is_connreset_and_send_to_gone_peer_is_epipe);
        tcase_add_test(tc, test_nonblocking_empty_socket_is_eagain);
        tcase_add_test(tc, test_fds_arrive_in_order_and_cloexec);
        tcase_add_test(tc, test_fd_passing_to_forked_child);
        tcase_add_test(tc, test_fd_cap_one_over);
        tcase_add_test(tc, test_fd_cap_kernel_maximum);
        tcase_add_test(tc, test_fd_to_receiver_accepting_none);
        tcase_add_test(tc, test_foreign_control_message_refused);
        tcase_add_test(tc, test_close_fds);
        suite_add_tcase(s, tc);

        tc = tcase_create("listener");
        tcase_set_timeout(tc, 60);
        tcase_add_checked_fixture(tc, tmpdir_setup, tmpdir_teardown);
        tcase_add_test(tc, test_listen_creates_parents_and_applies_mode);
        tcase_add_test(tc, test_connect_accept_flags_and_data);
        tcase_add_test(tc, test_peer_cred_and_groups_of_forked_child);
        tcase_add_test(tc, test_listen_replaces_stale_socket);
        tcase_add_test(tc, test_listen_refuses_live_socket);
        tcase_add_test(tc, test_listen_refuses_live_listener_of_another_type);
        tcase_add_test(tc, test_listen_never_removes_a_non_socket);
        tcase_add_test(tc, test_path_checks);
        tcase_add_test(tc, test_default_socket_path);
        suite_add_tcase(s, tc);

        tc = tcase_create("msg");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_msg_roundtrip_every_body);
        tcase_add_test(tc, test_msg_alloc_reply_with_fds);
        tcase_add_test(tc, test_msg_large_envelope_roundtrip);
        tcase_add_test(tc, test_msg_pack_into_caller_buffer_or_heap);
        tcase_add_test(tc, test_msg_oversize_refused_and_nothing_sent);
        tcase_add_test(tc, test_msg_garbage_is_ebadmsg);
        tcase_add_test(tc, test_msg_envelope_framing);
        tcase_add_test(tc, test_msg_unpack_beyond_arena);
        suite_add_tcase(s, tc);

        tc = tcase_create("backend");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_host_capacity_enforced);
        tcase_add_test(tc, test_host_segment_is_sealed_memfd);
        tcase_add_test(tc, test_host_check_empties_every_copy);
        tcase_add_test(tc, test_host_freeze_is_read_only_for_every_holder);
        tcase_add_test(tc, test_host_sizes_must_be_granules);
        tcase_add_test(tc, test_host_capacity_defaults_and_rounding);
        tcase_add_test(tc, test_backend_open_kinds);
        tcase_add_test(tc, test_round_up);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(ipc_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
