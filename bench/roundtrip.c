/* gpumem-bench-roundtrip: latency of one allocation through the daemon.
 *
 *   cached : gpumem_alloc + gpumem_free of a block the session's cache serves
 *            (one request/reply round trip plus one one-way free message)
 *   fresh  : gpumem_alloc + gpumem_free + gpumem_trim, so every allocation
 *            creates, passes and maps a new segment and every trim asks for
 *            it back (the cudaMalloc-per-tensor analogue)
 *
 * --heap central (the default here: the round trip is what is measured) or
 * local (the session's heap in the client: no message once cached).
 * Prints median and p99 in microseconds. Usage:
 *   gpumem-bench-roundtrip --socket PATH [--size BYTES] [--iters N] [--mode cached|fresh] [--clients N]
 *                          [--heap central|local] */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "gpumem/gpumem.h"

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

/* Runs the loop in this process; writes median and p99 (ns) to out[0..1].
 * After warming up it says so on `ready` and waits until `go` closes, so that
 * all clients measure at the same time. */
static int run(const char *socket_path, gpumem_heap_mode heap, size_t size, int iters, bool fresh, int ready, int go,
               uint64_t out[2]) {
        gpumem_client *c;
        int r = gpumem_connect_heap(socket_path, heap, &c);
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", gpumem_strerror(r));
                return 1;
        }
        uint64_t *lat = calloc((size_t) iters, sizeof(*lat));
        void *p;
        for (int i = 0; i < 100; i++) { /* warm-up: the first segment, page faults */
                if (gpumem_alloc(c, size, 0, &p) != 0)
                        return 1;
                gpumem_free(c, p);
        }
        char ch = 'r';
        if (write(ready, &ch, 1) != 1 || read(go, &ch, 1) != 0)
                return 1;
        for (int i = 0; i < iters; i++) {
                uint64_t t0 = gm_now_ns();
                r = gpumem_alloc(c, size, 0, &p);
                if (r < 0) {
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                gpumem_free(c, p);
                if (fresh)
                        gpumem_trim(c, NULL);
                lat[i] = gm_now_ns() - t0;
        }
        qsort(lat, (size_t) iters, sizeof(*lat), cmp_u64);
        out[0] = lat[iters / 2];
        out[1] = lat[(size_t) ((double) iters * 0.99)];
        free(lat);
        gpumem_disconnect(c);
        return 0;
}

int main(int argc, char **argv) {
        const char *socket_path = NULL;
        size_t size = 4096;
        int iters = 20000, clients = 1;
        bool fresh = false;
        gpumem_heap_mode heap = GPUMEM_HEAP_CENTRAL;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--socket") && i + 1 < argc)
                        socket_path = argv[++i];
                else if (!strcmp(argv[i], "--size") && i + 1 < argc)
                        size = strtoull(argv[++i], NULL, 10);
                else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
                        iters = atoi(argv[++i]);
                else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
                        clients = atoi(argv[++i]);
                else if (!strcmp(argv[i], "--mode") && i + 1 < argc)
                        fresh = !strcmp(argv[++i], "fresh");
                else if (!strcmp(argv[i], "--heap") && i + 1 < argc)
                        heap = !strcmp(argv[++i], "local") ? GPUMEM_HEAP_LOCAL : GPUMEM_HEAP_CENTRAL;
                else {
                        fprintf(stderr,
                                "usage: %s --socket PATH [--size B] [--iters N] [--mode cached|fresh] "
                                "[--clients N] [--heap central|local]\n",
                                argv[0]);
                        return 2;
                }
        }
        if (iters < 100 || clients < 1)
                return 2;
        /* Each client process reports its median and p99 through a pipe; the
         * table shows the median of medians and the worst p99. */
        int fds[2], ready[2], go[2];
        if (pipe(fds) < 0 || pipe(ready) < 0 || pipe(go) < 0)
                return 1;
        for (int k = 0; k < clients; k++) {
                if (fork() == 0) {
                        close(go[1]);
                        uint64_t out[2];
                        int r = run(socket_path, heap, size, iters, fresh, ready[1], go[0], out);
                        if (r == 0 && write(fds[1], out, sizeof(out)) != sizeof(out))
                                r = 1;
                        _exit(r);
                }
        }
        close(fds[1]);
        close(ready[1]);
        close(go[0]);
        for (int k = 0; k < clients; k++) { /* every client connected and warmed up */
                char ch;
                if (read(ready[0], &ch, 1) != 1)
                        break;
        }
        uint64_t start = gm_now_ns();
        close(go[1]); /* start together */
        uint64_t *med = calloc((size_t) clients, sizeof(*med)), worst_p99 = 0;
        int got = 0;
        uint64_t out[2];
        while (got < clients && read(fds[0], out, sizeof(out)) == sizeof(out)) {
                med[got++] = out[0];
                if (out[1] > worst_p99)
                        worst_p99 = out[1];
        }
        int failed = 0, status;
        while (wait(&status) > 0)
                failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        double seconds = (double) (gm_now_ns() - start) / 1e9;
        if (failed || got != clients)
                return 1;
        qsort(med, (size_t) clients, sizeof(*med), cmp_u64);
        printf("%-8s heap=%-7s size=%-9zu clients=%-4d median_us=%.2f p99_us=%.2f pairs_per_s=%.0f\n",
               fresh ? "fresh" : "cached", heap == GPUMEM_HEAP_LOCAL ? "local" : "central", size, clients,
               (double) med[clients / 2] / 1000.0, (double) worst_p99 / 1000.0, (double) clients * iters / seconds);
        free(med);
        return 0;
}
