/* gpumemctl's connection to the daemon, shared by its command files: one
 * libgpumem control connection (gpumem/admin.h) whose failures become
 * gpumemctl's messages and exit codes. Below gpumemctl.c and
 * gpumemctl_top.c; calls only libgpumem's admin API. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "gpumemctl.h"

int ctl_failed(const ctl_t *c, int r) {
        const char *why = gpumem_admin_error(c->admin);
        switch (gpumem_admin_failure_kind(c->admin)) {
        case GPUMEM_ADMIN_REFUSED:
                fprintf(stderr, "gpumemctl: %s (%s)\n", why, strerror(-r));
                return EXIT_REFUSED;
        case GPUMEM_ADMIN_UNREACHABLE:
        case GPUMEM_ADMIN_LOST:
                fprintf(stderr, "gpumemctl: %s\n", why);
                return EXIT_UNREACHABLE;
        default:
                fprintf(stderr, "gpumemctl: %s\n", why[0] ? why : strerror(-r));
                return EXIT_REFUSED;
        }
}

int ctl_connect(ctl_t *c) {
        if (c->admin)
                return 0;
        const char *path = c->socket_path;
        int device = c->device;
        char buf[108];
        bool named = path != NULL; /* by -s or $GPUMEM_SOCKET */
        if (!path) {
                int r = gpumem_admin_socket(device, buf, sizeof(buf));
                if (r < 0) {
                        fprintf(stderr, "gpumemctl: no socket path%s: %s\n",
                                r == -EINVAL && device >= 0 ? " ($GPUMEM_SOCKET_TEMPLATE needs one %d)" : "",
                                strerror(-r));
                        return EXIT_UNREACHABLE;
                }
                path = buf;
        }
        gpumem_admin *a;
        int r = gpumem_admin_new(path, "gpumemctl", &a);
        if (r < 0) {
                fprintf(stderr, "gpumemctl: %s\n", strerror(-r));
                return EXIT_UNREACHABLE;
        }
        r = gpumem_admin_connect(a);
        if (r == 0) {
                c->admin = a;
                return 0;
        }
        /* Not connected: no request goes out without a hello. */
        gpumem_admin_failure kind = gpumem_admin_failure_kind(a);
        const ctl_t failed = {.admin = a};
        int code = kind == GPUMEM_ADMIN_UNEXPECTED ? EXIT_UNREACHABLE : ctl_failed(&failed, r);
        if (kind == GPUMEM_ADMIN_UNEXPECTED)
                fprintf(stderr, "gpumemctl: %s\n", gpumem_admin_error(a));
        else if ((r == -ENOENT || r == -ECONNREFUSED) && kind == GPUMEM_ADMIN_UNREACHABLE && named)
                fprintf(stderr,
                        "gpumemctl: start gpumemd there (gpumemd --socket %s), or name another "
                        "daemon with -s SOCKET or -d N\n",
                        path);
        else if ((r == -ENOENT || r == -ECONNREFUSED) && kind == GPUMEM_ADMIN_UNREACHABLE)
                fprintf(stderr,
                        "gpumemctl: start the system's (systemctl start gpumemd@%d) or your own "
                        "(gpumemd --device %d), or name another daemon with -s SOCKET or "
                        "$GPUMEM_SOCKET\n",
                        device >= 0 ? device : 0, device >= 0 ? device : 0);
        gpumem_admin_free(a);
        return code;
}

const char *ctl_fmt_age(uint64_t ms, char *buf, size_t len) {
        uint64_t s = ms / 1000;
        if (s < 120)
                snprintf(buf, len, "%" PRIu64 "s", s);
        else if (s < 7200)
                snprintf(buf, len, "%" PRIu64 "m", s / 60);
        else
                snprintf(buf, len, "%" PRIu64 "h", s / 3600);
        return buf;
}
