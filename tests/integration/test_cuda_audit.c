/* Issues #23 and #25 on the emulated cuda backend: how a tenant's give-backs
 * are checked (release_check = verify | trust), and the continuous audit of
 * believed give-backs by each process's NVML figure. The attacks run as a
 * separate process of another uid (this binary again, through setpriv,
 * with "attack" or "keep" as its first argument): "attack" returns memory
 * honestly at that instant, keeps the fds, imports and maps them again;
 * "keep" ends two sessions while it still maps their memory and stays
 * alive. Needs root (to act as another uid) for those cases; reports and
 * skips them otherwise. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_loader.h"
#include "fakecuda_check.h"
#include "gpumem/gpumem.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)
#define ATTACKER 65534
/* The attacker's pieces: five segments of 32 MiB under a 64 MiB quota. */
#define ATTACK_PIECES 5
#define ATTACK_PIECE (32 * MiB)
#define AUDIT_INTERVAL_MS 1000

static gm_test_daemon_t daemon_;
static char pool_path[64];

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static void setup(void) {
        gm_fake_new_pool(pool_path, sizeof(pool_path));
        ck_assert_int_eq(chmod(pool_path, 0666), 0); /* one device for every uid's processes */
        setenv("FAKECUDA_CONTEXT_BYTES", "0", 1);    /* device figures: memory alone */
}

/* Starts gpumemd with `config` ([daemon] keys first), `name`=`value` in its
 * environment only (name may be NULL). */
static void start_daemon(const char *config, const char *const *args, const char *name, const char *value) {
        if (name)
                setenv(name, value, 1);
        gm_test_daemon_start_config(&daemon_, "256M", args, config);
        if (name)
                unsetenv(name);
}

static const gm_cuda_t *cuda(void);

static void finish(void) {
        gm_test_daemon_stop(&daemon_);
        cuda(); /* the emulator loaded here: its device figures */
        ck_assert_msg(gm_fake_device_bytes(0) == 0, "%llu bytes still in use on the device",
                      (unsigned long long) gm_fake_device_bytes(0));
        unlink(pool_path);
}

/* `gpumemctl quota get T --json` (or `quota list` when tenant is NULL). */
static void quota_json(const char *tenant, char *out, size_t len) {
        const char *get[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "quota", "get", tenant, "--json", NULL};
        const char *list[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "quota", "list", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, len, tenant ? get : list), 0);
}

/* A number field of tenant's entry in `quota get --json`. */
static long long tenant_field(const char *tenant, const char *name) {
        char out[4096], key[64];
        quota_json(tenant, out, sizeof(out));
        snprintf(key, sizeof(key), "\"%s\": ", name);
        const char *at = strstr(out, key);
        ck_assert_msg(at != NULL, "no %s: %s", name, out);
        return strtoll(at + strlen(key), NULL, 10);
}

/* Polls a tenant's field until it is `want` or ~10 s pass; the last value. */
static long long wait_field(const char *tenant, const char *name, long long want) {
        long long v = tenant_field(tenant, name);
        for (int i = 0; i < 500 && v != want; i++) {
                usleep(20000);
                v = tenant_field(tenant, name);
        }
        return v;
}

/* GET /metrics from 127.0.0.1:port into out. */
static void fetch_metrics(int port, char *out, size_t len) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(connect(fd, (struct sockaddr *) &a, sizeof(a)), 0);
        static const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
        ck_assert_int_eq(write(fd, req, sizeof(req) - 1), (ssize_t) sizeof(req) - 1);
        size_t n = 0;
        ssize_t r;
        while (n + 1 < len && (r = read(fd, out + n, len - 1 - n)) > 0)
                n += (size_t) r;
        out[n] = '\0';
        close(fd);
}

/* ---- release_check ---- */

/* A new session (`heap`) that allocates `size`, frees it and gives it back
 * (trim): its client, and what the trim released. */
