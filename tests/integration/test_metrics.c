/* The Prometheus endpoint of a real gpumemd: the text passes promtool, its
 * figures equal gpumemctl's for the same state, counters follow requests, and
 * broken, oversized, idle or abandoned HTTP clients leave the daemon serving
 * both scrapes and allocations. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "metrics.h"
#include "requests.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

static gm_test_daemon_t daemon_;
static char dir_[64];
static char metrics_path_[128]; /* the endpoint's unix socket */
static char tenant_[32];
static const char *device_arg_; /* --device for the next setup(), NULL = default */

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

static void start_daemon(const char *listen) {
        const char *args[] = {"--metrics-listen", listen, device_arg_ ? "--device" : NULL, device_arg_, NULL};
        gm_test_daemon_start(&daemon_, "64M", args);
}

static int connect_unix(const char *path);

static void setup(void) {
        snprintf(dir_, sizeof(dir_), "/tmp/gpumemd-metrics-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir_));
        snprintf(metrics_path_, sizeof(metrics_path_), "%s/metrics.sock", dir_);
        snprintf(tenant_, sizeof(tenant_), "uid:%u", (unsigned) getuid());
        char listen[160];
        snprintf(listen, sizeof(listen), "unix:%s", metrics_path_);
        start_daemon(listen);
        /* The endpoint starts after the control socket. */
        int fd = -ENOENT;
        for (int i = 0; i < 1000 && fd < 0; i++) {
                fd = connect_unix(metrics_path_);
                if (fd < 0)
                        sleep_ms(10);
        }
        ck_assert_msg(fd >= 0, "the metrics endpoint did not come up at %s", metrics_path_);
        close(fd);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
        ck_assert_int_ne(access(metrics_path_, F_OK), 0); /* the endpoint removed its socket */
        rmdir(dir_);
}

/* The UUID label the uuid cases expect: the one configured on host; on cuda
 * the emulated driver's device 0 under FAKECUDA_UUID_PREFIX=0123456789abcdef
 * (tests/integration/metrics.cmake), the daemon selecting it by index. */
#define TEST_UUID "GPU-8f6c2a3e-1b2c-4d5e-8f90-0123456789ab"
#define FAKECUDA_UUID "GPU-01234567-89ab-cdef-0000-000000000000"
static const char *expected_uuid_;

static void setup_uuid(void) {
        device_arg_ = expected_uuid_ = TEST_UUID;
        setup();
        device_arg_ = NULL;
}

static void setup_cuda_uuid(void) {
        expected_uuid_ = FAKECUDA_UUID;
        setenv("FAKENVML_NO_PROCESS_MEMORY", "1", 1); /* nothing can check a release here */
        setup();
}

static void setup_tcp(void) {
        snprintf(tenant_, sizeof(tenant_), "uid:%u", (unsigned) getuid());
        start_daemon("127.0.0.1:0");
}

static void teardown_tcp(void) {
        gm_test_daemon_stop(&daemon_);
}

/* ---- a small HTTP client ---- */

static int connect_unix(const char *path) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        ck_assert_uint_lt(strlen(path), sizeof(a.sun_path));
        memcpy(a.sun_path, path, strlen(path) + 1);
        if (connect(fd, (struct sockaddr *) &a, sizeof(a)) < 0) {
                close(fd);
                return -errno;
        }
        struct timeval tv = {.tv_sec = 30};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return fd;
}

