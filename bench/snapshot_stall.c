/* gpumem-bench-snapshot-stall: what a large snapshot costs the daemon's other
 * clients.
 *
 * A holder process keeps a session of --blocks blocks (512 B each, its heap
 * local or central); this process's probe session (central: every call is
 * a round trip through the daemon's loop) times cached alloc+free pairs, in
 * alternating quiet and busy phases; in a busy phase a third process takes
 * snapshots of the holder's pid back to back. Prints, per phase kind, the
 * probe's median, p99 and worst pair, and the snapshots' mean time. Usage:
 *   gpumem-bench-snapshot-stall --socket PATH [--blocks N] [--phase-ms MS] [--phases N]
 *                               [--heap central|local] [--format json|pickle] */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "gpumem/gpumem.h"

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

/* The holder: N blocks, "ready" on `ready`, then waits to be killed. */
static void hold(const char *socket_path, gpumem_heap_mode heap, size_t n, int ready) {
        gpumem_client *c;
        if (gpumem_connect_heap(socket_path, heap, &c) < 0)
                _exit(1);
        for (size_t i = 0; i < n; i++) {
                void *p;
                if (gpumem_alloc(c, 512, 0, &p) < 0)
                        _exit(1);
        }
        if (write(ready, "r", 1) != 1)
                _exit(1);
        pause();
        _exit(0);
}

/* The snapshot taker: snapshots of pid until killed; writes its count and
 * total nanoseconds to `out` when told to stop (SIGTERM). */
static volatile sig_atomic_t stop;
static void on_term(int sig) {
        stop = 1;
}

static void take(const char *socket_path, uint32_t pid, gpumem_snapshot_format fmt, int out) {
        gpumem_client *c;
        signal(SIGTERM, on_term);
        if (gpumem_connect_heap(socket_path, GPUMEM_HEAP_CENTRAL, &c) < 0)
                _exit(1);
        uint64_t n = 0, ns = 0, bytes = 0;
        while (!stop) {
                void *data;
                size_t len;
                uint64_t t0 = gm_now_ns();
                if (gpumem_snapshot(c, fmt, pid, &data, &len) < 0)
                        break;
                ns += gm_now_ns() - t0;
                bytes = len;
                n++;
                gpumem_buffer_free(data);
        }
        uint64_t r[3] = {n, ns, bytes};
        if (write(out, r, sizeof(r)) != sizeof(r))
                _exit(1);
        _exit(0);
}

int main(int argc, char **argv) {
        const char *socket_path = NULL;
        size_t blocks = 200000;
        int phase_ms = 2000, phases = 3;
        gpumem_heap_mode heap = GPUMEM_HEAP_CENTRAL;
        gpumem_snapshot_format fmt = GPUMEM_SNAPSHOT_PICKLE;
        for (int i = 1; i + 1 < argc; i += 2) {
                if (strcmp(argv[i], "--socket") == 0)
                        socket_path = argv[i + 1];
                else if (strcmp(argv[i], "--blocks") == 0)
                        blocks = strtoull(argv[i + 1], NULL, 10);
                else if (strcmp(argv[i], "--phase-ms") == 0)
                        phase_ms = atoi(argv[i + 1]);
                else if (strcmp(argv[i], "--phases") == 0)
                        phases = atoi(argv[i + 1]);
                else if (strcmp(argv[i], "--heap") == 0)
                        heap = strcmp(argv[i + 1], "local") == 0 ? GPUMEM_HEAP_LOCAL : GPUMEM_HEAP_CENTRAL;
                else if (strcmp(argv[i], "--format") == 0)
                        fmt = strcmp(argv[i + 1], "json") == 0 ? GPUMEM_SNAPSHOT_JSON : GPUMEM_SNAPSHOT_PICKLE;
        }
        if (!socket_path) {
                fprintf(stderr,
                        "usage: %s --socket PATH [--blocks N] [--phase-ms MS] [--phases N] "
                        "[--heap central|local] [--format json|pickle]\n",
                        argv[0]);
                return 2;
        }
        int ready[2];
        if (pipe(ready) < 0)
                return 1;
        pid_t holder = fork();
        if (holder == 0)
                hold(socket_path, heap, blocks, ready[1]);
        close(ready[1]); /* a holder that fails closes the pipe */
        char b;
        if (read(ready[0], &b, 1) != 1) {
                fprintf(stderr, "the holder failed\n");
                return 1;
        }
        gpumem_client *probe;
        if (gpumem_connect_heap(socket_path, GPUMEM_HEAP_CENTRAL, &probe) < 0)
                return 1;
        size_t cap = 1u << 22;
        uint64_t *lat[2] = {malloc(cap * sizeof(uint64_t)), malloc(cap * sizeof(uint64_t))};
        size_t n[2] = {0, 0};
        uint64_t snaps = 0, snap_ns = 0, snap_bytes = 0;
        for (int ph = 0; ph < 2 * phases; ph++) {
                int busy = ph % 2, out[2] = {-1, -1};
                pid_t taker = -1;
                if (busy) {
                        if (pipe(out) < 0)
                                return 1;
                        taker = fork();
                        if (taker == 0)
                                take(socket_path, (uint32_t) holder, fmt, out[1]);
                }
                uint64_t end = gm_now_ns() + (uint64_t) phase_ms * 1000000u;
                while (gm_now_ns() < end && n[busy] < cap) {
                        void *p;
                        uint64_t t0 = gm_now_ns();
                        if (gpumem_alloc(probe, 4096, 0, &p) < 0 || gpumem_free(probe, p) < 0)
                                return 1;
                        lat[busy][n[busy]++] = gm_now_ns() - t0;
                }
                if (busy) {
                        kill(taker, SIGTERM);
                        uint64_t r[3] = {0, 0, 0};
                        if (read(out[0], r, sizeof(r)) == sizeof(r)) {
                                snaps += r[0];
                                snap_ns += r[1];
                                snap_bytes = r[2];
                        }
                        waitpid(taker, NULL, 0);
                        close(out[0]);
                        close(out[1]);
                }
        }
        kill(holder, SIGKILL);
        waitpid(holder, NULL, 0);
        printf("blocks %zu heap %s: snapshots %" PRIu64 " of %" PRIu64 " bytes, mean %.1f ms\n", blocks,
               heap == GPUMEM_HEAP_LOCAL ? "local" : "central", snaps, snap_bytes,
               snaps ? (double) snap_ns / (double) snaps / 1e6 : 0.0);
        for (int k = 0; k < 2; k++) {
                qsort(lat[k], n[k], sizeof(uint64_t), cmp_u64);
                if (n[k] == 0)
                        continue;
                printf("%s: pairs %zu median %.1f us p99 %.1f us max %.1f us\n", k ? "busy " : "quiet", n[k],
                       (double) lat[k][n[k] / 2] / 1e3, (double) lat[k][n[k] * 99 / 100] / 1e3,
                       (double) lat[k][n[k] - 1] / 1e3);
        }
        gpumem_disconnect(probe);
        return 0;
}