static gpumem_client *connect_and_give_back(gpumem_heap_mode heap, uint64_t size, uint64_t *ret_released) {
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect_heap(daemon_.socket_path, heap, &c), 0);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, size, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_gt(released, 0);
        *ret_released = released;
        return c;
}

/* The daemon's environment for "nothing can check": no NVML at all, or NVML
 * whose process list gives no per-process figure. */
static const char *const unchecked_env[][2] = {
        {"GPUMEM_LIBNVML", "/nonexistent/libnvidia-ml.so.1"},
        {"FAKENVML_NO_PROCESS_MEMORY", "1"},
};

/* A client of tenant `solo` (this uid) gives 8 MiB back where nothing can
 * verify it: with `trust` its charge drops at once and nothing is held
 * unverified; with `verify` it is held charged until the session ends. */
static void check_release(const char *config, bool trusted, gpumem_heap_mode heap) {
        size_t n = sizeof(unchecked_env) / sizeof(unchecked_env[0]);
        for (size_t k = 0; k < n; k++) {
                start_daemon(config, NULL, unchecked_env[k][0], unchecked_env[k][1]);
                uint64_t released;
                gpumem_client *c = connect_and_give_back(heap, 8 * MiB, &released);
                if (trusted) {
                        ck_assert_int_eq(wait_field("solo", "reserved_bytes", 0), 0); /* at once */
                        ck_assert_int_eq(tenant_field("solo", "release_unverified_bytes"), 0);
                        for (int i = 0; i < 500 && gm_fake_device_bytes(0) != 0; i++)
                                usleep(10000);
                        ck_assert_uint_eq(gm_fake_device_bytes(0), 0); /* back to the driver */
                } else {
                        ck_assert_int_eq(wait_field("solo", "release_unverified_bytes", (long long) released),
                                         (long long) released);
                        ck_assert_int_eq(tenant_field("solo", "reserved_bytes"), (long long) released);
                }
                gpumem_disconnect(c);
                ck_assert_int_eq(wait_field("solo", "reserved_bytes", 0), 0);
                finish();
                if (k + 1 < n)
                        setup(); /* the next daemon on a fresh device */
        }
}

static const char trust_config[] = "[tenant solo]\nuser = 0\nrelease_check = trust\n";
/* The default trusts; the tenant's own setting wins. */
static const char verify_config[] = "release_check = trust\n[tenant solo]\nuser = 0\nrelease_check = verify\n";

START_TEST(test_trust_releases_at_once_local) {
        check_release(trust_config, true, GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_trust_releases_at_once_central) {
        check_release(trust_config, true, GPUMEM_HEAP_CENTRAL);
}
END_TEST

START_TEST(test_verify_holds_unverified_local) {
        check_release(verify_config, false, GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_verify_holds_unverified_central) {
        check_release(verify_config, false, GPUMEM_HEAP_CENTRAL);
}
END_TEST

/* The setting shows in `quota list` (text and JSON) and in /metrics, per
 * tenant: its own, or the [daemon] default for the others. */
START_TEST(test_release_check_shown) {
        static const char *const args[] = {"--metrics-listen", "127.0.0.1:19487", NULL};
        start_daemon("release_check = trust\n[tenant solo]\nuser = 0\nrelease_check = verify\n[tenant batch]\n"
                     "user = 65534\nquota = 1G\n",
                     args, NULL, NULL);
        char out[16384];
        quota_json(NULL, out, sizeof(out));
        ck_assert_msg(strstr(out, "\"tenant\": \"solo\"") && strstr(out, "\"release_check\": \"verify\""), "%.500s",
                      out);
        ck_assert_msg(strstr(out, "\"release_check\": \"trust\""), "%.500s", out); /* batch: the default */
        ck_assert_msg(strstr(out, "\"audited_bytes\": 0"), "%.500s", out);
        const char *text[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "quota", "list", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), text), 0);
        ck_assert_msg(strstr(out, "CHECK") && strstr(out, "verify") && strstr(out, "trust"), "%.500s", out);
        static char metrics[1 << 20];
        fetch_metrics(19487, metrics, sizeof(metrics));
        const char *const want[] = {"gpumem_tenant_release_check{device=\"0\"", "tenant=\"solo\",mode=\"verify\"} 1",
                                    "tenant=\"batch\",mode=\"trust\"} 1", "gpumem_audited_bytes{",
                                    "gpumem_audit_checks_total{"};
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
                ck_assert_msg(strstr(metrics, want[i]), "no %s in /metrics: %.300s", want[i], metrics);
        finish();
}
END_TEST

