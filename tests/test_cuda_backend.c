/* Check suite for the cuda backend (backend/backend_cuda.c), the cuda mapper
 * (client/mapper_cuda.c) and their loader, run over the emulated driver
 * (tests/fakecuda, selected by GPUMEM_LIBCUDA). Each test runs in its own
 * forked process (CK_FORK), so each loads the driver afresh and may set the
 * FAKECUDA_* configuration before its first CUDA call. Device pointers of the
 * emulated driver are CPU mappings, so the tests read and write through them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "cuda_loader.h"
#include "mapper.h"
#include "testutil.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define SEG (4 * MiB)

#define ck_assert_ok(expr)                                                                                     \
        do {                                                                                                   \
                int _r = (expr);                                                                               \
                ck_assert_msg(_r >= 0, "%s failed: %s (%s)", #expr, strerror(-_r), gm_cuda_last_error());      \
        } while (0)

/* ---- helpers ---- */

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
        ck_assert_ok(gm_mapper_cuda_new(0, granularity, &m));
        ck_assert_str_eq(m->ops->backend, "cuda");
        return m;
}

static void fill(void *p, size_t n, uint32_t seed) {
        uint32_t *w = p;
        for (size_t i = 0; i < n / sizeof(*w); i++)
                w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static bool verify(const void *p, size_t n, uint32_t seed) {
        const uint32_t *w = p;
        for (size_t i = 0; i < n / sizeof(*w); i++)
                if (w[i] != (seed ^ (uint32_t)(i * 2654435761u)))
                        return false;
        return true;
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
        ck_assert_int_eq(st.st_size, (off_t)SEG);
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
        return (void *)(intptr_t)((gm_backend_t *)arg)->ops->mem_info(arg, &free_bytes, &total);
}

START_TEST(test_mem_info_other_thread) {
        /* cuMemGetInfo needs a current context; a fresh thread has none. */
        gm_backend_t *b = open_cuda(0);
        pthread_t t;
        void *ret;
        ck_assert_int_eq(pthread_create(&t, NULL, mem_info_thread, b), 0);
        ck_assert_int_eq(pthread_join(t, &ret), 0);
        ck_assert_int_eq((int)(intptr_t)ret, 0);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_device_selection) {
        setenv("FAKECUDA_DEVICE_COUNT", "3", 1);
        setenv("FAKECUDA_UUID_PREFIX", "0123abcd", 1);
        gm_backend_options_t opts = {.kind = "cuda", .device = 0,
                                     .device_uuid = "GPU-0123abcd-0000-0000-0000-000000000002"};
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
        ck_assert_int_eq(gm_mapper_cuda_new(0, 2 * MiB, &m), -ELIBACC);

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

        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* The client: plain exit codes, no Check calls in this process. */
                gm_mapper_t *m;
                uint64_t base;
                if (gm_mapper_cuda_new(0, 2 * MiB, &m) < 0 || m->ops->reserve(m, SEG, &base) < 0)
                        _exit(10);
                if (base % (2 * MiB) != 0 || m->ops->map(m, base, 0, SEG, phys.fd) < 0)
                        _exit(11);
                fill((void *)(uintptr_t)base, SEG, 0xc0ffee);
                if (m->ops->unmap(m, base, 0, SEG) < 0 || m->ops->unreserve(m, base, SEG) < 0)
                        _exit(12);
                m->ops->destroy(m);
                _exit(0);
        }
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "client failed with status %#x", status);

        gm_mapper_t *m = new_mapper(b->granularity);
        uint64_t base = map_copy(m, phys.fd, SEG);
        ck_assert(verify((void *)(uintptr_t)base, SEG, 0xc0ffee));
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
        fill((void *)(uintptr_t)base, 2 * SEG, 7);

        /* The second piece alone, elsewhere, holds the second half. */
        ck_assert(verify((void *)(uintptr_t)base, 2 * SEG, 7));
        uint64_t other = map_copy(m, p2.fd, SEG);
        ck_assert_int_eq(memcmp((void *)(uintptr_t)other, (void *)(uintptr_t)(base + SEG), SEG), 0);
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
        fill((void *)(uintptr_t)base, SEG, 99);
        gm_backend_release(b, &phys);
        ck_assert(verify((void *)(uintptr_t)base, SEG, 99));
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
                _exit(msync((void *)(uintptr_t)base, 4096, MS_ASYNC) < 0 && errno == ENOMEM ? 0 : 1);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child sees the mapping");
        ck_assert_int_eq(msync((void *)(uintptr_t)base, 4096, MS_ASYNC), 0);
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
        fill((void *)(uintptr_t)base, SEG, 5);
        ck_assert(verify((void *)(uintptr_t)base, SEG, 5));
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
        return (void *)(intptr_t)job->m->ops->unmap(job->m, job->base, 0, SEG);
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
        ck_assert_int_eq((int)(intptr_t)ret, 0);
        ck_assert_ok(m->ops->unreserve(m, job.base, SEG));
        m->ops->destroy(m);
        gm_backend_release(b, &phys);
        gm_backend_close(b);
}
END_TEST

START_TEST(test_mapper_arguments) {
        gm_mapper_t *m = NULL;
        ck_assert_int_eq(gm_mapper_cuda_new(0, 0, &m), -EINVAL);
        ck_assert_int_eq(gm_mapper_cuda_new(0, 1 * MiB, &m), -EINVAL); /* not a multiple of the device's 2 MiB */
        ck_assert_int_eq(gm_mapper_cuda_new(1, 2 * MiB, &m), -ENODEV);
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
        ck_assert_int_eq(cu->CtxSetCurrent(ctx), CUDA_SUCCESS);
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
}
END_TEST

static Suite *cuda_suite(void) {
        Suite *s = suite_create("cuda");
        TCase *tc = tcase_create("backend");
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
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(cuda_suite());
        /* Every test configures the emulated driver before loading it. */
        srunner_set_fork_status(sr, CK_FORK);
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
