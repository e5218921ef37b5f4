#include "testutil.h"
#ifdef GM_TEST_FAKECUDA
#include "fakecuda_check.h"
#endif

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc.h"
#include "msg.h"

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

const char *gm_test_backend(void) {
        const char *b = getenv("GPUMEM_TEST_BACKEND");
        return b && *b ? b : "host";
}

void gm_test_daemon_start_config(gm_test_daemon_t *d, const char *capacity, const char *const *extra_args,
                                 const char *config_text) {
        memset(d, 0, sizeof(*d));
        snprintf(d->dir, sizeof(d->dir), "/tmp/gpumemd-test-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(d->dir));
        snprintf(d->extra_config, sizeof(d->extra_config), "%s", config_text ? config_text : "");
        gm_test_daemon_launch(d, capacity, extra_args);
}

void gm_test_daemon_start(gm_test_daemon_t *d, const char *capacity, const char *const *extra_args) {
        gm_test_daemon_start_config(d, capacity, extra_args, NULL);
}

void gm_test_daemon_launch(gm_test_daemon_t *d, const char *capacity, const char *const *extra_args) {
        ck_assert_int_eq(chmod(d->dir, 0755), 0); /* clients run as other users too */
        snprintf(d->socket_path, sizeof(d->socket_path), "%s/gpu0.sock", d->dir);
        snprintf(d->log_path, sizeof(d->log_path), "%s/gpumemd.log", d->dir);
        /* Its own configuration: never the machine's /etc/gpumem/gpumemd.conf,
         * and persistent state in the test directory. */
        snprintf(d->config_path, sizeof(d->config_path), "%s/gpumemd.conf", d->dir);
        FILE *conf = fopen(d->config_path, "we");
        ck_assert_ptr_nonnull(conf);
        fprintf(conf, "[daemon]\nstate_dir = %s/state\n%s", d->dir, d->extra_config);
        fclose(conf);
        const char *argv[32] = {GPUMEMD_BIN,    "--backend",   gm_test_backend(), "--socket",
                                d->socket_path, "--capacity",  capacity,          "-v",
                                "--config",     d->config_path};
        size_t n = 10;
        for (size_t i = 0; extra_args && extra_args[i] && n < 31; i++)
                argv[n++] = extra_args[i];
        argv[n] = NULL;
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int log = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (log >= 0)
                        dup2(log, STDERR_FILENO);
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        d->pid = pid;
        /* Readiness: the socket accepts a connection (not a timing assertion). */
        for (int i = 0; i < 1000; i++) {
                int fd;
                if (gm_ipc_connect(d->socket_path, &fd) == 0) {
                        close(fd);
                        return;
                }
                int status;
                if (waitpid(pid, &status, WNOHANG) == pid)
                        ck_abort_msg("gpumemd exited during start (status %d); see %s", status, d->log_path);
                sleep_ms(10);
        }
        ck_abort_msg("gpumemd did not start listening on %s", d->socket_path);
}

int gm_test_run_suite(Suite *s) {
        SRunner *sr = srunner_create(s);
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int gm_test_run_in_process(const TTest *test, int timeout_s) {
        Suite *s = suite_create("attack");
        TCase *tc = tcase_create("attack");
        tcase_set_timeout(tc, timeout_s);
        tcase_add_test(tc, test);
        suite_add_tcase(s, tc);
        SRunner *sr = srunner_create(s);
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

void gm_test_shell(const char *cmd) {
        ck_assert_msg(system(cmd) != -1, "cannot run '%s'", cmd);
}

void gm_test_daemon_stop(gm_test_daemon_t *d) {
        if (d->pid <= 0)
                return;
        ck_assert_int_eq(kill(d->pid, SIGTERM), 0);
        int status = 0;
        ck_assert_int_eq(waitpid(d->pid, &status, 0), d->pid);
        d->pid = 0;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                char cmd[400];
                snprintf(cmd, sizeof(cmd), "tail -n 30 %s >&2", d->log_path);
                gm_test_shell(cmd);
        }
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gpumemd exit status %d", status);
        ck_assert_int_ne(access(d->socket_path, F_OK), 0); /* the socket file is removed */
#ifdef GM_TEST_FAKECUDA
        if (!d->keep_dir)                        /* (a restart keeps what the fd store holds) */
                gm_fake_assert_device_drained(); /* emulated device: nothing leaked by the daemon or clients */
#endif
        if (d->keep_dir)
                return;
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
        gm_test_shell(cmd);
}

int gm_test_count_fds(pid_t pid) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
        DIR *dir = opendir(path);
        ck_assert_ptr_nonnull(dir);
        int n = 0;
        struct dirent *e;
        while ((e = readdir(dir)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(dir);
        return n;
}

int gm_test_raw_connect(const char *socket_path) {
        int fd;
        ck_assert_int_eq(gm_ipc_connect(socket_path, &fd), 0);
        return fd;
}

Gpumem__Envelope *gm_test_raw_recv_fd(int fd, int *ret_fd) {
        static uint8_t buf[GM_IPC_MAX_PACKET_DEFAULT];
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t len, n_fds;
        *ret_fd = -1;
        int r = gm_ipc_recv(fd, buf, sizeof(buf), fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds);
        if (r < 0)
                return NULL;
        if (n_fds > 0) {
                *ret_fd = fds[0];
                fds[0] = -1;
        }
        gm_close_fds(fds, n_fds);
        Gpumem__Envelope *env = NULL;
        ck_assert_int_eq(gm_msg_unpack(buf, len, &env), 0);
        return env;
}

Gpumem__Envelope *gm_test_raw_recv(int fd) {
        int kept;
        Gpumem__Envelope *env = gm_test_raw_recv_fd(fd, &kept);
        if (kept >= 0)
                close(kept);
        return env;
}

void gm_test_raw_send_body(int fd, uint64_t request_id, Gpumem__Envelope__BodyCase body_case, void *body) {
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = request_id;
        env.body_case = body_case;
        env.hello = body; /* the oneof's members share one pointer slot */
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
}

Gpumem__Envelope *gm_test_raw_await_body(int fd, Gpumem__Envelope__BodyCase body_case) {
        for (int i = 0; i < 10; i++) {
                struct pollfd pf = {.fd = fd, .events = POLLIN};
                ck_assert_msg(poll(&pf, 1, 5000) == 1, "no envelope of kind %d came", (int) body_case);
                Gpumem__Envelope *e = gm_test_raw_recv(fd);
                ck_assert_msg(e != NULL, "connection closed before an envelope of kind %d", (int) body_case);
                if (e->body_case == body_case)
                        return e;
                gm_msg_free(e);
        }
        ck_abort_msg("no envelope of kind %d in 10 packets", (int) body_case);
        return NULL;
}

void gm_test_raw_acknowledge_mapped(int fd, uint64_t block_id) {
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = block_id;
        gm_test_raw_send_body(fd, 3, GPUMEM__ENVELOPE__BODY_FREE, &f);
        Gpumem__Trim trim = GPUMEM__TRIM__INIT;
        trim.tenant = "";
        gm_test_raw_send_body(fd, 4, GPUMEM__ENVELOPE__BODY_TRIM, &trim);
        Gpumem__Envelope *e = gm_test_raw_await_body(fd, GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST);
        Gpumem__ReleaseAck ack = GPUMEM__RELEASE_ACK__INIT;
        ack.release_id = e->release_request->release_id;
        gm_msg_free(e);
        gm_test_raw_send_body(fd, 5, GPUMEM__ENVELOPE__BODY_RELEASE_ACK, &ack); /* "unmapped", and it is not */
}

void gm_test_raw_assert_caught(int fd) {
        Gpumem__Envelope *e = gm_test_raw_await_body(fd, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error->code, EBUSY);
        ck_assert_msg(strstr(e->error->message, "still mapped"), "%s", e->error->message);
        gm_msg_free(e);
        ck_assert_ptr_null(gm_test_raw_recv(fd));
}

void gm_test_raw_lying_release(int fd, uint64_t block_id) {
        gm_test_raw_acknowledge_mapped(fd, block_id);
        gm_test_raw_assert_caught(fd);
}

Gpumem__Envelope *gm_test_raw_grant(int fd, uint64_t request_id, uint64_t segment_id, uint64_t size, int *ret_fd) {
        Gpumem__Grant g = GPUMEM__GRANT__INIT;
        g.segment_id = segment_id;
        g.segment_va_size = size;
        g.size = size;
        g.block_size = size;
        gm_test_raw_send_body(fd, request_id, GPUMEM__ENVELOPE__BODY_GRANT, &g);
        for (;;) {
                Gpumem__Envelope *e = gm_test_raw_recv_fd(fd, ret_fd);
                ck_assert_ptr_nonnull(e);
                if (e->request_id == request_id)
                        return e;
                if (*ret_fd >= 0)
                        close(*ret_fd);
                gm_msg_free(e);
        }
}

void gm_test_raw_return(int fd, uint64_t request_id, uint64_t segment_id, uint64_t size) {
        gm_test_raw_return_closing(fd, request_id, segment_id, size, false);
}

void gm_test_raw_return_closing(int fd, uint64_t request_id, uint64_t segment_id, uint64_t size, bool closes_intent) {
        Gpumem__Range range = GPUMEM__RANGE__INIT;
        range.segment_id = segment_id;
        range.length = size;
        Gpumem__Range *ranges[] = {&range};
        Gpumem__ReturnPieces ret = GPUMEM__RETURN_PIECES__INIT;
        ret.n_ranges = 1;
        ret.ranges = ranges;
        ret.closes_intent = closes_intent;
        gm_test_raw_send_body(fd, request_id, GPUMEM__ENVELOPE__BODY_RETURN_PIECES, &ret);
}

Gpumem__Envelope *gm_test_raw_return_intent(int fd, uint64_t request_id) {
        Gpumem__ReturnIntent intent = GPUMEM__RETURN_INTENT__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_RETURN_INTENT;
        env.return_intent = &intent;
        return gm_test_raw_call(fd, &env);
}

Gpumem__Envelope *gm_test_raw_call(int fd, Gpumem__Envelope *env) {
        ck_assert_int_eq(gm_msg_send(fd, env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
        for (;;) {
                Gpumem__Envelope *reply = gm_test_raw_recv(fd);
                if (!reply || reply->request_id == env->request_id)
                        return reply;
                gm_msg_free(reply);
        }
}

void gm_test_raw_hello(int fd, bool admin) {
        gm_test_raw_hello_named(fd, admin, "test");
}

/* Sends Hello asking for `heap_mode` and returns the reply. */
Gpumem__Envelope *gm_test_raw_hello_mode(int fd, bool admin, const char *client_name, const char *resume_token,
                                         Gpumem__HeapMode heap_mode) {
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = (char *) client_name;
        hello.admin = admin;
        hello.resume_token = (char *) (resume_token ? resume_token : "");
        hello.heap_mode = heap_mode;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 1;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        Gpumem__Envelope *reply = gm_test_raw_call(fd, &env);
        ck_assert_ptr_nonnull(reply);
        return reply;
}

Gpumem__Envelope *gm_test_raw_hello_reply(int fd, bool admin, const char *client_name, const char *resume_token) {
        return gm_test_raw_hello_mode(fd, admin, client_name, resume_token, GPUMEM__HEAP_MODE__HEAP_MODE_UNSPECIFIED);
}

void gm_test_raw_hello_local(int fd) {
        Gpumem__Envelope *reply =
                gm_test_raw_hello_mode(fd, false, "raw-local", NULL, GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        ck_assert_int_eq(reply->hello_reply->heap_mode, GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL);
        gm_msg_free(reply); /* its statistics page's fd was closed */
}

void gm_test_raw_hello_named(int fd, bool admin, const char *client_name) {
        Gpumem__Envelope *reply = gm_test_raw_hello_reply(fd, admin, client_name, NULL);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        gm_msg_free(reply);
}

/* Tenant `tenant`'s charged bytes and session count, as an admin's quota
 * query answers them (zeros for a tenant the daemon does not know). */
static void tenant_figures(const char *socket_path, const char *tenant, uint64_t *ret_charged, uint32_t *ret_sessions) {
        int fd = gm_test_raw_connect(socket_path);
        gm_test_raw_hello(fd, true);
        Gpumem__Quota q = GPUMEM__QUOTA__INIT;
        q.op = GPUMEM__QUOTA_OP__QUOTA_OP_GET;
        q.tenant = (char *) tenant;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_QUOTA;
        env.quota = &q;
        Gpumem__Envelope *reply = gm_test_raw_call(fd, &env);
        ck_assert_ptr_nonnull(reply);
        bool known = reply->body_case == GPUMEM__ENVELOPE__BODY_QUOTA_REPLY && reply->quota_reply->n_tenants == 1;
        *ret_charged = known ? reply->quota_reply->tenants[0]->charged : 0;
        *ret_sessions = known ? reply->quota_reply->tenants[0]->sessions : 0;
        gm_msg_free(reply);
        close(fd);
}

uint64_t gm_test_tenant_charged(const char *socket_path, const char *tenant) {
        uint64_t charged;
        uint32_t sessions;
        tenant_figures(socket_path, tenant, &charged, &sessions);
        return charged;
}

uint32_t gm_test_tenant_sessions(const char *socket_path, const char *tenant) {
        uint64_t charged;
        uint32_t sessions;
        tenant_figures(socket_path, tenant, &charged, &sessions);
        return sessions;
}

int64_t gm_test_device_stat(const char *socket_path, const char *name) {
        int fd = gm_test_raw_connect(socket_path);
        gm_test_raw_hello(fd, true);
        Gpumem__Stats stats = GPUMEM__STATS__INIT;
        stats.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE;
        char *names[1] = {(char *) name};
        stats.n_names = 1;
        stats.names = names;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        env.stats = &stats;
        Gpumem__Envelope *reply = gm_test_raw_call(fd, &env);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_STATS_REPLY);
        ck_assert_uint_eq(reply->stats_reply->n_stats, 1);
        int64_t v = reply->stats_reply->stats[0]->value;
        gm_msg_free(reply);
        close(fd);
        return v;
}

int64_t gm_test_wait_device_stat(const char *socket_path, const char *name, int64_t want) {
        int64_t v = gm_test_device_stat(socket_path, name);
        for (int i = 0; i < 1000 && v != want; i++) {
                sleep_ms(10);
                v = gm_test_device_stat(socket_path, name);
        }
        return v;
}

int gm_test_run(char *buf, size_t buf_len, const char *const *argv) {
        int pipefd[2];
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                dup2(pipefd[1], STDOUT_FILENO);
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        close(pipefd[1]);
        size_t len = 0;
        ssize_t n;
        char discard[4096];
        /* Keep what fits, drain the rest (the child must not die of SIGPIPE). */
        while ((n = len + 1 < buf_len ? read(pipefd[0], buf + len, buf_len - 1 - len)
                                      : read(pipefd[0], discard, sizeof(discard))) > 0)
                if (len + 1 < buf_len)
                        len += (size_t) n;
        buf[len] = '\0';
        close(pipefd[0]);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static uint64_t splitmix(uint64_t *x) {
        uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

void gm_test_fill(void *p, size_t n, uint64_t seed) {
#ifdef GM_TEST_FAKECUDA
        if (gm_fake_device_fill(p, n, seed)) /* the emulator's device memory: only its kernels touch it */
                return;
#endif
        uint64_t *w = p;
        for (size_t i = 0; i < n / 8; i++)
                w[i] = splitmix(&seed);
        for (size_t i = n & ~(size_t) 7; i < n; i++)
                ((uint8_t *) p)[i] = (uint8_t) seed;
}

size_t gm_test_first_nonzero(const void *p, size_t n) {
#ifdef GM_TEST_FAKECUDA
        int on_device = gm_fake_device_verify_byte(p, n, 0);
        if (on_device >= 0)
                return on_device == 1 ? n : 0;
#endif
        for (size_t i = 0; i < n; i++)
                if (((const uint8_t *) p)[i] != 0)
                        return i;
        return n;
}

bool gm_test_verify(const void *p, size_t n, uint64_t seed) {
#ifdef GM_TEST_FAKECUDA
        int on_device = gm_fake_device_verify(p, n, seed);
        if (on_device >= 0)
                return on_device == 1;
#endif
        const uint64_t *w = p;
        for (size_t i = 0; i < n / 8; i++)
                if (w[i] != splitmix(&seed))
                        return false;
        for (size_t i = n & ~(size_t) 7; i < n; i++)
                if (((const uint8_t *) p)[i] != (uint8_t) seed)
                        return false;
        return true;
}

void gm_test_spawn(const char *const *argv, uid_t uid, gm_test_proc_t *ret) {
        int in[2], out[2];
        ck_assert_int_eq(pipe2(in, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                dup2(in[0], STDIN_FILENO);
                dup2(out[1], STDOUT_FILENO);
                const char *args[40];
                size_t n = 0;
                if (uid != 0) {
                        static char ids[2][32];
                        snprintf(ids[0], sizeof(ids[0]), "%u", (unsigned) uid);
                        snprintf(ids[1], sizeof(ids[1]), "%u", (unsigned) uid);
                        args[n++] = "/usr/bin/setpriv";
                        args[n++] = "--reuid";
                        args[n++] = ids[0];
                        args[n++] = "--regid";
                        args[n++] = ids[1];
                        args[n++] = "--clear-groups";
                        args[n++] = "--";
                }
                for (size_t i = 0; argv[i] && n < 39; i++)
                        args[n++] = argv[i];
                args[n] = NULL;
                execv(args[0], (char *const *) args);
                _exit(127);
        }
        close(in[0]);
        close(out[1]);
        ret->pid = pid;
        ret->stdin_fd = in[1];
        ret->stdout_fd = out[0];
}

bool gm_test_proc_read_line(gm_test_proc_t *p, char *buf, size_t len) {
        size_t n = 0;
        while (n + 1 < len) {
                char ch;
                if (read(p->stdout_fd, &ch, 1) != 1)
                        break;
                if (ch == '\n')
                        break;
                buf[n++] = ch;
        }
        buf[n] = '\0';
        return n > 0;
}

int gm_test_proc_finish(gm_test_proc_t *p) {
        if (p->stdin_fd >= 0)
                close(p->stdin_fd);
        p->stdin_fd = -1;
        int status;
        ck_assert_int_eq(waitpid(p->pid, &status, 0), p->pid);
        close(p->stdout_fd);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int gm_test_run_as(char *buf, size_t buf_len, uid_t uid, const char *const *argv) {
        gm_test_proc_t p;
        gm_test_spawn(argv, uid, &p);
        close(p.stdin_fd);
        p.stdin_fd = -1;
        size_t len = 0;
        ssize_t n;
        char discard[4096];
        while ((n = len + 1 < buf_len ? read(p.stdout_fd, buf + len, buf_len - 1 - len)
                                      : read(p.stdout_fd, discard, sizeof(discard))) > 0)
                if (len + 1 < buf_len)
                        len += (size_t) n;
        buf[len] = '\0';
        return gm_test_proc_finish(&p);
}

size_t gm_test_count(const char *text, const char *what) {
        size_t n = 0;
        for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
                n++;
        return n;
}

void *gm_test_own_stats_page(void) {
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        void *page = NULL;
        while (f && fgets(line, sizeof(line), f))
                if (strstr(line, "gpumem-stats") && strstr(line, "rw"))
                        page = (void *) (uintptr_t) strtoull(line, NULL, 16);
        if (f)
                fclose(f);
        return page;
}

int64_t gm_test_client_tag_bytes(const char *gpumemctl, const char *socket_path, pid_t pid, const char *tag) {
        static char out[65536];
        const char *argv[] = {gpumemctl, "-s", socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        char pat[96];
        snprintf(pat, sizeof(pat), "\"pid\": %d,", (int) pid);
        const char *e = strstr(out, pat);
        if (!e)
                return -1;
        const char *tags = strstr(e, "\"tags\": {");
        const char *end = tags ? strchr(tags, '}') : NULL;
        snprintf(pat, sizeof(pat), "\"%s\": ", tag);
        const char *t = tags ? strstr(tags, pat) : NULL;
        return t && t < end ? strtoll(t + strlen(pat), NULL, 10) : 0;
}

static bool all_threads_stopped(pid_t pid) {
        char path[320];
        snprintf(path, sizeof(path), "/proc/%d/task", (int) pid);
        DIR *dir = opendir(path);
        ck_assert_ptr_nonnull(dir);
        bool stopped = true;
        for (struct dirent *t; stopped && (t = readdir(dir));) {
                if (t->d_name[0] == '.')
                        continue;
                char stat[512] = "";
                snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int) pid, t->d_name);
                FILE *f = fopen(path, "re");
                if (!f)
                        continue; /* the thread has exited */
                size_t n = fread(stat, 1, sizeof(stat) - 1, f);
                fclose(f);
                stat[n] = '\0';
                const char *state = strrchr(stat, ')'); /* "TID (COMM) STATE ..." */
                stopped = state && state[1] == ' ' && state[2] == 'T';
        }
        closedir(dir);
        return stopped;
}

void gm_test_stop_process(pid_t pid) {
        ck_assert_int_eq(kill(pid, SIGSTOP), 0);
        for (int tries = 0; !all_threads_stopped(pid); tries++) {
                ck_assert_msg(tries < 3000, "pid %d did not stop", (int) pid);
                usleep(10000);
        }
}
