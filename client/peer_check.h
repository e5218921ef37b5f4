/* The client's side of "no squatting": libgpumem and gpumemctl connect only
 * to a socket in a directory that nobody but a trusted user could have put it
 * in, and only to a daemon that runs as a trusted user. Trusted: root, the
 * caller itself (a per-user daemon), the packaged service user "gpumem", and
 * the user named by $GPUMEM_DAEMON_USER (a name or a uid), when set. */
#pragma once

#include <stddef.h>

/* Connects a CLOEXEC SOCK_SEQPACKET socket to `path` after the directory
 * check and checks the listener's credentials. On failure returns negative
 * errno (-EPERM for an untrusted directory or daemon) and writes a one-line
 * message naming the path into why. */
int gm_peer_connect(const char *path, int *ret_fd, char *why, size_t why_len);