static int connect_tcp(unsigned port) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        struct sockaddr_in a = {
                .sin_family = AF_INET, .sin_port = htons((uint16_t) port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        ck_assert_int_eq(connect(fd, (struct sockaddr *) &a, sizeof(a)), 0);
        struct timeval tv = {.tv_sec = 30};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return fd;
}

/* Sends `req` and reads the whole response until the server closes. Returns the
 * status code, 0 when the server closed without answering, -1 on a read error.
 * *ret_resp (malloc'd, NUL-terminated) gets the raw response. */
static int http_exchange(int fd, const char *req, size_t len, char **ret_resp) {
        size_t sent = 0;
        while (sent < len) {
                ssize_t n = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
                if (n <= 0)
                        break; /* the server may refuse early: read its answer */
                sent += (size_t) n;
        }
        size_t cap = 64 * 1024, got = 0;
        char *buf = malloc(cap);
        ck_assert_ptr_nonnull(buf);
        for (;;) {
                if (got + 1 == cap) {
                        cap *= 2;
                        buf = realloc(buf, cap);
                        ck_assert_ptr_nonnull(buf);
                }
                ssize_t n = recv(fd, buf + got, cap - 1 - got, 0);
                if (n == 0 || (n < 0 && errno == ECONNRESET))
                        break;
                if (n < 0) {
                        free(buf);
                        return -1;
                }
                got += (size_t) n;
        }
        close(fd);
        buf[got] = '\0';
        int status = 0;
        if (got && sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
                status = -1;
        if (ret_resp)
                *ret_resp = buf;
        else
                free(buf);
        return status;
}

static int http_unix(const char *req, char **ret_resp) {
        int fd = connect_unix(metrics_path_);
        ck_assert_msg(fd >= 0, "cannot connect to %s: %s", metrics_path_, strerror(-fd));
        return http_exchange(fd, req, strlen(req), ret_resp);
}

static const char scrape_request[] = "GET /metrics HTTP/1.1\r\nHost: gpumemd\r\nConnection: close\r\n\r\n";

/* GET /metrics; asserts 200 and the exposition content type; returns the body. */
static char *scrape(void) {
        char *resp;
        int status = http_unix(scrape_request, &resp);
        ck_assert_msg(status == 200, "scrape status %d: %.200s", status, resp);
        ck_assert_ptr_nonnull(strstr(resp, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        char *body = strstr(resp, "\r\n\r\n");
        ck_assert_ptr_nonnull(body);
        char *copy = strdup(body + 4);
        free(resp);
        return copy;
}

/* Scrapes until one answers 200, for while limits refuse new connections. */
static char *scrape_eventually(void) {
        for (int i = 0; i < 600; i++) {
                int fd = connect_unix(metrics_path_);
                if (fd >= 0) {
                        char *resp;
                        int status = http_exchange(fd, scrape_request, strlen(scrape_request), &resp);
                        free(resp);
                        if (status == 200)
                                return scrape();
                }
                sleep_ms(100);
        }
        ck_abort_msg("the metrics endpoint did not answer within a minute");
        return NULL;
}

/* The value of one series ("name{labels}"); aborts when it is absent. */
static double metric(const char *body, const char *series) {
        size_t len = strlen(series);
        for (const char *p = body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, series, len) == 0 && p[len] == ' ')
                        return strtod(p + len + 1, NULL);
        ck_abort_msg("series %s not in the scrape", series);
        return 0;
}

static bool has_series(const char *body, const char *series) {
        size_t len = strlen(series);
        for (const char *p = body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, series, len) == 0 && p[len] == ' ')
                        return true;
        return false;
}

static double tenant_metric(const char *body, const char *name, const char *pool) {
        char series[256];
        if (pool)
                snprintf(series, sizeof(series), "%s{device=\"0\",tenant=\"%s\",pool=\"%s\"}", name, tenant_, pool);
        else
                snprintf(series, sizeof(series), "%s{device=\"0\",tenant=\"%s\"}", name, tenant_);
        return metric(body, series);
}

/* One key of `gpumemctl stats --json` output. */
static int64_t json_value(const char *json, const char *key) {
        char pat[160]; /* a key of up to 127 characters, quoted, and ": " */
        snprintf(pat, sizeof(pat), "\"%s\": ", key);
        const char *p = strstr(json, pat);
        ck_assert_msg(p != NULL, "key %s not in %s", key, json);
        return strtoll(p + strlen(pat), NULL, 10);
}

/* Runs promtool check metrics on text; returns its exit status, output in msg.
 * Without promtool at build time (Debian package prometheus) it accepts all. */
static int promtool_check(const char *text, char *msg, size_t msg_len) {
#ifndef GM_PROMTOOL
        snprintf(msg, msg_len, "promtool not available");
        return 0;
#else
        int in[2], out[2];
        ck_assert_int_eq(pipe2(in, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                dup2(in[0], STDIN_FILENO);
                dup2(out[1], STDOUT_FILENO);
                dup2(out[1], STDERR_FILENO);
                execl(GM_PROMTOOL, GM_PROMTOOL, "check", "metrics", (char *) NULL);
                _exit(127);
        }
        close(in[0]);
        close(out[1]);
        signal(SIGPIPE, SIG_IGN);
        size_t len = strlen(text);
        for (size_t off = 0; off < len;) {
                ssize_t n = write(in[1], text + off, len - off);
                if (n <= 0)
                        break;
                off += (size_t) n;
        }
        close(in[1]);
        size_t got = 0;
        ssize_t n;
        while (got + 1 < msg_len && (n = read(out[0], msg + got, msg_len - 1 - got)) > 0)
                got += (size_t) n;
        msg[got] = '\0';
        close(out[0]);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
#endif
}

static gpumem_client *connect_client(void) {
        gpumem_client *c = NULL;
        int r = gpumem_connect(daemon_.socket_path, &c);
        ck_assert_msg(r == 0, "gpumem_connect: %s", gpumem_strerror(r));
        return c;
}

/* Allocates and frees one block: the daemon serves allocations. */
static void assert_allocation_works(void) {
        gpumem_client *c = connect_client();
        void *p;
        int r = gpumem_alloc(c, 3 * MiB, 0, &p);
        ck_assert_msg(r == 0, "alloc: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
}

/* Waits until the daemon holds at most `baseline` fds (closing is asynchronous). */
static void wait_fds(int baseline) {
        int n = gm_test_count_fds(daemon_.pid);
        for (int i = 0; i < 3000 && n > baseline; i++) {
                sleep_ms(10);
                n = gm_test_count_fds(daemon_.pid);
        }
        ck_assert_int_le(n, baseline);
}

/* ---- tests ---- */

START_TEST(test_figures_equal_gpumemctl) {
        gpumem_client *c = connect_client();
        static const size_t sizes[] = {100, 4096, 300000, 2 * MiB, 5 * MiB + 3, 1, 700000};
        enum { N = sizeof(sizes) / sizeof(sizes[0]) };
        void *ptrs[N];
        for (size_t i = 0; i < N; i++) {
                int r = gpumem_alloc(c, sizes[i], 0, &ptrs[i]);
                ck_assert_msg(r == 0, "alloc %zu: %s", sizes[i], gpumem_strerror(r));
        }
        ck_assert_int_eq(gpumem_free(c, ptrs[1]), 0); /* splits stay: inactive_split > 0 */
        ck_assert_int_eq(gpumem_free(c, ptrs[4]), 0);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "allocation.all.current", &v), 0); /* the frees reached the daemon */
        ck_assert_int_eq(v, N - 2);

        char *body = scrape();
        char msg[4096];
        int rc = promtool_check(body, msg, sizeof(msg));
        ck_assert_msg(rc == 0, "promtool check metrics failed (%d): %s", rc, msg);

        static char json[65536];
        const char *tenant_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--json", "--tenant",
                                     tenant_,       NULL};
        ck_assert_int_eq(gm_test_run(json, sizeof(json), tenant_argv), 0);

        static const struct {
                const char *metric, *stat, *value;
        } pairs[] = {
                {"gpumem_reserved_bytes", "reserved_bytes", "current"},
                {"gpumem_allocated_bytes", "allocated_bytes", "current"},
                {"gpumem_active_bytes", "active_bytes", "current"},
                {"gpumem_requested_bytes", "requested_bytes", "current"},
                {"gpumem_inactive_split_bytes", "inactive_split_bytes", "current"},
                {"gpumem_reserved_peak_bytes", "reserved_bytes", "peak"},
                {"gpumem_allocated_peak_bytes", "allocated_bytes", "peak"},
                {"gpumem_active_peak_bytes", "active_bytes", "peak"},
                {"gpumem_requested_peak_bytes", "requested_bytes", "peak"},
                {"gpumem_inactive_split_peak_bytes", "inactive_split_bytes", "peak"},
                {"gpumem_segments", "segment", "current"},
                {"gpumem_blocks", "active", "current"},
                {"gpumem_allocations_total", "allocation", "allocated"},
                {"gpumem_frees_total", "allocation", "freed"},
        };
        for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
                char key[128];
                double sum = 0;
                static const char *const pools[][2] = {{"small", "small_pool"}, {"large", "large_pool"}};
                for (int p = 0; p < 2; p++) {
                        double m = tenant_metric(body, pairs[i].metric, pools[p][0]);
                        snprintf(key, sizeof(key), "%s.%s.%s", pairs[i].stat, pools[p][1], pairs[i].value);
                        ck_assert_msg(m == (double) json_value(json, key), "%s{pool=%s} = %.0f, gpumemctl %s = %lld",
                                      pairs[i].metric, pools[p][0], m, key, (long long) json_value(json, key));
                        sum += m;
                }
                snprintf(key, sizeof(key), "%s.all.%s", pairs[i].stat, pairs[i].value);
                if (strcmp(pairs[i].value, "peak") != 0) /* the sum of pool peaks only bounds the joint peak */
                        ck_assert_msg(sum == (double) json_value(json, key), "sum of %s = %.0f, gpumemctl %s = %lld",
                                      pairs[i].metric, sum, key, (long long) json_value(json, key));
        }
        /* The workload left something in every figure that matters. */
        ck_assert_int_gt(json_value(json, "allocated_bytes.large_pool.current"), 0);
        ck_assert_int_gt(json_value(json, "allocated_bytes.small_pool.current"), 0);
        ck_assert_int_gt(json_value(json, "inactive_split_bytes.all.current"), 0);
        ck_assert_int_eq(json_value(json, "allocation.all.freed"), 2);

        double pending = tenant_metric(body, "gpumem_pending_free_bytes", "small") +
                         tenant_metric(body, "gpumem_pending_free_bytes", "large");
        ck_assert(pending == (double) (json_value(json, "active_bytes.all.current") -
                                       json_value(json, "allocated_bytes.all.current")));
        ck_assert(tenant_metric(body, "gpumem_alloc_retries_total", NULL) ==
                  (double) json_value(json, "num_alloc_retries"));
        /* gpumemctl's own session is counted in its answer, not in the scrape before it. */
        ck_assert(tenant_metric(body, "gpumem_sessions", NULL) == 1);
        ck_assert_int_eq(json_value(json, "sessions"), 2);
        /* Everything reserved is charged and held in the backend: one tenant, no releases pending. */
        double reserved = (double) json_value(json, "reserved_bytes.all.current");
        ck_assert(tenant_metric(body, "gpumem_charged_bytes", NULL) == reserved);
        ck_assert(tenant_metric(body, "gpumem_releasing_bytes", NULL) == 0);
        ck_assert(tenant_metric(body, "gpumem_release_unverified_bytes", NULL) == 0);
        ck_assert(metric(body, "gpumem_device_in_use_bytes{device=\"0\"}") == reserved);
        ck_assert(metric(body, "gpumem_device_capacity_bytes{device=\"0\"}") == (double) (64 * MiB));
        ck_assert(metric(body, "gpumem_device_capacity_bytes{device=\"0\"}") ==
                  (double) json_value(json, "capacity_bytes"));
        double largest = tenant_metric(body, "gpumem_largest_free_block_bytes", NULL);
        ck_assert(largest > 0 && largest <= reserved - (double) json_value(json, "active_bytes.all.current"));
        char series[128];
        snprintf(series, sizeof(series), "gpumem_quota_bytes{device=\"0\",tenant=\"%s\"}", tenant_);
        ck_assert(!has_series(body, series)); /* no quota set */
        /* Requests are timed: this client's allocations and frees so far. */
        ck_assert(metric(body, "gpumem_request_duration_seconds_count{device=\"0\",op=\"alloc\"}") == N);
        ck_assert(metric(body, "gpumem_request_duration_seconds_bucket{device=\"0\",op=\"alloc\",le=\"+Inf\"}") == N);
        ck_assert(metric(body, "gpumem_request_duration_seconds_count{device=\"0\",op=\"free\"}") == 2);
        ck_assert(metric(body, "gpumem_request_duration_seconds_sum{device=\"0\",op=\"alloc\"}") > 0);
        /* The daemon's fds now, plus possibly the scrape's connection if not yet closed. */
        double fds = metric(body, "process_open_fds"), now = gm_test_count_fds(daemon_.pid);
        ck_assert_msg(fds == now || fds == now + 1, "process_open_fds %.0f, /proc says %.0f", fds, now);
        ck_assert(metric(body, "process_resident_memory_bytes") > 0);

        /* The device-wide view matches too. */
        const char *device_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--json", NULL};
        ck_assert_int_eq(gm_test_run(json, sizeof(json), device_argv), 0);
        ck_assert(tenant_metric(body, "gpumem_reserved_bytes", "small") +
                          tenant_metric(body, "gpumem_reserved_bytes", "large") ==
                  (double) json_value(json, "reserved_bytes.all.current"));
        free(body);

        /* After everything is freed and the session is gone, the live figures are 0. */
        for (size_t i = 0; i < N; i++)
                if (i != 1 && i != 4)
                        ck_assert_int_eq(gpumem_free(c, ptrs[i]), 0);
        gpumem_disconnect(c);
        gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0);
        body = scrape();
        ck_assert(tenant_metric(body, "gpumem_allocated_bytes", "large") == 0);
        ck_assert(tenant_metric(body, "gpumem_reserved_bytes", "small") == 0);
        ck_assert(tenant_metric(body, "gpumem_allocations_total", "small") +
                          tenant_metric(body, "gpumem_allocations_total", "large") ==
                  N);
        ck_assert(metric(body, "gpumem_device_in_use_bytes{device=\"0\"}") == 0);
        ck_assert_int_eq(promtool_check(body, msg, sizeof(msg)), 0);
        free(body);

        /* Quota and clients requests are timed like every other kind. */
        char out[4096];
        const char *quota_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "quota", "list", NULL};
        const char *clients_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), quota_argv), 0);
        ck_assert_int_eq(gm_test_run(out, sizeof(out), clients_argv), 0);
        body = scrape();
        ck_assert(metric(body, "gpumem_request_duration_seconds_count{device=\"0\",op=\"quota\"}") >= 1);
        ck_assert(metric(body, "gpumem_request_duration_seconds_count{device=\"0\",op=\"clients\"}") >= 1);
        free(body);
}
END_TEST

