/* Trusted connections to gpumemd (peer_check.h). */
#include "peer_check.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc.h"
#include "trust.h"

#define SERVICE_USER "gpumem"

/* The uid of a user name or decimal uid; -1 when unknown. */
static long resolve_user(const char *name) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(name, &end, 10);
        if (*name && !*end && errno == 0 && v < (unsigned long) (uid_t) -1)
                return (long) v;
        char buf[1024];
        struct passwd pw, *found = NULL;
        if (getpwnam_r(name, &pw, buf, sizeof(buf), &found) != 0 || !found)
                return -1;
        return (long) found->pw_uid;
}

static void trusted_set(gm_trust_t *t) {
        *t = (gm_trust_t){0};
        gm_trust_add(t, geteuid());
        long uid = resolve_user(SERVICE_USER);
        if (uid >= 0)
                gm_trust_add(t, (uid_t) uid);
        const char *extra = secure_getenv("GPUMEM_DAEMON_USER");
        if (extra && *extra && (uid = resolve_user(extra)) >= 0)
                gm_trust_add(t, (uid_t) uid);
}

/* 0 when snprintf() wrote a whole path of n bytes into a buffer of len. */
static int path_written(size_t len, int n) {
        if (n < 0)
                return -EINVAL;
        return (size_t) n < len ? 0 : -ENAMETOOLONG;
}

int gm_peer_default_socket(int device, bool use_env, char *buf, size_t len) {
        if (device < 0)
                return -EINVAL;
        const char *env = use_env ? secure_getenv("GPUMEM_SOCKET") : NULL;
        if (env && *env)
                return path_written(len, snprintf(buf, len, "%s", env));
        return gm_ipc_default_socket_path(device, true, buf, len);
}

int gm_peer_device_socket(int index, char *buf, size_t len) {
        const char *tmpl = getenv("GPUMEM_SOCKET_TEMPLATE");
        if (!tmpl || !*tmpl)
                return gm_peer_default_socket(index, index == 0, buf, len);
        const char *d = strstr(tmpl, "%d");
        if (!d || strchr(d + 2, '%') || strchr(tmpl, '%') != d)
                return -EINVAL; /* exactly one conversion, and it is %d */
        return path_written(len, snprintf(buf, len, "%.*s%d%s", (int) (d - tmpl), tmpl, index, d + 2));
}

/* No daemon listens at the path: nothing there, or a socket left behind. */
static bool not_running(int r) {
        return r == -ENOENT || r == -ECONNREFUSED;
}

/* Why connect() was refused (EACCES) in reason: the socket's group, which a
 * caller who is not a member may ask to join. */
static void describe_denied(const char *path, char *reason, size_t reason_len) {
        struct stat st;
        struct group gr, *g = NULL;
        char buf[4096];
        if (stat(path, &st) < 0 || getgrgid_r(st.st_gid, &gr, buf, sizeof(buf), &g) != 0 || !g) {
                snprintf(reason, reason_len, "%s", strerror(EACCES));
                return;
        }
        snprintf(reason, reason_len,
                 "%s: the socket (mode %04o) admits members of group '%s', and this process is not one "
                 "(an administrator adds a user with: usermod -aG %s USER)",
                 strerror(EACCES), (unsigned) (st.st_mode & 07777), g->gr_name, g->gr_name);
}

int gm_peer_connect(const char *path, int *ret_fd, char *why, size_t why_len) {
        gm_trust_t t;
        trusted_set(&t);
        char reason[384] = "";
        int r = gm_trust_check_dir(path, &t, reason, sizeof(reason));
        if (r < 0 && r != -EPERM)
                snprintf(reason, sizeof(reason), "%s", strerror(-r));
        int fd = -1;
        if (r == 0 && (r = gm_ipc_connect(path, &fd)) < 0) {
                if (r == -EACCES)
                        describe_denied(path, reason, sizeof(reason));
                else
                        snprintf(reason, sizeof(reason), "%s", strerror(-r));
        }
        if (r == 0 && (r = gm_trust_check_peer(fd, &t, reason, sizeof(reason))) < 0) {
                close(fd);
                if (r != -EPERM)
                        snprintf(reason, sizeof(reason), "%s", strerror(-r));
        }
        if (not_running(r)) {
                snprintf(why, why_len, "gpumemd is not running at '%s' (%s)", path,
                         r == -ENOENT ? "no such socket" : "nothing listens on that socket");
                return r;
        }
        if (r < 0) {
                snprintf(why, why_len, "cannot connect to gpumemd at '%s': %s", path, reason);
                return r;
        }
        *ret_fd = fd;
        return 0;
}
