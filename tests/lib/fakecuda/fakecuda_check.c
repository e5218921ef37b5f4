#include "fakecuda_check.h"
#include "pool.h"

#include <check.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *gm_fake_symbol(const char *name) {
        void *lib = dlopen(getenv("GPUMEM_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
        ck_assert_ptr_nonnull(lib);
        void *fn = dlsym(lib, name);
        ck_assert_ptr_nonnull(fn);
        dlclose(lib);
        return fn;
}

bool gm_fake_usage(fakecuda_usage_t *ret) {
        const char *path = getenv("GPUMEM_LIBCUDA");
        void *lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
        if (!lib)
                return false;
        dlclose(lib);
        fakecuda_usage_fn fn;
        void *p = gm_fake_symbol("fakecuda_usage");
        memcpy(&fn, &p, sizeof(p));
        return fn(ret) == 0;
}

uint64_t gm_fake_device_bytes(int device) {
        fakecuda_device_usage_fn fn;
        void *p = gm_fake_symbol("fakecuda_device_usage");
        memcpy(&fn, &p, sizeof(p));
        uint64_t bytes = 0, allocations = 0;
        ck_assert_int_eq(fn(device, &bytes, &allocations), 0);
        return bytes;
}

/* A symbol of the emulator when this process loaded it, else NULL. */
static void *loaded_symbol(const char *name) {
        const char *path = getenv("GPUMEM_LIBCUDA");
        void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
        void *fn = lib ? dlsym(lib, name) : NULL;
        if (lib)
                dlclose(lib);
        return fn;
}

static bool is_device_pointer(const void *p) {
        fakecuda_is_device_pointer_fn is_device;
        void *fn = loaded_symbol("fakecuda_is_device_pointer");
        memcpy(&is_device, &fn, sizeof(fn));
        return fn && is_device(p);
}

/* Outside a check test too (client programs): a failed kernel aborts. */
static void *device_symbol(const char *name) {
        void *fn = loaded_symbol(name);
        if (!fn) {
                fprintf(stderr, "the loaded emulator has no %s\n", name);
                abort();
        }
        return fn;
}

bool gm_fake_device_fill(void *p, size_t n, uint64_t seed) {
        if (!is_device_pointer(p))
                return false;
        fakecuda_device_pattern_fn pattern;
        void *fn = device_symbol("fakecuda_device_pattern");
        memcpy(&pattern, &fn, sizeof(fn));
        int r = pattern((uint64_t) (uintptr_t) p, n, seed);
        if (r != 0) {
                fprintf(stderr, "fakecuda_device_pattern(%p, %zu): CUresult %d\n", p, n, r);
                abort();
        }
        return true;
}

int gm_fake_device_verify(const void *p, size_t n, uint64_t seed) {
        if (!is_device_pointer(p))
                return -1;
        fakecuda_device_verify_pattern_fn verify;
        void *fn = device_symbol("fakecuda_device_verify_pattern");
        memcpy(&verify, &fn, sizeof(fn));
        int ok = 0, r = verify((uint64_t) (uintptr_t) p, n, seed, &ok);
        if (r != 0) {
                fprintf(stderr, "fakecuda_device_verify_pattern(%p, %zu): CUresult %d\n", p, n, r);
                abort();
        }
        return ok;
}

int gm_fake_device_verify_byte(const void *p, size_t n, unsigned char value) {
        if (!is_device_pointer(p))
                return -1;
        fakecuda_device_verify_fn verify;
        void *fn = device_symbol("fakecuda_device_verify");
        memcpy(&verify, &fn, sizeof(fn));
        int ok = 0, r = verify((uint64_t) (uintptr_t) p, n, value, &ok);
        if (r != 0) {
                fprintf(stderr, "fakecuda_device_verify(%p, %zu): CUresult %d\n", p, n, r);
                abort();
        }
        return ok;
}

void gm_fake_assert_no_objects(void) {
        fakecuda_usage_t u;
        if (!gm_fake_usage(&u))
                return;
        ck_assert_msg(u.faults == 0, "%ld emulated kernels faulted: their memory was unmapped under them", u.faults);
        ck_assert_msg(u.handles == 0 && u.mappings == 0 && u.reservations == 0 && u.blocks == 0 && u.streams == 0 &&
                              u.events == 0 && u.contexts == 0 && u.stack_depth == 0 && u.host_allocations == 0,
                      "leaked: %ld handles, %ld mappings, %ld reservations, %ld blocks, %ld streams, %ld events, "
                      "%ld contexts, context stack %ld, %ld page-locked host blocks",
                      u.handles, u.mappings, u.reservations, u.blocks, u.streams, u.events, u.contexts, u.stack_depth,
                      u.host_allocations);
}

void gm_fake_new_pool(char *path, size_t len) {
        snprintf(path, len, "/tmp/fakecuda-pool-XXXXXX");
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
        setenv("FAKECUDA_POOL", path, 1);
}

void gm_fake_assert_device_drained(void) {
        const char *path = getenv("FAKECUDA_POOL");
        if (!path || !*path)
                return;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return; /* no process used the emulator */
        void *p = mmap(NULL, sizeof(fake_pool_t), PROT_READ, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(p, MAP_FAILED);
        const fake_pool_t *pool = p;
        uint64_t bytes = 0;
        for (int i = 0; i < 500; i++) {
                bytes = 0; /* read without the lock: polled until it holds */
                for (int d = 0; pool->magic == FAKE_POOL_MAGIC && d < FAKE_MAX_DEVICES; d++)
                        bytes += fake_pool_live_bytes(pool, d, true);
                if (bytes == 0)
                        break;
                usleep(10000);
        }
        munmap(p, sizeof(fake_pool_t));
        close(fd);
        ck_assert_msg(bytes == 0, "%llu bytes of device memory still held by other processes",
                      (unsigned long long) bytes);
}
