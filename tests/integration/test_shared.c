/* Shared objects end to end (issue 27): a real gpumemd, real client
 * processes (this binary again, by mode) under this uid and another. A
 * publisher fills and publishes an object and exits; a second process maps
 * it read-only and finds its bytes; a write through that mapping faults
 * (host: SIGSEGV; the emulated driver: the kernel faults); an unadmitted
 * tenant is refused; unpublish and the last close give the memory back.
 * On host and, with GM_TEST_FAKECUDA, on the emulated cuda driver.
 *
 * Client modes (argv[1]), printing one line each:
 *   publish SOCKET NAME SIZE SEED READERS   create, fill from SEED, publish (READERS: comma-separated
 *                                           tenants, "-" for none), print "published VERSION"
 *   read SOCKET NAME VERSION SEED           open, verify, print "ok", "bad" or "refused ERRNO"
 *   hold SOCKET NAME [SEED]                 open, print "ready", close at stdin's EOF (with SEED:
 *                                           verify first, print "ok" or "bad")
 *   write SOCKET NAME                       open and write through the read-only mapping:
 *                                           host dies by SIGSEGV; cuda prints "faulted" or "wrote"
 *   unpublish SOCKET NAME VERSION           print "ok" or "refused ERRNO" */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "testutil.h"
#ifdef GM_TEST_FAKECUDA
#include "fakecuda_check.h"
#endif

#define MiB (1024ull * 1024ull)
#define NOBODY 65534

/* ---- the client modes ---- */

static bool fill(void *p, size_t n, uint64_t seed) {
#ifdef GM_TEST_FAKECUDA
        if (gm_fake_device_fill(p, n, seed))
                return true;
#endif
        gm_test_fill(p, n, seed);
        return true;
}

static bool verify(const void *p, size_t n, uint64_t seed) {
#ifdef GM_TEST_FAKECUDA
        int r = gm_fake_device_verify(p, n, seed);
        if (r >= 0)
                return r == 1;
#endif
        return gm_test_verify(p, n, seed);
}

/* Writes through a read-only mapping: the host's mmap faults (SIGSEGV);
 * the emulator's kernel faults. "faulted" or "wrote". */
static bool on_cuda(void) {
        return strcmp(gm_test_backend(), "cuda") == 0;
}

/* A symbol of the emulator this process loaded (outside a check test:
 * fakecuda_check.h's lookups assert through check), or NULL. */
#ifdef GM_TEST_FAKECUDA
static void *emulator_symbol(const char *name) {
        const char *path = getenv("GPUMEM_LIBCUDA");
        void *lib = on_cuda() && path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
        void *fn = lib ? dlsym(lib, name) : NULL;
        if (lib)
                dlclose(lib);
        return fn;
}

#endif

static int write_read_only(const gpumem_shared *s) {
        void *p = (void *) gpumem_shared_ptr(s);
#ifdef GM_TEST_FAKECUDA
        void *pattern_sym = emulator_symbol("fakecuda_device_pattern"), *usage_sym = emulator_symbol("fakecuda_usage");
        if (pattern_sym && usage_sym) {
                fakecuda_device_pattern_fn pattern;
                fakecuda_usage_fn usage;
                memcpy(&pattern, &pattern_sym, sizeof(pattern));
                memcpy(&usage, &usage_sym, sizeof(usage));
                int r = pattern((uint64_t) (uintptr_t) p, 4096, 99); /* a kernel, waited for */
                fakecuda_usage_t u = {0};
                bool faulted = usage(&u) == 0 && u.faults > 0;
                printf("%s %d\n", faulted ? "faulted" : "wrote", r);
                fflush(stdout);
                _exit(0); /* the context is broken for good: no orderly close */
        }
#endif
        signal(SIGSEGV, SIG_DFL); /* the fault, not a sanitizer's report of it, ends the process */
        memset(p, 0x5a, 4096);    /* host: SIGSEGV here */
        printf("wrote\n");
        return 0;
}

