/* gpu_client: the client side of scripts/gpu-check.sh. A plain C program over
 * libgpumem and the CUDA driver API, which it loads with dlopen
 * ($GPUMEM_LIBCUDA, else libcuda.so.1) like libgpumem does.
 *
 * On a GPU it writes and checks memory with real kernels (kernels.cu as PTX,
 * $GM_CHECK_PTX, JIT-compiled by the driver). Over the emulated driver
 * (tests/lib/fakecuda), whose device memory the CPU cannot touch either, the
 * same fills, checks and long-running work are the emulator's kernels
 * (fakecuda_launch_*, queued on the same streams and run later by its stream
 * workers): every result line names which of the two ran ("kernels" or
 * "emulated kernels").
 *
 *   gpu_client pattern SOCKET SEED DIR   allocate blocks of assorted sizes, fill
 *        them, write DIR/held-SEED (bytes held), wait for DIR/go, verify, free
 *   gpu_client expandable SOCKET          many pages, partial frees, trim, verify
 *   gpu_client streams SOCKET             record_stream/free_async on real streams
 *        with 300 ms kernels still running on the second stream
 *   gpu_client trim-busy SOCKET           trim while a kernel writes a live block
 *   gpu_client cache SOCKET DIR           cache memory, DIR/cached, wait for DIR/go,
 *        report whether the daemon reclaimed it meanwhile; then DIR/released
 *        (bytes and pid) and wait for DIR/go2 (the device's figures are read while
 *        this client still lives)
 *   gpu_client hold SOCKET DIR            fill blocks, DIR/ready, wait for DIR/go
 *        (a daemon restart happens meanwhile), verify, allocate more, free
 *   gpu_client hog BYTES DIR              cuMemAlloc BYTES outside gpumemd, DIR/hog,
 *        wait for DIR/go
 *   gpu_client oom SOCKET                 allocate until cuMemCreate fails, print
 *        the diagnosis
 *   gpu_client bench SOCKET               median ns of a cached alloc+free through
 *        the daemon and of cuMemAlloc+cuMemFree
 *   gpu_client grow SOCKET BYTES           the driver's minimum and recommended
 *        granularity; the time to grow to BYTES in 2 MiB blocks, then free, trim
 *   gpu_client early-reuse SOCKET          record_stream'd block freed while a
 *        kernel on a second stream still uses it; the next allocation of that
 *        size must not be it (or, if it is, keeps its data after the kernel)
 *   gpu_client queued-free SOCKET DIR     free with a kernel still queued, then
 *        gpumem_trim; again, DIR/queued, wait for DIR/go (an admin trim, a
 *        Reclaim, meanwhile); each time cuStreamSynchronize must succeed and
 *        the trimmed bytes be released
 *   gpu_client oom-ladder SOCKET BLOCK    (a daemon with a memory fraction of 4
 *        BLOCKs) three blocks, a kernel still queued on two of them when they
 *        are freed, then a 1.5 BLOCK request that only the retry ladder's
 *        release of the cached two can serve: cuStreamSynchronize must
 *        succeed afterwards and the live block keep its data
 *   gpu_client context SOCKET             a context of the caller's own current
 *        (cuCtxCreate; the emulator has none: device 0's primary context) stays
 *        current through gpumem_alloc, gpumem_free, gpumem_trim (page reuse on)
 *   gpu_client publish SOCKET NAME BYTES SEED  create a staging shared object of
 *        BYTES, fill it with a kernel (SEED's pattern), publish it readable by
 *        every tenant ("*"), close it and exit (the daemon keeps it)
 *   gpu_client open-verify SOCKET NAME SEED [DIR]  (DIR: write DIR/ready-PID once
 *        connected, wait for DIR/open; DIR/mapped-PID once verified, wait for
 *        DIR/go) open NAME read-only, verify SEED's pattern with a kernel
 *        reading the read-only mapping, close
 *   gpu_client open-write SOCKET NAME     open NAME read-only and write it with
 *        a kernel: the kernel must fault (cuStreamSynchronize fails, the
 *        context is lost, so this process ends without closing)
 *   gpu_client unpublish SOCKET NAME      withdraw every version of NAME
 *   gpu_client sleeper SOCKET DIR         fill blocks, DIR/filled (bytes), wait for
 *        DIR/sleep; gpumem_sleep keeping every block, DIR/asleep (released bytes,
 *        ns), wait for DIR/wake; gpumem_wake, verify every block at the same
 *        address with a kernel, free; says whether the kept data was pinned
 *   gpu_client neighbour SOCKET BYTES [DIR]  allocate BYTES (in 64 MiB blocks),
 *        fill them (DIR: then DIR/holding, wait for DIR/release), verify them,
 *        free, trim
 *   gpu_client probe -                    load the driver (and the kernels) only
 * Exit status 0 when the mode's checks held; the last line is the result. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpumem/gpumem.h"

#define MiB (1024ull * 1024ull)

/* ---- the driver ---- */

static struct {
        bool kernels; /* a real device: PTX loaded */
        PFN_cuInit_v2000 Init;
        PFN_cuGetErrorName_v6000 GetErrorName;
        PFN_cuDevicePrimaryCtxRetain_v7000 PrimaryCtxRetain;
        PFN_cuDevicePrimaryCtxRelease_v11000 PrimaryCtxRelease;
        PFN_cuCtxPushCurrent_v4000 CtxPush;
        PFN_cuCtxPopCurrent_v4000 CtxPop;
        PFN_cuStreamCreate_v2000 StreamCreate;
        PFN_cuStreamDestroy_v4000 StreamDestroy;
        PFN_cuStreamSynchronize_v2000 StreamSynchronize;
        PFN_cuMemAlloc_v3020 MemAlloc;
        PFN_cuMemFree_v3020 MemFree;
        PFN_cuModuleLoadData_v2000 ModuleLoadData;
        PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
        PFN_cuLaunchKernel_v4000 LaunchKernel;
        PFN_cuMemsetD32_v3020 MemsetD32;
        PFN_cuMemcpyDtoH_v3020 MemcpyDtoH;
        PFN_cuMemGetAllocationGranularity_v10020 Granularity;
        PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
        PFN_cuCtxCreate_v3020 CtxCreate;   /* absent in the emulator */
        PFN_cuCtxDestroy_v4000 CtxDestroy; /* absent in the emulator */
        CUfunction fill, check, spin_fill;
        CUdeviceptr bad; /* mismatch counter of gm_check */
        /* The emulator's kernels (tests/lib/fakecuda/fakecuda.h), when it is the driver. */
        int (*emu_pattern)(void *stream, uint64_t dst, size_t bytes, uint64_t seed);
        int (*emu_verify_pattern)(void *stream, uint64_t src, size_t bytes, uint64_t seed, int *ret_ok);
        int (*emu_spin)(void *stream, unsigned ms);
} cu;