/* ---- the audit ---- */

static const gm_cuda_t *cuda(void) {
        const gm_cuda_t *cu;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        return cu;
}

/* Maps a segment's fd (not consumed) through the driver itself. */
static CUdeviceptr driver_map(int seg_fd, uint64_t size) {
        const gm_cuda_t *cu = cuda();
        CUdeviceptr base;
        ck_assert_int_eq(cu->MemAddressReserve(&base, size, 0, 0, 0), CUDA_SUCCESS);
        CUmemGenericAllocationHandle handle;
        ck_assert_int_eq(cu->MemImportFromShareableHandle(&handle, (void *) (uintptr_t) seg_fd,
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                         CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemMap(base, size, 0, handle, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemRelease(handle), CUDA_SUCCESS); /* the mapping alone holds it now */
        return base;
}

static void driver_unmap(CUdeviceptr base, uint64_t size) {
        const gm_cuda_t *cu = cuda();
        ck_assert_int_eq(cu->MemUnmap(base, size), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemAddressFree(base, size), CUDA_SUCCESS);
}

static bool read_command(char *buf, size_t len) {
        if (!fgets(buf, (int) len, stdin))
                return false;
        buf[strcspn(buf, "\n")] = '\0';
        return true;
}

static const char *attack_socket;
static FILE *to_parent; /* stdout, the parent's pipe; check's own output goes to stderr */

/* One more Grant of 2 MiB on fd: tells the parent "refused CODE TEXT" or
 * "granted" (the piece not mapped). */
static void try_grant(int fd, uint64_t request_id) {
        int seg_fd;
        Gpumem__Envelope *e = gm_test_raw_grant(fd, request_id, 100, 2 * MiB, &seg_fd);
        if (e->body_case == GPUMEM__ENVELOPE__BODY_ERROR)
                fprintf(to_parent, "refused %u %s\n", e->error->code, e->error->message);
        else
                fprintf(to_parent, "granted\n");
        if (seg_fd >= 0)
                close(seg_fd);
        gm_msg_free(e);
}

/* The attacker (uid ATTACKER): each piece granted, mapped, announced,
 * unmapped and returned (believed: it is gone at that instant), its fd kept;
 * then every kept fd imported and mapped again. Prints "mapped BYTES", then
 * on "grant" tries one more Grant and prints its outcome, on "unmap" lets go
 * of everything and prints "unmapped", and ends at "exit". */
static void attack(const char *socket_path) {
        int fd = gm_test_raw_connect(socket_path);
        gm_test_raw_hello_local(fd);
        int kept[ATTACK_PIECES];
        CUdeviceptr bases[ATTACK_PIECES];
        uint64_t id = 2;
        for (int k = 0; k < ATTACK_PIECES; k++) {
                Gpumem__Envelope *e = gm_test_raw_grant(fd, id++, 1 + (uint64_t) k, ATTACK_PIECE, &kept[k]);
                ck_assert_msg(e->body_case == GPUMEM__ENVELOPE__BODY_GRANT_REPLY && kept[k] >= 0, "grant %d: %s", k,
                              e->error ? e->error->message : "?");
                gm_msg_free(e);
                CUdeviceptr base = driver_map(kept[k], ATTACK_PIECE);
                e = gm_test_raw_return_intent(fd, id++);
                ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_OK);
                gm_msg_free(e);
                driver_unmap(base, ATTACK_PIECE);
                gm_test_raw_return_closing(fd, id++, 1 + (uint64_t) k, ATTACK_PIECE, true);
                usleep(50000); /* believed: the charge drops */
        }
        for (int k = 0; k < ATTACK_PIECES; k++)
                bases[k] = driver_map(kept[k], ATTACK_PIECE);
        fprintf(to_parent, "mapped %llu\n", (unsigned long long) (ATTACK_PIECES * ATTACK_PIECE));
        fflush(to_parent);
        char cmd[64];
        while (read_command(cmd, sizeof(cmd))) {
                if (strcmp(cmd, "grant") == 0) {
                        try_grant(fd, id++);
                } else if (strcmp(cmd, "unmap") == 0) {
                        for (int k = 0; k < ATTACK_PIECES; k++) {
                                driver_unmap(bases[k], ATTACK_PIECE);
                                close(kept[k]);
                        }
                        fprintf(to_parent, "unmapped\n");
                } else if (strcmp(cmd, "exit") == 0) {
                        break;
                }
                fflush(to_parent);
        }
        close(fd);
}

/* The process that keeps mapping after its sessions end (uid ATTACKER):
 * session A is granted a piece, maps, announces, unmaps and returns it
 * (believed: the driver's attribution of mappings is confirmed), then is
 * granted another and maps it; session B, on a second connection of the
 * same process, is granted one and maps it; both connections close with
 * the two pieces still mapped (their fds closed: the mappings alone hold
 * them). Prints "kept BYTES", then on "grant" opens a new session, tries a
 * Grant and prints its outcome, and ends at "exit". */
static void keep(const char *socket_path) {
        int a = gm_test_raw_connect(socket_path), seg_fd;
        gm_test_raw_hello_local(a);
        uint64_t id = 2;
        Gpumem__Envelope *e = gm_test_raw_grant(a, id++, 1, ATTACK_PIECE, &seg_fd);
        ck_assert_msg(e->body_case == GPUMEM__ENVELOPE__BODY_GRANT_REPLY && seg_fd >= 0, "grant: %s",
                      e->error ? e->error->message : "?");
        gm_msg_free(e);
        CUdeviceptr returned = driver_map(seg_fd, ATTACK_PIECE);
        e = gm_test_raw_return_intent(a, id++);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_OK);
        gm_msg_free(e);
        driver_unmap(returned, ATTACK_PIECE);
        close(seg_fd);
        gm_test_raw_return_closing(a, id++, 1, ATTACK_PIECE, true);
        usleep(50000); /* believed: the charge drops */
        int b = gm_test_raw_connect(socket_path);
        gm_test_raw_hello_local(b);
        int fds[2] = {a, b};
        for (int k = 0; k < 2; k++) {
                e = gm_test_raw_grant(fds[k], id++, 2 + (uint64_t) k, ATTACK_PIECE, &seg_fd);
                ck_assert_msg(e->body_case == GPUMEM__ENVELOPE__BODY_GRANT_REPLY && seg_fd >= 0, "grant %d: %s", k,
                              e->error ? e->error->message : "?");
                gm_msg_free(e);
                (void) driver_map(seg_fd, ATTACK_PIECE); /* kept: never unmapped */
                close(seg_fd);
        }
        close(a);
        close(b);
        fprintf(to_parent, "kept %llu\n", (unsigned long long) (2 * ATTACK_PIECE));
        fflush(to_parent);
        char cmd[64];
        while (read_command(cmd, sizeof(cmd)) && strcmp(cmd, "exit") != 0) {
                if (strcmp(cmd, "grant") != 0)
                        continue;
                int c = gm_test_raw_connect(socket_path);
                gm_test_raw_hello_local(c);
                try_grant(c, id++);
                close(c);
                fflush(to_parent);
        }
}

