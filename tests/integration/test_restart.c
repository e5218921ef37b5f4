/* Restarts that lose nothing. This test plays systemd for gpumemd: it owns the
 * control socket (passed as LISTEN_FDS "control", so clients can connect while
 * no daemon runs), it listens on a NOTIFY_SOCKET and keeps the fds the daemon
 * stores there (FDSTORE=1/FDNAME=, FDSTOREREMOVE=1), and after a SIGKILL it
 * starts a new daemon with those fds through LISTEN_FDS/LISTEN_FDNAMES. Client
 * processes must keep every byte, re-attach, and find the ledger as before. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc.h"
#include "msg.h"
#include "testutil.h"
#ifdef GM_TEST_FAKECUDA
#include "fakecuda_check.h"
#endif

#define MAX_STORED 4096

typedef struct fake_systemd {
        char dir[256];
        char control_path[300];
        char notify_path[300];
        char log_path[300];
        char config_path[300];
        int control_fd; /* the listening socket, ours across daemon lifetimes */
        int notify_fd;
        struct {
                char name[64];
                int fd;
        } store[MAX_STORED];
        size_t n_store;
        bool ready, stopping;
        unsigned watchdog_pings, status_lines;
        char last_status[256];
        pid_t daemon;
} fake_systemd_t;

static fake_systemd_t sd;
/* Like systemd, notifications are read as they come (the kernel queues only a
 * few datagrams; a daemon sending more would block). */
static pthread_t pump_thread;
static pthread_mutex_t pump_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool pump_stop;

