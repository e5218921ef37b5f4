/* Cost of a /metrics scrape with many sessions.
 *
 *   gpumem-bench-metrics [--sessions N] [--scrapes N]
 *           [--socket SOCK --metrics unix:PATH]
 *
 * Always: the in-process render cost (gm_metrics_render over N synthetic
 * sessions, each with a heap holding a few blocks, spread over 4 tenants).
 * With --socket and --metrics (a running gpumemd started with
 * --metrics-listen unix:PATH): a child process opens N sessions holding a few
 * blocks each, then the end-to-end latency of scrapes over the unix socket.
 * Prints median and p99 in microseconds. Starts no daemon itself. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "gpumem/gpumem.h"
#include "metrics.h"

#define BLOCKS_PER_SESSION 3
static const size_t block_sizes[BLOCKS_PER_SESSION] = {512, 4096, 100000}; /* small pool: one 2 MiB segment */

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *ns, size_t n) {
        qsort(ns, n, sizeof(*ns), cmp_u64);
        printf("%-34s median %8.1f us   p99 %8.1f us   (%zu runs)\n", what, (double) ns[n / 2] / 1e3,
               (double) ns[(n * 99) / 100] / 1e3, n);
}

/* ---- in-process: gm_metrics_render over a synthetic daemon ---- */

static int fake_create(void *userdata, uint64_t segment_id, uint64_t va_size, uint64_t offset, uint64_t size,
                       uint64_t *ret_handle) {
        *ret_handle = segment_id;
        return 0;
}

static void fake_release(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                         bool whole_segment) {
}

static int bench_render(unsigned n_sessions, unsigned runs) {
        static gm_daemon_t d;
        char err[256] = "";
        gm_backend_options_t bopts = {.kind = "host", .capacity = 1ull << 40};
        if (gm_backend_host_open(&bopts, &d.backend, err, sizeof(err)) < 0 ||
            gm_alloc_config_parse(NULL, &d.alloc_config, err, sizeof(err)) < 0) {
                fprintf(stderr, "setup failed: %s\n", err);
                return -1;
        }
        d.loop = uv_default_loop();
        gm_stats_init(&d.device_stats);
        d.va_cursor = 1ull << 40;
        enum { TENANTS = 4 };
        gm_tenant_t tenants[TENANTS] = {0};
        for (int t = 0; t < TENANTS; t++) {
                snprintf(tenants[t].name, sizeof(tenants[t].name), "bench-%d", t);
                gm_stats_init(&tenants[t].stats);
                tenants[t].next = t + 1 < TENANTS ? &tenants[t + 1] : NULL;
        }
        d.tenants = &tenants[0];
        gm_session_t *sessions = calloc(n_sessions, sizeof(*sessions));
        if (!sessions)
                return -1;
        gm_provider_t provider = {.create = fake_create, .release = fake_release};
        for (unsigned i = 0; i < n_sessions; i++) {
                gm_session_t *s = &sessions[i];
                s->tenant = &tenants[i % TENANTS];
                s->tenant->sessions++;
                gm_heap_params_t params = {
                        .capacity = d.backend->capacity,
                        .va_cursor = &d.va_cursor,
                        .extra_sinks = {&s->tenant->stats, &d.device_stats, NULL},
                };
                gm_alloc_result_t res;
                if (gm_heap_new(&d.alloc_config, &provider, &params, &s->heap) < 0)
                        return -1;
                for (int b = 0; b < BLOCKS_PER_SESSION; b++)
                        if (gm_heap_alloc(s->heap, block_sizes[b], 0, &res) < 0)
                                return -1;
                s->next = d.sessions;
                d.sessions = s;
                d.n_sessions++;
        }
        /* A real endpoint (on a throw-away socket) so that counters and histograms are rendered too. */
        char path[] = "/tmp/gpumem-bench-metrics-XXXXXX";
        if (!mkdtemp(path))
                return -1;
        char listen[64];
        snprintf(listen, sizeof(listen), "unix:%s/m.sock", path);
        gm_metrics_t *m = NULL;
        if (gm_metrics_start(&d, listen, &m, err, sizeof(err)) < 0) {
                fprintf(stderr, "gm_metrics_start: %s\n", err);
                return -1;
        }
        for (int op = 0; op < _GM_REQUEST_OP_MAX; op++)
                gm_metrics_observe_request(m, op, 1000u * (uint64_t) (op + 1));
        gm_metrics_count_refusal(m, "bench-0", GM_OOM_DEVICE_FULL);

        uint64_t *ns = calloc(runs, sizeof(*ns));
        size_t len = 0;
        for (unsigned r = 0; r < runs; r++) {
                char *text;
                uint64_t t0 = gm_now_ns();
                if (gm_metrics_render(&d, m, &text, &len) < 0)
                        return -1;
                ns[r] = gm_now_ns() - t0;
                free(text);
        }
        char what[64];
        snprintf(what, sizeof(what), "render, %u sessions (%zu bytes)", n_sessions, len);
        report(what, ns, runs);
        free(ns);

        m = gm_metrics_stop(m);
        uv_run(d.loop, UV_RUN_DEFAULT);
        rmdir(path);
        for (unsigned i = 0; i < n_sessions; i++)
                gm_heap_destroy(sessions[i].heap);
        free(sessions);
        d.backend = gm_backend_close(d.backend);
        return 0;
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
                uint64_t t0 = gm_now_ns();
                size = scrape_once(metrics_path);
                ns[r] = gm_now_ns() - t0;
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
                {"socket", required_argument, NULL, 's'},   {"metrics", required_argument, NULL, 'm'},
                {"sessions", required_argument, NULL, 'n'}, {"scrapes", required_argument, NULL, 'r'},
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
        if (n_sessions == 0 || runs == 0 || !socket_path != !metrics ||
            (metrics && strncmp(metrics, "unix:", 5) != 0)) {
                fprintf(stderr, "%s: --socket and --metrics unix:PATH go together; counts must be > 0\n", argv[0]);
                return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        if (bench_render(n_sessions, runs) < 0)
                return 1;
        if (socket_path && bench_scrapes(socket_path, metrics + 5, n_sessions, runs) < 0)
                return 1;
        return 0;
}