static gpumem_client *client;

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        exit(1);
}

static void ck(CUresult r, const char *what) {
        if (r == CUDA_SUCCESS)
                return;
        const char *name = "?";
        if (cu.GetErrorName)
                cu.GetErrorName(r, &name);
        die("%s: %s", what, name);
}

static void ck_gm(int r, const char *what) {
        if (r < 0)
                die("%s: %s (%s)", what, gpumem_strerror(r), gpumem_last_error(client));
}

static void *sym(void *lib, const char *name, bool required) {
        void *p = dlsym(lib, name);
        if (!p && required)
                die("the driver lacks %s", name);
        return p;
}

#define SYM(field, name, required)                   \
        do {                                         \
                void *p_ = sym(lib, name, required); \
                memcpy(&cu.field, &p_, sizeof(p_));  \
        } while (0)

static const char *method(void) {
        return cu.kernels ? "kernels" : "emulated kernels";
}

/* Loads the driver, makes device 0's primary context current (as an
 * application would have it) and, on a GPU, the kernels. */
static void driver_open(void) {
        const char *path = getenv("GPUMEM_LIBCUDA");
        void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
                die("cannot load the CUDA driver: %s", dlerror());
        SYM(Init, "cuInit", true);
        SYM(GetErrorName, "cuGetErrorName", true);
        SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", true);
        SYM(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", true);
        SYM(CtxPush, "cuCtxPushCurrent_v2", true);
        SYM(CtxPop, "cuCtxPopCurrent_v2", true);
        SYM(StreamCreate, "cuStreamCreate", true);
        SYM(StreamDestroy, "cuStreamDestroy_v2", true);
        SYM(StreamSynchronize, "cuStreamSynchronize", true);
        SYM(MemAlloc, "cuMemAlloc_v2", true);
        SYM(MemFree, "cuMemFree_v2", true);
        SYM(ModuleLoadData, "cuModuleLoadData", false);
        SYM(ModuleGetFunction, "cuModuleGetFunction", false);
        SYM(LaunchKernel, "cuLaunchKernel", false);
        SYM(MemsetD32, "cuMemsetD32_v2", false);
        SYM(MemcpyDtoH, "cuMemcpyDtoH_v2", false);
        SYM(Granularity, "cuMemGetAllocationGranularity", true);
        SYM(CtxGetCurrent, "cuCtxGetCurrent", true);
        SYM(CtxCreate, "cuCtxCreate_v2", false);
        SYM(CtxDestroy, "cuCtxDestroy_v2", false);
        SYM(emu_pattern, "fakecuda_launch_pattern", false);
        SYM(emu_verify_pattern, "fakecuda_launch_verify_pattern", false);
        SYM(emu_spin, "fakecuda_launch_spin", false);
        ck(cu.Init(0), "cuInit");
        CUcontext ctx;
        ck(cu.PrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
        ck(cu.CtxPush(ctx), "cuCtxPushCurrent");
        if (cu.emu_pattern && cu.emu_verify_pattern && cu.emu_spin)
                return; /* the emulator: its own kernels */
        if (!cu.ModuleLoadData || !cu.LaunchKernel || !cu.MemsetD32 || !cu.MemcpyDtoH)
                die("the driver has neither cuLaunchKernel nor the emulator's kernels");
        const char *ptx_path = getenv("GM_CHECK_PTX");
        FILE *f = ptx_path ? fopen(ptx_path, "re") : NULL;
        if (!f)
                die("a GPU needs the kernels: GM_CHECK_PTX=%s cannot be read", ptx_path ? ptx_path : "(unset)");
        static char ptx[1 << 20];
        size_t n = fread(ptx, 1, sizeof(ptx) - 1, f);
        fclose(f);
        ptx[n] = '\0';
        CUmodule mod;
        ck(cu.ModuleLoadData(&mod, ptx), "cuModuleLoadData (JIT of kernels.ptx)");
        ck(cu.ModuleGetFunction(&cu.fill, mod, "gm_fill"), "cuModuleGetFunction(gm_fill)");
        ck(cu.ModuleGetFunction(&cu.check, mod, "gm_check"), "cuModuleGetFunction(gm_check)");
        ck(cu.ModuleGetFunction(&cu.spin_fill, mod, "gm_spin_fill"), "cuModuleGetFunction(gm_spin_fill)");
        ck(cu.MemAlloc(&cu.bad, sizeof(unsigned)), "cuMemAlloc");
        cu.kernels = true;
}

static void driver_close(void) {
        if (cu.kernels)
                cu.MemFree(cu.bad);
        CUcontext ctx;
        cu.CtxPop(&ctx);
        cu.PrimaryCtxRelease(0);
}

static void launch(CUfunction f, CUstream stream, void **params) {
        ck(cu.LaunchKernel(f, 264, 1, 1, 256, 1, 1, 0, stream, params, NULL), "cuLaunchKernel");
}

/* Fills [p, +bytes) with the seed's pattern on `stream`; `spin_ns` of work first. */
static void fill_async(void *p, uint64_t bytes, uint32_t seed, CUstream stream, uint64_t spin_ns) {
        unsigned long long n = bytes / 4, ns = spin_ns;
        CUdeviceptr d = (CUdeviceptr) (uintptr_t) p;
        if (!cu.kernels) {
                if (spin_ns)
                        ck(cu.emu_spin(stream, (unsigned) (spin_ns / 1000000)), "fakecuda_launch_spin");
                ck(cu.emu_pattern(stream, d, bytes, seed), "fakecuda_launch_pattern");
                return;
        }
        void *params[] = {&d, &n, &seed, &ns};
        launch(spin_ns ? cu.spin_fill : cu.fill, stream, params);
}

static void fill(void *p, uint64_t bytes, uint32_t seed) {
        fill_async(p, bytes, seed, NULL, 0);
        ck(cu.StreamSynchronize(NULL), "cuStreamSynchronize");
}

static bool verify(const void *p, uint64_t bytes, uint32_t seed) {
        unsigned long long n = bytes / 4;
        CUdeviceptr d = (CUdeviceptr) (uintptr_t) p;
        if (!cu.kernels) {
                int ok = 0;
                ck(cu.emu_verify_pattern(NULL, d, bytes, seed, &ok), "fakecuda_launch_verify_pattern");
                ck(cu.StreamSynchronize(NULL), "cuStreamSynchronize");
                return ok == 1;
        }
        unsigned bad = 0;
        ck(cu.MemsetD32(cu.bad, 0, 1), "cuMemsetD32");
        void *params[] = {&d, &n, &seed, &cu.bad};
        launch(cu.check, NULL, params);
        ck(cu.StreamSynchronize(NULL), "cuStreamSynchronize");
        ck(cu.MemcpyDtoH(&bad, cu.bad, sizeof(bad)), "cuMemcpyDtoH");
        return bad == 0;
}

/* ---- helpers ---- */

static void connect_to(const char *socket) {
        ck_gm(gpumem_connect(socket, &client), "gpumem_connect");
}

static int64_t stat_of(const char *name) {
        int64_t v = -1;
        ck_gm(gpumem_stat(client, name, &v), name);
        return v;
}

static void touch(const char *dir, const char *name, const char *content) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        char tmp[520];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "we");
        if (!f || fprintf(f, "%s\n", content) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
                die("cannot write %s", path);
}

static void wait_for(const char *dir, const char *name, int seconds) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        for (int i = 0; i < seconds * 100; i++) {
                if (access(path, F_OK) == 0)
                        return;
                usleep(10000);
        }
        die("waited %d s for %s", seconds, path);
}

