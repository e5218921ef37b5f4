/* The identity of a connected peer as the kernel reports it (see identity.h). */
#include "identity.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ipc.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5, asm-generic value */
#endif

/* ---- unit names ---- */

static bool has_suffix(const char *s, size_t n, const char *suffix) {
        size_t k = strlen(suffix);
        return n > k && memcmp(s + n - k, suffix, k) == 0;
}

bool gm_unit_name_valid(const char *s, size_t n, const char *suffix) {
        if (n == 0 || n > GM_UNIT_NAME_MAX || !has_suffix(s, n, suffix))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char) s[i]) && !strchr(":_.\\@-", s[i]))
                        return false;
        return true;
}

bool gm_unit_name_valid_leaf(const char *s, size_t n) {
        return gm_unit_name_valid(s, n, ".service") || gm_unit_name_valid(s, n, ".scope");
}

/* "user@<uid>.service": a per-user service manager, whose subtree the user owns. */
static bool is_user_manager(const char *s, size_t n) {
        static const char prefix[] = "user@", suffix[] = ".service";
        size_t p = sizeof(prefix) - 1, q = sizeof(suffix) - 1;
        if (n <= p + q || memcmp(s, prefix, p) != 0 || memcmp(s + n - q, suffix, q) != 0)
                return false;
        for (size_t i = p; i < n - q; i++)
                if (!isdigit((unsigned char) s[i]))
                        return false;
        return true;
}

/* ---- identity ---- */

/* The unit of one cgroup path ("/system.slice/foo.service/..."), n bytes. */
static bool path_unit(const char *p, size_t n, char ret_unit[GM_UNIT_NAME_MAX + 1], bool *ret_user_unit) {
        const char *end = p + n;
        const char *manager = NULL;
        size_t manager_len = 0;
        if (n == 0 || *p != '/')
                return false;
        while (p < end) {
                p++; /* the '/' */
                const char *slash = memchr(p, '/', (size_t) (end - p));
                size_t c = slash ? (size_t) (slash - p) : (size_t) (end - p);
                if (gm_unit_name_valid(p, c, ".slice")) {
                        p += c;
                        continue;
                }
                if (!gm_unit_name_valid_leaf(p, c))
                        break;
                if (!manager && is_user_manager(p, c)) {
                        manager = p, manager_len = c;
                        p += c;
                        continue;
                }
                memcpy(ret_unit, p, c);
                ret_unit[c] = '\0';
                *ret_user_unit = manager != NULL;
                return true;
        }
        if (!manager)
                return false;
        /* In user@UID.service itself or in a subgroup that names no unit. */
        memcpy(ret_unit, manager, manager_len);
        ret_unit[manager_len] = '\0';
        *ret_user_unit = false;
        return true;
}

void gm_cgroup_parse_unit(const char *text, char ret_unit[GM_UNIT_NAME_MAX + 1], bool *ret_user_unit) {
        const char *v2 = NULL, *v1 = NULL;
        size_t v2_len = 0, v1_len = 0;
        for (const char *s = text; *s;) {
                const char *nl = strchr(s, '\n');
                size_t n = nl ? (size_t) (nl - s) : strlen(s);
                /* "ID:CONTROLLERS:PATH"; the path may itself hold ':'. */
                const char *c1 = memchr(s, ':', n);
                const char *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t) (c1 + 1 - s)) : NULL;
                if (c2) {
                        const char *path = c2 + 1;
                        size_t path_len = n - (size_t) (path - s);
                        if (c1 - s == 1 && s[0] == '0' && c2 == c1 + 1)
                                v2 = path, v2_len = path_len;
                        else if (c2 - c1 - 1 == 12 && memcmp(c1 + 1, "name=systemd", 12) == 0)
                                v1 = path, v1_len = path_len;
                }
                s += n + (nl ? 1 : 0);
        }
        bool user = false;
        if ((v2 && path_unit(v2, v2_len, ret_unit, &user)) || (v1 && path_unit(v1, v1_len, ret_unit, &user))) {
                *ret_user_unit = user;
                return;
        }
        ret_unit[0] = '\0';
        *ret_user_unit = false;
}

