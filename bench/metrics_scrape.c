/* Cost of a /metrics scrape with many sessions.
 *
 *   gpumem-bench-metrics [--sessions N] [--scrapes N]
 *           [--socket SOCK --metrics unix:PATH]
 *
 * With --socket and --metrics (a running gpumemd started with
 * --metrics-listen unix:PATH): a child process opens N sessions holding a few
 * blocks each (local or central heaps: $GPUMEM_HEAP), then the end-to-end
 * latency of scrapes over the unix socket (with local sessions every scrape
 * reads their statistics pages).
 * Prints median and p99 in microseconds. Starts no daemon itself. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem/gpumem.h"

#define BLOCKS_PER_SESSION 3
static const size_t block_sizes[BLOCKS_PER_SESSION] = {512, 4096, 100000}; /* small pool: one 2 MiB segment */

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *ns, size_t n) {
        qsort(ns, n, sizeof(*ns), cmp_u64);
        printf("%-34s median %8.1f us   p99 %8.1f us   (%zu runs)\n", what, (double) ns[n / 2] / 1e3,
               (double) ns[(n * 99) / 100] / 1e3, n);
}

/* ---- end to end: scrapes of a running daemon ---- */

/* Holds n sessions with a few blocks each; writes one byte to `ready` once they
 * exist, then waits until `ready` is closed by the parent (read end: `hold`). */
static void hold_sessions(const char *socket_path, unsigned n, int ready, int hold) {
        gpumem_client **c = calloc(n, sizeof(*c));
        for (unsigned i = 0; i < n; i++) {
                int r = gpumem_connect(socket_path, &c[i]);
                for (int b = 0; r == 0 && b < BLOCKS_PER_SESSION; b++) {
                        void *p;
                        r = gpumem_alloc(c[i], block_sizes[b], 0, &p);
                }
                if (r < 0) {
                        fprintf(stderr, "session %u: %s\n", i, gpumem_strerror(r));
                        _exit(1);
                }
        }
        char x = 1;
        if (write(ready, &x, 1) != 1)
                _exit(1);
        while (read(hold, &x, 1) > 0) {
        }
        for (unsigned i = 0; i < n; i++)
                gpumem_disconnect(c[i]);
        _exit(0);
}

/* One GET /metrics; returns the response size, or -1. */
static ssize_t scrape_once(const char *path) {
        static char buf[1 << 20];
        static const char req[] = "GET /metrics HTTP/1.1\r\nHost: gpumemd\r\nConnection: close\r\n\r\n";
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
        if (fd < 0 || connect(fd, (struct sockaddr *) &a, sizeof(a)) < 0 ||
            send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t) sizeof(req) - 1) {
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        ssize_t total = 0, n;
        bool ok = false;
        while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
                if (total == 0)
                        ok = n >= 12 && strncmp(buf, "HTTP/1.1 200", 12) == 0;
                total += n;
        }
        close(fd);
        return n == 0 && ok ? total : -1;
}

static int bench_scrapes(const char *socket_path, const char *metrics_path, unsigned n_sessions, unsigned runs) {
        int ready[2], hold[2];
        if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(hold, O_CLOEXEC) < 0)
                return -1;
        pid_t pid = fork();
        if (pid < 0)
                return -1;
        if (pid == 0) {
                close(ready[0]);
                close(hold[1]);
                hold_sessions(socket_path, n_sessions, ready[1], hold[0]);
        }
        close(ready[1]);
        close(hold[0]);
        char x;
        int ok = read(ready[0], &x, 1) == 1;
        close(ready[0]);
        uint64_t *ns = calloc(runs, sizeof(*ns));
        ssize_t size = 0;
        for (unsigned r = 0; ok && r < runs; r++) {
                uint64_t t0 = now_ns();
                size = scrape_once(metrics_path);
                ns[r] = now_ns() - t0;
                ok = size > 0;
        }
        close(hold[1]);
        int status;
        waitpid(pid, &status, 0);
        if (!ok) {
                fprintf(stderr, "scrape of %s failed\n", metrics_path);
                free(ns);
                return -1;
        }
        char what[64];
        snprintf(what, sizeof(what), "scrape, %u sessions (%zd bytes)", n_sessions, size);
        report(what, ns, runs);
        free(ns);
        return 0;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"metrics", required_argument, NULL, 'm'},
                {"sessions", required_argument, NULL, 'n'},
                {"scrapes", required_argument, NULL, 'r'},
                {},
        };
        const char *socket_path = NULL, *metrics = NULL;
        unsigned n_sessions = 256, runs = 1000;
        int c;
        while ((c = getopt_long(argc, argv, "s:m:n:r:", opts, NULL)) != -1) {
                switch (c) {
                case 's':
                        socket_path = optarg;
                        break;
                case 'm':
                        metrics = optarg;
                        break;
                case 'n':
                        n_sessions = (unsigned) strtoul(optarg, NULL, 10);
                        break;
                case 'r':
                        runs = (unsigned) strtoul(optarg, NULL, 10);
                        break;
                default:
                        fprintf(stderr, "usage: %s [--sessions N] [--scrapes N] [--socket SOCK --metrics unix:PATH]\n",
                                argv[0]);
                        return 2;
                }
        }
        if (n_sessions == 0 || runs == 0 || !socket_path || !metrics ||
            (metrics && strncmp(metrics, "unix:", 5) != 0)) {
                fprintf(stderr, "%s: --socket and --metrics unix:PATH go together; counts must be > 0\n", argv[0]);
                return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        if (socket_path && bench_scrapes(socket_path, metrics + 5, n_sessions, runs) < 0)
                return 1;
        return 0;
}
