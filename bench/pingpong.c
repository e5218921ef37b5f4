/* The physical floor of a daemon round trip: two processes bounce one
 * SOCK_SEQPACKET packet of --size bytes back and forth --iters times over the
 * same transport the daemon uses (gm_ipc_send/gm_ipc_recv), and the parent
 * prints the median and 99th percentile round trip in microseconds. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "ipc.h"

#define WARMUP_ITERS 1000

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

/* Echoes every packet back until the peer hangs up. */
static int echo(int sock, char *buf, size_t size) {
        for (;;) {
                size_t len, n_fds;
                int r = gm_ipc_recv(sock, buf, size, NULL, 0, &len, &n_fds);
                if (r == -ECONNRESET)
                        return 0;
                if (r < 0 || (r = gm_ipc_send(sock, buf, len, NULL, 0)) < 0)
                        return -r;
        }
}

static int bounce(int sock, char *buf, size_t size) {
        size_t len, n_fds;
        int r = gm_ipc_send(sock, buf, size, NULL, 0);
        if (r == 0)
                r = gm_ipc_recv(sock, buf, size, NULL, 0, &len, &n_fds);
        if (r == 0 && len != size)
                r = -EPROTO;
        return r;
}

static void usage(FILE *f) {
        fprintf(f,
                "usage: gpumem-bench-pingpong [--size BYTES] [--iters N]\n"
                "  --size   packet size, 1..%u (default 64)\n"
                "  --iters  measured round trips (default 100000)\n",
                GM_IPC_MAX_PACKET_DEFAULT);
}

int main(int argc, char **argv) {
        static const struct option longopts[] = {
                {"size", required_argument, NULL, 's'},
                {"iters", required_argument, NULL, 'n'},
                {"help", no_argument, NULL, 'h'},
                {0},
        };
        unsigned long size = 64, iters = 100000;
        for (int c; (c = getopt_long(argc, argv, "s:n:h", longopts, NULL)) != -1;) {
                char *end;
                switch (c) {
                case 's':
                case 'n':
                        errno = 0;
                        *(c == 's' ? &size : &iters) = strtoul(optarg, &end, 10);
                        if (errno || *end || end == optarg) {
                                usage(stderr);
                                return 2;
                        }
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (size == 0 || size > GM_IPC_MAX_PACKET_DEFAULT || iters == 0) {
                usage(stderr);
                return 2;
        }

        int sv[2];
        char *buf = calloc(1, size);
        double *rtt = malloc(iters * sizeof(double));
        if (!buf || !rtt || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
                perror("setup");
                return 1;
        }
        pid_t pid = fork();
        if (pid < 0) {
                perror("fork");
                return 1;
        }
        if (pid == 0) {
                close(sv[0]);
                _exit(echo(sv[1], buf, size) == 0 ? 0 : 1);
        }
        close(sv[1]);

        int r = 0;
        for (unsigned long i = 0; i < WARMUP_ITERS && r == 0; i++)
                r = bounce(sv[0], buf, size);
        for (unsigned long i = 0; i < iters && r == 0; i++) {
                double t0 = ((double) gm_now_ns() / 1e3);
                r = bounce(sv[0], buf, size);
                rtt[i] = ((double) gm_now_ns() / 1e3) - t0;
        }
        close(sv[0]);
        int status;
        waitpid(pid, &status, 0);
        if (r < 0) {
                fprintf(stderr, "pingpong: %s\n", strerror(-r));
                return 1;
        }

        qsort(rtt, iters, sizeof(double), cmp_double);
        size_t p99 = (size_t) ((iters * 99 + 99) / 100) - 1; /* nearest rank */
        printf("pingpong size=%lu iters=%lu median_us=%.2f p99_us=%.2f\n", size, iters, rtt[iters / 2], rtt[p99]);
        free(rtt);
        free(buf);
        return 0;
}