static bool keeping; /* the attacker's process runs keep(), not attack() */

START_TEST(test_attack) {
        if (keeping)
                keep(attack_socket);
        else
                attack(attack_socket);
}
END_TEST

/* The attacker's process: the attack as the one case of a suite of its own,
 * run in this process (its failures reported on stderr). */
static int attack_main(const char *socket_path) {
        unsetenv("CK_RUN_SUITE"); /* the parent's choice of its own cases */
        unsetenv("CK_RUN_CASE");
        attack_socket = socket_path;
        int out = dup(STDOUT_FILENO);
        to_parent = out >= 0 ? fdopen(out, "w") : NULL;
        if (!to_parent || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
                return 2;
        return gm_test_run_in_process(test_attack, 120);
}

static void tell(gm_test_proc_t *p, const char *cmd) {
        ck_assert_int_eq(write(p->stdin_fd, cmd, strlen(cmd)), (ssize_t) strlen(cmd));
}

/* Starts gpumemd with `config` for an attack, where this run may act as
 * another uid (root); false (said) where it skips. */
static bool start_attack(const char *test, const char *config) {
        if (geteuid() != 0) {
                fprintf(stderr, "%s: needs root (acts as uid %d), skipped\n", test, ATTACKER);
                return false;
        }
        start_daemon(config, NULL, NULL, NULL);
        cuda(); /* the emulator loaded here: its device figures */
        return true;
}

/* Runs this binary again as the attacker (`mode`, uid ATTACKER) against the
 * daemon; its first line starts with `first`. */
static void spawn_attacker(const char *mode, const char *first, gm_test_proc_t *ret) {
        const char *argv[] = {AUDIT_BIN, mode, daemon_.socket_path, NULL};
        gm_test_spawn(argv, ATTACKER, ret);
        char line[2048];
        ck_assert(gm_test_proc_read_line(ret, line, sizeof(line)));
        ck_assert_msg(strncmp(line, first, strlen(first)) == 0, "attacker: %s", line);
}

/* Lines of the daemon's log that hold `text`. */
static int log_lines(const char *text) {
        char out[64];
        const char *grep[] = {"/bin/grep", "-c", text, daemon_.log_path, NULL};
        gm_test_run(out, sizeof(out), grep); /* exits 1 when there is none */
        return atoi(out);
}

/* Waits until tenant `liar` is charged `bytes` as audited, found within one
 * audit interval (plus the tick and the polling) of `since_ms`. */
static void assert_audited_soon(long long bytes, uint64_t since_ms) {
        long long audited = wait_field("liar", "audited_bytes", bytes);
        uint64_t found_after = now_ms() - since_ms;
        ck_assert_int_eq(audited, bytes);
        ck_assert_msg(found_after <= 3 * AUDIT_INTERVAL_MS, "found after %llu ms", (unsigned long long) found_after);
}

/* While the liar is charged as audited: its next Grant is refused (over
 * its quota; the refusal saying `refusal_says`), and another tenant asking
 * for `too_big` (more than is really free) is refused naming the audited
 * memory, not granted it: no over-commit. The other tenant's client. */
static gpumem_client *assert_contained(gm_test_proc_t *p, const char *refusal_says, uint64_t too_big) {
        char line[2048];
        tell(p, "grant\n");
        ck_assert(gm_test_proc_read_line(p, line, sizeof(line)));
        ck_assert_msg(strncmp(line, "refused 122 ", 12) == 0 && strstr(line, refusal_says), "attacker: %s", line);
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_LOCAL, &c), 0);
        void *big;
        ck_assert_int_eq(gpumem_alloc(c, too_big, 0, &big), -ENOMEM);
        ck_assert_msg(strstr(gpumem_last_error(c), "audited"), "%s", gpumem_last_error(c));
        return c;
}