START_TEST(test_refusals_and_reclaims_counted) {
        gpumem_client *c = connect_client();
        void *a, *b;
        ck_assert_int_eq(gpumem_alloc(c, 40 * MiB, 0, &a), 0);
        ck_assert_int_eq(gpumem_alloc(c, 40 * MiB, 0, &b), -ENOMEM); /* capacity is 64M */
        char *body = scrape();
        static const char *const reasons[] = {"quota", "fragmentation", "device", "reclaim", "external"};
        double total = 0;
        for (int i = 0; i < 5; i++) {
                char series[256];
                snprintf(series, sizeof(series), "gpumem_oom_refusals_total{device=\"0\",tenant=\"%s\",reason=\"%s\"}",
                         tenant_, reasons[i]);
                total += metric(body, series);
        }
        ck_assert(total == 1);
        free(body);

        /* A trim asks the client for its cached segment back; the client acknowledges. */
        ck_assert_int_eq(gpumem_free(c, a), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_gt(released, 0);
        double requested = 0, acknowledged = -1;
        for (int i = 0; i < 1000 && acknowledged != requested; i++) {
                body = scrape();
                requested = metric(body, "gpumem_reclaim_requests_total{device=\"0\",outcome=\"requested\"}");
                acknowledged = metric(body, "gpumem_reclaim_requests_total{device=\"0\",outcome=\"acknowledged\"}");
                free(body);
                if (acknowledged != requested)
                        sleep_ms(10);
        }
        ck_assert(requested >= 1);
        ck_assert(acknowledged == requested);
        body = scrape();
        ck_assert(metric(body, "gpumem_reclaim_requests_total{device=\"0\",outcome=\"timed_out\"}") == 0);
        ck_assert(metric(body, "gpumem_request_duration_seconds_count{device=\"0\",op=\"trim\"}") == 1);
        ck_assert(metric(body, "gpumem_request_duration_seconds_count{device=\"0\",op=\"release_ack\"}") == requested);
        free(body);
        gpumem_disconnect(c);
}
END_TEST

/* Runs gpumemctl with `args` (after -s SOCKET); asserts success; returns its output. */
static char *ctl(const char *const *args) {
        const char *argv[16] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path};
        size_t n = 3;
        for (; args[n - 3]; n++)
                argv[n] = args[n - 3];
        argv[n] = NULL;
        static char out[64 * 1024];
        int rc = gm_test_run(out, sizeof(out), argv);
        ck_assert_msg(rc == 0, "%s %s: exit %d: %s", args[0], args[1] ? args[1] : "", rc, out);
        return out;
}