static int client_main(int argc, char **argv) {
        const char *mode = argv[1], *name = argc > 3 ? argv[3] : "";
        gpumem_client *c;
        int r = gpumem_connect(argv[2], &c);
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", gpumem_strerror(r));
                return 1;
        }
        gpumem_shared *s = NULL;
        int status = 0;
        if (strcmp(mode, "publish") == 0 && argc == 7) {
                uint64_t size = strtoull(argv[4], NULL, 0), seed = strtoull(argv[5], NULL, 0), version = 0;
                const char *readers[8] = {NULL};
                char list[256];
                snprintf(list, sizeof(list), "%s", argv[6]);
                size_t n = 0;
                for (char *save, *t = strtok_r(list, ",", &save); t && n < 7; t = strtok_r(NULL, ",", &save))
                        if (strcmp(t, "-") != 0)
                                readers[n++] = t;
                void *p;
                if ((r = gpumem_shared_create(c, name, size, &s, &p)) < 0 || !fill(p, size, seed) ||
                    (r = gpumem_shared_publish(c, s, n ? readers : NULL, "layout", 6, 0, &version)) < 0) {
                        fprintf(stderr, "publish: %s\n", gpumem_last_error(c));
                        status = 1;
                } else {
                        printf("published %llu\n", (unsigned long long) version);
                }
        } else if (strcmp(mode, "read") == 0 && argc == 6) {
                const void *meta;
                size_t meta_len;
                if ((r = gpumem_shared_open(c, name, strtoull(argv[4], NULL, 0), &s)) < 0)
                        printf("refused %d\n", -r);
                else if (gpumem_shared_meta(s, &meta, &meta_len) == 0 && meta_len == 6 &&
                         memcmp(meta, "layout", 6) == 0 &&
                         verify(gpumem_shared_ptr(s), gpumem_shared_size(s), strtoull(argv[5], NULL, 0)))
                        printf("ok\n");
                else
                        printf("bad\n");
        } else if (strcmp(mode, "hold") == 0 && (argc == 4 || argc == 5)) {
                if ((r = gpumem_shared_open(c, name, 0, &s)) < 0) {
                        printf("refused %d\n", -r);
                } else {
                        printf("ready\n");
                        fflush(stdout);
                        char line[16];
                        while (fgets(line, sizeof(line), stdin))
                                ;
                        if (argc == 5) /* still the publisher's bytes (after a daemon restart, say) */
                                printf(verify(gpumem_shared_ptr(s), gpumem_shared_size(s), strtoull(argv[4], NULL, 0))
                                               ? "ok\n"
                                               : "bad\n");
                }
        } else if (strcmp(mode, "write") == 0 && argc == 4) {
                if ((r = gpumem_shared_open(c, name, 0, &s)) < 0) {
                        printf("refused %d\n", -r);
                } else {
                        fflush(stdout);
                        status = write_read_only(s);
                }
        } else if (strcmp(mode, "unpublish") == 0 && argc == 5) {
                r = gpumem_shared_unpublish(c, name, strtoull(argv[4], NULL, 0));
                if (r < 0)
                        printf("refused %d\n", -r);
                else
                        printf("ok\n");
        } else {
                fprintf(stderr, "bad mode\n");
                status = 2;
        }
        fflush(stdout);
        gpumem_shared_close(c, s);
        gpumem_disconnect(c);
        return status;
}

/* ---- the tests ---- */

static gm_test_daemon_t daemon_;
static char self_[512];
#ifdef GM_TEST_FAKECUDA
static char pool_[128];
#endif

static void setup(void) {
#ifdef GM_TEST_FAKECUDA
        if (on_cuda())
                gm_fake_new_pool(pool_, sizeof(pool_));
#endif
        gm_test_daemon_start(&daemon_, "256M", NULL);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_); /* exits 0 only with nothing held */
#ifdef GM_TEST_FAKECUDA
        if (on_cuda())
                gm_fake_assert_device_drained();
#endif
}

/* Runs one client mode as `uid`; its first line in `line`, its exit status returned. */
static int run_client(uid_t uid, char *line, size_t len, const char *const *args) {
        const char *argv[10] = {self_};
        size_t n = 1;
        for (; args[n - 1] && n < 9; n++)
                argv[n] = args[n - 1];
        argv[n] = NULL;
        gm_test_proc_t p;
        gm_test_spawn(argv, uid, &p);
        line[0] = '\0';
        if (!gm_test_proc_read_line(&p, line, len))
                line[0] = '\0';
        return gm_test_proc_finish(&p);
}

static void publish(const char *name, uint64_t size, const char *seed, const char *readers, const char *want) {
        char line[128], sz[32];
        snprintf(sz, sizeof(sz), "%llu", (unsigned long long) size);
        const char *args[] = {"publish", daemon_.socket_path, name, sz, seed, readers, NULL};
        ck_assert_int_eq(run_client(0, line, sizeof(line), args), 0);
        ck_assert_str_eq(line, want);
}