static const char attack_config[] = "audit_interval_ms = 1000\n[tenant liar]\nuser = 65534\nquota = 64M\n";

/* Issue #25: the attacker maps 160 MiB under its 64 MiB quota, charged 0.
 * Within one audit interval (plus a tick) its tenant is charged the memory
 * as audited, its next grant is refused (over its quota) naming it, and another
 * tenant's request for the whole device is refused instead of over-committing
 * it; once it unmaps, the next audit lifts it all. */
START_TEST(test_reimport_after_return_audited) {
        if (!start_attack("test_reimport_after_return_audited", attack_config))
                return;
        gm_test_proc_t p;
        spawn_attacker("attack", "mapped ", &p);
        char line[2048];
        uint64_t mapped_at = now_ms();
        ck_assert_int_ge(gm_fake_device_bytes(0), (int64_t) (ATTACK_PIECES * ATTACK_PIECE)); /* it is live */

        assert_audited_soon((long long) (ATTACK_PIECES * ATTACK_PIECE), mapped_at);
        ck_assert_int_eq(tenant_field("liar", "reserved_bytes"), 0);
        ck_assert_int_eq(log_lines("of the memory it gave back"), 1); /* one line */

        /* Another tenant asks for the whole daemon: no over-commit. */
        gpumem_client *c = assert_contained(&p, "gave back", 200 * MiB);
        void *small;
        ck_assert_int_eq(gpumem_alloc(c, 64 * MiB, 0, &small), 0); /* what is really free */
        ck_assert_int_eq(gpumem_free(c, small), 0);

        tell(&p, "unmap\n");
        ck_assert(gm_test_proc_read_line(&p, line, sizeof(line)));
        ck_assert_str_eq(line, "unmapped");
        ck_assert_int_eq(wait_field("liar", "audited_bytes", 0), 0);
        tell(&p, "grant\n");
        ck_assert(gm_test_proc_read_line(&p, line, sizeof(line)));
        ck_assert_str_eq(line, "granted");
        tell(&p, "exit\n");
        ck_assert_int_eq(gm_test_proc_finish(&p), 0);
        gpumem_disconnect(c);
        finish();
}
END_TEST

