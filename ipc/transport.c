/* AF_UNIX SOCK_SEQPACKET transport: one message a packet, fds by SCM_RIGHTS.
 *
 * Invariant of gm_ipc_recv: a packet is either handed over whole (bytes and
 * every fd it carried) or refused, and a refused packet leaves no fd open in
 * this process and nothing behind in the socket. To keep that true even for a
 * sender that attaches more fds than we accept, the control buffer always has
 * room for the kernel's per-message maximum (GM_IPC_MAX_FDS_LIMIT). */
#include "ipc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CMSG_BUF_LEN CMSG_SPACE(sizeof(int) * GM_IPC_MAX_FDS_LIMIT)

/* A control buffer aligned for struct cmsghdr. */
typedef union cmsg_buf {
        struct cmsghdr align;
        char buf[CMSG_BUF_LEN];
} cmsg_buf_t;

void gm_close_fds(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++) {
                if (fds[i] >= 0) {
                        close(fds[i]);
                        fds[i] = -1;
                }
        }
}

int gm_ipc_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds) {
        if (len == 0 || n_fds > GM_IPC_MAX_FDS_LIMIT)
                return -EMSGSIZE;

        struct iovec iov = {.iov_base = (void *) buf, .iov_len = len};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        cmsg_buf_t control;
        if (n_fds > 0) {
                memset(&control, 0, sizeof(control));
                mh.msg_control = control.buf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }

        ssize_t n;
        do
                n = sendmsg(sock, &mh, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        /* SOCK_SEQPACKET sends a packet whole or not at all. */
        return (size_t) n == len ? 0 : -EIO;
}

int gm_ipc_recv(int sock, void *buf, size_t buf_len, int *fds, size_t max_fds, size_t *ret_len, size_t *ret_n_fds) {
        struct iovec iov = {.iov_base = buf, .iov_len = buf_len};
        cmsg_buf_t control;
        struct msghdr mh = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof(control.buf),
        };

        ssize_t n;
        bool reset_seen = false;
        for (;;) {
                mh.msg_controllen = sizeof(control.buf);
                n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
                if (n >= 0)
                        break;
                if (errno == EINTR)
                        continue;
                /* A peer that closed while our packet sat unread in its queue
                 * leaves ECONNRESET, reported once and ahead of what it sent
                 * before closing (such as the reason for a refusal): read on. */
                if (errno == ECONNRESET && !reset_seen) {
                        reset_seen = true;
                        continue;
                }
                return -errno;
        }

        /* Take every fd first, so that any refusal below can close them all. */
        int got[GM_IPC_MAX_FDS_LIMIT];
        size_t n_got = 0;
        bool foreign = false;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
                        foreign = true;
                        continue;
                }
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k && n_got < GM_IPC_MAX_FDS_LIMIT; i++)
                        memcpy(&got[n_got++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }

        int r = 0;
        if (n == 0)
                r = -ECONNRESET; /* clients never send empty packets: this is EOF */
        else if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || foreign || n_got > max_fds)
                r = -EMSGSIZE;
        if (r < 0) {
                gm_close_fds(got, n_got);
                return r;
        }

        if (n_got > 0)
                memcpy(fds, got, sizeof(int) * n_got);
        *ret_len = (size_t) n;
        *ret_n_fds = n_got;
        return 0;
}

int gm_ipc_peer_cred(int sock, gm_peer_cred_t *ret_cred) {
        struct ucred uc;
        socklen_t len = sizeof(uc);
        if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
                return -errno;
        *ret_cred = (gm_peer_cred_t){.pid = uc.pid, .uid = uc.uid, .gid = uc.gid};
        return 0;
}

int gm_ipc_peer_groups(int sock, gid_t *groups, size_t max, size_t *ret_n) {
        socklen_t len = (socklen_t) (max * sizeof(gid_t));
        if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
                *ret_n = len / sizeof(gid_t);
                return 0;
        }
        if (errno != ERANGE)
                return -errno;

        /* More groups than `max`: the kernel said how many (they are fixed at
         * connect time), so fetch them all and keep the first `max`. */
        gid_t *all = malloc(len);
        if (!all)
                return -ENOMEM;
        if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, all, &len) < 0) {
                int r = -errno;
                free(all);
                return r;
        }
        size_t n = len / sizeof(gid_t);
        if (n > max)
                n = max;
        if (n > 0)
                memcpy(groups, all, n * sizeof(gid_t));
        free(all);
        *ret_n = n;
        return 0;
}

static int sockaddr_from_path(const char *path, struct sockaddr_un *ret_sa) {
        if (!path || !*path)
                return -EINVAL;
        size_t len = strlen(path);
        if (len >= sizeof(ret_sa->sun_path))
                return -ENAMETOOLONG;
        memset(ret_sa, 0, sizeof(*ret_sa));
        ret_sa->sun_family = AF_UNIX;
        memcpy(ret_sa->sun_path, path, len);
        return 0;
}

/* Creates every missing directory above the last '/' of `path`, each with
 * mode 0755 regardless of the umask; existing ones are left as they are. */
