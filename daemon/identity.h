/* The identity of a connected peer as the kernel reports it: credentials,
 * groups and the systemd unit of its cgroup. Nothing here logs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define GM_UNIT_NAME_MAX 255u /* systemd's limit */
#define GM_IDENTITY_MAX_GROUPS 64u
#define GM_COMM_MAX 16u /* the kernel's TASK_COMM_LEN, NUL included */

/* The peer of a connection, as the kernel reports it. */
typedef struct gm_identity {
        pid_t pid;
        uid_t uid;
        gid_t gid;
        gid_t groups[GM_IDENTITY_MAX_GROUPS]; /* supplementary groups (the first 64) */
        size_t n_groups;
        char unit[GM_UNIT_NAME_MAX + 1]; /* systemd unit; "" when none or unverifiable */
        /* The unit lives under a user's own service manager (user@UID.service),
         * whose cgroup subtree that user controls and may name freely: such a
         * unit is shown but never matched by unit= rules. */
        bool user_unit;
        /* The command name (/proc/PID/comm) when it connected, raw: the process
         * sets it itself (escape before showing it); "" when unverifiable. */
        char comm[GM_COMM_MAX];
} gm_identity_t;

/* Fills *ret from a connected AF_UNIX socket: uid, gid and pid (SO_PEERCRED),
 * supplementary groups (SO_PEERGROUPS), the unit from /proc/PID/cgroup and the
 * command name from /proc/PID/comm.
 * `pid` is 0, or the pid the caller already holds for this peer, which must
 * match SO_PEERCRED's (-ESRCH otherwise). The unit is read only when the
 * kernel can vouch that the pid still names the peer (SO_PEERPIDFD), and so is
 * the command name: a peer
 * that has exited, an old kernel or an unreadable /proc give "". Fails only
 * when the credentials cannot be read. */
int gm_identity_read(int sock, pid_t pid, gm_identity_t *ret);

/* The unit in the contents of a /proc/PID/cgroup file: from the "0::" line
 * (cgroup v2) or, when present, the "name=systemd:" line (v1, hybrid). Slices
 * are skipped and the first unit below them is taken; under user@UID.service
 * the user's unit below it is taken and *ret_user_unit set. Anything else
 * (no systemd hierarchy, foreign paths, malformed names) gives "". */
void gm_cgroup_parse_unit(const char *text, char ret_unit[GM_UNIT_NAME_MAX + 1], bool *ret_user_unit);

/* A systemd unit name of n bytes (not NUL-terminated) ending in `suffix`. */
bool gm_unit_name_valid(const char *s, size_t n, const char *suffix);
/* A unit a process can run in: a .service or a .scope. */
bool gm_unit_name_valid_leaf(const char *s, size_t n);