static void read_as(uid_t uid, const char *name, const char *version, const char *seed, const char *want) {
        char line[128];
        const char *args[] = {"read", daemon_.socket_path, name, version, seed, NULL};
        ck_assert_int_eq(run_client(uid, line, sizeof(line), args), 0);
        ck_assert_str_eq(line, want);
}

static void unpublish(uid_t uid, const char *name, const char *version, const char *want) {
        char line[128];
        const char *args[] = {"unpublish", daemon_.socket_path, name, version, NULL};
        ck_assert_int_eq(run_client(uid, line, sizeof(line), args), 0);
        ck_assert_str_eq(line, want);
}

/* A process of `uid` that maps `name` until its stdin closes. */
static void hold_as(uid_t uid, const char *name, gm_test_proc_t *ret) {
        const char *argv[] = {self_, "hold", daemon_.socket_path, name, NULL};
        gm_test_spawn(argv, uid, ret);
        char line[64];
        ck_assert(gm_test_proc_read_line(ret, line, sizeof(line)));
        ck_assert_str_eq(line, "ready");
}

static uint64_t charged(const char *tenant) {
        return gm_test_tenant_charged(daemon_.socket_path, tenant);
}

/* The publisher has exited: the object lives on, charged once to its
 * tenant, and another process reads its bytes; a second version is newer. */
START_TEST(test_read_after_publisher_exit) {
        publish("model/weights", 6 * MiB, "77", "*", "published 1");
        ck_assert_uint_eq(charged("uid:0"), 6 * MiB);
        read_as(0, "model/weights", "0", "77", "ok");
        read_as(NOBODY, "model/weights", "1", "77", "ok"); /* "*": every tenant */
        ck_assert_uint_eq(charged("uid:65534"), 0);
        publish("model/weights", 2 * MiB, "78", "*", "published 2");
        read_as(0, "model/weights", "0", "78", "ok");
        read_as(0, "model/weights", "1", "77", "ok");
        read_as(0, "model/weights", "3", "77", "refused 2"); /* ENOENT */
        unpublish(0, "model/weights", "0", "ok");
        read_as(0, "model/weights", "0", "77", "refused 2");
        ck_assert_uint_eq(charged("uid:0"), 0);
}
END_TEST

/* A write through the read-only mapping faults. */
START_TEST(test_write_faults) {
        publish("ro", 2 * MiB, "5", "-", "published 1");
        char line[128];
        const char *args[] = {"write", daemon_.socket_path, "ro", NULL};
        int status = run_client(0, line, sizeof(line), args);
        if (on_cuda()) {
                ck_assert_int_eq(status, 0);
                ck_assert_msg(strncmp(line, "faulted ", 8) == 0 && strcmp(line, "faulted 0") != 0, "%s", line);
        } else {
                ck_assert_int_eq(status, 128 + SIGSEGV);
        }
        read_as(0, "ro", "0", "5", "ok"); /* the bytes are as published */
        unpublish(0, "ro", "0", "ok");
        ck_assert_uint_eq(charged("uid:0"), 0);
}
END_TEST

/* Readers: none admits the publisher's tenant only; a named tenant is
 * admitted; only the publisher's tenant (or an admin) unpublishes. */
START_TEST(test_unadmitted_tenant_refused) {
        publish("private", 2 * MiB, "9", "-", "published 1");
        read_as(NOBODY, "private", "0", "9", "refused 13"); /* EACCES */
        read_as(0, "private", "0", "9", "ok");
        publish("private", 2 * MiB, "10", "uid:65534", "published 2");
        read_as(NOBODY, "private", "2", "10", "ok");
        read_as(NOBODY, "private", "1", "9", "refused 13");
        unpublish(NOBODY, "private", "0", "refused 1"); /* EPERM */
        unpublish(0, "private", "0", "ok");
        ck_assert_uint_eq(charged("uid:0"), 0);
}
END_TEST

/* Unpublished while mapped: nobody opens it any more, it stays charged
 * until its last mapper closes it, then the memory is back. */