static int mkdir_parents(const char *path) {
        char dir[sizeof(((struct sockaddr_un *) 0)->sun_path)];
        const char *slash = strrchr(path, '/');
        if (!slash || slash == path)
                return 0;
        size_t len = (size_t) (slash - path);
        memcpy(dir, path, len);
        dir[len] = '\0';

        for (char *p = dir + 1;; p++) {
                if (*p != '/' && *p != '\0')
                        continue;
                char saved = *p;
                *p = '\0';
                if (mkdir(dir, 0755) == 0) {
                        if (chmod(dir, 0755) < 0)
                                return -errno;
                } else if (errno != EEXIST) {
                        return -errno;
                }
                *p = saved;
                if (saved == '\0')
                        return 0;
        }
}

/* Whether a process listens on the socket file at `sa` (probed with a
 * socket of `type`): 1 live, 0 stale (a socket file nobody listens on),
 * negative errno when undecidable or when the path holds something that is
 * not a socket (never ours to remove). */
static int probe_live(const struct sockaddr_un *sa, int type) {
        struct stat st;
        if (lstat(sa->sun_path, &st) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISSOCK(st.st_mode))
                return -EADDRINUSE;

        int fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        int r = connect(fd, (const struct sockaddr *) sa, sizeof(*sa));
        int err = errno;
        close(fd);
        if (r == 0)
                return 1;
        if (err == ECONNREFUSED || err == ENOENT)
                return 0;
        return 1; /* EAGAIN (full backlog), EPROTOTYPE (another socket type): someone is there */
}

int gm_ipc_bind_unix(int fd, const struct sockaddr_un *sa, int type) {
        if (bind(fd, (const struct sockaddr *) sa, sizeof(*sa)) == 0)
                return 0;
        if (errno != EADDRINUSE)
                return -errno;
        int r = probe_live(sa, type);
        if (r != 0)
                return r > 0 ? -EADDRINUSE : r;
        if (unlink(sa->sun_path) < 0 && errno != ENOENT)
                return -errno;
        return bind(fd, (const struct sockaddr *) sa, sizeof(*sa)) == 0 ? 0 : -errno;
}

int gm_ipc_listen(const char *path, mode_t mode, int backlog, int *ret_fd) {
        struct sockaddr_un sa;
        int r = sockaddr_from_path(path, &sa);
        if (r < 0)
                return r;
        r = mkdir_parents(path);
        if (r < 0)
                return r;

        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;

        r = gm_ipc_bind_unix(fd, &sa, SOCK_SEQPACKET);
        if (r < 0)
                goto fail_close;

        /* Nobody can connect before listen(), so the mode is in place first. */
        if (chmod(path, mode) < 0 || listen(fd, backlog) < 0) {
                r = -errno;
                goto fail_unlink;
        }
        *ret_fd = fd;
        return 0;

fail_unlink:
        unlink(path);
fail_close:
        close(fd);
        return r;
}

int gm_ipc_make_socket_dir(const char *path) {
        struct sockaddr_un sa;
        int r = sockaddr_from_path(path, &sa);
        return r < 0 ? r : mkdir_parents(path);
}

int gm_ipc_accept(int listen_fd, int *ret_fd) {
        int fd;
        do
                fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
                return -errno;
        *ret_fd = fd;
        return 0;
}

int gm_ipc_connect(const char *path, int *ret_fd) {
        struct sockaddr_un sa;
        int r = sockaddr_from_path(path, &sa);
        if (r < 0)
                return r;

        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        /* An interrupted AF_UNIX connect leaves the socket unconnected, so a
         * plain retry starts over. */
        do
                r = connect(fd, (struct sockaddr *) &sa, sizeof(sa));
        while (r < 0 && errno == EINTR);
        if (r < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

int gm_ipc_default_socket_path(int device, bool client_side, char *buf, size_t buf_len) {
        if (device < 0)
                return -EINVAL;
        const char *dir = secure_getenv("GPUMEM_SYSTEM_SOCKET_DIR");
        if (!dir || dir[0] != '/')
                dir = GM_IPC_SYSTEM_SOCKET_DIR;
        int n = snprintf(buf, buf_len, "%s/gpu%d.sock", dir, device);
        bool whole = n >= 0 && (size_t) n < buf_len;
        struct stat st;
        if (geteuid() != 0 && !(client_side && whole && stat(buf, &st) == 0 && S_ISSOCK(st.st_mode))) {
                const char *runtime = secure_getenv("XDG_RUNTIME_DIR");
                if (runtime && runtime[0] == '/')
                        n = snprintf(buf, buf_len, "%s/gpumem/gpu%d.sock", runtime, device);
                else
                        n = snprintf(buf, buf_len, "/tmp/gpumem-%u/gpu%d.sock", (unsigned) geteuid(), device);
        }
        if (n < 0)
                return -EINVAL;
        if ((size_t) n >= buf_len)
                return -ENAMETOOLONG;
        return 0;
}