static double allocations_total(const char *body) {
        return tenant_metric(body, "gpumem_allocations_total", "small") +
               tenant_metric(body, "gpumem_allocations_total", "large");
}

/* gpumemctl's resets start its figures again; what Prometheus scrapes goes on. */
START_TEST(test_counters_survive_resets) {
        gpumem_client *c = connect_client();
        void *p;
        for (int i = 0; i < 3; i++) {
                ck_assert_int_eq(gpumem_alloc(c, 3 * MiB, 0, &p), 0);
                ck_assert_int_eq(gpumem_free(c, p), 0);
        }
        char *body = scrape();
        ck_assert(allocations_total(body) == 3);
        ck_assert(tenant_metric(body, "gpumem_frees_total", "large") == 3);
        free(body);
        ck_assert_int_eq(json_value(ctl((const char *[]){"stats", "--json", "--tenant", tenant_, NULL}),
                                    "allocation.all.allocated"),
                         3);

        ctl((const char *[]){"stats", "--reset-accumulated", "--tenant", tenant_, NULL});
        ctl((const char *[]){"stats", "--reset-accumulated", NULL});
        ck_assert_int_eq(json_value(ctl((const char *[]){"stats", "--json", "--tenant", tenant_, NULL}),
                                    "allocation.all.allocated"),
                         0);
        ck_assert_int_eq(json_value(ctl((const char *[]){"stats", "--json", NULL}), "allocation.all.freed"), 0);
        body = scrape();
        ck_assert(allocations_total(body) == 3);
        ck_assert(tenant_metric(body, "gpumem_frees_total", "large") == 3);
        free(body);

        ck_assert_int_eq(gpumem_alloc(c, 3 * MiB, 0, &p), 0);
        body = scrape();
        ck_assert(allocations_total(body) == 4);
        free(body);
        ck_assert_int_eq(json_value(ctl((const char *[]){"stats", "--json", "--tenant", tenant_, NULL}),
                                    "allocation.all.allocated"),
                         1);
        ck_assert_int_eq(json_value(ctl((const char *[]){"stats", "--json", NULL}), "allocation.all.allocated"), 1);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
}
END_TEST

/* A quota for a tenant nobody is creates no series; the quota is kept. */
START_TEST(test_no_series_for_unused_tenants) {
        assert_allocation_works();
        ctl((const char *[]){"quota", "set", "tpyo", "1G", "--runtime", NULL});
        ck_assert_ptr_nonnull(strstr(ctl((const char *[]){"quota", "list", NULL}), "tpyo"));
        /* gpumemctl's own connections end as it exits, which the daemon may
         * see only a moment later on a loaded machine: wait for that, not for
         * a fixed time. */
        char *body = scrape();
        for (int i = 0; i < 100 && tenant_metric(body, "gpumem_sessions", NULL) != 0; i++) {
                free(body);
                sleep_ms(50);
                body = scrape();
        }
        ck_assert_ptr_null(strstr(body, "tenant=\"tpyo\""));
        ck_assert(tenant_metric(body, "gpumem_sessions", NULL) == 0); /* ours stays after its session */
        ck_assert(allocations_total(body) == 1);
        free(body);
}
END_TEST

/* An allocation that waits for another session's cache is timed until served. */
START_TEST(test_reclaim_wait_observed) {
        gpumem_client *holder = connect_client(), *taker = connect_client();
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(holder, 40 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(holder, p), 0); /* cached in the holder's session */
        char *body = scrape();
        ck_assert(metric(body, "gpumem_reclaim_wait_seconds_count{device=\"0\"}") == 0);
        free(body);
        int r = gpumem_alloc(taker, 40 * MiB, 0, &q); /* capacity 64M: only with the holder's cache */
        ck_assert_msg(r == 0, "alloc: %s", gpumem_last_error(taker));
        body = scrape();
        ck_assert(metric(body, "gpumem_reclaim_wait_seconds_count{device=\"0\"}") == 1);
        ck_assert(metric(body, "gpumem_reclaim_wait_seconds_bucket{device=\"0\",le=\"+Inf\"}") == 1);
        ck_assert(metric(body, "gpumem_reclaim_wait_seconds_sum{device=\"0\"}") < 2.5);
        ck_assert(metric(body, "gpumem_reclaim_requests_total{device=\"0\",outcome=\"acknowledged\"}") >= 1);
        free(body);
        ck_assert_int_eq(gpumem_free(taker, q), 0);
        gpumem_disconnect(taker);
        gpumem_disconnect(holder);
}
END_TEST

/* Every gpumem_ series carries the GPU's UUID (dcgm-exporter's label name),
 * next to the device index: the configured one on host, the driver's on cuda. */
START_TEST(test_uuid_on_every_series) {
        assert_allocation_works();
        char *body = scrape();
        char labels[128];
        snprintf(labels, sizeof(labels), "{device=\"0\",UUID=\"%s\"", expected_uuid_);
        size_t samples = 0;
        for (const char *p = body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                if (strncmp(p, "gpumem_", 7) != 0)
                        continue;
                const char *brace = strchr(p, '{'), *eol = strchr(p, '\n');
                ck_assert_msg(brace && brace < eol && strncmp(brace, labels, strlen(labels)) == 0,
                              "no UUID label: %.*s", (int) (eol - p), p);
                samples++;
        }
        ck_assert_uint_gt(samples, 100);
        char series[256];
        snprintf(series, sizeof(series), "gpumem_allocations_total%s,tenant=\"%s\",pool=\"large\"}", labels, tenant_);
        ck_assert(metric(body, series) == 1);
        free(body);
}
END_TEST