/* Issue #25, the last cuda hole: a process of another uid ends two
 * sessions (one process, two connections) while it still maps 64 MiB they
 * were granted, and stays alive. Within one audit interval (plus a tick)
 * its tenant is charged the memory as audited, once (64 MiB, not once per
 * session), one log line; its next session's Grant is refused (over its
 * quota) and another tenant is not granted the still-live memory; the
 * charge goes once the process exits. */
START_TEST(test_kept_mapping_after_end_audited) {
        if (!start_attack("test_kept_mapping_after_end_audited", attack_config))
                return;
        gm_test_proc_t p;
        spawn_attacker("keep", "kept ", &p);
        uint64_t kept_at = now_ms();
        long long kept = 2 * (long long) ATTACK_PIECE;
        ck_assert_int_eq(wait_field("liar", "reserved_bytes", 0), 0); /* its sessions are over */
        ck_assert_int_ge(gm_fake_device_bytes(0), kept);              /* and the memory is live */

        assert_audited_soon(kept, kept_at);
        usleep(2500 * 1000); /* two more audits: charged once, not once per session */
        ck_assert_int_eq(tenant_field("liar", "audited_bytes"), kept);
        ck_assert_int_eq(log_lines("after its session ended"), 1); /* one line */
        /* Another tenant asks for all that is not audited and more. */
        gpumem_disconnect(assert_contained(&p, "audited", 224 * MiB));

        tell(&p, "exit\n");
        ck_assert_int_eq(gm_test_proc_finish(&p), 0);
        ck_assert_int_eq(wait_field("liar", "audited_bytes", 0), 0);
        finish();
}
END_TEST

/* The bound: with max_audited_processes = 1, a second process that keeps
 * mapping after its sessions end takes the first one's place (the oldest
 * dropped, one log line): only its 64 MiB stay audited. */