/* Sizes of the bigger blocks, a quarter with $GM_CHECK_SMALL (the emulator's
 * memory is host memory). */
static uint64_t big(uint64_t bytes) {
        const char *small = getenv("GM_CHECK_SMALL");
        return small && *small && strcmp(small, "0") != 0 ? bytes / 4 : bytes;
}

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static const uint64_t block_sizes[] = {4096, 512 * 1024, 3 * MiB, 24 * MiB, 96 * MiB};
#define N_BLOCKS 20

typedef struct blocks {
        void *p[N_BLOCKS];
        uint64_t size[N_BLOCKS];
        uint64_t bytes;
} blocks_t;

static void blocks_fill(blocks_t *b, uint32_t seed) {
        b->bytes = 0;
        for (int i = 0; i < N_BLOCKS; i++) {
                b->size[i] = block_sizes[i % 5];
                ck_gm(gpumem_alloc(client, b->size[i], 0, &b->p[i]), "gpumem_alloc");
                fill(b->p[i], b->size[i], seed + (uint32_t) i);
                b->bytes += b->size[i];
        }
}

static int blocks_verify_free(blocks_t *b, uint32_t seed) {
        int bad = 0;
        for (int i = 0; i < N_BLOCKS; i++) {
                bad += !verify(b->p[i], b->size[i], seed + (uint32_t) i);
                ck_gm(gpumem_free(client, b->p[i]), "gpumem_free");
        }
        return bad;
}

/* ---- modes ---- */

static int mode_pattern(const char *socket, uint32_t seed, const char *dir) {
        connect_to(socket);
        blocks_t b;
        blocks_fill(&b, seed);
        char held[32], name[32];
        snprintf(held, sizeof(held), "%" PRIu64, b.bytes);
        snprintf(name, sizeof(name), "held-%u", seed);
        touch(dir, name, held);
        wait_for(dir, "go", 120);
        int bad = blocks_verify_free(&b, seed);
        if (bad)
                die("client %u: %d of %d blocks lost their pattern", seed, bad, N_BLOCKS);
        gpumem_disconnect(client);
        printf("client %u: %d blocks, %.1f MiB written and verified with %s\n", seed, N_BLOCKS, (double) b.bytes / MiB,
               method());
        return 0;
}

static int mode_expandable(const char *socket) {
        connect_to(socket);
        void *large, *small[64];
        const uint64_t big_size = big(1500 * MiB);
        ck_gm(gpumem_alloc(client, big_size, 0, &large), "gpumem_alloc(1500 MiB)");
        for (int i = 0; i < 64; i++)
                ck_gm(gpumem_alloc(client, 3 * MiB, 0, &small[i]), "gpumem_alloc(3 MiB)");
        fill(large, big_size, 1);
        for (int i = 0; i < 64; i++)
                fill(small[i], 3 * MiB, 100 + (uint32_t) i);
        int64_t reserved = stat_of("reserved_bytes.all.current");
        ck_gm(gpumem_free(client, large), "gpumem_free");
        for (int i = 0; i < 64; i += 2)
                ck_gm(gpumem_free(client, small[i]), "gpumem_free");
        uint64_t released = 0;
        ck_gm(gpumem_trim(client, &released), "gpumem_trim");
        int64_t after = stat_of("reserved_bytes.all.current");
        int bad = 0;
        for (int i = 1; i < 64; i += 2) {
                bad += !verify(small[i], 3 * MiB, 100 + (uint32_t) i);
                ck_gm(gpumem_free(client, small[i]), "gpumem_free");
        }
        ck_gm(gpumem_trim(client, NULL), "gpumem_trim");
        int64_t end = stat_of("reserved_bytes.all.current");
        gpumem_disconnect(client);
        /* Pages the remaining small blocks share with the freed ones stay mapped. */
        if (bad || released == 0 || after >= reserved || end != 0)
                die("%d blocks lost data, %" PRIu64 " bytes released (reserved %" PRId64 " -> %" PRId64 "), %" PRId64
                    " reserved at the end",
                    bad, released, reserved, after, end);
        printf("expandable segments: reserved %.0f MiB, trim released %.0f MiB, %.0f MiB stayed for live blocks "
               "(verified with %s), 0 at the end\n",
               (double) reserved / MiB, (double) released / MiB, (double) after / MiB, method());
        return 0;
}

