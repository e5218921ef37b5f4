/* Whom a socket may be trusted to: the directories that hold it and the
 * process listening on it. A socket in a directory another user can write to
 * (or owns) can be replaced by that user's own listener, which would then be
 * handed a client's memory; so both ends refuse such a path, as ssh-agent and
 * systemd do. Nothing here logs: a refusal comes back as -EPERM with a
 * one-line reason. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define GM_TRUST_MAX_UIDS 4u

/* The uids trusted to own the socket's directory and to listen on it. Root
 * (uid 0) is always trusted. */
typedef struct gm_trust {
        uid_t uids[GM_TRUST_MAX_UIDS];
        size_t n_uids;
} gm_trust_t;

/* Adds uid (ignored when already there or when the set is full). */
void gm_trust_add(gm_trust_t *t, uid_t uid);
bool gm_trust_has(const gm_trust_t *t, uid_t uid);

/* Checks the directories of socket path `path`, from "/" down to its parent:
 * the parent must be owned by a trusted uid and writable by nobody else (no
 * group or other write bit); every directory above it must be owned by a
 * trusted uid and be either not writable by group and others or sticky (as
 * /tmp is). Symbolic links are followed as connect() follows them, and what
 * they resolve to is checked. Returns 0, -EPERM with the reason in why, or the
 * negative errno of a failed lookup (-ENOENT: no such directory). */
int gm_trust_check_dir(const char *path, const gm_trust_t *t, char *why, size_t why_len);

/* Checks the peer of connected socket `fd` (SO_PEERCRED): its uid must be
 * trusted. -EPERM with the reason in why otherwise. */
int gm_trust_check_peer(int fd, const gm_trust_t *t, char *why, size_t why_len);