START_TEST(test_ended_processes_bounded) {
        if (!start_attack("test_ended_processes_bounded",
                          "audit_interval_ms = 1000\nmax_audited_processes = 1\n[tenant liar]\nuser = 65534\n"
                          "quota = 128M\n"))
                return;
        gm_test_proc_t p[2];
        long long kept = 2 * (long long) ATTACK_PIECE;
        const char *dropped = "no longer audited after its session ended";
        for (int k = 0; k < 2; k++) {
                spawn_attacker("keep", "kept ", &p[k]);
                for (int i = 0; k == 1 && i < 500 && log_lines(dropped) == 0; i++)
                        usleep(20000); /* the second's sessions ended: the first dropped */
                ck_assert_int_eq(wait_field("liar", "audited_bytes", kept), kept);
        }
        ck_assert_int_eq(log_lines(dropped), 1);
        usleep(1500 * 1000); /* another audit: still only the second one's */
        ck_assert_int_eq(tenant_field("liar", "audited_bytes"), kept);
        for (int k = 0; k < 2; k++) {
                tell(&p[k], "exit\n");
                ck_assert_int_eq(gm_test_proc_finish(&p[k]), 0);
        }
        ck_assert_int_eq(wait_field("liar", "audited_bytes", 0), 0);
        finish();
}
END_TEST

/* The other side: an honest process (libgpumem, this one, a `heap`
 * session) that holds device memory of its own (16 MiB by cuMemCreate,
 * before its session), returns memory (confirming the driver's
 * attribution), is handed 32 MiB and disconnects (libgpumem unmaps first),
 * and stays alive: never charged. */
static void check_honest_disconnect(gpumem_heap_mode heap) {
        start_daemon("audit_interval_ms = 1000\n[tenant honest]\nuser = 0\nquota = 64M\n", NULL, NULL, NULL);
        const gm_cuda_t *cu = cuda();
        CUmemAllocationProp prop = gm_cuda_alloc_prop(0, false);
        CUmemGenericAllocationHandle own;
        ck_assert_int_eq(cu->MemCreate(&own, 16 * MiB, &prop, 0), CUDA_SUCCESS); /* outside gpumemd */
        uint64_t released;
        gpumem_client *c = connect_and_give_back(heap, 32 * MiB, &released);
        ck_assert_int_eq(wait_field("honest", "reserved_bytes", 0), 0); /* believed */
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 32 * MiB, 0, &p), 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(wait_field("honest", "reserved_bytes", 0), 0);
        for (int i = 0; i < 30; i++) { /* three audit intervals */
                ck_assert_int_eq(tenant_field("honest", "audited_bytes"), 0);
                usleep(100000);
        }
        ck_assert_int_eq(log_lines("after its session ended"), 0);
        ck_assert_int_eq(cu->MemRelease(own), CUDA_SUCCESS);
        finish();
}

START_TEST(test_honest_disconnect_not_audited_local) {
        check_honest_disconnect(GPUMEM_HEAP_LOCAL);
}
END_TEST

START_TEST(test_honest_disconnect_not_audited_central) {
        check_honest_disconnect(GPUMEM_HEAP_CENTRAL);
}
END_TEST

static Suite *audit_suite(void) {
        Suite *s = suite_create("cuda_audit");
        TCase *tc = tcase_create("release_check");
        tcase_add_checked_fixture(tc, setup, NULL);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_trust_releases_at_once_local);
        tcase_add_test(tc, test_trust_releases_at_once_central);
        tcase_add_test(tc, test_verify_holds_unverified_local);
        tcase_add_test(tc, test_verify_holds_unverified_central);
        tcase_add_test(tc, test_release_check_shown);
        tcase_add_test(tc, test_reimport_after_return_audited);
        tcase_add_test(tc, test_kept_mapping_after_end_audited);
        tcase_add_test(tc, test_ended_processes_bounded);
        tcase_add_test(tc, test_honest_disconnect_not_audited_local);
        tcase_add_test(tc, test_honest_disconnect_not_audited_central);
        suite_add_tcase(s, tc);
        return s;
}

int main(int argc, char **argv) {
        if (argc == 3 && (strcmp(argv[1], "attack") == 0 || strcmp(argv[1], "keep") == 0)) {
                keeping = strcmp(argv[1], "keep") == 0;
                return attack_main(argv[2]);
        }
        SRunner *sr = srunner_create(audit_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