/* Where nothing can check a release (no per-process figure from NVML),
 * the released memory shows in gpumem_release_unverified_bytes, charged,
 * until its session ends. */
START_TEST(test_release_unverified_gauge) {
        gpumem_client *c = connect_client();
        void *p;
        uint64_t released = 0;
        ck_assert(gpumem_alloc(c, 3 * MiB, 0, &p) == 0 && gpumem_free(c, p) == 0);
        ck_assert(gpumem_trim(c, &released) == 0 && released > 0); /* its cache, given back */
        char unverified[256], charged[256];
        snprintf(unverified, sizeof(unverified),
                 "gpumem_release_unverified_bytes{device=\"0\",UUID=\"%s\",tenant=\"%s\"}", expected_uuid_, tenant_);
        snprintf(charged, sizeof(charged), "gpumem_charged_bytes{device=\"0\",UUID=\"%s\",tenant=\"%s\"}",
                 expected_uuid_, tenant_);
        char *body = scrape();
        for (int i = 0; i < 500 && metric(body, unverified) != (double) released; i++) { /* the ack follows */
                free(body);
                sleep_ms(10);
                body = scrape();
        }
        ck_assert(metric(body, unverified) == (double) released);
        ck_assert(metric(body, charged) == (double) released);
        free(body);
        gpumem_disconnect(c);
        body = scrape();
        for (int i = 0; i < 500 && metric(body, charged) != 0; i++) {
                free(body);
                sleep_ms(10);
                body = scrape();
        }
        ck_assert(metric(body, unverified) == 0 && metric(body, charged) == 0);
        free(body);
}
END_TEST

/* A claim shows as gpumem_claimed_bytes{tenant} while it stands, shrinks as
 * the session is granted memory inside it, and is gone with the session. */
START_TEST(test_claimed_gauge) {
        gpumem_client *c = connect_client();
        uint64_t claimed = 0;
        ck_assert_int_eq(gpumem_claim(c, 40 * MiB, &claimed), 0);
        ck_assert_uint_eq(claimed, 40 * MiB);
        char series[256];
        snprintf(series, sizeof(series), "gpumem_claimed_bytes{device=\"0\",tenant=\"%s\"}", tenant_);
        char *body = scrape();
        char msg[4096];
        int rc = promtool_check(body, msg, sizeof(msg));
        ck_assert_msg(rc == 0, "promtool check metrics failed (%d): %s", rc, msg);
        ck_assert(metric(body, series) == (double) (40 * MiB));
        free(body);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 16 * MiB, 0, &p), 0); /* one 16 MiB segment, taken from the claim */
        body = scrape();
        ck_assert(metric(body, series) == (double) (24 * MiB));
        free(body);
        gpumem_disconnect(c);
        body = scrape();
        for (int i = 0; i < 500 && metric(body, series) != 0; i++) {
                free(body);
                sleep_ms(10);
                body = scrape();
        }
        ck_assert(metric(body, series) == 0);
        free(body);
}
END_TEST

