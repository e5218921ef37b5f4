/* Check suite for the cuda backend (backend/backend_cuda.c), the cuda mapper
 * (client/mapper_cuda.c) and their loader, run over the emulated driver
 * (tests/lib/fakecuda, selected by GPUMEM_LIBCUDA). Each test runs in its own
 * forked process (CK_FORK), so each loads the driver afresh and may set the
 * FAKECUDA_* configuration before its first CUDA call; each gets its own
 * device pool file, and at its end holds no driver object and the device has
 * nothing in use (a leak is a failure). Device pointers of the emulated
 * driver are CPU mappings, so the tests read and write through them. A second
 * process that uses the driver is this program again, exec'd (CUDA does not
 * survive fork without exec): see helper_main(). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "cuda_loader.h"
#include "fakecuda_check.h"
#include "mapper.h"
#include "testutil.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define SEG (4 * MiB)

#define ck_assert_ok(expr)                                                                                \
        do {                                                                                              \
                int _r = (expr);                                                                          \
                ck_assert_msg(_r >= 0, "%s failed: %s (%s)", #expr, strerror(-_r), gm_cuda_last_error()); \
        } while (0)

/* ---- helpers ---- */

static char pool_path[64];

/* Every test: its own device pool, shared with the processes it starts. */
static void setup(void) {
        gm_fake_new_pool(pool_path, sizeof(pool_path));
        setenv("FAKECUDA_CONTEXT_BYTES", "0", 0); /* contexts cost nothing unless a test says so */
}

/* ...and at its end nothing is left: no driver object in this process,
 * nothing in use on any device. */
static void teardown(void) {
        fakecuda_usage_t u;
        if (gm_fake_usage(&u)) {
                gm_fake_assert_no_objects();
                for (int d = 0; d < 4; d++)
                        ck_assert_msg(gm_fake_device_bytes(d) == 0, "device %d: %llu bytes still in use", d,
                                      (unsigned long long) gm_fake_device_bytes(d));
        }
        unlink(pool_path);
}

/* Runs this program again (exec'd, so it may use CUDA) as helper `mode` with
 * `args`, after setting the NULL-terminated NAME, VALUE pairs in `env`;
 * returns its exit status. fds stay open across the exec. */
static int run_helper(const char *mode, const char *const *args, const char *const *env) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                for (size_t i = 0; env && env[i]; i += 2)
                        setenv(env[i], env[i + 1], 1);
                const char *argv[16] = {"/proc/self/exe", "--helper", mode};
                size_t n = 3;
                for (size_t i = 0; args && args[i] && n < 15; i++)
                        argv[n++] = args[i];
                argv[n] = NULL;
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* An fd number as a helper argument; the fd loses CLOEXEC to cross exec. */
static const char *pass_fd(int fd, char *buf, size_t len) {
        ck_assert_int_eq(fcntl(fd, F_SETFD, 0), 0);
        snprintf(buf, len, "%d", fd);
        return buf;
}

static gm_backend_t *open_cuda(uint64_t capacity) {
        gm_backend_options_t opts = {.kind = "cuda", .device = 0, .capacity = capacity};
        gm_backend_t *b = NULL;
        char err[256] = "";
        int r = gm_backend_cuda_open(&opts, &b, err, sizeof(err));
        ck_assert_msg(r == 0, "gm_backend_cuda_open: %s (%s)", strerror(-r), err);
        return b;
}

static gm_mapper_t *new_mapper(uint64_t granularity) {
        gm_mapper_t *m = NULL;
        ck_assert_ok(gm_mapper_cuda_new(0, NULL, granularity, &m));
        ck_assert_str_eq(m->ops->backend, "cuda");
        return m;
}

/* Device memory is written and read by the emulator's kernels only. */
static void fill(void *p, size_t n, uint32_t seed) {
        if (!gm_fake_device_fill(p, n, seed)) /* helpers run outside a check test too */
                abort();
}

static bool verify(const void *p, size_t n, uint32_t seed) {
        int ok = gm_fake_device_verify(p, n, seed);
        ck_assert_int_ge(ok, 0);
        return ok == 1;
}

/* Reserves a range, maps a dup of `fd` at its start and returns the base. */
static uint64_t map_copy(gm_mapper_t *m, int fd, uint64_t size) {
        uint64_t base = 0;
        ck_assert_ok(m->ops->reserve(m, size, &base));
        ck_assert_ok(m->ops->map(m, base, 0, size, dup(fd)));
        return base;
}

static void unmap_all(gm_mapper_t *m, uint64_t base, uint64_t size) {
        ck_assert_ok(m->ops->unmap(m, base, 0, size));
        ck_assert_ok(m->ops->unreserve(m, base, size));
}

/* ---- backend ---- */