/* Reads every pending notification; keeps or drops stored fds. Caller holds pump_lock. */
static void sd_pump_locked(void) {
        for (;;) {
                char buf[4096];
                char cbuf[CMSG_SPACE(sizeof(int) * 16) + CMSG_SPACE(sizeof(struct ucred))];
                struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
                struct msghdr mh = {
                        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
                ssize_t n = recvmsg(sd.notify_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                if (n < 0)
                        return;
                buf[n] = '\0';
                int fds[16];
                size_t n_fds = 0;
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
                        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                                n_fds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                                memcpy(fds, CMSG_DATA(cm), n_fds * sizeof(int));
                        }
                char name[64] = "stored";
                const char *fdname = strstr(buf, "FDNAME=");
                if (fdname)
                        sscanf(fdname + 7, "%63[^\n]", name);
                if (strstr(buf, "READY=1"))
                        sd.ready = true;
                if (strstr(buf, "STOPPING=1"))
                        sd.stopping = true;
                if (strstr(buf, "WATCHDOG=1"))
                        sd.watchdog_pings++;
                const char *status = strstr(buf, "STATUS=");
                if (status) {
                        sd.status_lines++;
                        sscanf(status + 7, "%255[^\n]", sd.last_status);
                }
                if (strstr(buf, "FDSTOREREMOVE=1")) {
                        for (size_t i = 0; i < sd.n_store;)
                                if (strcmp(sd.store[i].name, name) == 0) {
                                        close(sd.store[i].fd);
                                        sd.store[i] = sd.store[--sd.n_store];
                                } else {
                                        i++;
                                }
                }
                if (strstr(buf, "FDSTORE=1")) {
                        for (size_t i = 0; i < n_fds; i++) {
                                ck_assert_uint_lt(sd.n_store, MAX_STORED);
                                snprintf(sd.store[sd.n_store].name, sizeof(sd.store[0].name), "%s", name);
                                sd.store[sd.n_store++].fd = fds[i];
                        }
                        n_fds = 0;
                }
                gm_close_fds(fds, n_fds);
        }
}

static void sd_pump(void) {
        pthread_mutex_lock(&pump_lock);
        sd_pump_locked();
        pthread_mutex_unlock(&pump_lock);
}

static size_t stored_count(void) {
        pthread_mutex_lock(&pump_lock);
        size_t n = sd.n_store;
        pthread_mutex_unlock(&pump_lock);
        return n;
}

static bool sd_is_ready(void) {
        pthread_mutex_lock(&pump_lock);
        bool ready = sd.ready;
        pthread_mutex_unlock(&pump_lock);
        return ready;
}

static void *pump_main(void *arg) {
        while (!pump_stop) {
                struct pollfd pfd = {.fd = sd.notify_fd, .events = POLLIN};
                if (poll(&pfd, 1, 10) > 0)
                        sd_pump();
        }
        return NULL;
}

static void sd_setup(void) {
        memset(&sd, 0, sizeof(sd));
        snprintf(sd.dir, sizeof(sd.dir), "/tmp/gpumemd-restart-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(sd.dir));
        snprintf(sd.control_path, sizeof(sd.control_path), "%s/gpu0.sock", sd.dir);
        snprintf(sd.notify_path, sizeof(sd.notify_path), "%s/notify", sd.dir);
        snprintf(sd.log_path, sizeof(sd.log_path), "%s/gpumemd.log", sd.dir);
        snprintf(sd.config_path, sizeof(sd.config_path), "%s/gpumemd.conf", sd.dir);
        FILE *f = fopen(sd.config_path, "we");
        fprintf(f, "[daemon]\nstate_dir = %s/state\nreattach_grace_ms = 3000\n", sd.dir);
        fclose(f);
        ck_assert_int_eq(gm_ipc_listen(sd.control_path, 0666, 64, &sd.control_fd), 0);
        sd.notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(sd.notify_fd, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        memcpy(a.sun_path, sd.notify_path, strlen(sd.notify_path) + 1);
        ck_assert_int_eq(bind(sd.notify_fd, (struct sockaddr *) &a, sizeof(a)), 0);
        int one = 1;
        setsockopt(sd.notify_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
        pump_stop = false;
        ck_assert_int_eq(pthread_create(&pump_thread, NULL, pump_main, NULL), 0);
}

/* Starts gpumemd as systemd would: control socket and stored fds from 3 up. */
static void sd_start_daemon(const char *alloc_conf, bool notify) {
        pthread_mutex_lock(&pump_lock);
        sd_pump_locked();
        sd.ready = false;
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int n = 1 + (int) sd.n_store;
                int *high = calloc((size_t) n, sizeof(int));
                high[0] = fcntl(sd.control_fd, F_DUPFD, 1000);
                for (size_t i = 0; i < sd.n_store; i++)
                        high[i + 1] = fcntl(sd.store[i].fd, F_DUPFD, 1000);
                size_t names_len = 16 + sd.n_store * 64;
                char *names = calloc(1, names_len);
                strcat(names, "control");
                for (int i = 0; i < n; i++) {
                        dup2(high[i], 3 + i); /* dup2 clears FD_CLOEXEC */
                        if (i > 0) {
                                strcat(names, ":");
                                strcat(names, sd.store[i - 1].name);
                        }
                }
                char count[16], pidbuf[16];
                snprintf(count, sizeof(count), "%d", n);
                snprintf(pidbuf, sizeof(pidbuf), "%d", (int) getpid());
                setenv("LISTEN_FDS", count, 1);
                setenv("LISTEN_PID", pidbuf, 1);
                setenv("LISTEN_FDNAMES", names, 1);
                setenv("WATCHDOG_USEC", "200000", 1); /* pings every 100 ms */
                setenv("WATCHDOG_PID", pidbuf, 1);
                if (notify)
                        setenv("NOTIFY_SOCKET", sd.notify_path, 1);
                else
                        unsetenv("NOTIFY_SOCKET");
                int log = open(sd.log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
                dup2(log, STDERR_FILENO);
                execl(GPUMEMD_BIN, GPUMEMD_BIN, "--backend", gm_test_backend(), "--socket", sd.control_path,
                      "--capacity", "512M", "--config", sd.config_path, "--metrics-listen", "none", "-v",
                      "--alloc-conf", alloc_conf, (char *) NULL);
                _exit(127);
        }
        pthread_mutex_unlock(&pump_lock);
        sd.daemon = pid;
        if (!notify) {
                /* No readiness message: a request on the (queued) socket answers once it serves. */
                (void) gm_test_device_stat(sd.control_path, "segment.all.current");
                return;
        }
        for (int i = 0; i < 1000 && !sd_is_ready(); i++) {
                usleep(10000);
                int status;
                if (waitpid(pid, &status, WNOHANG) == pid) {
                        char cmd[400];
                        snprintf(cmd, sizeof(cmd), "tail -n 20 %s >&2", sd.log_path);
                        gm_test_shell(cmd);
                        ck_abort_msg("gpumemd exited during start (status %d)", status);
                }
        }
        ck_assert_msg(sd_is_ready(), "no READY=1 from gpumemd");
}

static void sd_teardown(void) {
        int status = 0;
        if (sd.daemon > 0) {
                kill(sd.daemon, SIGTERM);
                waitpid(sd.daemon, &status, 0);
        }
        pump_stop = true;
        pthread_join(pump_thread, NULL);
        for (size_t i = 0; i < sd.n_store; i++)
                close(sd.store[i].fd);
        close(sd.control_fd);
        close(sd.notify_fd);
#ifdef GM_TEST_FAKECUDA
        gm_fake_assert_device_drained(); /* emulated device: the daemons and clients left nothing */
#endif
        char cmd[400];
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                snprintf(cmd, sizeof(cmd), "tail -n 20 %s >&2", sd.log_path);
                gm_test_shell(cmd);
        }
        snprintf(cmd, sizeof(cmd), "rm -rf %s", sd.dir);
        gm_test_shell(cmd);
        /* Every test is a leak test: the daemon exits 0 only with nothing held. */
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gpumemd exit status %d", status);
}

static int64_t device_stat(const char *name) {
        return gm_test_device_stat(sd.control_path, name);
}

/* Stats that must be equal across a restart: the ledger. */
static const char *const LEDGER[] = {
        "allocated_bytes.all.current", "reserved_bytes.all.current",       "active_bytes.all.current",
        "requested_bytes.all.current", "allocation.all.current",           "segment.all.current",
        "inactive_split.all.current",  "inactive_split_bytes.all.current",
};
#define N_LEDGER (sizeof(LEDGER) / sizeof(LEDGER[0]))

static void restart_keeps_everything(const char *alloc_conf, bool with_fd_store) {
        sd_start_daemon(alloc_conf, with_fd_store);
        enum { N = 3 };
        gm_test_proc_t clients[N];
        char ready[N][128], line[128];
        for (int i = 0; i < N; i++) {
                char seed[16];
                snprintf(seed, sizeof(seed), "%d", 1000 * (i + 1));
                const char *argv[] = {GM_TEST_CLIENT, sd.control_path, "survive", seed, "0", NULL};
                gm_test_spawn(argv, 0, &clients[i]);
                ck_assert(gm_test_proc_read_line(&clients[i], ready[i], sizeof(ready[i])));
                ck_assert_msg(strncmp(ready[i], "ready ", 6) == 0, "client: %s", ready[i]);
        }
        int64_t before[N_LEDGER];
        for (size_t k = 0; k < N_LEDGER; k++)
                before[k] = device_stat(LEDGER[k]);
        ck_assert_int_gt(before[1], 0);
        sd_pump();
        /* The store holds exactly the reserved memory: one fd per piece. */
        uint64_t stored_bytes = 0;
        pthread_mutex_lock(&pump_lock);
        for (size_t i = 0; i < sd.n_store; i++) {
                struct stat st;
                ck_assert_int_eq(fstat(sd.store[i].fd, &st), 0);
                stored_bytes += (uint64_t) st.st_size;
        }
        pthread_mutex_unlock(&pump_lock);
        ck_assert_uint_eq(stored_bytes, with_fd_store ? (uint64_t) before[1] : 0);

        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        ck_assert_int_eq(waitpid(sd.daemon, NULL, 0), sd.daemon);
        sd.daemon = 0;
        sd_start_daemon(alloc_conf, with_fd_store);

        /* Every client re-attaches on its own; the ledger comes back equal. */
        bool equal = false;
        for (int tries = 0; tries < 1000 && !equal; tries++) {
                equal = true;
                for (size_t k = 0; k < N_LEDGER && equal; k++)
                        equal = device_stat(LEDGER[k]) == before[k];
                if (!equal)
                        usleep(10000);
        }
        for (size_t k = 0; k < N_LEDGER; k++)
                ck_assert_msg(device_stat(LEDGER[k]) == before[k], "%s: %lld after, %lld before", LEDGER[k],
                              (long long) device_stat(LEDGER[k]), (long long) before[k]);
        for (int i = 0; i < N; i++) {
                ck_assert_int_eq(write(clients[i].stdin_fd, "check\n", 6), 6);
                ck_assert(gm_test_proc_read_line(&clients[i], line, sizeof(line)));
                ck_assert_msg(strcmp(line + 6, ready[i] + 6) == 0, "client %d: %s, before: %s", i, line, ready[i]);
                ck_assert(gm_test_proc_read_line(&clients[i], line, sizeof(line)));
                ck_assert_str_eq(line, "ok"); /* data intact, and it goes on allocating */
        }
        for (int i = 0; i < N; i++)
                ck_assert_int_eq(gm_test_proc_finish(&clients[i]), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", 0), 0);
        usleep(100000);
        sd_pump();
        ck_assert_uint_eq(stored_count(), 0); /* everything released left the store */
}

#ifdef GM_TEST_FAKECUDA
/* Page reuse on the cuda backend: a central client's fence marks belong to
 * the daemon that asked for them. A client holding a mark (its event still
 * pending) across a restart forgets it: the new daemon never asked for that
 * number and would end the session on hearing it complete. */
START_TEST(test_fence_marks_forgotten_across_restart) {
        if (strcmp(gm_test_backend(), "cuda") != 0)
                return;
        const char *conf = "expandable_segments:True,gpumemd_page_reuse:True";
        sd_start_daemon(conf, true);
        char hold[400];
        snprintf(hold, sizeof(hold), "%s/hold-events", sd.dir);
        int fd = open(hold, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        setenv("FAKECUDA_HOLD_EVENTS", hold, 1); /* the client's events only */
        const char *argv[] = {GM_TEST_CLIENT, sd.control_path, "fenced", "9", "0", NULL};
        gm_test_proc_t client;
        gm_test_spawn(argv, 0, &client);
        unsetenv("FAKECUDA_HOLD_EVENTS");
        char line[128];
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        ck_assert_str_eq(line, "ready");
        int64_t total = device_stat("reserved_bytes.all.current");
        ck_assert_int_eq(total, 64 << 20); /* the fence is pending: 32 MiB were new */

        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        ck_assert_int_eq(waitpid(sd.daemon, NULL, 0), sd.daemon);
        sd.daemon = 0;
        sd_start_daemon(conf, true);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", total), total);
        unlink(hold); /* the old mark's event completes */
        for (int k = 0; k < 3; k++) {
                ck_assert_int_eq(write(client.stdin_fd, "alloc\n", 6), 6);
                ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
                ck_assert_str_eq(line, "ok");
        }
        /* The new daemon's own fence after a's free moved its pages: 3 x 32 MiB
         * more took 8 pages from the hole and 40 new ones. */
        ck_assert_int_eq(device_stat("reserved_bytes.all.current"), total + (80 << 20));
        ck_assert_int_eq(gm_test_proc_finish(&client), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", 0), 0);
}
END_TEST
#endif

START_TEST(test_sigkill_with_fd_store) {
        restart_keeps_everything("expandable_segments:False", true);
        /* The loop pinged the watchdog and reported live figures all along. */
        pthread_mutex_lock(&pump_lock);
        ck_assert_uint_gt(sd.watchdog_pings, 2);
        ck_assert_uint_gt(sd.status_lines, 2);
        ck_assert_msg(strstr(sd.last_status, "sessions") && strstr(sd.last_status, "in use"), "STATUS=%s",
                      sd.last_status);
        pthread_mutex_unlock(&pump_lock);
}
END_TEST

START_TEST(test_sigkill_with_fd_store_expandable) {
        restart_keeps_everything("expandable_segments:True", true);
}
END_TEST

START_TEST(test_sigkill_without_fd_store) {
        restart_keeps_everything("expandable_segments:False", false);
}
END_TEST

/* Page reuse gives both pools 2 MiB pages, so a restart cannot tell a
 * segment's pool from its pages: the ledger keeps it. A client holds a
 * small-pool segment and a large-pool one (one page moved into it from the
 * small pool, a freed block cached in it); after a SIGKILL and restart its
 * stats and snapshot show the same pools, the device's per-pool figures are
 * back, and a large request lands in the cached block of the large-pool
 * segment (restored in the small pool, it would map a new segment). */
static void restart_keeps_pools(bool with_fd_store) {
        static const char *const POOLS[] = {"reserved_bytes.large_pool.current", "reserved_bytes.small_pool.current",
                                            "segment.large_pool.current", "segment.small_pool.current"};
        const char *conf = "expandable_segments:True,gpumemd_page_reuse:True";
        sd_start_daemon(conf, with_fd_store);
        const char *argv[] = {GM_TEST_CLIENT, sd.control_path, "pools", "41", "0", NULL};
        gm_test_proc_t client;
        gm_test_spawn(argv, 0, &client);
        char ready[128], line[128];
        ck_assert(gm_test_proc_read_line(&client, ready, sizeof(ready)));
        long long large, small, n_large, n_small;
        unsigned snap_large, snap_small;
        ck_assert_msg(sscanf(ready, "ready %lld %lld %lld %lld snapshot %u %u", &large, &small, &n_large, &n_small,
                             &snap_large, &snap_small) == 6,
                      "client: %s", ready);
        /* Six pages in the large pool, one of them moved from the small pool,
         * which keeps one (on cuda the first large request asks for the
         * fence after the small blocks' frees and the second one moves the
         * page). */
        ck_assert_msg(large == 12 << 20 && small == 2 << 20 && snap_large > 0 && snap_small > 0, "client: %s", ready);
        int64_t total = device_stat("reserved_bytes.all.current"), before[4];
        for (size_t k = 0; k < 4; k++)
                before[k] = device_stat(POOLS[k]);
        ck_assert_int_eq(total, large + small);

        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        ck_assert_int_eq(waitpid(sd.daemon, NULL, 0), sd.daemon);
        sd.daemon = 0;
        sd_start_daemon(conf, with_fd_store);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", total), total);
        for (size_t k = 0; k < 4; k++)
                ck_assert_msg(device_stat(POOLS[k]) == before[k], "device %s: %lld after, %lld before", POOLS[k],
                              (long long) device_stat(POOLS[k]), (long long) before[k]);
        ck_assert_int_eq(write(client.stdin_fd, "check\n", 6), 6);
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        ck_assert_msg(strncmp(line, "pools ", 6) == 0 && strcmp(line + 6, ready + 6) == 0, "after: %s, before: %s",
                      line, ready);
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        ck_assert_str_eq(line, "reused intact");
        ck_assert_int_eq(gm_test_proc_finish(&client), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", 0), 0);
        usleep(100000);
        sd_pump();
        ck_assert_uint_eq(stored_count(), 0);
}

START_TEST(test_page_reuse_pools_with_fd_store) {
        restart_keeps_pools(true);
}
END_TEST

START_TEST(test_page_reuse_pools_without_fd_store) {
        restart_keeps_pools(false);
}
END_TEST

/* Stored segments whose client never comes back are released after the grace. */
START_TEST(test_unclaimed_segments_released_after_grace) {
        sd_start_daemon("expandable_segments:False", true);
        const char *argv[] = {GM_TEST_CLIENT, sd.control_path, "survive", "5", "0", NULL};
        gm_test_proc_t client;
        gm_test_spawn(argv, 0, &client);
        char line[128];
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        sd_pump();
        size_t stored = stored_count();
        ck_assert_uint_gt(stored, 0);
        /* The client is stopped first, so it cannot reconnect (its queued
         * Hello would re-attach it) between the two deaths. */
        gm_test_stop_process(client.pid);
        int status;
        ck_assert_int_eq(waitpid(client.pid, &status, WUNTRACED), client.pid);
        ck_assert(WIFSTOPPED(status));
        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        waitpid(sd.daemon, NULL, 0);
        ck_assert_int_eq(kill(client.pid, SIGKILL), 0); /* the client dies too */
        gm_test_proc_finish(&client);
        sd.daemon = 0;
        sd_start_daemon("expandable_segments:False", true);
        /* Adopted and held for the grace period (3 s here), then released. */
        ck_assert_int_gt(device_stat("reserved_bytes.all.current") + 1, 0);
        for (int i = 0; i < 1000 && stored_count() > 0; i++) {
                usleep(10000);
                sd_pump();
        }
        ck_assert_uint_eq(stored_count(), 0);
        FILE *f = fopen(sd.log_path, "re");
        char log[16384];
        size_t n = fread(log, 1, sizeof(log) - 1, f);
        log[n] = '\0';
        fclose(f);
        ck_assert_msg(strstr(log, "adopted") && strstr(log, "no client re-attached"), "log: %s", log);
}
END_TEST

/* One line of a shared-object client (test_shared's modes) as `uid`. */
static void shared_client(uid_t uid, const char *const *args, const char *want) {
        const char *argv[10] = {SHARED_BIN};
        for (size_t i = 0; args[i] && i < 8; i++)
                argv[i + 1] = args[i];
        gm_test_proc_t p;
        gm_test_spawn(argv, uid, &p);
        char line[128] = "";
        ck_assert(gm_test_proc_read_line(&p, line, sizeof(line)));
        ck_assert_int_eq(gm_test_proc_finish(&p), 0);
        ck_assert_str_eq(line, want);
}

/* Issue 27: a published shared object outlives its publisher and a
 * SIGKILL of the daemon (its fd in the store, its entry and side file in
 * the journal): the next daemon adopts it as a published object, a new
 * process reads the publisher's bytes, and its unpublish gives the memory
 * back and takes it out of the store. */
START_TEST(test_shared_object_survives_sigkill) {
        sd_start_daemon("expandable_segments:False", true);
        const char *publish[] = {"publish", sd.control_path, "model/weights", "4194304", "41", "*", NULL};
        shared_client(0, publish, "published 1");
        sd_pump();
        ck_assert_uint_eq(stored_count(), 1);
        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        ck_assert_int_eq(waitpid(sd.daemon, NULL, 0), sd.daemon);
        sd.daemon = 0;
        sd_start_daemon("expandable_segments:False", true);
        const char *read[] = {"read", sd.control_path, "model/weights", "1", "41", NULL};
        shared_client(0, read, "ok");
        ck_assert_uint_eq(gm_test_tenant_charged(sd.control_path, "uid:0"), 4u << 20);
        publish[4] = "42"; /* the next version numbers on from the journal's */
        shared_client(0, publish, "published 2");
        const char *unpublish[] = {"unpublish", sd.control_path, "model/weights", "0", NULL};
        shared_client(0, unpublish, "ok");
        /* Version 1 was adopted: until the re-attach window (3 s here) ends a
         * process that maps it may still come back, so it is kept till then. */
        uint64_t charged = 1;
        for (int i = 0; i < 1000 && (charged = gm_test_tenant_charged(sd.control_path, "uid:0")) != 0; i++)
                usleep(10000);
        ck_assert_uint_eq(charged, 0);
        usleep(100000);
        sd_pump();
        ck_assert_uint_eq(stored_count(), 0);
}
END_TEST

static bool log_says_reattached(pid_t pid);

/* `gpumemctl clients --json`'s bytes of pool `tag` of process `pid`. */
static int64_t clients_tag_bytes(pid_t pid, const char *tag) {
        return gm_test_client_tag_bytes(GPUMEMCTL_BIN, sd.control_path, pid, tag);
}

/* How many blocks and trace entries a `--category tag` snapshot puts in pool `tag`. */
static size_t snapshot_category_count(const char *tag) {
        char file[400], out[4096], want[64];
        snprintf(file, sizeof(file), "%s/tags.json", sd.dir);
        const char *argv[] = {GPUMEMCTL_BIN, "-s",   sd.control_path, "snapshot", "-o", file,
                              "--format",    "json", "--category",    "tag",      NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        FILE *f = fopen(file, "re");
        ck_assert_ptr_nonnull(f);
        static char json[1 << 20];
        size_t n = fread(json, 1, sizeof(json) - 1, f);
        fclose(f);
        json[n] = '\0';
        snprintf(want, sizeof(want), "\"category\":\"%s\"", tag);
        return gm_test_count(json, want);
}

/* Issue 27: a session's tagged pools survive a SIGKILL and restart, in
 * either heap mode (GPUMEM_HEAP): the ledger carries each piece's pool, so
 * the new daemon books the same bytes per pool (gm_broker_check adds them
 * up in debug builds), the snapshot names the same pools, and the
 * tenant's tag_quota still counts the pool's restored bytes. */
static void restart_keeps_tags(bool with_fd_store) {
        FILE *f = fopen(sd.config_path, "ae");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "[tenant uid:%u]\ntag_quota = kv:24M\n", (unsigned) getuid());
        fclose(f);
        sd_start_daemon("expandable_segments:False", with_fd_store);
        const char *argv[] = {GM_TEST_CLIENT, sd.control_path, "tagged", "77", "0", NULL};
        gm_test_proc_t client;
        gm_test_spawn(argv, 0, &client);
        char line[128];
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        ck_assert_str_eq(line, "ready");
        const char *const pools[] = {"kv", "weights", ""};
        int64_t before[3];
        for (int i = 0; i < 3; i++)
                before[i] = clients_tag_bytes(client.pid, pools[i]);
        ck_assert_int_ge(before[0], 13 << 20);
        ck_assert_int_ge(before[1], 4 << 20);
        size_t snap_kv = snapshot_category_count("kv"), snap_weights = snapshot_category_count("weights");
        ck_assert_uint_ge(snap_kv, 2);
        ck_assert_uint_ge(snap_weights, 1);
        int64_t total = device_stat("reserved_bytes.all.current");

        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        ck_assert_int_eq(waitpid(sd.daemon, NULL, 0), sd.daemon);
        sd.daemon = 0;
        sd_start_daemon("expandable_segments:False", with_fd_store);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", total), total);
        for (int i = 0; i < 1000 && !log_says_reattached(client.pid); i++)
                usleep(10000);
        ck_assert_msg(log_says_reattached(client.pid), "the client did not re-attach");
        for (int i = 0; i < 3; i++)
                ck_assert_msg(clients_tag_bytes(client.pid, pools[i]) == before[i],
                              "pool '%s': %lld bytes after the restart, %lld before", pools[i],
                              (long long) clients_tag_bytes(client.pid, pools[i]), (long long) before[i]);
        ck_assert_uint_eq(snapshot_category_count("kv"), snap_kv);
        ck_assert_uint_eq(snapshot_category_count("weights"), snap_weights);
        /* 13 MiB of "kv" held: 12 more pass the 24 MiB tag_quota */
        ck_assert_int_eq(write(client.stdin_fd, "check\n", 6), 6);
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        ck_assert_msg(strcmp(line, "kv refused 122") == 0, "after the restart: %s", line); /* EDQUOT */
        ck_assert(gm_test_proc_read_line(&client, line, sizeof(line)));
        ck_assert_str_eq(line, "intact");
        ck_assert_int_eq(gm_test_proc_finish(&client), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(sd.control_path, "reserved_bytes.all.current", 0), 0);
}

START_TEST(test_tags_with_fd_store) {
        restart_keeps_tags(true);
}
END_TEST

START_TEST(test_tags_without_fd_store) {
        restart_keeps_tags(false);
}
END_TEST

/* Whether the daemon's log says pid re-attached its session. */
static bool log_says_reattached(pid_t pid) {
        FILE *f = fopen(sd.log_path, "re");
        if (!f)
                return false;
        static char log[1 << 16];
        size_t n = fread(log, 1, sizeof(log) - 1, f);
        log[n] = '\0';
        fclose(f);
        char want[64];
        snprintf(want, sizeof(want), "(pid %d) re-attached", (int) pid);
        return strstr(log, want) != NULL;
}

/* Issue 27: a process that maps a shared object across a daemon SIGKILL
 * re-attaches as its mapper: an unpublish on the new daemon keeps the
 * memory (charged to the publisher's tenant, past the re-attach window
 * too) until that process closes it, and the books add up all along
 * (gm_broker_check after every request in debug builds, and at exit). */
START_TEST(test_shared_object_mapped_across_restart) {
        sd_start_daemon("expandable_segments:False", true);
        const char *publish[] = {"publish", sd.control_path, "model/weights", "4194304", "41", "*", NULL};
        shared_client(0, publish, "published 1");
        const char *hold[] = {SHARED_BIN, "hold", sd.control_path, "model/weights", "41", NULL};
        gm_test_proc_t reader;
        gm_test_spawn(hold, 0, &reader);
        char line[128] = "";
        ck_assert(gm_test_proc_read_line(&reader, line, sizeof(line)));
        ck_assert_str_eq(line, "ready");
        sd_pump();
        ck_assert_int_eq(kill(sd.daemon, SIGKILL), 0);
        ck_assert_int_eq(waitpid(sd.daemon, NULL, 0), sd.daemon);
        sd.daemon = 0;
        sd_start_daemon("expandable_segments:False", true);
        for (int i = 0; i < 1000 && !log_says_reattached(reader.pid); i++)
                usleep(10000);
        ck_assert_msg(log_says_reattached(reader.pid), "the reader did not re-attach");
        const char *unpublish[] = {"unpublish", sd.control_path, "model/weights", "0", NULL};
        shared_client(0, unpublish, "ok");
        ck_assert_uint_eq(gm_test_tenant_charged(sd.control_path, "uid:0"), 4u << 20);
        usleep(3500000); /* past the re-attach window: the reader is a known mapper */
        ck_assert_uint_eq(gm_test_tenant_charged(sd.control_path, "uid:0"), 4u << 20);
        sd_pump();
        ck_assert_uint_eq(stored_count(), 0); /* withdrawn: out of the store, kept for its mapper */
        close(reader.stdin_fd);
        reader.stdin_fd = -1;
        ck_assert(gm_test_proc_read_line(&reader, line, sizeof(line)));
        ck_assert_str_eq(line, "ok");
        ck_assert_int_eq(gm_test_proc_finish(&reader), 0);
        ck_assert_uint_eq(gm_test_tenant_charged(sd.control_path, "uid:0"), 0);
        const char *read[] = {"read", sd.control_path, "model/weights", "1", "41", NULL};
        shared_client(0, read, "refused 2");
}
END_TEST

int main(void) {
        Suite *s = suite_create("restart");
        TCase *tc = tcase_create("restart");
        tcase_add_checked_fixture(tc, sd_setup, sd_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_sigkill_with_fd_store);
        tcase_add_test(tc, test_sigkill_with_fd_store_expandable);
#ifdef GM_TEST_FAKECUDA
        tcase_add_test(tc, test_fence_marks_forgotten_across_restart);
#endif
        tcase_add_test(tc, test_sigkill_without_fd_store);
        tcase_add_test(tc, test_unclaimed_segments_released_after_grace);
        tcase_add_test(tc, test_page_reuse_pools_with_fd_store);
        tcase_add_test(tc, test_page_reuse_pools_without_fd_store);
        tcase_add_test(tc, test_shared_object_survives_sigkill);
        tcase_add_test(tc, test_shared_object_mapped_across_restart);
        suite_add_tcase(s, tc);
        TCase *tags = tcase_create("tags"); /* CK_RUN_CASE=tags runs these alone */
        tcase_add_checked_fixture(tags, sd_setup, sd_teardown);
        tcase_set_timeout(tags, 120);
        tcase_add_test(tags, test_tags_with_fd_store);
        tcase_add_test(tags, test_tags_without_fd_store);
        suite_add_tcase(s, tags);
        return gm_test_run_suite(s);
}