static int mode_streams(const char *socket) {
        connect_to(socket);
        CUstream s1, s2;
        ck(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        ck(cu.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        void *a, *b;
        ck_gm(gpumem_alloc(client, 64 * MiB, (uint64_t) (uintptr_t) s1, &a), "gpumem_alloc");
        ck_gm(gpumem_alloc(client, 64 * MiB, (uint64_t) (uintptr_t) s1, &b), "gpumem_alloc");
        /* Kernels that take 300 ms on s2 use both blocks; the frees must wait for them. */
        fill_async(a, 64 * MiB, 5, s2, 300000000);
        fill_async(b, 64 * MiB, 6, s2, 300000000);
        ck_gm(gpumem_record_stream(client, a, (uint64_t) (uintptr_t) s2), "gpumem_record_stream");
        ck_gm(gpumem_free(client, a), "gpumem_free");
        ck_gm(gpumem_free_async(client, b, (uint64_t) (uintptr_t) s2), "gpumem_free_async");
        int64_t pending = stat_of("active_bytes.all.current");
        int64_t allocated = stat_of("allocated_bytes.all.current");
        uint64_t t0 = now_ns();
        int64_t active = pending;
        for (int i = 0; i < 1000 && active != 0; i++) {
                usleep(5000);
                active = stat_of("active_bytes.all.current");
        }
        uint64_t waited_ms = (now_ns() - t0) / 1000000;
        ck(cu.StreamSynchronize(s2), "cuStreamSynchronize");
        ck(cu.StreamDestroy(s1), "cuStreamDestroy");
        ck(cu.StreamDestroy(s2), "cuStreamDestroy");
        gpumem_disconnect(client);
        if (pending != (int64_t) (128 * MiB) || allocated != 0 || active != 0)
                die("streams: %" PRId64 " bytes pending after the frees (want %llu), allocated %" PRId64 ", %" PRId64
                    " still active after %" PRIu64 " ms",
                    pending, 128 * MiB, allocated, active, waited_ms);
        printf("free_async/record_stream: %.0f MiB pending while the streams were busy (%s), released %" PRIu64
               " ms after\n",
               (double) pending / MiB,
               cu.kernels ? "300 ms kernels on a second stream" : "300 ms emulated kernels on a second stream",
               waited_ms);
        return 0;
}

static int mode_trim_busy(const char *socket) {
        connect_to(socket);
        void *cache, *live;
        const uint64_t cache_size = big(512 * MiB), live_size = big(256 * MiB);
        ck_gm(gpumem_alloc(client, cache_size, 0, &cache), "gpumem_alloc");
        ck_gm(gpumem_free(client, cache), "gpumem_free");
        CUstream s;
        ck(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        ck_gm(gpumem_alloc(client, live_size, (uint64_t) (uintptr_t) s, &live), "gpumem_alloc");
        fill_async(live, live_size, 9, s, 500000000); /* half a second of work on the live block */
        uint64_t released = 0;
        uint64_t t0 = now_ns();
        ck_gm(gpumem_trim(client, &released), "gpumem_trim");
        uint64_t trim_ms = (now_ns() - t0) / 1000000;
        ck(cu.StreamSynchronize(s), "cuStreamSynchronize");
        bool ok = verify(live, live_size, 9);
        ck_gm(gpumem_free(client, live), "gpumem_free");
        ck(cu.StreamDestroy(s), "cuStreamDestroy");
        gpumem_disconnect(client);
        if (!ok || released < cache_size)
                die("trim while busy: released %" PRIu64 " bytes, live block %s", released, ok ? "intact" : "damaged");
        printf("trim while %s: %.0f MiB released in %" PRIu64 " ms, the live block intact (%s)\n",
               cu.kernels ? "a 500 ms kernel writes a live block" : "a live block is in use", (double) released / MiB,
               trim_ms, method());
        return 0;
}

static int mode_cache(const char *socket, const char *dir) {
        connect_to(socket);
        void *p;
        const uint64_t size = big(512 * MiB);
        ck_gm(gpumem_alloc(client, size, 0, &p), "gpumem_alloc");
        fill(p, size, 3);
        ck_gm(gpumem_free(client, p), "gpumem_free");
        int64_t cached = stat_of("reserved_bytes.all.current");
        touch(dir, "cached", "1");
        wait_for(dir, "go", 120);
        int64_t left = stat_of("reserved_bytes.all.current");
        /* A local heap gives its cache back when it serves the daemon's
         * Reclaim, after the trim has answered: wait for it (bounded). */
        for (int i = 0; i < 200 && left != 0; i++) {
                usleep(50000);
                left = stat_of("reserved_bytes.all.current");
        }
        if (cached < (int64_t) size || left != 0)
                die("reclaim: cached %" PRId64 " bytes, %" PRId64 " left after the trim", cached, left);
        char released[64];
        snprintf(released, sizeof(released), "%" PRId64 " %d", cached, (int) getpid());
        touch(dir, "released", released);
        wait_for(dir, "go2", 120);
        gpumem_disconnect(client);
        printf("reclaim: an admin trim (gpumemctl trim) took back this idle client's %.0f MiB cache\n",
               (double) cached / MiB);
        return 0;
}

static int mode_hold(const char *socket, const char *dir) {
        connect_to(socket);
        blocks_t b;
        blocks_fill(&b, 40);
        touch(dir, "ready", "1");
        wait_for(dir, "go", 120);
        void *more;
        ck_gm(gpumem_alloc(client, 8 * MiB, 0, &more), "gpumem_alloc after the restart");
        fill(more, 8 * MiB, 77);
        bool ok = verify(more, 8 * MiB, 77);
        ck_gm(gpumem_free(client, more), "gpumem_free");
        int bad = blocks_verify_free(&b, 40);
        gpumem_disconnect(client);
        if (bad || !ok)
                die("restart: %d of %d blocks lost data", bad, N_BLOCKS);
        printf("client kept %.1f MiB in %d blocks across the restart and allocates again (%s)\n",
               (double) b.bytes / MiB, N_BLOCKS, method());
        return 0;
}

static int mode_hog(uint64_t bytes, const char *dir) {
        CUdeviceptr p;
        ck(cu.MemAlloc(&p, bytes), "cuMemAlloc (outside gpumemd)");
        touch(dir, "hog", "1");
        wait_for(dir, "go", 300);
        cu.MemFree(p);
        return 0;
}

static int mode_oom(const char *socket) {
        connect_to(socket);
        void *p[512];
        int n = 0, r = 0;
        while (n < 512 && (r = gpumem_alloc(client, 1024 * MiB, 0, &p[n])) == 0)
                n++;
        char msg[2048];
        snprintf(msg, sizeof(msg), "%s", gpumem_last_error(client));
        for (int i = 0; i < n; i++)
                ck_gm(gpumem_free(client, p[i]), "gpumem_free");
        ck_gm(gpumem_trim(client, NULL), "gpumem_trim");
        gpumem_disconnect(client);
        printf("oom message: %s\n", msg);
        if (r != -ENOMEM || !strstr(msg, "CUDA out of memory"))
                die("out of memory: %d GiB allocated, then %s", n, gpumem_strerror(r));
        const char *reason = strstr(msg, "used outside gpumemd")       ? "memory used outside gpumemd"
                             : strstr(msg, "full of live allocations") ? "device full of live allocations"
                             : strstr(msg, "other tenants' caches")    ? "other tenants' caches"
                                                                       : "other";
        printf("cuMemCreate out of memory after %d GiB: -ENOMEM, diagnosis: %s\n", n, reason);
        return 0;
}

/* A block freed after gpumem_record_stream must not be handed out while the
 * recorded stream's kernel still uses it. */
static int mode_early_reuse(const char *socket) {
        connect_to(socket);
        CUstream s1, s2;
        ck(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        ck(cu.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        const uint64_t size = big(64 * MiB);
        void *a, *b;
        ck_gm(gpumem_alloc(client, size, (uint64_t) (uintptr_t) s1, &a), "gpumem_alloc");
        fill_async(a, size, 21, s2, 500000000); /* 500 ms on s2, then it writes the block */
        ck_gm(gpumem_record_stream(client, a, (uint64_t) (uintptr_t) s2), "gpumem_record_stream");
        ck_gm(gpumem_free(client, a), "gpumem_free");
        ck_gm(gpumem_alloc(client, size, (uint64_t) (uintptr_t) s1, &b), "gpumem_alloc right after the free");
        fill_async(b, size, 22, s1, 0); /* done long before the kernel on s2 writes */
        ck(cu.StreamSynchronize(s1), "cuStreamSynchronize");
        ck(cu.StreamSynchronize(s2), "cuStreamSynchronize");
        bool same = a == b, ok = verify(b, size, 22);
        ck_gm(gpumem_free(client, b), "gpumem_free");
        ck(cu.StreamDestroy(s1), "cuStreamDestroy");
        ck(cu.StreamDestroy(s2), "cuStreamDestroy");
        gpumem_disconnect(client);
        if (!ok)
                die("early reuse: the allocation after a record_stream'd free %s the freed block and lost its data to "
                    "the recorded stream's kernel",
                    same ? "was" : "was not");
        printf("early reuse after record_stream: %s while a 500 ms %s on the recorded stream ran; its data intact "
               "after (verified with %s)\n",
               same ? "the next allocation got the freed address" : "the next allocation got another address",
               cu.kernels ? "kernel" : "emulated kernel", method());
        return 0;
}

/* Frees a block whose kernel is still queued on `s` and trims, by
 * gpumem_trim or (with dir) by an admin trim of another process; then
 * cuStreamSynchronize must succeed and the reserved bytes must go. */
static uint64_t queued_free_round(CUstream s, uint64_t size, const char *dir) {
        void *p;
        ck_gm(gpumem_alloc(client, size, (uint64_t) (uintptr_t) s, &p), "gpumem_alloc");
        fill_async(p, size, 31, s, dir ? 1500000000 : 500000000);
        ck_gm(gpumem_free(client, p), "gpumem_free");
        uint64_t released = 0;
        if (dir) {
                touch(dir, "queued", "1");
                wait_for(dir, "go", 120);
        } else {
                ck_gm(gpumem_trim(client, &released), "gpumem_trim");
        }
        ck(cu.StreamSynchronize(s),
           dir ? "cuStreamSynchronize after the Reclaim" : "cuStreamSynchronize after the trim");
        int64_t left = stat_of("reserved_bytes.all.current");
        for (int i = 0; i < 200 && left != 0; i++) { /* a release may wait for the stream's work */
                usleep(50000);
                left = stat_of("reserved_bytes.all.current");
        }
        if (left != 0)
                die("queued free: %" PRId64 " bytes still reserved after the %s", left, dir ? "Reclaim" : "trim");
        return released;
}

static int mode_queued_free(const char *socket, const char *dir) {
        connect_to(socket);
        CUstream s;
        ck(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        const uint64_t size = big(256 * MiB);
        uint64_t released = queued_free_round(s, size, NULL);
        queued_free_round(s, size, dir);
        ck(cu.StreamDestroy(s), "cuStreamDestroy");
        gpumem_disconnect(client);
        printf("free with %s still queued: gpumem_trim (%.0f MiB released at once) and an admin trim's Reclaim each "
               "gave back %.0f MiB; cuStreamSynchronize succeeded after both\n",
               cu.kernels ? "a kernel" : "an emulated kernel", (double) released / MiB, (double) size / MiB);
        return 0;
}

/* The retry ladder with a kernel still queued on the cached blocks it
 * releases: the release must wait for that kernel (else it faults and the
 * stream reports it), the live block must keep its data. */
static int mode_oom_ladder(const char *socket, uint64_t block) {
        connect_to(socket);
        CUstream s;
        ck(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        void *a, *b, *live, *big;
        ck_gm(gpumem_alloc(client, block, (uint64_t) (uintptr_t) s, &a), "gpumem_alloc");
        ck_gm(gpumem_alloc(client, block, (uint64_t) (uintptr_t) s, &b), "gpumem_alloc");
        ck_gm(gpumem_alloc(client, block, (uint64_t) (uintptr_t) s, &live), "gpumem_alloc");
        fill(live, block, 51);
        fill_async(a, block, 52, s, 1500000000); /* 1.5 s of work first, then it writes a */
        fill_async(b, block, 53, s, 0);
        ck_gm(gpumem_free(client, a), "gpumem_free");
        ck_gm(gpumem_free(client, b), "gpumem_free");
        int64_t retries = stat_of("num_alloc_retries"), reserved = stat_of("reserved_bytes.all.current");
        const uint64_t big_size = block + block / 2;
        uint64_t t0 = now_ns();
        int r = gpumem_alloc(client, big_size, (uint64_t) (uintptr_t) s, &big);
        uint64_t alloc_ms = (now_ns() - t0) / 1000000;
        if (r < 0)
                die("oom ladder: %.0f MiB over the fraction refused: %s (%s)", (double) big_size / MiB,
                    gpumem_strerror(r), gpumem_last_error(client));
        int64_t retried = stat_of("num_alloc_retries") - retries, after = stat_of("reserved_bytes.all.current");
        ck(cu.StreamSynchronize(s), "cuStreamSynchronize after the ladder");
        bool ok = verify(live, block, 51);
        fill(big, big_size, 54);
        bool big_ok = verify(big, big_size, 54);
        ck_gm(gpumem_free(client, big), "gpumem_free");
        ck_gm(gpumem_free(client, live), "gpumem_free");
        ck_gm(gpumem_trim(client, NULL), "gpumem_trim");
        ck(cu.StreamDestroy(s), "cuStreamDestroy");
        gpumem_disconnect(client);
        if (retried != 1 || !ok || !big_ok)
                die("oom ladder: %" PRId64 " retries (want 1), live block %s, new block %s", retried,
                    ok ? "intact" : "damaged", big_ok ? "intact" : "damaged");
        printf("oom ladder: a %.0f MiB request over the memory fraction (4 x %.0f MiB) released two cached blocks "
               "%s still wrote (1 retry, reserved %.0f -> %.0f MiB, served in %" PRIu64
               " ms); cuStreamSynchronize succeeded, the live block intact (%s)\n",
               (double) big_size / MiB, (double) block / MiB,
               cu.kernels ? "a queued kernel" : "a queued emulated kernel", (double) reserved / MiB,
               (double) after / MiB, alloc_ms, method());
        return 0;
}

static void context_unchanged(CUcontext want, const char *after) {
        CUcontext now = NULL;
        ck(cu.CtxGetCurrent(&now), "cuCtxGetCurrent");
        if (now != want)
                die("context: after %s the current context is %p, not the caller's %p", after, (void *) now,
                    (void *) want);
}

static int mode_context(const char *socket) {
        CUcontext own = NULL;
        bool created = cu.CtxCreate && cu.CtxDestroy;
        if (created) {
                ck(cu.CtxCreate(&own, 0, 0), "cuCtxCreate");
        } else {
                ck(cu.CtxGetCurrent(&own), "cuCtxGetCurrent");
        }
        connect_to(socket);
        context_unchanged(own, "gpumem_connect");
        /* Page reuse: the third request fits no free block, so it takes the
         * pages under the first one's hole instead of mapping new ones. */
        void *a, *b, *c;
        ck_gm(gpumem_alloc(client, 8 * MiB, 0, &a), "gpumem_alloc");
        context_unchanged(own, "gpumem_alloc");
        ck_gm(gpumem_alloc(client, 8 * MiB, 0, &b), "gpumem_alloc");
        ck_gm(gpumem_free(client, a), "gpumem_free");
        context_unchanged(own, "gpumem_free");
        ck_gm(gpumem_alloc(client, 12 * MiB, 0, &c), "gpumem_alloc (page reuse)");
        context_unchanged(own, "gpumem_alloc with page reuse");
        ck_gm(gpumem_free(client, b), "gpumem_free");
        ck_gm(gpumem_free(client, c), "gpumem_free");
        uint64_t released = 0;
        ck_gm(gpumem_trim(client, &released), "gpumem_trim");
        context_unchanged(own, "gpumem_trim");
        gpumem_disconnect(client);
        context_unchanged(own, "gpumem_disconnect");
        if (created) {
                CUcontext popped;
                ck(cu.CtxPop(&popped), "cuCtxPopCurrent");
                ck(cu.CtxDestroy(own), "cuCtxDestroy");
        }
        printf("context: %s stayed current through gpumem_alloc, gpumem_free (page reuse on) and gpumem_trim "
               "(%.0f MiB released)\n",
               created ? "a non-primary context (cuCtxCreate)"
                       : "the caller's context (device 0's primary: the emulator has no cuCtxCreate)",
               (double) released / MiB);
        return 0;
}

static int mode_grow(const char *socket, uint64_t bytes) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                                    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
        size_t minimum = 0, recommended = 0;
        ck(cu.Granularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
        ck(cu.Granularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity");
        connect_to(socket);
        enum { MAX_PAGES = 8192 }; /* 16 GiB of 2 MiB blocks */
        static void *p[MAX_PAGES];
        uint64_t n = bytes / (2 * MiB) < MAX_PAGES ? bytes / (2 * MiB) : MAX_PAGES;
        uint64_t t0 = now_ns();
        for (uint64_t i = 0; i < n; i++)
                ck_gm(gpumem_alloc(client, 2 * MiB, 0, &p[i]), "gpumem_alloc(2 MiB)");
        uint64_t grow_ns = now_ns() - t0;
        int64_t reserved = stat_of("reserved_bytes.all.current");
        t0 = now_ns();
        for (uint64_t i = 0; i < n; i++)
                ck_gm(gpumem_free(client, p[i]), "gpumem_free");
        uint64_t released = 0;
        ck_gm(gpumem_trim(client, &released), "gpumem_trim");
        uint64_t shrink_ns = now_ns() - t0;
        gpumem_disconnect(client);
        printf("grow: granularity minimum %zu KiB, recommended %zu KiB; %" PRIu64 " x 2 MiB (%.1f GiB, reserved %.1f "
               "GiB) in %.1f ms (%.1f us a block), freed and trimmed (%.1f GiB) in %.1f ms%s\n",
               minimum / 1024, recommended / 1024, n, (double) (n * 2 * MiB) / (1024.0 * MiB),
               (double) reserved / (1024.0 * MiB), (double) grow_ns / 1e6, (double) grow_ns / 1e3 / (double) n,
               (double) released / (1024.0 * MiB), (double) shrink_ns / 1e6,
               cu.kernels ? "" : " (emulated driver: not the GPU's figures)");
        return n > 0 && released > 0 ? 0 : 1;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, size_t n) {
        qsort(v, n, sizeof(*v), cmp_u64);
        return v[n / 2];
}

static int mode_bench(const char *socket) {
        connect_to(socket);
        static const uint64_t sizes[] = {4096, MiB, 64 * MiB};
        enum { ROUNDS = 7, OPS = 200 };
        printf("%-10s %16s %16s %8s\n", "size", "gpumem ns", "cuMemAlloc ns", "ratio");
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                uint64_t gm[ROUNDS], raw[ROUNDS];
                void *p;
                ck_gm(gpumem_alloc(client, sizes[s], 0, &p), "gpumem_alloc"); /* warm: a cached block */
                ck_gm(gpumem_free(client, p), "gpumem_free");
                for (int round = 0; round < ROUNDS; round++) { /* interleaved rounds */
                        uint64_t t[OPS];
                        for (int i = 0; i < OPS; i++) {
                                uint64_t t0 = now_ns();
                                ck_gm(gpumem_alloc(client, sizes[s], 0, &p), "gpumem_alloc");
                                ck_gm(gpumem_free(client, p), "gpumem_free");
                                t[i] = now_ns() - t0;
                        }
                        gm[round] = median(t, OPS);
                        for (int i = 0; i < OPS / 4; i++) {
                                CUdeviceptr d;
                                uint64_t t0 = now_ns();
                                ck(cu.MemAlloc(&d, sizes[s]), "cuMemAlloc");
                                ck(cu.MemFree(d), "cuMemFree");
                                t[i] = now_ns() - t0;
                        }
                        raw[round] = median(t, OPS / 4);
                }
                uint64_t gm_lo = gm[0], gm_hi = gm[0];
                for (int i = 1; i < ROUNDS; i++) {
                        gm_lo = gm[i] < gm_lo ? gm[i] : gm_lo;
                        gm_hi = gm[i] > gm_hi ? gm[i] : gm_hi;
                }
                uint64_t g = median(gm, ROUNDS), r = median(raw, ROUNDS);
                printf("%-10" PRIu64 " %16" PRIu64 " %16" PRIu64 " %8.2f   (gpumem spread %" PRIu64 "-%" PRIu64 ")\n",
                       sizes[s], g, r, (double) r / (double) (g ? g : 1), gm_lo, gm_hi);
        }
        gpumem_disconnect(client);
        printf("bench: cached alloc+free through gpumemd vs cuMemAlloc+cuMemFree, medians of %d interleaved rounds%s\n",
               ROUNDS, cu.kernels ? "" : " (emulated driver: not the GPU's figures)");
        return 0;
}

/* ---- shared objects ---- */

static int mode_publish(const char *socket, const char *name, uint64_t bytes, uint32_t seed) {
        connect_to(socket);
        gpumem_shared *s;
        void *p;
        uint64_t t0 = now_ns();
        ck_gm(gpumem_shared_create(client, name, bytes, &s, &p), "gpumem_shared_create");
        fill(p, bytes, seed);
        static const char *const everyone[] = {"*", NULL};
        uint64_t version = 0;
        ck_gm(gpumem_shared_publish(client, s, everyone, NULL, 0, 0, &version), "gpumem_shared_publish");
        uint64_t publish_ms = (now_ns() - t0) / 1000000;
        uint64_t size = gpumem_shared_size(s);
        gpumem_shared_close(client, s);
        gpumem_disconnect(client);
        printf("publish: %s@%" PRIu64 ", %.0f MiB filled with %s and published to every tenant in %" PRIu64
               " ms; the publisher exits\n",
               name, version, (double) size / MiB, method(), publish_ms);
        return 0;
}

static void touch_pid(const char *dir, const char *prefix) {
        char name[64];
        snprintf(name, sizeof(name), "%s-%d", prefix, (int) getpid());
        touch(dir, name, "1");
}

static int mode_open_verify(const char *socket, const char *name, uint32_t seed, const char *dir) {
        connect_to(socket);
        if (dir) {
                touch_pid(dir, "ready");
                wait_for(dir, "open", 120);
        }
        gpumem_shared *s;
        ck_gm(gpumem_shared_open(client, name, 0, &s), "gpumem_shared_open");
        const void *p = gpumem_shared_ptr(s);
        uint64_t size = gpumem_shared_size(s), version = gpumem_shared_version(s);
        uint64_t t0 = now_ns();
        bool ok = verify(p, size, seed);
        uint64_t verify_ms = (now_ns() - t0) / 1000000;
        if (dir) {
                touch_pid(dir, "mapped");
                wait_for(dir, "go", 120);
        }
        gpumem_shared_close(client, s);
        gpumem_disconnect(client);
        if (!ok)
                die("open-verify: %s@%" PRIu64 " (%.0f MiB, read-only at %p) does not hold the publisher's pattern",
                    name, version, (double) size / MiB, p);
        printf("open-verify: pid %d mapped %s@%" PRIu64 " read-only at %p, %.0f MiB verified with %s in %" PRIu64
               " ms\n",
               (int) getpid(), name, version, p, (double) size / MiB, method(), verify_ms);
        return 0;
}

/* A kernel write through the read-only mapping must fault; the context is
 * lost then, so this process ends without closing (the session's end drops
 * its open). */
static int mode_open_write(const char *socket, const char *name) {
        connect_to(socket);
        gpumem_shared *s;
        ck_gm(gpumem_shared_open(client, name, 0, &s), "gpumem_shared_open");
        void *p = (void *) (uintptr_t) gpumem_shared_ptr(s);
        uint64_t size = gpumem_shared_size(s);
        fill_async(p, size < MiB ? size : MiB, 77, NULL, 0);
        CUresult r = cu.StreamSynchronize(NULL);
        const char *err = "CUDA_SUCCESS";
        cu.GetErrorName(r, &err);
        if (r == CUDA_SUCCESS)
                die("open-write: a %s write through the read-only mapping of %s at %p succeeded", method(), name, p);
        printf("open-write: a write kernel (%s) through the read-only mapping of %s at %p faulted: %s\n", method(),
               name, p, err);
        fflush(stdout);
        _exit(0);
}

static int mode_unpublish(const char *socket, const char *name) {
        connect_to(socket);
        ck_gm(gpumem_shared_unpublish(client, name, 0), "gpumem_shared_unpublish");
        gpumem_disconnect(client);
        printf("unpublish: %s withdrawn\n", name);
        return 0;
}

/* ---- sleep and wake ---- */

static int mode_sleeper(const char *socket, const char *dir) {
        connect_to(socket);
        blocks_t b;
        blocks_fill(&b, 500);
        void *addr[N_BLOCKS];
        memcpy(addr, b.p, sizeof(addr));
        char line[64];
        snprintf(line, sizeof(line), "%" PRIu64, b.bytes);
        touch(dir, "filled", line);
        wait_for(dir, "sleep", 120);
        static const char *const keep_all[] = {"*", NULL};
        uint64_t released = 0, t0 = now_ns();
        ck_gm(gpumem_sleep(client, NULL, keep_all, &released), "gpumem_sleep");
        uint64_t sleep_ns = now_ns() - t0, needs = gpumem_sleeping_bytes(client);
        uint64_t pinned = gpumem_sleeping_pinned_bytes(client);
        snprintf(line, sizeof(line), "%" PRIu64 " %" PRIu64, released, sleep_ns);
        touch(dir, "asleep", line);
        wait_for(dir, "wake", 120);
        t0 = now_ns();
        ck_gm(gpumem_wake(client, 30000), "gpumem_wake");
        uint64_t wake_ns = now_ns() - t0;
        if (gpumem_sleeping_bytes(client) != 0 || memcmp(addr, b.p, sizeof(addr)) != 0)
                die("sleeper: still %" PRIu64 " bytes asleep after the wake", gpumem_sleeping_bytes(client));
        int bad = blocks_verify_free(&b, 500);
        gpumem_disconnect(client);
        if (bad)
                die("sleeper: %d of %d blocks lost their data over sleep and wake", bad, N_BLOCKS);
        printf("sleep/wake: %d blocks (%.1f MiB) kept, %s (%.1f MiB page-locked); sleep released %.1f MiB in %.1f ms "
               "(wake needed %.1f MiB), wake in %.1f ms; every block verified with %s at its address\n",
               N_BLOCKS, (double) b.bytes / MiB,
               pinned == 0         ? "pageable"
               : pinned >= b.bytes ? "pinned"
                                   : "partly pinned (GPUMEM_SLEEP_PINNED_MAX)",
               (double) pinned / MiB, (double) released / MiB, (double) sleep_ns / 1e6, (double) needs / MiB,
               (double) wake_ns / 1e6, method());
        return 0;
}

static int mode_neighbour(const char *socket, uint64_t bytes, const char *dir) {
        connect_to(socket);
        enum { MAX = 64 };
        void *p[MAX];
        uint64_t n = (bytes + 64 * MiB - 1) / (64 * MiB);
        n = n > MAX ? MAX : n;
        for (uint64_t i = 0; i < n; i++) {
                ck_gm(gpumem_alloc(client, 64 * MiB, 0, &p[i]), "gpumem_alloc(64 MiB)");
                fill(p[i], 64 * MiB, 900 + (uint32_t) i);
        }
        if (dir) {
                touch(dir, "holding", "1");
                wait_for(dir, "release", 120);
        }
        int bad = 0;
        for (uint64_t i = 0; i < n; i++) {
                bad += !verify(p[i], 64 * MiB, 900 + (uint32_t) i);
                ck_gm(gpumem_free(client, p[i]), "gpumem_free");
        }
        uint64_t released = 0;
        ck_gm(gpumem_trim(client, &released), "gpumem_trim");
        gpumem_disconnect(client);
        if (bad)
                die("neighbour: %d of %" PRIu64 " blocks lost their data", bad, n);
        printf("neighbour: %" PRIu64 " MiB allocated, filled and verified with %s, freed, %.0f MiB trimmed\n", n * 64,
               method(), (double) released / MiB);
        return 0;
}

int main(int argc, char **argv) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        if (argc < 3) {
                fprintf(stderr, "usage: see the comment at the top of gpu_client.c\n");
                return 2;
        }
        const char *mode = argv[1];
        driver_open();
        int r;
        if (strcmp(mode, "pattern") == 0 && argc == 5)
                r = mode_pattern(argv[2], (uint32_t) strtoul(argv[3], NULL, 10), argv[4]);
        else if (strcmp(mode, "expandable") == 0)
                r = mode_expandable(argv[2]);
        else if (strcmp(mode, "streams") == 0)
                r = mode_streams(argv[2]);
        else if (strcmp(mode, "trim-busy") == 0)
                r = mode_trim_busy(argv[2]);
        else if (strcmp(mode, "cache") == 0 && argc == 4)
                r = mode_cache(argv[2], argv[3]);
        else if (strcmp(mode, "hold") == 0 && argc == 4)
                r = mode_hold(argv[2], argv[3]);
        else if (strcmp(mode, "hog") == 0 && argc == 4)
                r = mode_hog(strtoull(argv[2], NULL, 10), argv[3]);
        else if (strcmp(mode, "oom") == 0)
                r = mode_oom(argv[2]);
        else if (strcmp(mode, "bench") == 0)
                r = mode_bench(argv[2]);
        else if (strcmp(mode, "grow") == 0 && argc == 4)
                r = mode_grow(argv[2], strtoull(argv[3], NULL, 10));
        else if (strcmp(mode, "early-reuse") == 0)
                r = mode_early_reuse(argv[2]);
        else if (strcmp(mode, "queued-free") == 0 && argc == 4)
                r = mode_queued_free(argv[2], argv[3]);
        else if (strcmp(mode, "oom-ladder") == 0 && argc == 4)
                r = mode_oom_ladder(argv[2], strtoull(argv[3], NULL, 10));
        else if (strcmp(mode, "context") == 0)
                r = mode_context(argv[2]);
        else if (strcmp(mode, "publish") == 0 && argc == 6)
                r = mode_publish(argv[2], argv[3], strtoull(argv[4], NULL, 10), (uint32_t) strtoul(argv[5], NULL, 10));
        else if (strcmp(mode, "open-verify") == 0 && (argc == 5 || argc == 6))
                r = mode_open_verify(argv[2], argv[3], (uint32_t) strtoul(argv[4], NULL, 10),
                                     argc == 6 ? argv[5] : NULL);
        else if (strcmp(mode, "open-write") == 0 && argc == 4)
                r = mode_open_write(argv[2], argv[3]);
        else if (strcmp(mode, "unpublish") == 0 && argc == 4)
                r = mode_unpublish(argv[2], argv[3]);
        else if (strcmp(mode, "sleeper") == 0 && argc == 4)
                r = mode_sleeper(argv[2], argv[3]);
        else if (strcmp(mode, "neighbour") == 0 && (argc == 4 || argc == 5))
                r = mode_neighbour(argv[2], strtoull(argv[3], NULL, 10), argc == 5 ? argv[4] : NULL);
        else if (strcmp(mode, "probe") == 0)
                r = printf("driver loaded; %s\n", cu.kernels ? "kernels JIT-compiled" : "the emulator's kernels") < 0;
        else
                die("unknown mode or arguments: %s", mode);
        driver_close();
        return r;
}
