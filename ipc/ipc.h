/* Packet transport between gpumemd and its clients: AF_UNIX SOCK_SEQPACKET,
 * one message a packet, file descriptors by SCM_RIGHTS, peer credentials.
 * Every fd created here is CLOEXEC; errors are negative errno; nothing logs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define GM_IPC_MAX_PACKET_DEFAULT (64u * 1024u) /* bytes in one packet */
#define GM_IPC_MAX_FDS_DEFAULT 32u              /* fds in one packet (kernel cap: 253) */
#define GM_IPC_MAX_FDS_LIMIT 253u

typedef struct gm_peer_cred {
        pid_t pid;
        uid_t uid;
        gid_t gid;
} gm_peer_cred_t;

/* Sends one packet of `len` bytes with `n_fds` fds attached (MSG_NOSIGNAL).
 * The fds stay owned by the caller. -EMSGSIZE when len is 0 or n_fds exceeds
 * GM_IPC_MAX_FDS_LIMIT; -EAGAIN on a full non-blocking socket; -EPIPE when the
 * peer is gone. */
int gm_ipc_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds);

/* Receives one packet into buf (capacity buf_len) and at most max_fds fds
 * (MSG_CMSG_CLOEXEC). On success returns 0 with *ret_len bytes and *ret_n_fds
 * fds, which the caller then owns. A packet longer than buf_len, carrying more
 * than max_fds fds, or carrying anything but SCM_RIGHTS is refused with
 * -EMSGSIZE and every fd it carried is closed. Returns -ECONNRESET when the
 * peer closed the connection, -EAGAIN when a non-blocking socket has nothing. */
int gm_ipc_recv(int sock, void *buf, size_t buf_len, int *fds, size_t max_fds, size_t *ret_len, size_t *ret_n_fds);

/* SO_PEERCRED of a connected socket. */
int gm_ipc_peer_cred(int sock, gm_peer_cred_t *ret_cred);
/* SO_PEERGROUPS: up to max supplementary groups; *ret_n is the number stored. */
int gm_ipc_peer_groups(int sock, gid_t *groups, size_t max, size_t *ret_n);

/* Binds and listens on `path` (non-blocking, CLOEXEC). A stale socket file
 * (nobody listening) is replaced; a live one gives -EADDRINUSE. The parent
 * directory is created (mode 0755) when missing. `mode` is applied to the
 * socket file. */
int gm_ipc_listen(const char *path, mode_t mode, int backlog, int *ret_fd);
/* Binds fd to the unix socket address `sa`, replacing a stale socket file
 * (one nobody listening with a socket of `type` answers on). -EADDRINUSE
 * when someone listens there or the path is not a socket. */
struct sockaddr_un;
int gm_ipc_bind_unix(int fd, const struct sockaddr_un *sa, int type);
/* Creates every missing directory above the socket file `path` (mode 0755,
 * whatever the umask); existing ones are left as they are. */
int gm_ipc_make_socket_dir(const char *path);
/* Accepts one connection, non-blocking and CLOEXEC. -EAGAIN when none waits. */
int gm_ipc_accept(int listen_fd, int *ret_fd);
/* Connects a blocking CLOEXEC SOCK_SEQPACKET socket to `path`. */
int gm_ipc_connect(const char *path, int *ret_fd);

/* Where the packaged (system) daemons listen: $GPUMEM_SYSTEM_SOCKET_DIR when
 * it is an absolute path (tests, relocated installs), else this. */
#define GM_IPC_SYSTEM_SOCKET_DIR "/run/gpumem"

/* The default socket of device `device`, for the daemon and its clients alike:
 * as root the system socket <system dir>/gpu<N>.sock; else the caller's own
 * $XDG_RUNTIME_DIR/gpumem/gpu<N>.sock (without it /tmp/gpumem-<uid>/gpu<N>.sock),
 * except that a client (`client_side`) takes the system socket whenever one
 * exists (a packaged daemon serves everyone). */
int gm_ipc_default_socket_path(int device, bool client_side, char *buf, size_t buf_len);

/* Closes every fd in fds[0..n) (ignores -1 entries). */
void gm_close_fds(int *fds, size_t n);
