/* Socket path and peer checks (trust.h). */
#include "trust.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ipc.h"

void gm_trust_add(gm_trust_t *t, uid_t uid) {
        if (!gm_trust_has(t, uid) && t->n_uids < GM_TRUST_MAX_UIDS)
                t->uids[t->n_uids++] = uid;
}

bool gm_trust_has(const gm_trust_t *t, uid_t uid) {
        if (uid == 0)
                return true;
        for (size_t i = 0; i < t->n_uids; i++)
                if (t->uids[i] == uid)
                        return true;
        return false;
}

static int refuse(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t why_len, const char *fmt, ...) {
        if (why && why_len > 0) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(why, why_len, fmt, ap);
                va_end(ap);
        }
        return -EPERM;
}

/* "root or uid 1000 or uid 998" into buf. */
static const char *trusted_list(const gm_trust_t *t, char *buf, size_t len) {
        int n = snprintf(buf, len, "root");
        for (size_t i = 0; i < t->n_uids && n >= 0 && (size_t) n < len; i++)
                if (t->uids[i] != 0)
                        n += snprintf(buf + n, len - (size_t) n, " or uid %u", (unsigned) t->uids[i]);
        return buf;
}

static int check_one(const char *dir, bool parent, const gm_trust_t *t, char *why, size_t why_len) {
        struct stat st;
        if (stat(dir, &st) < 0)
                return -errno;
        char list[96];
        if (!S_ISDIR(st.st_mode))
                return refuse(why, why_len, "'%s' is not a directory", dir);
        if (!gm_trust_has(t, st.st_uid))
                return refuse(why, why_len, "refusing socket directory '%s': owned by uid %u, not by %s", dir,
                              (unsigned) st.st_uid, trusted_list(t, list, sizeof(list)));
        bool writable = st.st_mode & (S_IWGRP | S_IWOTH);
        if (writable && (parent || !(st.st_mode & S_ISVTX)))
                return refuse(why, why_len,
                              "refusing socket directory '%s': writable by other users (mode %04o), so anyone "
                              "could have put the socket there",
                              dir, (unsigned) (st.st_mode & 07777));
        return 0;
}

int gm_trust_check_dir(const char *path, const gm_trust_t *t, char *why, size_t why_len) {
        if (!path || !*path)
                return -EINVAL;
        const char *slash = strrchr(path, '/');
        char dir[PATH_MAX];
        if (!slash) {
                snprintf(dir, sizeof(dir), ".");
        } else {
                size_t len = slash == path ? 1 : (size_t) (slash - path);
                if (len >= sizeof(dir))
                        return -ENAMETOOLONG;
                memcpy(dir, path, len);
                dir[len] = '\0';
        }
        /* What connect() will reach: the parent with every link resolved. */
        char real[PATH_MAX];
        if (!realpath(dir, real))
                return -errno;
        int r = check_one(real, true, t, why, why_len);
        for (char *p = strrchr(real, '/'); r == 0 && p; p = strrchr(real, '/')) {
                if (p == real) {
                        if (real[1] == '\0')
                                break;
                        real[1] = '\0'; /* "/" itself */
                } else {
                        *p = '\0';
                }
                r = check_one(real, false, t, why, why_len);
        }
        return r;
}

int gm_trust_check_peer(int fd, const gm_trust_t *t, char *why, size_t why_len) {
        gm_peer_cred_t cred;
        int r = gm_ipc_peer_cred(fd, &cred);
        if (r < 0)
                return r;
        char list[96];
        if (!gm_trust_has(t, cred.uid))
                return refuse(why, why_len, "refusing the daemon: it runs as uid %u (pid %d), not as %s",
                              (unsigned) cred.uid, (int) cred.pid, trusted_list(t, list, sizeof(list)));
        return 0;
}