START_TEST(test_http_errors) {
        char *resp;
        ck_assert_int_eq(http_unix("GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL), 404);
        ck_assert_int_eq(http_unix("GET /metrics/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL), 404);
        ck_assert_int_eq(http_unix("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                   "Connection: close\r\n\r\nabc",
                                   &resp),
                         405);
        ck_assert_ptr_nonnull(strstr(resp, "\r\nAllow: GET, HEAD\r\n"));
        free(resp);
        ck_assert_int_eq(http_unix("HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &resp), 200);
        ck_assert_ptr_null(strstr(resp, "gpumem_build_info")); /* headers only */
        free(resp);

        /* Malformed requests get an error answer or a closed connection, never a 200. */
        static const char *const malformed[] = {
                "GARBAGE\r\n\r\n",
                "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
                "GET /metrics HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                "GET /metrics HTTP/9.1\r\nHost: x\r\n\r\n",
                "GET /metrics\r\n\r\n",
                "\x01\x02\x03\xff\r\n\r\n",
        };
        for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
                int fd = connect_unix(metrics_path_);
                ck_assert_int_ge(fd, 0);
                /* Half-close so that a server waiting for more sees the end. */
                send(fd, malformed[i], strlen(malformed[i]), MSG_NOSIGNAL);
                shutdown(fd, SHUT_WR);
                int status = http_exchange(fd, "", 0, NULL);
                ck_assert_msg(status == 0 || status >= 400, "malformed request %zu: status %d", i, status);
        }

        /* A header block beyond the 16 KiB limit is refused. */
        size_t big = 64 * 1024;
        char *req = malloc(big + 128);
        ck_assert_ptr_nonnull(req);
        int n = snprintf(req, big + 128, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: ");
        memset(req + n, 'a', big);
        strcpy(req + n + big, "\r\nConnection: close\r\n\r\n");
        int fd = connect_unix(metrics_path_);
        ck_assert_int_ge(fd, 0);
        int status = http_exchange(fd, req, strlen(req), NULL);
        ck_assert_msg(status == 0 || (status >= 400 && status < 500), "oversized header: status %d", status);
        free(req);

        char *body = scrape();
        ck_assert_ptr_nonnull(strstr(body, "gpumem_build_info{device=\"0\",version=\""));
        free(body);
        assert_allocation_works();
}
END_TEST

START_TEST(test_idle_connections) {
        free(scrape());
        int baseline = gm_test_count_fds(daemon_.pid);
        enum { IDLE = 100 };
        int fds[IDLE];
        for (int i = 0; i < IDLE; i++) {
                fds[i] = connect_unix(metrics_path_);
                ck_assert_int_ge(fds[i], 0);
                if (i % 2) /* half of them start a request and stall */
                        send(fds[i], "GET /metr", 9, MSG_NOSIGNAL);
        }
        /* Allocations are served while the HTTP side is saturated. */
        assert_allocation_works();
        /* Scrapes are answered again once idle connections time out. */
        free(scrape_eventually());
        for (int i = 0; i < IDLE; i++)
                close(fds[i]);
        free(scrape_eventually());
        assert_allocation_works();
        wait_fds(baseline); /* nothing leaked */
}
END_TEST

START_TEST(test_clients_disconnecting_mid_request) {
        free(scrape());
        int baseline = gm_test_count_fds(daemon_.pid);
        for (int i = 0; i < 30; i++) {
                int fd = connect_unix(metrics_path_);
                ck_assert_int_ge(fd, 0);
                switch (i % 3) {
                case 0: /* half a request line */
                        send(fd, "GET /metrics HTTP/1.1\r\nHost:", 28, MSG_NOSIGNAL);
                        break;
                case 1: /* a whole request, gone before the answer */
                        send(fd, scrape_request, strlen(scrape_request), MSG_NOSIGNAL);
                        break;
                case 2: { /* reads a little of the answer, then leaves */
                        char buf[16];
                        send(fd, scrape_request, strlen(scrape_request), MSG_NOSIGNAL);
                        ck_assert_int_gt(recv(fd, buf, sizeof(buf), 0), 0);
                        break;
                }
                }
                close(fd);
        }
        char *body = scrape();
        ck_assert_ptr_nonnull(strstr(body, "# TYPE gpumem_request_duration_seconds histogram\n"));
        free(body);
        assert_allocation_works();
        wait_fds(baseline);
}
END_TEST

/* TCP on a port the kernel picks: the daemon logs where it serves. */
START_TEST(test_tcp_listener) {
        unsigned port = 0;
        char line[512];
        for (int i = 0; i < 1000 && !port; i++) {
                FILE *f = fopen(daemon_.log_path, "re");
                ck_assert_ptr_nonnull(f);
                while (fgets(line, sizeof(line), f))
                        if (sscanf(line, "<%*d>metrics: serving http://127.0.0.1:%u/metrics", &port) == 1)
                                break;
                fclose(f);
                if (!port)
                        sleep_ms(10);
        }
        ck_assert_uint_gt(port, 0);
        char *resp;
        ck_assert_int_eq(http_exchange(connect_tcp(port), scrape_request, strlen(scrape_request), &resp), 200);
        ck_assert_ptr_nonnull(strstr(resp, "\r\n\r\n# HELP gpumem_build_info "));
        free(resp);
        ck_assert_int_eq(http_exchange(connect_tcp(port), "GET / HTTP/1.0\r\n\r\n", 18, NULL), 404);
        assert_allocation_works();
}
END_TEST

/* ---- in process: the renderer and the listener setup on a synthetic daemon ---- */

static gm_metrics_source_t fake_;
static gm_backend_t *fake_backend_;

/* The op index of a request body, as the daemon's request table numbers it. */
static unsigned op_of(Gpumem__Envelope__BodyCase body) {
        return (unsigned) gm_requests_index(body);
}

static void setup_fake(void) {
        memset(&fake_, 0, sizeof(fake_));
        char err[256];
        gm_backend_options_t bopts = {.kind = "host", .capacity = 1ull << 30};
        ck_assert_int_eq(gm_backend_host_open(&bopts, &fake_backend_, err, sizeof(err)), 0);
        gm_alloc_config_t conf;
        ck_assert_int_eq(gm_alloc_config_parse(NULL, &conf, err, sizeof(err)), 0);
        gm_broker_params_t params = {.backend = fake_backend_, .alloc_config = &conf};
        gm_broker_t *b;
        ck_assert_int_eq(gm_broker_new(&params, &b), 0);
        fake_.loop = uv_default_loop();
        fake_.broker = b;
        fake_.n_ops = gm_requests_op_names(&fake_.op_names);
        /* Synthetic figures: written straight into the broker's tenants. */
        gm_tenant_t *plain = gm_tenant_get(b, "plain"), *weird = gm_tenant_get(b, "we\"ird\\na\nme");
        ck_assert_ptr_nonnull(plain);
        ck_assert_ptr_nonnull(weird);
        plain->stats.allocation[GM_STAT_ALL].allocated = 1; /* it has had a session */
        gm_tenant_set_quota(weird, GM_QUOTA_RUNTIME, true, 5000);
        weird->charged_bytes = 4096;
        /* Quotas alone: from the configuration (shown), from `quota set` (not). */
        gm_tenant_set_quota(gm_tenant_get(b, "configured"), GM_QUOTA_CONFIG, true, 1 << 20);
        gm_tenant_set_quota(gm_tenant_get(b, "typo"), GM_QUOTA_RUNTIME, true, 1 << 20);
        weird->stats.reserved_bytes[GM_STAT_LARGE_POOL].current = 4096;
        snprintf(dir_, sizeof(dir_), "/tmp/gpumemd-metrics-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir_));
        snprintf(metrics_path_, sizeof(metrics_path_), "%s/metrics.sock", dir_);
}

static void teardown_fake(void) {
        uv_run(fake_.loop, UV_RUN_DEFAULT); /* close callbacks of stopped endpoints */
        gm_broker_t *b = (gm_broker_t *) fake_.broker;
        gm_tenant_find(b, "we\"ird\\na\nme")->charged_bytes = 0;
        gm_broker_free(b);
        fake_backend_ = gm_backend_close(fake_backend_);
        unlink(metrics_path_);
        rmdir(dir_);
}

static char *render(const gm_metrics_t *m) {
        char *text;
        size_t len;
        ck_assert_int_eq(gm_metrics_render(fake_.broker, m, &text, &len), 0);
        ck_assert_uint_eq(strlen(text), len);
        char msg[4096];
        int rc = promtool_check(text, msg, sizeof(msg));
        ck_assert_msg(rc == 0, "promtool check metrics failed (%d): %s", rc, msg);
        return text;
}

/* A shared object's series: its bytes and mappers labelled by name,
 * version and the publisher's tenant while it lives, the count of objects;
 * promtool accepts them; the series go with the object. */
START_TEST(test_shared_series) {
        gpumem_client *pub = connect_client(), *reader = connect_client();
        gpumem_shared *s, *r;
        void *p;
        ck_assert_int_eq(gpumem_shared_create(pub, "model/w-1", 3 * MiB, &s, &p), 0);
        char *body = scrape();
        ck_assert(metric(body, "gpumem_shared_objects{device=\"0\"}") == 1);
        ck_assert_ptr_null(strstr(body, "gpumem_shared_bytes{")); /* staging: no version yet */
        free(body);
        const char *readers[] = {"*", NULL};
        ck_assert_int_eq(gpumem_shared_publish(pub, s, readers, NULL, 0, 0, NULL), 0);
        ck_assert_int_eq(gpumem_shared_open(reader, "model/w-1", 0, &r), 0);
        char bytes[256], mappers[256];
        snprintf(bytes, sizeof(bytes),
                 "gpumem_shared_bytes{device=\"0\",name=\"model/w-1\",version=\"1\",tenant=\"%s\"}", tenant_);
        snprintf(mappers, sizeof(mappers), "gpumem_shared_mappers%s", strchr(bytes, '{'));
        body = scrape();
        char msg[4096];
        int rc = promtool_check(body, msg, sizeof(msg));
        ck_assert_msg(rc == 0, "promtool check metrics failed (%d): %s", rc, msg);
        ck_assert(metric(body, bytes) == (double) (4 * MiB)); /* rounded up to the 2 MiB granularity */
        ck_assert(metric(body, mappers) == 2);
        free(body);
        gpumem_shared_close(pub, s);
        ck_assert_int_eq(gpumem_shared_unpublish(reader, "model/w-1", 0), 0);
        body = scrape();
        ck_assert(metric(body, mappers) == 1); /* withdrawn, still mapped by the reader */
        free(body);
        gpumem_shared_close(reader, r);
        body = scrape();
        ck_assert_ptr_null(strstr(body, "gpumem_shared_bytes{"));
        ck_assert(metric(body, "gpumem_shared_objects{device=\"0\"}") == 0);
        free(body);
        gpumem_disconnect(reader);
        gpumem_disconnect(pub);
}
END_TEST

START_TEST(test_render_labels_counters_and_overflow) {
        char listen[160], err[256];
        snprintf(listen, sizeof(listen), "unix:%s", metrics_path_);
        gm_metrics_t *m = NULL;
        ck_assert_int_eq(gm_metrics_start(&fake_, listen, &m, err, sizeof(err)), 0);
        ck_assert_ptr_nonnull(m);

        /* Label values are escaped; quota only where one is set. */
        char *text = render(m);
        ck_assert_ptr_nonnull(strstr(
                text, "gpumem_reserved_bytes{device=\"0\",tenant=\"we\\\"ird\\\\na\\nme\",pool=\"large\"} 4096\n"));
        ck_assert_ptr_nonnull(strstr(text, "gpumem_quota_bytes{device=\"0\",tenant=\"we\\\"ird\\\\na\\nme\"} 5000\n"));
        ck_assert_ptr_null(strstr(text, "gpumem_quota_bytes{device=\"0\",tenant=\"plain\"}"));
        ck_assert(metric(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"plain\",reason=\"quota\"}") == 0);
        ck_assert(metric(text, "gpumem_quota_bytes{device=\"0\",tenant=\"configured\"}") == 1 << 20);
        ck_assert_ptr_null(strstr(text, "tenant=\"typo\""));
        ck_assert_ptr_null(strstr(text, "UUID="));          /* none configured */
        ck_assert_ptr_null(strstr(text, "gpumem_fdstore")); /* no fd store */
        free(text);

        /* Under systemd the fd store's fill and limit. */
        gm_broker_t *b = (gm_broker_t *) fake_.broker;
        b->store_max = 8192;
        b->n_stored = 3;
        text = render(m);
        ck_assert(metric(text, "gpumem_fdstore_fds{device=\"0\"}") == 3);
        ck_assert(metric(text, "gpumem_fdstore_max_fds{device=\"0\"}") == 8192);
        free(text);
        b->store_max = b->n_stored = 0;

        /* Histogram buckets are cumulative, sums in seconds. */
        gm_metrics_observe_request(m, op_of(GPUMEM__ENVELOPE__BODY_ALLOC), 7000);          /* 7 us */
        gm_metrics_observe_request(m, op_of(GPUMEM__ENVELOPE__BODY_ALLOC), 3000000000ull); /* 3 s: above every bound */
        gm_metrics_observe_request(m, op_of(GPUMEM__ENVELOPE__BODY_SNAPSHOT), 1000000);
        gm_metrics_observe_request(m, op_of(GPUMEM__ENVELOPE__BODY_ERROR), 1000000); /* ignored */
        gm_metrics_count_reclaim(m, GM_RECLAIM_TIMED_OUT);
        gm_metrics_observe_reclaim_wait(m, 3000000); /* 3 ms */
        /* 1100 names: the table keeps 1023 and counts the rest as "other". */
        for (int i = 0; i < 1100; i++) {
                char name[32];
                snprintf(name, sizeof(name), "t%d", i);
                gm_metrics_count_refusal(m, name, GM_OOM_DEVICE_FULL);
        }
        gm_metrics_count_refusal(m, "plain", GM_OOM_QUOTA);
        gm_metrics_count_refusal(m, "plain", GM_OOM_QUOTA);
        gm_metrics_count_refusal(m, "t5", GM_OOM_EXTERNAL);
        text = render(m);
        ck_assert(metric(text, "gpumem_request_duration_seconds_bucket{device=\"0\",op=\"alloc\",le=\"5e-06\"}") == 0);
        ck_assert(metric(text, "gpumem_request_duration_seconds_bucket{device=\"0\",op=\"alloc\",le=\"1e-05\"}") == 1);
        ck_assert(metric(text, "gpumem_request_duration_seconds_bucket{device=\"0\",op=\"alloc\",le=\"2.5\"}") == 1);
        ck_assert(metric(text, "gpumem_request_duration_seconds_bucket{device=\"0\",op=\"alloc\",le=\"+Inf\"}") == 2);
        ck_assert(metric(text, "gpumem_request_duration_seconds_count{device=\"0\",op=\"alloc\"}") == 2);
        ck_assert_double_eq_tol(metric(text, "gpumem_request_duration_seconds_sum{device=\"0\",op=\"alloc\"}"),
                                3.000007, 1e-9);
        ck_assert(metric(text, "gpumem_request_duration_seconds_bucket{device=\"0\",op=\"snapshot\",le=\"0.001\"}") ==
                  1);
        ck_assert(metric(text, "gpumem_reclaim_requests_total{device=\"0\",outcome=\"timed_out\"}") == 1);
        ck_assert(metric(text, "gpumem_reclaim_wait_seconds_bucket{device=\"0\",le=\"0.0025\"}") == 0);
        ck_assert(metric(text, "gpumem_reclaim_wait_seconds_bucket{device=\"0\",le=\"0.005\"}") == 1);
        ck_assert(metric(text, "gpumem_reclaim_wait_seconds_count{device=\"0\"}") == 1);
        /* Every request kind of the table has its series, timed or not yet. */
        static const char *const every_op[] = {
                "hello",       "alloc",           "free",          "free_completed", "trim",        "stats",
                "release_ack", "reset_stats",     "history",       "snapshot",       "alloc_conf",  "quota",
                "clients",     "reattach",        "grant",         "return_pieces",  "reclaim_ack", "move_pieces",
                "samples",     "snapshot_answer", "return_intent", "sleep_state",    "claim"};
        static const char *const shared_ops[] = {"shared_create", "shared_publish",   "shared_open",
                                                 "shared_close",  "shared_unpublish", "shared_list"};
        size_t n_every = sizeof(every_op) / sizeof(every_op[0]), n_shared = sizeof(shared_ops) / sizeof(shared_ops[0]);
        ck_assert_uint_eq(fake_.n_ops, n_every + n_shared);
        for (size_t i = 0; i < n_every + n_shared; i++) {
                char series[128];
                snprintf(series, sizeof(series), "gpumem_request_duration_seconds_count{device=\"0\",op=\"%s\"}",
                         i < n_every ? every_op[i] : shared_ops[i - n_every]);
                ck_assert_msg(has_series(text, series), "no series %s", series);
        }
        ck_assert(metric(text, "gpumem_reclaim_requests_total{device=\"0\",outcome=\"requested\"}") == 0);
        ck_assert(metric(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"t0\",reason=\"device\"}") == 1);
        ck_assert(metric(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"t5\",reason=\"external\"}") == 1);
        ck_assert(metric(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"t1022\",reason=\"device\"}") == 1);
        ck_assert(!has_series(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"t1023\",reason=\"device\"}"));
        ck_assert(metric(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"other\",reason=\"device\"}") ==
                  1100 - 1023);
        ck_assert(metric(text, "gpumem_oom_refusals_total{device=\"0\",tenant=\"other\",reason=\"quota\"}") == 2);
        free(text);

        /* Disabled: the state only, and every entry point accepts NULL. */
        gm_metrics_observe_request(NULL, op_of(GPUMEM__ENVELOPE__BODY_ALLOC), 1);
        gm_metrics_observe_reclaim_wait(NULL, 1);
        gm_metrics_count_refusal(NULL, "plain", GM_OOM_QUOTA);
        gm_metrics_count_reclaim(NULL, GM_RECLAIM_REQUESTED);
        text = render(NULL);
        ck_assert_ptr_nonnull(strstr(text, "# TYPE gpumem_reserved_bytes gauge\n"));
        ck_assert_ptr_null(strstr(text, "gpumem_request_duration_seconds"));
        free(text);

        ck_assert_ptr_null(gm_metrics_stop(m));
        ck_assert_int_ne(access(metrics_path_, F_OK), 0);
        ck_assert_ptr_null(gm_metrics_stop(NULL));
}
END_TEST

START_TEST(test_listen_addresses) {
        char err[256] = "";
        gm_metrics_t *m = (gm_metrics_t *) &fake_; /* must stay untouched on failure */
        static const char *const invalid[] = {
                "9470",      "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "localhost:9470",
                "[::1:9470", "::1:9470",  "unix:",      "1.2.3.4:9x"};
        for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
                ck_assert_int_eq(gm_metrics_start(&fake_, invalid[i], &m, err, sizeof(err)), -EINVAL);
                ck_assert_ptr_eq(m, (gm_metrics_t *) &fake_);
                ck_assert_msg(err[0], "no message for '%s'", invalid[i]);
        }
        char longpath[200];
        memset(longpath, 'x', sizeof(longpath));
        memcpy(longpath, "unix:/", 6);
        longpath[sizeof(longpath) - 1] = '\0';
        ck_assert_int_eq(gm_metrics_start(&fake_, longpath, &m, err, sizeof(err)), -EINVAL);

        ck_assert_int_eq(gm_metrics_start(&fake_, "none", &m, err, sizeof(err)), 0);
        ck_assert_ptr_null(m);
        m = (gm_metrics_t *) &fake_;
        ck_assert_int_eq(gm_metrics_start(&fake_, "", &m, err, sizeof(err)), 0);
        ck_assert_ptr_null(m);

        /* IPv6 loopback and a kernel-chosen port. */
        ck_assert_int_eq(gm_metrics_start(&fake_, "[::1]:0", &m, err, sizeof(err)), 0);
        m = gm_metrics_stop(m);

        /* A stale unix socket file is replaced; a live one is not. */
        int stale = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        ck_assert_uint_lt(strlen(metrics_path_), sizeof(a.sun_path));
        memcpy(a.sun_path, metrics_path_, strlen(metrics_path_) + 1);
        ck_assert_int_eq(bind(stale, (struct sockaddr *) &a, sizeof(a)), 0);
        close(stale); /* the file stays, nobody listens */
        char listen[160];
        snprintf(listen, sizeof(listen), "unix:%s", metrics_path_);
        gm_metrics_t *first = NULL, *second = NULL;
        ck_assert_int_eq(gm_metrics_start(&fake_, listen, &first, err, sizeof(err)), 0);
        ck_assert_int_eq(gm_metrics_start(&fake_, listen, &second, err, sizeof(err)), -EADDRINUSE);
        ck_assert_ptr_null(second);
        ck_assert_int_eq(access(metrics_path_, F_OK), 0); /* the live endpoint keeps its file */
        gm_metrics_stop(first);
        /* Not a socket: left alone. */
        int fd = open(metrics_path_, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        ck_assert_int_eq(gm_metrics_start(&fake_, listen, &second, err, sizeof(err)), -EADDRINUSE);
        ck_assert_int_eq(access(metrics_path_, F_OK), 0);
}
END_TEST

static Suite *metrics_suite(void) {
        Suite *s = suite_create("metrics");
        TCase *tc;
        if (strcmp(gm_test_backend(), "cuda") == 0) { /* tests/integration/metrics.cmake: metrics_cuda_uuid */
                tc = tcase_create("cuda_uuid");
                tcase_add_checked_fixture(tc, setup_cuda_uuid, teardown);
                tcase_set_timeout(tc, 180);
                tcase_add_test(tc, test_uuid_on_every_series);
                tcase_add_test(tc, test_release_unverified_gauge);
                suite_add_tcase(s, tc);
                return s;
        }
        tc = tcase_create("endpoint");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, test_figures_equal_gpumemctl);
        tcase_add_test(tc, test_refusals_and_reclaims_counted);
        tcase_add_test(tc, test_http_errors);
        tcase_add_test(tc, test_idle_connections);
        tcase_add_test(tc, test_clients_disconnecting_mid_request);
        tcase_add_test(tc, test_counters_survive_resets);
        tcase_add_test(tc, test_no_series_for_unused_tenants);
        tcase_add_test(tc, test_reclaim_wait_observed);
        tcase_add_test(tc, test_claimed_gauge);
        tcase_add_test(tc, test_shared_series);
        suite_add_tcase(s, tc);
        tc = tcase_create("uuid");
        tcase_add_checked_fixture(tc, setup_uuid, teardown);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, test_uuid_on_every_series);
        suite_add_tcase(s, tc);
        tc = tcase_create("tcp");
        tcase_add_checked_fixture(tc, setup_tcp, teardown_tcp);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, test_tcp_listener);
        suite_add_tcase(s, tc);
        tc = tcase_create("render");
        tcase_add_checked_fixture(tc, setup_fake, teardown_fake);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_render_labels_counters_and_overflow);
        tcase_add_test(tc, test_listen_addresses);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(metrics_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