START_TEST(test_unpublish_then_last_close) {
        publish("kv/prefix", 4 * MiB, "3", "*", "published 1");
        gm_test_proc_t holder;
        hold_as(NOBODY, "kv/prefix", &holder);
        unpublish(0, "kv/prefix", "1", "ok");
        read_as(0, "kv/prefix", "0", "3", "refused 2");
        ck_assert_uint_eq(charged("uid:0"), 4 * MiB);
        ck_assert_int_eq(gm_test_proc_finish(&holder), 0);
        for (int i = 0; i < 500 && charged("uid:0"); i++)
                usleep(10000);
        ck_assert_uint_eq(charged("uid:0"), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
}
END_TEST

/* gpumemctl shared as `uid`: its output in out, its exit status returned. */
static int ctl_shared(uid_t uid, char *out, size_t len, const char *sub, const char *arg, bool json) {
        const char *argv[8] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "shared", sub};
        size_t n = 5;
        if (arg)
                argv[n++] = arg;
        if (json)
                argv[n++] = "--json";
        return gm_test_run_as(out, len, uid, argv);
}

/* gpumemctl shared: list shows what the caller may see (an admin all; a
 * tenant what it published or may open), show one object's readers and
 * the sessions that map it, rm unpublishes (the publisher's tenant or an
 * admin). */
START_TEST(test_gpumemctl_shared) {
        publish("w/open", 2 * MiB, "1", "*", "published 1");
        publish("w/private", 4 * MiB, "2", "-", "published 1");
        gm_test_proc_t holder;
        hold_as(NOBODY, "w/open", &holder);
        static char out[16384];
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "list", NULL, true), 0);
        ck_assert_msg(strstr(out, "\"name\": \"w/open\"") && strstr(out, "\"name\": \"w/private\""), "%s", out);
        ck_assert_msg(strstr(out, "\"state\": \"published\""), "%s", out);
        ck_assert_int_eq(ctl_shared(NOBODY, out, sizeof(out), "list", NULL, true), 0);
        ck_assert_msg(strstr(out, "\"name\": \"w/open\"") && !strstr(out, "w/private"), "%s", out);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "list", NULL, false), 0);
        ck_assert_msg(strstr(out, "MAPPERS") && strstr(out, "w/open"), "%s", out);

        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "show", "w/open@1", true), 0);
        char pid[64];
        snprintf(pid, sizeof(pid), "\"pid\": %d, \"tenant\": \"uid:65534\", \"opens\": 1", (int) holder.pid);
        ck_assert_msg(strstr(out, pid) && strstr(out, "\"mappers\": 1") && strstr(out, "\"readers\": [\"*\"]") &&
                              strstr(out, "\"meta_bytes\": 6") && strstr(out, "\"size\": 2097152"),
                      "%s", out);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "show", "w/open", false), 0);
        snprintf(pid, sizeof(pid), "mapped by pid %d", (int) holder.pid);
        ck_assert_msg(strstr(out, pid) && strstr(out, "readers: *"), "%s", out);
        ck_assert_int_eq(ctl_shared(NOBODY, out, sizeof(out), "show", "w/private", false), 1);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "show", "w/open@2", false), 1);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "show", "w/open@x", false), 2);

        ck_assert_int_eq(ctl_shared(NOBODY, out, sizeof(out), "rm", "w/private", false), 1); /* EPERM */
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "rm", "w/private@1", false), 0);
        ck_assert_uint_eq(charged("uid:0"), 2 * MiB);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "rm", "w/open", false), 0);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "show", "w/open", true), 0); /* withdrawn, still mapped */
        ck_assert_msg(strstr(out, "\"state\": \"withdrawn\""), "%s", out);
        ck_assert_int_eq(gm_test_proc_finish(&holder), 0);
        for (int i = 0; i < 500 && charged("uid:0"); i++)
                usleep(10000);
        ck_assert_uint_eq(charged("uid:0"), 0);
        ck_assert_int_eq(ctl_shared(0, out, sizeof(out), "list", NULL, true), 0);
        ck_assert_msg(strstr(out, "\"objects\": []"), "%s", out);
}
END_TEST

/* A snapshot by `uid` (gpumemctl snapshot, --pid unless 0) into file, judged
 * by tests/lib/snapshot_check.py; then whether the Python expression `expr`
 * holds of its shared segments (`sh`: each segment's gpumemd_shared). */
