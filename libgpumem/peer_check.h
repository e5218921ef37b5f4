/* The client's side of "no squatting": libgpumem and gpumemctl connect only
 * to a socket in a directory that nobody but a trusted user could have put it
 * in, and only to a daemon that runs as a trusted user. Trusted: root, the
 * caller itself (a per-user daemon), the packaged service user "gpumem", and
 * the user named by $GPUMEM_DAEMON_USER (a name or a uid), when set.
 *
 * Which socket a client picks when it is given none is decided here too, so
 * that libgpumem and gpumemctl pick the same one. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* The highest GPU index a socket is looked up for. */
#define GM_PEER_MAX_DEVICE 63

/* The socket a client uses for GPU `device` when it is given none:
 * $GPUMEM_SOCKET when `use_env` and it is set, else the default a client
 * takes (gm_ipc_default_socket_path). The connection's trust checks apply to
 * whichever is picked. */
int gm_peer_default_socket(int device, bool use_env, char *buf, size_t len);

/* The socket of device index `index`: $GPUMEM_SOCKET_TEMPLATE with its one
 * "%d" replaced by the index (-EINVAL when it holds another conversion), else
 * gm_peer_default_socket(index, index == 0). */
int gm_peer_device_socket(int index, char *buf, size_t len);

/* Connects a CLOEXEC SOCK_SEQPACKET socket to `path` after the directory
 * check and checks the listener's credentials. On failure returns negative
 * errno (-EPERM for an untrusted directory or daemon; -ENOENT or
 * -ECONNREFUSED when no daemon listens there) and writes a one-line message
 * naming the path into why. */
int gm_peer_connect(const char *path, int *ret_fd, char *why, size_t why_len);