/* Reads a small /proc file whole (NUL-terminated) into buf. */
static int read_proc(const char *path, char *buf, size_t size) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        size_t len = 0;
        for (;;) {
                ssize_t k = read(fd, buf + len, size - 1 - len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0 || (len += (size_t) k) == size - 1)
                        break;
        }
        close(fd);
        buf[len] = '\0';
        return 0;
}

static bool pidfd_alive(int pidfd) {
        return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0 || errno == EPERM;
}

/* The effective uid on the "Uid:" line of /proc/PID/status. */
static bool proc_euid_is(pid_t pid, uid_t uid, char *buf, size_t size) {
        char path[64];
        unsigned real, effective;
        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        if (read_proc(path, buf, size) < 0)
                return false;
        const char *u = strstr(buf, "\nUid:");
        return u && sscanf(u + 5, "%u %u", &real, &effective) == 2 && effective == (unsigned) uid;
}

/* The command name in the contents of /proc/PID/comm: the name, then a
 * newline the kernel adds (the name itself may hold newlines). */
static void comm_from(const char *text, char ret_comm[GM_COMM_MAX]) {
        size_t n = strlen(text);
        if (n > 0 && text[n - 1] == '\n')
                n--;
        if (n >= GM_COMM_MAX)
                n = GM_COMM_MAX - 1;
        memcpy(ret_comm, text, n);
        ret_comm[n] = '\0';
}

/* Sets id->unit and id->comm only when the kernel vouches that cred->pid still names the
 * peer: SO_PEERPIDFD pins the peer process itself (Linux >= 6.5); older
 * kernels get a pidfd by pid plus a uid check, which a pid reused by another
 * user cannot pass. The pidfd must still be alive after /proc was read. */
static void peer_unit(int sock, const gm_peer_cred_t *cred, gm_identity_t *id) {
        int pidfd = -1;
        socklen_t l = sizeof(pidfd);
        bool by_pid = false;
        if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &l) < 0) {
                if (errno != ENOPROTOOPT)
                        return;                                      /* the peer is gone */
                pidfd = (int) syscall(SYS_pidfd_open, cred->pid, 0); /* always CLOEXEC */
                by_pid = true;
        }
        if (pidfd < 0)
                return;
        size_t size = 64 * 1024;
        char *text = malloc(size), path[64], comm[GM_COMM_MAX + 1] = "";
        snprintf(path, sizeof(path), "/proc/%d/comm", (int) cred->pid);
        bool have_comm = read_proc(path, comm, sizeof(comm)) == 0;
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) cred->pid);
        if (text && read_proc(path, text, size) == 0) {
                char *status = by_pid ? malloc(8192) : NULL;
                if ((!by_pid || (status && proc_euid_is(cred->pid, cred->uid, status, 8192))) && pidfd_alive(pidfd)) {
                        gm_cgroup_parse_unit(text, id->unit, &id->user_unit);
                        if (have_comm)
                                comm_from(comm, id->comm);
                }
                free(status);
        }
        free(text);
        close(pidfd);
}

int gm_identity_read(int sock, pid_t pid, gm_identity_t *ret) {
        gm_peer_cred_t cred;
        int r = gm_ipc_peer_cred(sock, &cred);
        if (r < 0)
                return r;
        if (pid != 0 && pid != cred.pid)
                return -ESRCH;
        gm_identity_t id = {.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
        r = gm_ipc_peer_groups(sock, id.groups, GM_IDENTITY_MAX_GROUPS, &id.n_groups);
        if (r < 0)
                return r;
        if (cred.pid > 0)
                peer_unit(sock, &cred, &id);
        *ret = id;
        return 0;
}