static bool snapshot_holds(uid_t uid, const char *file, const char *format, pid_t pid, const char *expr) {
        char pid_arg[16], out[512];
        snprintf(pid_arg, sizeof(pid_arg), "%d", (int) pid);
        const char *argv[] = {GPUMEMCTL_BIN, "-s",   daemon_.socket_path,  "snapshot", "-o", file,
                              "--format",    format, pid ? "--pid" : NULL, pid_arg,    NULL};
        ck_assert_int_eq(gm_test_run_as(out, sizeof(out), uid, argv), 0);
        char cmd[4096];
        snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s'", GM_PYTHON3, GM_SNAPSHOT_CHECK, file);
        ck_assert_int_eq(system(cmd), 0);
        if (strcmp(format, "json") != 0)
                return true;
        snprintf(cmd, sizeof(cmd),
                 "'%s' -c \"import json,sys; d=json.load(open('%s')); "
                 "sh=[s['gpumemd_shared'] for s in d['segments'] if 'gpumemd_shared' in s]; "
                 "pids=lambda o: sorted(m['pid'] for m in o['mappers']); "
                 "sys.exit(0 if (%s) else 1)\"",
                 GM_PYTHON3, file, expr);
        return system(cmd) == 0;
}

/* A snapshot lists each shared object once, as a segment of its own with its
 * mappers, not once per mapper; a tenant sees only the objects it may open
 * and its own mappers; --pid only what that process maps. */
START_TEST(test_snapshot_shows_shared_once) {
        publish("snap/open", 2 * MiB, "1", "*", "published 1");
        publish("snap/private", 4 * MiB, "2", "-", "published 1");
        gm_test_proc_t theirs, ours;
        hold_as(NOBODY, "snap/open", &theirs);
        hold_as(0, "snap/open", &ours);
        char file[64], expr[512];
        snprintf(file, sizeof(file), "/tmp/gm-shared-snap-%d.json", (int) getpid());
        snprintf(expr, sizeof(expr),
                 "len(sh) == 2 and sorted(o['name'] for o in sh) == ['snap/open', 'snap/private'] and "
                 "[pids(o) for o in sh if o['name'] == 'snap/open'] == [sorted([%d, %d])] and "
                 "[pids(o) for o in sh if o['name'] == 'snap/private'] == [[]] and "
                 "all(o['state'] == 'published' and o['tenant'] == 'uid:0' for o in sh) and "
                 "sorted(s['total_size'] for s in d['segments'] if 'gpumemd_shared' in s) == [%llu, %llu]",
                 (int) theirs.pid, (int) ours.pid, 2 * MiB, 4 * MiB);
        ck_assert_msg(snapshot_holds(0, file, "json", 0, expr), "admin's snapshot");
        unlink(file);
        snprintf(file, sizeof(file), "/tmp/gm-shared-snap-%d.pickle", (int) getpid());
        ck_assert(snapshot_holds(0, file, "pickle", 0, NULL));
        unlink(file);
        snprintf(file, sizeof(file), "/tmp/gm-shared-snap-%d-nobody.json", (int) getpid());
        snprintf(expr, sizeof(expr), "[o['name'] for o in sh] == ['snap/open'] and pids(sh[0]) == [%d]",
                 (int) theirs.pid);
        ck_assert_msg(snapshot_holds(NOBODY, file, "json", 0, expr), "another tenant's snapshot");
        unlink(file);
        snprintf(file, sizeof(file), "/tmp/gm-shared-snap-%d-pid.json", (int) getpid());
        snprintf(expr, sizeof(expr), "[o['name'] for o in sh] == ['snap/open'] and pids(sh[0]) == [%d]",
                 (int) ours.pid);
        ck_assert_msg(snapshot_holds(0, file, "json", ours.pid, expr), "one process's snapshot");
        unlink(file);
        ck_assert_int_eq(gm_test_proc_finish(&theirs), 0);
        ck_assert_int_eq(gm_test_proc_finish(&ours), 0);
        unpublish(0, "snap/open", "0", "ok");
        unpublish(0, "snap/private", "0", "ok");
        for (int i = 0; i < 500 && charged("uid:0"); i++)
                usleep(10000);
        ck_assert_uint_eq(charged("uid:0"), 0);
}
END_TEST

int main(int argc, char **argv) {
        if (argc > 2)
                return client_main(argc, argv);
        ssize_t n = readlink("/proc/self/exe", self_, sizeof(self_) - 1);
        if (n <= 0)
                return 1;
        self_[n] = '\0';
        Suite *s = suite_create("shared");
        TCase *tc = tcase_create("core");
        tcase_set_timeout(tc, 120);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_read_after_publisher_exit);
        tcase_add_test(tc, test_write_faults);
        tcase_add_test(tc, test_unadmitted_tenant_refused);
        tcase_add_test(tc, test_unpublish_then_last_close);
        tcase_add_test(tc, test_gpumemctl_shared);
        tcase_add_test(tc, test_snapshot_shows_shared_once);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