START_TEST(test_open_create_release) {
        gm_backend_t *b = open_cuda(0);
        ck_assert_str_eq(b->ops->name, "cuda");
        ck_assert_int_eq(b->device, 0);
        ck_assert_uint_eq(b->granularity, 2 * MiB);
        ck_assert_uint_eq(b->capacity, 4 * GiB); /* cuDeviceTotalMem */

        uint64_t free_bytes, total;
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        ck_assert_uint_eq(total, 4 * GiB);
        ck_assert_uint_eq(free_bytes, 4 * GiB);

        gm_phys_t phys;
        int fds = gm_test_count_fds(getpid());
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        ck_assert_int_ge(phys.fd, 0);
        ck_assert_uint_eq(phys.size, SEG);
        ck_assert_uint_ne(phys.handle, 0);
        ck_assert_uint_eq(b->in_use, SEG);
        ck_assert_int_eq(fcntl(phys.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC); /* the emulated export sets none */
        struct stat st;
        ck_assert_int_eq(fstat(phys.fd, &st), 0);
        ck_assert_int_eq(st.st_size, (off_t) SEG);
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        ck_assert_uint_eq(free_bytes, 4 * GiB - SEG);

        gm_backend_release(b, &phys);
        ck_assert_int_eq(phys.fd, -1);
        ck_assert_int_eq(gm_test_count_fds(getpid()), fds);
        ck_assert_uint_eq(b->in_use, 0);
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        ck_assert_uint_eq(free_bytes, 4 * GiB);

        ck_assert_int_eq(gm_backend_create(b, 3 * MiB, &phys), -EINVAL);
        ck_assert_int_eq(gm_backend_create(b, 0, &phys), -EINVAL);
        ck_assert_uint_eq(b->in_use, 0);
        ck_assert_ptr_null(gm_backend_close(b));
}
END_TEST

START_TEST(test_granularity_from_driver) {
        setenv("FAKECUDA_GRANULARITY", "8M", 1);
        setenv("FAKECUDA_CAPACITY", "64M", 1);
        gm_backend_t *b = open_cuda(0);
        ck_assert_uint_eq(b->granularity, 8 * MiB);
        ck_assert_uint_eq(b->capacity, 64 * MiB);
        gm_phys_t phys;
        ck_assert_int_eq(gm_backend_create(b, SEG, &phys), -EINVAL);
        ck_assert_ok(gm_backend_create(b, 16 * MiB, &phys));
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_capacity_limit) {
        gm_backend_t *b = open_cuda(8 * MiB);
        ck_assert_uint_eq(b->capacity, 8 * MiB);
        gm_phys_t p1, p2, p3;
        ck_assert_ok(gm_backend_create(b, SEG, &p1));
        ck_assert_ok(gm_backend_create(b, SEG, &p2));
        int fds = gm_test_count_fds(getpid());
        ck_assert_int_eq(gm_backend_create(b, SEG, &p3), -ENOMEM);
        ck_assert_ptr_nonnull(strstr(gm_cuda_last_error(), "capacity"));
        ck_assert_int_eq(gm_test_count_fds(getpid()), fds);
        ck_assert_uint_eq(b->in_use, 8 * MiB);
        gm_backend_release(b, &p1);
        ck_assert_ok(gm_backend_create(b, SEG, &p3));
        gm_backend_release(b, &p2);
        gm_backend_release(b, &p3);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_driver_out_of_memory) {
        /* The driver runs out before the configured capacity does. */
        setenv("FAKECUDA_CAPACITY", "8M", 1);
        gm_backend_t *b = open_cuda(64 * MiB);
        gm_phys_t p1, p2, p3;
        ck_assert_ok(gm_backend_create(b, SEG, &p1));
        ck_assert_ok(gm_backend_create(b, SEG, &p2));
        ck_assert_int_eq(gm_backend_create(b, SEG, &p3), -ENOMEM);
        ck_assert_str_eq(gm_cuda_last_error(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
        ck_assert_uint_eq(b->in_use, 8 * MiB);
        uint64_t free_bytes, total;
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        ck_assert_uint_eq(free_bytes, 0);
        ck_assert_uint_eq(total, 8 * MiB);
        gm_backend_release(b, &p1);
        gm_backend_release(b, &p2);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_fail_create_injected) {
        setenv("FAKECUDA_FAIL_CREATE_AT", "2", 1);
        gm_backend_t *b = open_cuda(0);
        gm_phys_t p1, p2;
        ck_assert_ok(gm_backend_create(b, SEG, &p1));
        int fds = gm_test_count_fds(getpid());
        ck_assert_int_eq(gm_backend_create(b, SEG, &p2), -ENOMEM);
        ck_assert_ptr_nonnull(strstr(gm_cuda_last_error(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY"));
        ck_assert_int_eq(gm_test_count_fds(getpid()), fds);
        ck_assert_uint_eq(b->in_use, SEG);
        ck_assert_ok(gm_backend_create(b, SEG, &p2));
        ck_assert_uint_eq(b->in_use, 2 * SEG);
        gm_backend_release(b, &p1);
        gm_backend_release(b, &p2);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_fail_create_other_error) {
        setenv("FAKECUDA_FAIL_CREATE_AT", "1", 1);
        setenv("FAKECUDA_FAIL_CREATE_ERROR", "CUDA_ERROR_UNKNOWN", 1);
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_int_eq(gm_backend_create(b, SEG, &phys), -EIO);
        ck_assert_str_eq(gm_cuda_last_error(), "cuMemCreate: CUDA_ERROR_UNKNOWN (unknown error)");
        ck_assert_uint_eq(b->in_use, 0);
        gm_backend_close(b);
}
END_TEST

static void *mem_info_thread(void *arg) {
        uint64_t free_bytes, total;
        return (void *) (intptr_t) ((gm_backend_t *) arg)->ops->mem_info(arg, &free_bytes, &total);
}

START_TEST(test_mem_info_other_thread) {
        /* cuMemGetInfo needs a current context; a fresh thread has none. */
        gm_backend_t *b = open_cuda(0);
        pthread_t t;
        void *ret;
        ck_assert_int_eq(pthread_create(&t, NULL, mem_info_thread, b), 0);
        ck_assert_int_eq(pthread_join(t, &ret), 0);
        ck_assert_int_eq((int) (intptr_t) ret, 0);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_device_selection) {
        setenv("FAKECUDA_DEVICE_COUNT", "3", 1);
        setenv("FAKECUDA_UUID_PREFIX", "0123abcd", 1);
        gm_backend_options_t opts = {
                .kind = "cuda", .device = 0, .device_uuid = "GPU-0123abcd-0000-0000-0000-000000000002"};
        gm_backend_t *b = NULL;
        char err[256] = "";
        ck_assert_ok(gm_backend_cuda_open(&opts, &b, err, sizeof(err)));
        ck_assert_int_eq(b->device, 2);
        gm_backend_close(b);

        opts.device_uuid = "0123ABCD000000000000000000000001"; /* no prefix, no dashes, upper case */
        ck_assert_ok(gm_backend_cuda_open(&opts, &b, err, sizeof(err)));
        ck_assert_int_eq(b->device, 1);
        gm_backend_close(b);

        opts.device_uuid = "GPU-0123abcd-0000-0000-0000-000000000007";
        ck_assert_int_eq(gm_backend_cuda_open(&opts, &b, err, sizeof(err)), -ENODEV);
        ck_assert_ptr_nonnull(strstr(err, "GPU-0123abcd-0000-0000-0000-000000000007"));
        opts.device_uuid = "GPU-12";
        ck_assert_int_eq(gm_backend_cuda_open(&opts, &b, err, sizeof(err)), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "malformed"));

        opts.device_uuid = NULL;
        opts.device = 1;
        ck_assert_ok(gm_backend_cuda_open(&opts, &b, err, sizeof(err)));
        ck_assert_int_eq(b->device, 1);
        gm_backend_close(b);
        opts.device = 3;
        ck_assert_int_eq(gm_backend_cuda_open(&opts, &b, err, sizeof(err)), -ENODEV);
        ck_assert_str_eq(err, "no cuda device 3 (3 present)");
}
END_TEST

START_TEST(test_no_libcuda_auto_falls_back) {
        setenv("GPUMEM_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        gm_backend_options_t opts = {.kind = "cuda", .device = 0, .capacity = 64 * MiB};
        gm_backend_t *b = NULL;
        char err[512] = "";
        ck_assert_int_eq(gm_backend_cuda_open(&opts, &b, err, sizeof(err)), -ELIBACC);
        ck_assert_ptr_nonnull(strstr(err, "cannot load /nonexistent/libcuda.so.1"));
        ck_assert_int_eq(gm_backend_open(&opts, &b, err, sizeof(err)), -ELIBACC);
        gm_mapper_t *m = NULL;
        ck_assert_int_eq(gm_mapper_cuda_new(0, NULL, 2 * MiB, &m), -ELIBACC);

        opts.kind = "auto";
        err[0] = '\0';
        ck_assert_ok(gm_backend_open(&opts, &b, err, sizeof(err)));
        ck_assert_str_eq(b->ops->name, "host");
        ck_assert_ptr_nonnull(strstr(err, "using host"));
        ck_assert_ptr_nonnull(strstr(err, "/nonexistent/libcuda.so.1"));
        gm_backend_close(b);
}
END_TEST

START_TEST(test_no_device_auto_falls_back) {
        setenv("FAKECUDA_DEVICE_COUNT", "0", 1);
        gm_backend_options_t opts = {.kind = "auto", .device = 0, .capacity = 64 * MiB};
        gm_backend_t *b = NULL;
        char err[512] = "";
        ck_assert_ok(gm_backend_open(&opts, &b, err, sizeof(err)));
        ck_assert_str_eq(b->ops->name, "host");
        ck_assert_ptr_nonnull(strstr(err, "cuInit: CUDA_ERROR_NO_DEVICE"));
        gm_backend_close(b);
        opts.kind = "cuda";
        ck_assert_int_eq(gm_backend_open(&opts, &b, err, sizeof(err)), -ENODEV);
}
END_TEST

/* ---- mapper ---- */

START_TEST(test_map_across_processes) {
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        char fd_arg[16];
        const char *args[] = {pass_fd(phys.fd, fd_arg, sizeof(fd_arg)), "12648430", b->device_uuid, NULL};
        ck_assert_int_eq(run_helper("map-client", args, NULL), 0);

        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base = map_copy(m, phys.fd, SEG);
        ck_assert(verify((void *) (uintptr_t) base, SEG, 12648430));
        unmap_all(m, base, SEG);
        m->ops->destroy(m);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_map_contiguous_pieces) {
        /* Expandable segments: pieces mapped side by side in one reservation. */
        gm_backend_t *b = open_cuda(0);
        gm_phys_t p1, p2;
        ck_assert_ok(gm_backend_create(b, SEG, &p1));
        ck_assert_ok(gm_backend_create(b, SEG, &p2));
        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base;
        ck_assert_ok(m->ops->reserve(m, 4 * SEG, &base));
        ck_assert_ok(m->ops->map(m, base, 0, SEG, dup(p1.fd)));
        ck_assert_ok(m->ops->map(m, base, SEG, SEG, dup(p2.fd)));
        fill((void *) (uintptr_t) base, 2 * SEG, 7); /* one kernel over both pieces */
        ck_assert(verify((void *) (uintptr_t) base, 2 * SEG, 7));
        fill((void *) (uintptr_t) (base + SEG), SEG, 8);

        /* The second piece alone, elsewhere, holds the second half. */
        uint64_t other = map_copy(m, p2.fd, SEG);
        ck_assert(verify((void *) (uintptr_t) other, SEG, 8));
        unmap_all(m, other, SEG);

        /* Pieces unmap one at a time; the reservation goes only when empty. */
        ck_assert_ok(m->ops->unmap(m, base, SEG, SEG));
        ck_assert_int_lt(m->ops->unreserve(m, base, 4 * SEG), 0);
        ck_assert_ok(m->ops->unmap(m, base, 0, SEG));
        ck_assert_ok(m->ops->unreserve(m, base, 4 * SEG));
        m->ops->destroy(m);
        gm_backend_release(b, &p1);
        gm_backend_release(b, &p2);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_mapping_outlives_daemon_handle) {
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base = map_copy(m, phys.fd, SEG);
        fill((void *) (uintptr_t) base, SEG, 99);
        gm_backend_release(b, &phys);
        ck_assert(verify((void *) (uintptr_t) base, SEG, 99));
        unmap_all(m, base, SEG);
        m->ops->destroy(m);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_fork_does_not_inherit_mappings) {
        /* As with a real device, a forked child has none of its parent's
         * device mappings (host-backend mappings are MADV_DONTFORK too). */
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base = map_copy(m, phys.fd, SEG);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0)
                _exit(msync((void *) (uintptr_t) base, 4096, MS_ASYNC) < 0 && errno == ENOMEM ? 0 : 1);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child sees the mapping");
        ck_assert_int_eq(msync((void *) (uintptr_t) base, 4096, MS_ASYNC), 0);
        unmap_all(m, base, SEG);
        m->ops->destroy(m);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

static void check_map_fault(const char *variable, const char *entry_point) {
        setenv(variable, "1", 1);
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base;
        ck_assert_ok(m->ops->reserve(m, SEG, &base));

        int fds = gm_test_count_fds(getpid());
        ck_assert_int_eq(m->ops->map(m, base, 0, SEG, dup(phys.fd)), -ENOMEM);
        ck_assert_int_eq(gm_test_count_fds(getpid()), fds); /* the fd was consumed */
        ck_assert_ptr_nonnull(strstr(gm_cuda_last_error(), entry_point));

        /* Nothing was left mapped: the same range maps now. */
        ck_assert_ok(m->ops->map(m, base, 0, SEG, dup(phys.fd)));
        fill((void *) (uintptr_t) base, SEG, 5);
        ck_assert(verify((void *) (uintptr_t) base, SEG, 5));
        unmap_all(m, base, SEG);
        ck_assert_int_eq(gm_test_count_fds(getpid()), fds);
        m->ops->destroy(m);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}

START_TEST(test_fail_import_injected) {
        check_map_fault("FAKECUDA_FAIL_IMPORT_AT", "cuMemImportFromShareableHandle: CUDA_ERROR_OUT_OF_MEMORY");
}
END_TEST

START_TEST(test_fail_map_injected) {
        check_map_fault("FAKECUDA_FAIL_MAP_AT", "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY");
}
END_TEST

typedef struct unmap_job {
        gm_mapper_t *m;
        uint64_t base;
} unmap_job_t;

static void *unmap_thread(void *arg) {
        unmap_job_t *job = arg;
        return (void *) (intptr_t) job->m->ops->unmap(job->m, job->base, 0, SEG);
}

START_TEST(test_unmap_from_service_thread) {
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        gm_mapper_t *m = new_mapper(b->granularity);
        unmap_job_t job = {.m = m, .base = map_copy(m, phys.fd, SEG)};
        pthread_t t;
        void *ret;
        ck_assert_int_eq(pthread_create(&t, NULL, unmap_thread, &job), 0);
        ck_assert_int_eq(pthread_join(t, &ret), 0);
        ck_assert_int_eq((int) (intptr_t) ret, 0);
        ck_assert_ok(m->ops->unreserve(m, job.base, SEG));
        m->ops->destroy(m);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_mapper_arguments) {
        gm_mapper_t *m = NULL;
        ck_assert_int_eq(gm_mapper_cuda_new(0, NULL, 0, &m), -EINVAL);
        ck_assert_int_eq(gm_mapper_cuda_new(0, NULL, 1 * MiB, &m), -EINVAL); /* not a multiple of the device's 2 MiB */
        ck_assert_int_eq(gm_mapper_cuda_new(1, NULL, 2 * MiB, &m), -ENODEV);
        ck_assert_ptr_null(m);
        m = new_mapper(4 * MiB);
        uint64_t base;
        ck_assert_int_eq(m->ops->reserve(m, 2 * MiB, &base), -EINVAL);
        ck_assert_ok(m->ops->reserve(m, 8 * MiB, &base));
        ck_assert_uint_eq(base % (4 * MiB), 0);
        ck_assert_ok(m->ops->unreserve(m, base, 8 * MiB));
        m->ops->destroy(m);
}
END_TEST

/* ---- emulated driver: held events (used by the free_async tests) ---- */

START_TEST(test_events_held) {
        char hold[] = "/tmp/fakecuda-hold-XXXXXX";
        int hold_fd = mkstemp(hold);
        ck_assert_int_ge(hold_fd, 0);
        close(hold_fd);
        setenv("FAKECUDA_HOLD_EVENTS", hold, 1);

        const gm_cuda_t *cu;
        ck_assert_ok(gm_cuda_load(&cu));
        CUdevice dev;
        CUcontext ctx;
        CUstream stream;
        CUevent event;
        ck_assert_int_eq(cu->DeviceGet(&dev, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
        ck_assert_int_eq(cu->StreamCreate(&stream, 0), CUDA_ERROR_INVALID_CONTEXT);
        ck_assert_int_eq(cu->CtxPushCurrent(ctx), CUDA_SUCCESS);
        ck_assert_int_eq(cu->StreamCreate(&stream, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventCreate(&event, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventRecord(event, stream), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventQuery(event), CUDA_ERROR_NOT_READY);
        ck_assert_int_eq(gm_cuda_errno(CUDA_ERROR_NOT_READY), -EAGAIN);
        ck_assert_int_eq(unlink(hold), 0);
        ck_assert_int_eq(cu->EventQuery(event), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventSynchronize(event), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventDestroy(event), CUDA_SUCCESS);
        ck_assert_int_eq(cu->StreamDestroy(stream), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
        ck_assert_int_eq(cu->CtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT); /* released */
        CUcontext popped;
        ck_assert_int_eq(cu->CtxPopCurrent(&popped), CUDA_SUCCESS);
        ck_assert_ptr_eq(popped, ctx);
}
END_TEST

/* ---- the defects a driver shows (issue #13) ---- */

static const gm_cuda_t *load(void) {
        const gm_cuda_t *cu;
        ck_assert_ok(gm_cuda_load(&cu));
        return cu;
}

/* Retains device `ordinal`'s primary context and pushes it. */
static CUcontext push_primary(const gm_cuda_t *cu, int ordinal) {
        CUdevice dev;
        CUcontext ctx;
        ck_assert_int_eq(cu->DeviceGet(&dev, ordinal), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
        ck_assert_int_eq(cu->CtxPushCurrent(ctx), CUDA_SUCCESS);
        return ctx;
}

static void pop_primary(const gm_cuda_t *cu, int ordinal, CUcontext want) {
        CUcontext ctx;
        ck_assert_int_eq(cu->CtxPopCurrent(&ctx), CUDA_SUCCESS);
        ck_assert_ptr_eq(ctx, want);
        ck_assert_int_eq(cu->DevicePrimaryCtxRelease(ordinal), CUDA_SUCCESS);
}

static CUcontext current(const gm_cuda_t *cu) {
        CUcontext ctx = NULL;
        ck_assert_int_eq(cu->CtxGetCurrent(&ctx), CUDA_SUCCESS);
        return ctx;
}

/* Defect 2: the library never changes the calling thread's context. */
START_TEST(test_caller_context_kept) {
        setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
        gm_backend_t *b = open_cuda(0);
        const gm_cuda_t *cu = load();
        CUcontext mine = push_primary(cu, 1); /* the application works on another GPU */
        gm_mapper_t *m = new_mapper(b->granularity);
        ck_assert_ptr_eq(current(cu), mine);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        uint64_t base = map_copy(m, phys.fd, SEG);
        ck_assert_ptr_eq(current(cu), mine);
        uint64_t event;
        ck_assert_ok(m->ops->event_record(m, 0, &event)); /* the default stream: of the caller's context */
        ck_assert_int_eq(m->ops->event_query(m, event), 1);
        m->ops->event_destroy(m, event);
        ck_assert_ok(m->ops->sync(m, 0));
        uint64_t free_bytes, total;
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        ck_assert_ptr_eq(current(cu), mine);
        unmap_all(m, base, SEG);
        ck_assert_ptr_eq(current(cu), mine);
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        ck_assert_int_eq(u.stack_depth, 1);
        m->ops->destroy(m);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
        pop_primary(cu, 1, mine);
}
END_TEST

/* Defect 3: a stream of another context gets an event of its own context. */
START_TEST(test_event_on_other_context_stream) {
        setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
        gm_mapper_t *m = new_mapper(2 * MiB); /* device 0 */
        const gm_cuda_t *cu = load();
        CUcontext other = push_primary(cu, 1);
        CUstream stream;
        ck_assert_int_eq(cu->StreamCreate(&stream, 0), CUDA_SUCCESS);
        pop_primary(cu, 1, other);
        CUcontext keep;
        CUdevice dev1;
        ck_assert_int_eq(cu->DeviceGet(&dev1, 1), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRetain(&keep, dev1), CUDA_SUCCESS); /* the stream's context lives on */

        uint64_t event;
        ck_assert_ok(m->ops->event_record(m, (uint64_t) (uintptr_t) stream, &event));
        ck_assert_int_eq(m->ops->event_query(m, event), 1);
        m->ops->event_destroy(m, event);
        ck_assert_ok(m->ops->sync(m, (uint64_t) (uintptr_t) stream));
        /* A stream value that is no stream is refused, not recorded. */
        ck_assert_int_eq(m->ops->event_record(m, 7, &event), -EINVAL);
        ck_assert_ptr_nonnull(strstr(gm_cuda_last_error(), "cuStreamGetCtx"));
        ck_assert_int_eq(cu->StreamDestroy(stream), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRelease(dev1), CUDA_SUCCESS);
        m->ops->destroy(m);
}
END_TEST

/* Defect 6: a fork()ed child makes no driver call and says why. */
START_TEST(test_fork_child_refused) {
        gm_mapper_t *m = new_mapper(2 * MiB);
        uint64_t base;
        ck_assert_ok(m->ops->reserve(m, SEG, &base));
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                gm_mapper_t *m2 = NULL;
                uint64_t b2;
                if (gm_mapper_cuda_new(0, NULL, 2 * MiB, &m2) != -EOPNOTSUPP || m2)
                        _exit(1);
                if (!strstr(gm_cuda_last_error(), "fork"))
                        _exit(2);
                if (m->ops->reserve(m, SEG, &b2) != -EOPNOTSUPP || m->ops->unreserve(m, base, SEG) != -EOPNOTSUPP)
                        _exit(3);
                m->ops->destroy(m); /* frees memory only */
                _exit(0);
        }
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
        /* The emulated driver refuses a forked child too, cuInit included. */
        const gm_cuda_t *cu = load();
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int count;
                _exit(cu->Init(0) == CUDA_ERROR_NOT_INITIALIZED &&
                                      cu->DeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED
                              ? 0
                              : 1);
        }
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "emulator child status %#x", status);
        ck_assert_ok(m->ops->unreserve(m, base, SEG));
        m->ops->destroy(m);
}
END_TEST

/* Defect 7: a device gpumemd cannot serve is refused at open, and auto
 * picks the host backend. */
static void check_refused_device(const char *variable, const char *value, const char *reason) {
        setenv(variable, value, 1);
        gm_backend_options_t opts = {.kind = "cuda", .device = 0, .capacity = 64 * MiB};
        gm_backend_t *b = NULL;
        char err[512] = "";
        ck_assert_int_eq(gm_backend_open(&opts, &b, err, sizeof(err)), -EOPNOTSUPP);
        ck_assert_msg(strstr(err, reason), "error: %s", err);
        opts.kind = "auto";
        ck_assert_ok(gm_backend_open(&opts, &b, err, sizeof(err)));
        ck_assert_str_eq(b->ops->name, "host");
        ck_assert_msg(strstr(err, reason), "error: %s", err);
        gm_backend_close(b);
}

START_TEST(test_refused_without_vmm) {
        check_refused_device("FAKECUDA_NO_VMM", "1", "virtual memory management");
}
END_TEST

START_TEST(test_refused_without_posix_fd) {
        check_refused_device("FAKECUDA_NO_POSIX_FD", "1", "POSIX file descriptors");
}
END_TEST

START_TEST(test_refused_compute_prohibited) {
        check_refused_device("FAKECUDA_COMPUTE_MODE", "prohibited", "compute-prohibited");
}
END_TEST

/* Defect 8: the daemon's backend holds no context; under exclusive-process
 * compute mode a client process can still have one. */
START_TEST(test_backend_holds_no_context) {
        setenv("FAKECUDA_COMPUTE_MODE", "exclusive_process", 1);
        setenv("FAKECUDA_CONTEXT_BYTES", "64M", 1);
        gm_backend_t *b = open_cuda(0);
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        uint64_t free_bytes, total;
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        ck_assert_uint_eq(total - free_bytes, SEG); /* no context of ours costs anything */
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        ck_assert_int_eq(u.contexts, 0);
        char fd_arg[16];
        const char *args[] = {pass_fd(phys.fd, fd_arg, sizeof(fd_arg)), "77", b->device_uuid, NULL};
        ck_assert_int_eq(run_helper("map-client", args, NULL), 0); /* retains, maps, writes */
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

/* Defect 8: memory figures from NVML, device-wide (another process's
 * allocation counts), and without NVML from a context held only for the call. */
static void check_mem_info(const char *libnvml, const char *source) {
        setenv("GPUMEM_LIBNVML", libnvml, 1);
        setenv("FAKECUDA_CONTEXT_BYTES", "32M", 1);
        gm_backend_t *b = open_cuda(0);
        ck_assert_msg(strstr(b->detail, source), "detail: %s", b->detail);
        ck_assert_ptr_nonnull(strstr(b->detail, "no CUDA context held"));
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        /* The helper holds 8 MiB (and its context's 32 MiB) while it asks. */
        gm_test_proc_t proc;
        const char *argv[] = {"/proc/self/exe", "--helper", "hold-alloc", "8388608", NULL};
        gm_test_spawn(argv, 0, &proc);
        char line[64];
        ck_assert(gm_test_proc_read_line(&proc, line, sizeof(line)));
        ck_assert_str_eq(line, "holding");
        uint64_t free_bytes, total;
        ck_assert_ok(b->ops->mem_info(b, &free_bytes, &total));
        uint64_t ours = strstr(source, "context") ? 32 * MiB : 0; /* the short-lived context, while it asks */
        ck_assert_uint_eq(total - free_bytes, SEG + 8 * MiB + 32 * MiB + ours);
        ck_assert_int_eq(gm_test_proc_finish(&proc), 0);
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        ck_assert_int_eq(u.contexts, 0);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}

START_TEST(test_mem_info_from_nvml) {
        check_mem_info(getenv("GM_TEST_FAKENVML"), "from NVML");
}
END_TEST

START_TEST(test_mem_info_without_nvml) {
        check_mem_info("/nonexistent/libnvidia-ml.so.1", "short-lived primary context");
}
END_TEST

/* Defect 9: the client finds the daemon's GPU by UUID under its own
 * CUDA_VISIBLE_DEVICES, and refuses one it cannot see. */
START_TEST(test_client_device_by_uuid) {
        setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
        gm_backend_t *b = open_cuda(0); /* physical device 0 */
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        char fd_arg[16];
        const char *by_uuid[] = {pass_fd(phys.fd, fd_arg, sizeof(fd_arg)), "5", b->device_uuid, NULL};
        const char *swapped[] = {"CUDA_VISIBLE_DEVICES", "1,0", NULL};
        ck_assert_int_eq(run_helper("map-client", by_uuid, swapped), 0); /* its ordinal 1 */
        const char *by_ordinal[] = {fd_arg, "5", "", NULL};
        ck_assert_int_eq(run_helper("map-client", by_ordinal, swapped), 11); /* ordinal 0 is the other GPU */
        const char *hidden[] = {"CUDA_VISIBLE_DEVICES", "1", NULL};
        ck_assert_int_eq(run_helper("map-client", by_uuid, hidden), 19); /* -ENODEV: cannot see it */
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

/* Defect 11: allocations are GPUDirect RDMA capable where the device allows. */
START_TEST(test_rdma_capable_allocations) {
        gm_backend_t *b = open_cuda(0);
        ck_assert_ptr_nonnull(strstr(b->detail, "GPUDirect RDMA"));
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys));
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        ck_assert_int_eq(u.rdma_handles, 1);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_no_rdma_where_unsupported) {
        setenv("FAKECUDA_NO_RDMA", "1", 1);
        gm_backend_t *b = open_cuda(0);
        ck_assert_ptr_null(strstr(b->detail, "GPUDirect RDMA"));
        gm_phys_t phys;
        ck_assert_ok(gm_backend_create(b, SEG, &phys)); /* the emulator refuses the flag here */
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        ck_assert_int_eq(u.rdma_handles, 0);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

/* Defect 11: entry points only tests use are not required. */
START_TEST(test_optional_entry_points) {
        setenv("FAKECUDA_HIDE", "cuStreamCreate,cuEventSynchronize,cuStreamDestroy,cuCtxSynchronize", 1);
        const gm_cuda_t *cu = load();
        ck_assert_ptr_null(cu->StreamCreate);
        ck_assert_ptr_null(cu->EventSynchronize);
        ck_assert_ptr_nonnull(cu->MemCreate);
        gm_backend_t *b = open_cuda(0);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_required_entry_point_missing) {
        setenv("FAKECUDA_HIDE", "cuMemMap", 1);
        const gm_cuda_t *cu;
        ck_assert_int_eq(gm_cuda_load(&cu), -ENOSYS);
        ck_assert_ptr_nonnull(strstr(gm_cuda_last_error(), "cuMemMap"));
}
END_TEST

/* ---- the emulated driver is as strict as the real one ---- */

START_TEST(test_emulator_strict) {
        const gm_cuda_t *cu = load();
        /* Entry points exist only from their version on, with that version's signature. */
        void *fn = NULL;
        CUdriverProcAddressQueryResult status;
        PFN_cuGetProcAddress_v12000 getproc;
        void *p = gm_fake_symbol("cuGetProcAddress_v2");
        memcpy(&getproc, &p, sizeof(p));
        ck_assert_int_eq(getproc("cuMemCreate", &fn, 10000, 0, &status), CUDA_ERROR_NOT_FOUND);
        ck_assert_int_eq(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        void *v1 = NULL, *v2 = NULL;
        ck_assert_int_eq(getproc("cuCtxSynchronize", &v1, 12080, 0, &status), CUDA_SUCCESS);
        ck_assert_int_eq(getproc("cuCtxSynchronize", &v2, 13000, 0, &status), CUDA_SUCCESS);
        ck_assert_ptr_ne(v1, v2);
        ck_assert_int_eq(getproc("cuNoSuchThing", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
        ck_assert_int_eq(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

        /* Events and streams belong to contexts. */
        CUcontext ctx = push_primary(cu, 0);
        CUstream stream;
        CUevent event;
        ck_assert_int_eq(cu->StreamCreate(&stream, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventCreate(&event, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventRecord(event, stream), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventRecord(event, (CUstream) (uintptr_t) 7), CUDA_ERROR_INVALID_HANDLE);
        ck_assert_int_eq(cu->EventDestroy(event),
                         CUDA_SUCCESS); /* using it now aborts: test_destroyed_event_poisoned */
        ck_assert_int_eq(cu->StreamDestroy(stream), CUDA_SUCCESS);
        pop_primary(cu, 0, ctx);
        ck_assert_int_eq(cu->CtxPopCurrent(&ctx), CUDA_ERROR_INVALID_CONTEXT);

        /* cuMemUnmap takes exactly one mapped range. */
        gm_backend_t *b = open_cuda(0);
        gm_phys_t p1, p2;
        ck_assert_ok(gm_backend_create(b, SEG, &p1));
        ck_assert_ok(gm_backend_create(b, SEG, &p2));
        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base;
        ck_assert_ok(m->ops->reserve(m, 4 * SEG, &base));
        ck_assert_ok(m->ops->map(m, base, 0, SEG, dup(p1.fd)));
        ck_assert_ok(m->ops->map(m, base, SEG, SEG, dup(p2.fd)));
        ck_assert_int_eq(m->ops->unmap(m, base, 0, 2 * SEG), -EINVAL); /* two mappings */
        ck_assert_int_eq(m->ops->unmap(m, base, 0, 4 * SEG), -EINVAL); /* with a hole */
        ck_assert_int_eq(m->ops->unmap(m, base, 0, SEG / 2), -EINVAL); /* a sub-range */
        ck_assert_ok(m->ops->unmap(m, base, 0, SEG));
        ck_assert_ok(m->ops->unmap(m, base, SEG, SEG));
        ck_assert_ok(m->ops->unreserve(m, base, 4 * SEG));
        /* An fd that is not the driver's is no handle. */
        int other = memfd_create("other", MFD_CLOEXEC);
        ck_assert_int_eq(ftruncate(other, SEG), 0);
        ck_assert_ok(m->ops->reserve(m, SEG, &base));
        ck_assert_int_eq(m->ops->map(m, base, 0, SEG, other), -EINVAL);
        ck_assert_ok(m->ops->unreserve(m, base, SEG));
        m->ops->destroy(m);
        gm_backend_release(b, &p1);
        gm_backend_release(b, &p2);
        gm_backend_close(b);
}
END_TEST

/* The pool is device-wide: memory a dead process held is free again, and
 * one mapped elsewhere stays in use after its creator released it. */
START_TEST(test_emulator_pool_device_wide) {
        setenv("FAKECUDA_CAPACITY", "64M", 1);
        gm_backend_t *b = open_cuda(0);
        gm_test_proc_t proc;
        const char *argv[] = {"/proc/self/exe", "--helper", "hold-alloc", "41943040", NULL};
        gm_test_spawn(argv, 0, &proc);
        char line[64];
        ck_assert(gm_test_proc_read_line(&proc, line, sizeof(line)));
        gm_phys_t p1, p2;
        ck_assert_ok(gm_backend_create(b, 16 * MiB, &p1));
        ck_assert_int_eq(gm_backend_create(b, 16 * MiB, &p2), -ENOMEM); /* 40 MiB are the helper's */
        kill(proc.pid, SIGKILL);
        ck_assert_int_eq(gm_test_proc_finish(&proc), 128 + SIGKILL);
        ck_assert_ok(gm_backend_create(b, 16 * MiB, &p2)); /* its memory went with it */
        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base = map_copy(m, p2.fd, 16 * MiB);
        gm_backend_release(b, &p2);
        ck_assert_uint_eq(gm_fake_device_bytes(0), 32 * MiB); /* still mapped here */
        unmap_all(m, base, 16 * MiB);
        ck_assert_uint_eq(gm_fake_device_bytes(0), 16 * MiB);
        m->ops->destroy(m);
        gm_backend_release(b, &p1);
        gm_backend_close(b);
}
END_TEST

/* ---- the asynchronous emulator itself ---- */

/* An emulator entry point (fakecuda.h, or a driver function gm_cuda_t lacks). */
#define FAKE_FN(type, name)                      \
        ({                                       \
                type fn_;                        \
                void *p_ = gm_fake_symbol(name); \
                memcpy(&fn_, &p_, sizeof(p_));   \
                fn_;                             \
        })

typedef CUresult (*begin_capture_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*is_capturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*graph_destroy_fn)(CUgraph);

/* One SEG piece of device 0 mapped read-write in this process, with its
 * primary context current. */
typedef struct emu_fixture {
        const gm_cuda_t *cu;
        gm_backend_t *b;
        gm_phys_t phys;
        gm_mapper_t *m;
        uint64_t base;
        CUcontext ctx;
} emu_fixture_t;

static void emu_open(emu_fixture_t *f) {
        f->b = open_cuda(0);
        ck_assert_ok(gm_backend_create(f->b, SEG, &f->phys));
        f->m = new_mapper(f->b->granularity);
        f->base = map_copy(f->m, f->phys.fd, SEG);
        f->cu = load();
        f->ctx = push_primary(f->cu, 0);
}

static void emu_close(emu_fixture_t *f, bool unmap) {
        pop_primary(f->cu, 0, f->ctx);
        if (unmap)
                unmap_all(f->m, f->base, SEG);
        f->m->ops->destroy(f->m);
        gm_backend_release(f->b, &f->phys);
        gm_backend_close(f->b);
}

/* Work runs later, in stream order; events and synchronize tell the truth. */
START_TEST(test_work_runs_later) {
        emu_fixture_t f;
        emu_open(&f);
        CUstream s;
        CUevent e;
        ck_assert_int_eq(f.cu->StreamCreate(&s, 0), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventCreate(&e, 0), CUDA_SUCCESS);
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_spin_fn, "fakecuda_launch_spin")(s, 500), CUDA_SUCCESS);
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_fill_fn, "fakecuda_launch_fill")(s, f.base, SEG, 0x5a), CUDA_SUCCESS);
        int ok = -1;
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_verify_fn, "fakecuda_launch_verify")(s, f.base, SEG, 0x5a, &ok),
                         CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventRecord(e, s), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventQuery(e), CUDA_ERROR_NOT_READY);
        ck_assert_int_eq(ok, -1); /* not run yet */
        ck_assert_int_eq(f.cu->StreamSynchronize(s), CUDA_SUCCESS);
        ck_assert_int_eq(ok, 1);
        ck_assert_int_eq(f.cu->EventQuery(e), CUDA_SUCCESS);
        /* Device to host and back. */
        unsigned char host[64], back[64];
        memset(host, 0x33, sizeof(host));
        ck_assert_int_eq(
                FAKE_FN(fakecuda_launch_from_host_fn, "fakecuda_launch_from_host")(NULL, f.base + 4096, host, 64),
                CUDA_SUCCESS);
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_to_host_fn, "fakecuda_launch_to_host")(NULL, back, f.base + 4096, 64),
                         CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->CtxSynchronize(), CUDA_SUCCESS);
        ck_assert_int_eq(memcmp(host, back, 64), 0);
        ck_assert_int_eq(f.cu->EventDestroy(e), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->StreamDestroy(s), CUDA_SUCCESS);
        emu_close(&f, true);
}
END_TEST

/* The legacy stream waits for blocking streams, not for non-blocking ones. */
START_TEST(test_legacy_stream_ordering) {
        emu_fixture_t f;
        emu_open(&f);
        CUstream blocking, nonblocking;
        CUevent e;
        ck_assert_int_eq(f.cu->StreamCreate(&blocking, 0), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->StreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventCreate(&e, 0), CUDA_SUCCESS);
        fakecuda_launch_spin_fn spin = FAKE_FN(fakecuda_launch_spin_fn, "fakecuda_launch_spin");
        ck_assert_int_eq(spin(nonblocking, 1000), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventQuery(e), CUDA_SUCCESS); /* not ordered after the non-blocking stream */
        ck_assert_int_eq(spin(blocking, 500), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventRecord(e, NULL), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventQuery(e), CUDA_ERROR_NOT_READY); /* ordered after the blocking one */
        ck_assert_int_eq(f.cu->EventSynchronize(e), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->CtxSynchronize(), CUDA_SUCCESS); /* every stream */
        ck_assert_int_eq(f.cu->EventDestroy(e), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->StreamDestroy(blocking), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->StreamDestroy(nonblocking), CUDA_SUCCESS);
        emu_close(&f, true);
}
END_TEST

/* Unmapping memory a queued kernel uses: the kernel faults and the context
 * is lost (its calls fail with CUDA_ERROR_ILLEGAL_ADDRESS from then on). */
START_TEST(test_unmap_under_kernel_faults) {
        emu_fixture_t f;
        emu_open(&f);
        CUstream s;
        ck_assert_int_eq(f.cu->StreamCreate(&s, 0), CUDA_SUCCESS);
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_spin_fn, "fakecuda_launch_spin")(s, 1000), CUDA_SUCCESS);
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_fill_fn, "fakecuda_launch_fill")(s, f.base, SEG, 1), CUDA_SUCCESS);
        unmap_all(f.m, f.base, SEG);
        ck_assert_int_eq(f.cu->StreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
        CUevent e;
        ck_assert_int_eq(f.cu->EventCreate(&e, 0), CUDA_ERROR_ILLEGAL_ADDRESS); /* sticky */
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        ck_assert_int_eq(u.faults, 1);
        ck_assert_int_eq(f.cu->StreamDestroy(s), CUDA_SUCCESS);
        emu_close(&f, false);
}
END_TEST

/* A kernel over memory that is not mapped faults too. */
START_TEST(test_kernel_on_unmapped_memory_faults) {
        emu_fixture_t f;
        emu_open(&f);
        ck_assert_int_eq(FAKE_FN(fakecuda_launch_fill_fn, "fakecuda_launch_fill")(NULL, f.base + SEG - 4096, 8192, 1),
                         CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->CtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        emu_close(&f, true);
}
END_TEST

/* Device memory is not the CPU's. */
START_TEST(test_cpu_cannot_touch_device_memory) {
        emu_fixture_t f;
        emu_open(&f);
        /* The fault itself must end the test, not a sanitizer's report of it
         * (ASan's SEGV handler exits with 1): the default action kills the
         * process with the signal the test expects. */
        signal(SIGSEGV, SIG_DFL);
        ((volatile char *) (uintptr_t) f.base)[0] = 1;
}
END_TEST

START_TEST(test_destroyed_stream_poisoned) {
        const gm_cuda_t *cu = load();
        push_primary(cu, 0);
        CUstream s;
        ck_assert_int_eq(cu->StreamCreate(&s, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->StreamDestroy(s), CUDA_SUCCESS);
        cu->StreamSynchronize(s);
}
END_TEST

START_TEST(test_destroyed_event_poisoned) {
        const gm_cuda_t *cu = load();
        push_primary(cu, 0);
        CUevent e;
        ck_assert_int_eq(cu->EventCreate(&e, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->EventDestroy(e), CUDA_SUCCESS);
        cu->EventQuery(e);
}
END_TEST

/* cuMemMap: address, size and offset in granules. */
START_TEST(test_map_alignment_checked) {
        const gm_cuda_t *cu = load();
        CUcontext ctx = push_primary(cu, 0);
        CUmemAllocationProp prop = gm_cuda_alloc_prop(0, false);
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        ck_assert_int_eq(cu->MemCreate(&h, 2 * SEG, &prop, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemAddressReserve(&va, 4 * SEG, 0, 0, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemMap(va + 4096, SEG, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
        ck_assert_int_eq(cu->MemMap(va, SEG + 4096, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
        ck_assert_int_eq(cu->MemMap(va, SEG, 4096, h, 0), CUDA_ERROR_INVALID_VALUE);
        ck_assert_int_eq(cu->MemMap(va, 2 * SEG, SEG, h, 0), CUDA_ERROR_INVALID_VALUE); /* past its end */
        ck_assert_int_eq(cu->MemMap(va, SEG, SEG, h, 0), CUDA_SUCCESS);                 /* its second half */
        ck_assert_int_eq(cu->MemUnmap(va, SEG), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemAddressFree(va, 4 * SEG), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemRelease(h), CUDA_SUCCESS);
        pop_primary(cu, 0, ctx);
}
END_TEST

static const gm_cuda_t *capture_cu;
static CUevent capture_event;

static void *query_from_other_thread(void *arg) {
        (void) arg;
        return (void *) (intptr_t) capture_cu->EventQuery(capture_event);
}

static CUresult query_elsewhere(void) {
        pthread_t t;
        void *r;
        ck_assert_int_eq(pthread_create(&t, NULL, query_from_other_thread, NULL), 0);
        ck_assert_int_eq(pthread_join(t, &r), 0);
        return (CUresult) (intptr_t) r;
}

/* The emulator's capture entry points (not in gm_cuda_t). */
typedef struct capture_fns {
        begin_capture_fn begin;
        end_capture_fn end;
        is_capturing_fn capturing;
        graph_destroy_fn graph_destroy;
} capture_fns_t;

/* emu_open(), and the capture entry points. */
static capture_fns_t capture_open(emu_fixture_t *f) {
        emu_open(f);
        capture_cu = f->cu;
        return (capture_fns_t){
                .begin = FAKE_FN(begin_capture_fn, "cuStreamBeginCapture_v2"),
                .end = FAKE_FN(end_capture_fn, "cuStreamEndCapture"),
                .capturing = FAKE_FN(is_capturing_fn, "cuStreamIsCapturing"),
                .graph_destroy = FAKE_FN(graph_destroy_fn, "cuGraphDestroy"),
        };
}

/* Stream capture: in global mode another thread's event query, and this
 * thread's cuMemMap, are refused and invalidate the capture; relaxed mode
 * allows them. */
START_TEST(test_capture_refuses_unsafe_calls) {
        emu_fixture_t f;
        capture_fns_t cap = capture_open(&f);
        CUstream s;
        CUgraph g;
        CUstreamCaptureStatus status;
        ck_assert_int_eq(f.cu->StreamCreate(&s, 0), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventCreate(&capture_event, 0), CUDA_SUCCESS);

        ck_assert_int_eq(cap.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        ck_assert_int_eq(cap.capturing(s, &status), CUDA_SUCCESS);
        ck_assert_int_eq(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
        ck_assert_int_eq(query_elsewhere(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        ck_assert_int_eq(cap.capturing(s, &status), CUDA_SUCCESS);
        ck_assert_int_eq(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        ck_assert_int_eq(cap.end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

        ck_assert_int_eq(cap.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->MemUnmap(f.base, SEG), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        ck_assert_int_eq(cap.end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

        ck_assert_int_eq(cap.begin(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
        ck_assert_int_eq(query_elsewhere(), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventRecord(capture_event, s), CUDA_SUCCESS);                      /* captured */
        ck_assert_int_eq(f.cu->EventQuery(capture_event), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* in any mode */
        ck_assert_int_eq(cap.end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

        ck_assert_int_eq(cap.begin(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
        ck_assert_int_eq(cap.end(s, &g), CUDA_SUCCESS);
        ck_assert_int_eq(cap.graph_destroy(g), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->EventDestroy(capture_event), CUDA_SUCCESS);
        ck_assert_int_eq(f.cu->StreamDestroy(s), CUDA_SUCCESS);
        emu_close(&f, true);
}
END_TEST

static CUstreamCaptureStatus other_thread_status;

/* The per-thread default stream's capture status as another host thread
 * sees it (its own per-thread stream), with the device's primary context. */
static void *per_thread_status_elsewhere(void *arg) {
        (void) arg;
        CUcontext ctx = push_primary(capture_cu, 0);
        is_capturing_fn capturing = FAKE_FN(is_capturing_fn, "cuStreamIsCapturing");
        other_thread_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        ck_assert_int_eq(capturing(CU_STREAM_PER_THREAD, &other_thread_status), CUDA_SUCCESS);
        pop_primary(capture_cu, 0, ctx);
        return NULL;
}

/* The per-thread default stream, as on the driver: each host thread has its
 * own, it can be captured (the legacy stream cannot), the mapper's
 * capturing op asks about it (never about the legacy stream), and it is a
 * blocking stream: asking about the legacy stream during its capture is
 * refused and invalidates it. */
START_TEST(test_capture_of_per_thread_stream) {
        emu_fixture_t f;
        capture_fns_t cap = capture_open(&f);
        uint64_t per_thread = (uint64_t) (uintptr_t) CU_STREAM_PER_THREAD;
        CUstreamCaptureStatus status;
        CUgraph g;
        ck_assert_int_eq(cap.begin(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        ck_assert_int_eq(cap.begin(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
                         CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        ck_assert_int_eq(f.m->ops->capturing(f.m, per_thread), 0);

        ck_assert_int_eq(cap.begin(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        ck_assert_int_eq(cap.capturing(CU_STREAM_PER_THREAD, &status), CUDA_SUCCESS);
        ck_assert_int_eq(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
        ck_assert_int_eq(f.m->ops->capturing(f.m, per_thread), 1);
        ck_assert_int_eq(f.m->ops->capturing(f.m, 0), 0); /* the legacy stream: not asked */
        ck_assert_int_eq(f.m->ops->capturing(f.m, (uint64_t) (uintptr_t) CU_STREAM_LEGACY), 0);
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, per_thread_status_elsewhere, NULL), 0);
        ck_assert_int_eq(pthread_join(t, NULL), 0);
        ck_assert_int_eq(other_thread_status, CU_STREAM_CAPTURE_STATUS_NONE); /* its own stream */
        ck_assert_int_eq(cap.end(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);    /* still valid */
        ck_assert_int_eq(cap.graph_destroy(g), CUDA_SUCCESS);
        ck_assert_int_eq(f.m->ops->capturing(f.m, per_thread), 0);

        ck_assert_int_eq(cap.begin(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        ck_assert_int_eq(cap.capturing(CU_STREAM_LEGACY, &status), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        ck_assert_int_eq(cap.end(CU_STREAM_PER_THREAD, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        emu_close(&f, true);
}
END_TEST

/* ---- helpers run as separate programs ---- */

static int helper_map_client(int fd, uint32_t seed, const char *uuid) {
        gm_mapper_t *m;
        uint64_t base;
        int r = gm_mapper_cuda_new(0, uuid, 2 * MiB, &m);
        if (r < 0) {
                fprintf(stderr, "map-client: %s (%s)\n", strerror(-r), gm_cuda_last_error());
                return r == -ENODEV ? 19 : 10;
        }
        if (m->ops->reserve(m, SEG, &base) < 0)
                return 10;
        if (base % (2 * MiB) != 0 || m->ops->map(m, base, 0, SEG, fd) < 0) {
                fprintf(stderr, "map-client: %s\n", gm_cuda_last_error());
                m->ops->unreserve(m, base, SEG);
                m->ops->destroy(m);
                return 11;
        }
        fill((void *) (uintptr_t) base, SEG, seed);
        if (m->ops->unmap(m, base, 0, SEG) < 0 || m->ops->unreserve(m, base, SEG) < 0)
                return 12;
        m->ops->destroy(m);
        return 0;
}

/* Holds `size` bytes (an allocation and the primary context) until stdin closes. */
static int helper_hold_alloc(uint64_t size) {
        const gm_cuda_t *cu;
        CUcontext ctx;
        CUmemGenericAllocationHandle h;
        CUmemAllocationProp prop = gm_cuda_alloc_prop(0, false);
        if (gm_cuda_load(&cu) < 0 || cu->DevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
            cu->MemCreate(&h, size, &prop, 0) != CUDA_SUCCESS)
                return 10;
        printf("holding\n");
        fflush(stdout);
        char buf[16];
        while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
        }
        cu->MemRelease(h);
        cu->DevicePrimaryCtxRelease(0);
        return 0;
}

static int helper_main(int argc, char **argv) {
        if (argc == 6 && strcmp(argv[2], "map-client") == 0)
                return helper_map_client(atoi(argv[3]), (uint32_t) strtoul(argv[4], NULL, 10), argv[5]);
        if (argc == 4 && strcmp(argv[2], "hold-alloc") == 0)
                return helper_hold_alloc(strtoull(argv[3], NULL, 10));
        fprintf(stderr, "unknown helper\n");
        return 100;
}

static Suite *cuda_suite(void) {
        Suite *s = suite_create("cuda");
        TCase *tc = tcase_create("backend");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_open_create_release);
        tcase_add_test(tc, test_granularity_from_driver);
        tcase_add_test(tc, test_capacity_limit);
        tcase_add_test(tc, test_driver_out_of_memory);
        tcase_add_test(tc, test_fail_create_injected);
        tcase_add_test(tc, test_fail_create_other_error);
        tcase_add_test(tc, test_mem_info_other_thread);
        tcase_add_test(tc, test_device_selection);
        tcase_add_test(tc, test_no_libcuda_auto_falls_back);
        tcase_add_test(tc, test_no_device_auto_falls_back);
        suite_add_tcase(s, tc);

        tc = tcase_create("mapper");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_map_across_processes);
        tcase_add_test(tc, test_map_contiguous_pieces);
        tcase_add_test(tc, test_mapping_outlives_daemon_handle);
        tcase_add_test(tc, test_fork_does_not_inherit_mappings);
        tcase_add_test(tc, test_fail_import_injected);
        tcase_add_test(tc, test_fail_map_injected);
        tcase_add_test(tc, test_unmap_from_service_thread);
        tcase_add_test(tc, test_mapper_arguments);
        tcase_add_test(tc, test_events_held);
        suite_add_tcase(s, tc);

        tc = tcase_create("driver_defects");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_caller_context_kept);
        tcase_add_test(tc, test_event_on_other_context_stream);
        tcase_add_test(tc, test_fork_child_refused);
        tcase_add_test(tc, test_refused_without_vmm);
        tcase_add_test(tc, test_refused_without_posix_fd);
        tcase_add_test(tc, test_refused_compute_prohibited);
        tcase_add_test(tc, test_backend_holds_no_context);
        tcase_add_test(tc, test_mem_info_from_nvml);
        tcase_add_test(tc, test_mem_info_without_nvml);
        tcase_add_test(tc, test_client_device_by_uuid);
        tcase_add_test(tc, test_rdma_capable_allocations);
        tcase_add_test(tc, test_no_rdma_where_unsupported);
        tcase_add_test(tc, test_optional_entry_points);
        tcase_add_test(tc, test_required_entry_point_missing);
        tcase_add_test(tc, test_emulator_strict);
        tcase_add_test(tc, test_emulator_pool_device_wide);
        suite_add_tcase(s, tc);

        tc = tcase_create("emulator");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_work_runs_later);
        tcase_add_test(tc, test_legacy_stream_ordering);
        tcase_add_test(tc, test_map_alignment_checked);
        tcase_add_test(tc, test_capture_refuses_unsafe_calls);
        tcase_add_test(tc, test_capture_of_per_thread_stream);
        suite_add_tcase(s, tc);

        /* Tests that end in a fault or a signal: no teardown's checks. */
        tc = tcase_create("emulator_faults");
        tcase_add_checked_fixture(tc, setup, NULL);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_unmap_under_kernel_faults);
        tcase_add_test(tc, test_kernel_on_unmapped_memory_faults);
        tcase_add_test_raise_signal(tc, test_cpu_cannot_touch_device_memory, SIGSEGV);
        tcase_add_test_raise_signal(tc, test_destroyed_stream_poisoned, SIGABRT);
        tcase_add_test_raise_signal(tc, test_destroyed_event_poisoned, SIGABRT);
        suite_add_tcase(s, tc);
        return s;
}

int main(int argc, char **argv) {
        if (argc > 2 && strcmp(argv[1], "--helper") == 0)
                return helper_main(argc, argv);
        SRunner *sr = srunner_create(cuda_suite());
        /* Every test configures the emulated driver before loading it. */
        srunner_set_fork_status(sr, CK_FORK);
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
