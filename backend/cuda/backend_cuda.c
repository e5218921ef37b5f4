/* Cuda backend: every segment is one cuMemCreate allocation of pinned device
 * memory, exported as a POSIX file descriptor that the daemon passes to the
 * owning client. Invariant: in_use is the sum of the sizes of the segments
 * created and not yet released, and never exceeds capacity.
 *
 * The daemon holds no CUDA context: cuMemCreate, export, import and release
 * need none, and a context would cost device memory and, under
 * exclusive-process compute mode, lock every client out of the device. The
 * device's free/total figures come from NVML (libnvidia-ml.so.1, dlopen'd;
 * $GPUMEM_LIBNVML overrides) by the device's UUID; without NVML each query
 * retains the primary context for the one cuMemGetInfo call and releases it
 * (backend.detail says which). NVML's running-process list also gives each
 * process's device memory (process_bytes), where the driver lists it. A
 * failure's text is left in
 * gm_cuda_last_error() (the ops have no reterr). */
#include "backend.h"
#include "cuda_loader.h"

#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_LIBNVML "libnvidia-ml.so.1"

/* The few NVML entry points used, with NVML's stable C ABI. */
typedef struct nvml_memory {
        unsigned long long total, free, used;
} nvml_memory_t;
/* nvmlProcessInfo_t of nvmlDeviceGetComputeRunningProcesses_v3. */
typedef struct nvml_process {
        unsigned int pid;
        unsigned long long used_gpu_memory; /* NVML_VALUE_NOT_AVAILABLE (all ones) where it cannot tell */
        unsigned int gpu_instance_id, compute_instance_id;
} nvml_process_t;
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_VALUE_NOT_AVAILABLE (~0ull)

typedef struct nvml {
        void *lib;
        void *device; /* nvmlDevice_t */
        int (*init)(void);
        int (*shutdown)(void);
        int (*get_handle_by_uuid)(const char *uuid, void **ret_device);
        int (*get_memory_info)(void *device, nvml_memory_t *ret_memory);
        int (*running_processes)(void *device, unsigned int *count, nvml_process_t *infos); /* NULL: none */
} nvml_t;

typedef struct cuda_backend {
        gm_backend_t base; /* first: the ops receive &base */
        const gm_cuda_t *cu;
        CUdevice dev;
        CUmemAllocationProp prop;
        nvml_t nvml; /* lib NULL: memory figures through a short-lived context */
} cuda_backend_t;

/* Opens NVML on the device `uuid` names; false (and nothing held) without it. */
static bool nvml_open(nvml_t *n, const char *uuid) {
        const char *path = getenv("GPUMEM_LIBNVML");
        void *lib = dlopen(path && *path ? path : DEFAULT_LIBNVML, RTLD_NOW | RTLD_LOCAL);
        if (!lib)
                return false;
        void *init = dlsym(lib, "nvmlInit_v2"), *shutdown = dlsym(lib, "nvmlShutdown"),
             *by_uuid = dlsym(lib, "nvmlDeviceGetHandleByUUID"), *meminfo = dlsym(lib, "nvmlDeviceGetMemoryInfo");
        nvml_t t = {.lib = lib};
        memcpy(&t.init, &init, sizeof(init));
        memcpy(&t.shutdown, &shutdown, sizeof(shutdown));
        memcpy(&t.get_handle_by_uuid, &by_uuid, sizeof(by_uuid));
        memcpy(&t.get_memory_info, &meminfo, sizeof(meminfo));
        void *processes = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
        memcpy(&t.running_processes, &processes, sizeof(processes));
        if (!init || !shutdown || !by_uuid || !meminfo || t.init() != 0) {
                dlclose(lib);
                return false;
        }
        nvml_memory_t m;
        if (t.get_handle_by_uuid(uuid, &t.device) != 0 || t.get_memory_info(t.device, &m) != 0) {
                t.shutdown();
                dlclose(lib);
                return false;
        }
        *n = t;
        return true;
}

static void nvml_close(nvml_t *n) {
        if (!n->lib)
                return;
        n->shutdown();
        dlclose(n->lib);
        n->lib = NULL;
}

static int set_cloexec(int fd) {
        int flags = fcntl(fd, F_GETFD);
        if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)
                return -errno;
        return 0;
}

static int cuda_create(gm_backend_t *b, uint64_t size, gm_phys_t *ret_phys) {
        cuda_backend_t *cb = (cuda_backend_t *) b;
        const gm_cuda_t *cu = cb->cu;
        int r;

        if (size == 0 || size % b->granularity != 0)
                return gm_cuda_fail_errno(-EINVAL,
                                          "segment size %" PRIu64 " is not a multiple of the granularity %" PRIu64,
                                          size, b->granularity);
        if (size > b->capacity - b->in_use)
                return gm_cuda_fail_errno(-ENOMEM,
                                          "cuda backend capacity: %" PRIu64 " of %" PRIu64 " bytes in use, %" PRIu64
                                          " more requested",
                                          b->in_use, b->capacity, size);

        CUmemGenericAllocationHandle handle;
        CUresult cr = cu->MemCreate(&handle, size, &cb->prop, 0);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cu, cr, "cuMemCreate");
        int fd = -1;
        cr = cu->MemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemExportToShareableHandle");
                goto fail_release;
        }
        /* The driver does not promise CLOEXEC on the fd it creates. */
        r = set_cloexec(fd);
        if (r < 0) {
                gm_cuda_fail_errno(r, "fcntl(FD_CLOEXEC) on an exported handle: %s", strerror(-r));
                close(fd);
                goto fail_release;
        }
        b->in_use += size;
        *ret_phys = (gm_phys_t){.fd = fd, .size = size, .handle = handle};
        return 0;

fail_release:
        cu->MemRelease(handle);
        return r;
}

static void cuda_release(gm_backend_t *b, gm_phys_t *phys) {
        cuda_backend_t *cb = (cuda_backend_t *) b;
        assert(phys->size <= b->in_use);
        close(phys->fd);
        phys->fd = -1;
        CUresult cr = cb->cu->MemRelease((CUmemGenericAllocationHandle) phys->handle);
        if (cr != CUDA_SUCCESS)
                gm_cuda_fail(cb->cu, cr, "cuMemRelease");
        b->in_use -= phys->size;
}

static int cuda_adopt(gm_backend_t *b, int fd, uint64_t size, gm_phys_t *ret_phys) {
        cuda_backend_t *cb = (cuda_backend_t *) b;
        if (size == 0 || size % b->granularity != 0) {
                close(fd);
                return gm_cuda_fail_errno(-EINVAL, "stored segment of %" PRIu64 " bytes", size);
        }
        CUmemGenericAllocationHandle handle;
        CUresult cr = cb->cu->MemImportFromShareableHandle(&handle, (void *) (uintptr_t) fd,
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (cr != CUDA_SUCCESS) {
                close(fd);
                return gm_cuda_fail(cb->cu, cr, "cuMemImportFromShareableHandle");
        }
        b->in_use += size; /* it exists: counted even beyond the capacity */
        *ret_phys = (gm_phys_t){.fd = fd, .size = size, .handle = (uint64_t) handle};
        return 0;
}

/* Without NVML: the primary context for this one call (a device's memory
 * figures need a context), then released again. */
static int mem_info_by_context(cuda_backend_t *cb, uint64_t *ret_free, uint64_t *ret_total) {
        const gm_cuda_t *cu = cb->cu;
        CUcontext ctx;
        CUresult cr = cu->DevicePrimaryCtxRetain(&ctx, cb->dev);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cu, cr, "cuDevicePrimaryCtxRetain");
        int r = gm_cuda_push(cu, ctx);
        size_t free_bytes = 0, total_bytes = 0;
        if (r == 0) {
                cr = cu->MemGetInfo(&free_bytes, &total_bytes);
                gm_cuda_pop(cu);
                if (cr != CUDA_SUCCESS)
                        r = gm_cuda_fail(cu, cr, "cuMemGetInfo");
        }
        cu->DevicePrimaryCtxRelease(cb->dev);
        if (r < 0)
                return r;
        *ret_free = free_bytes;
        *ret_total = total_bytes;
        return 0;
}

static int cuda_mem_info(gm_backend_t *b, uint64_t *ret_free, uint64_t *ret_total) {
        cuda_backend_t *cb = (cuda_backend_t *) b;
        if (!cb->nvml.lib)
                return mem_info_by_context(cb, ret_free, ret_total);
        nvml_memory_t m;
        int r = cb->nvml.get_memory_info(cb->nvml.device, &m);
        if (r != 0)
                return gm_cuda_fail_errno(-EIO, "nvmlDeviceGetMemoryInfo: NVML error %d", r);
        *ret_free = m.free;
        *ret_total = m.total;
        return 0;
}

static int cuda_process_bytes(gm_backend_t *b, int pid, uint64_t *ret_bytes) {
        cuda_backend_t *cb = (cuda_backend_t *) b;
        if (!cb->nvml.lib || !cb->nvml.running_processes)
                return -ENOSYS;
        nvml_process_t stack[64], *infos = stack;
        unsigned int count = sizeof(stack) / sizeof(stack[0]);
        int r = cb->nvml.running_processes(cb->nvml.device, &count, infos);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE) { /* count is now what it needs; a few more may start meanwhile */
                count += 16;
                infos = calloc(count, sizeof(*infos));
                if (!infos)
                        return -ENOMEM;
                r = cb->nvml.running_processes(cb->nvml.device, &count, infos);
        }
        uint64_t bytes = 0;
        for (unsigned int i = 0; r == 0 && i < count; i++) {
                if (infos[i].pid != (unsigned int) pid)
                        continue;
                if (infos[i].used_gpu_memory == NVML_VALUE_NOT_AVAILABLE)
                        r = -ENOSYS;
                else
                        bytes += infos[i].used_gpu_memory;
        }
        if (infos != stack)
                free(infos);
        if (r > 0)
                return gm_cuda_fail_errno(-EIO, "nvmlDeviceGetComputeRunningProcesses_v3: NVML error %d", r);
        if (r < 0)
                return r;
        *ret_bytes = bytes;
        return 0;
}

static void cuda_destroy(gm_backend_t *b) {
        cuda_backend_t *cb = (cuda_backend_t *) b;
        nvml_close(&cb->nvml);
        free(cb);
}

static const gm_backend_ops_t cuda_ops = {
        .name = "cuda",
        .caps = &gm_kind_cuda_caps,
        .last_error = gm_cuda_last_error,
        .create = cuda_create,
        .release = cuda_release,
        .adopt = cuda_adopt,
        .process_bytes = cuda_process_bytes,
        .mem_info = cuda_mem_info,
        .destroy = cuda_destroy,
};

int gm_backend_cuda_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr,
                         size_t reterr_len) {
        const gm_cuda_t *cu;
        cuda_backend_t *cb = NULL;
        int ordinal;
        bool rdma = false;
        CUresult cr;
        char uuid[GM_CUDA_UUID_LEN];
        int r = gm_cuda_load(&cu);
        if (r < 0)
                goto fail;
        cb = calloc(1, sizeof(*cb));
        if (!cb) {
                r = gm_cuda_fail_errno(-ENOMEM, "out of memory");
                goto fail;
        }
        cb->cu = cu;
        r = gm_cuda_find_device(cu, opts->device, opts->device_uuid, &cb->dev, &ordinal);
        if (r == 0)
                r = gm_cuda_check_device(cu, cb->dev, ordinal, &rdma);
        if (r == 0)
                r = gm_cuda_device_uuid(cu, cb->dev, uuid);
        if (r < 0)
                goto fail_free;

        cb->prop = gm_cuda_alloc_prop(ordinal, rdma);
        size_t granularity = 0;
        cr = cu->MemGetAllocationGranularity(&granularity, &cb->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemGetAllocationGranularity (POSIX fd handles)");
                goto fail_free;
        }
        if (granularity == 0) {
                r = gm_cuda_fail_errno(-EIO, "cuMemGetAllocationGranularity returned 0");
                goto fail_free;
        }
        uint64_t capacity = opts->capacity;
        if (capacity == 0) {
                size_t total;
                cr = cu->DeviceTotalMem(&total, cb->dev);
                if (cr != CUDA_SUCCESS) {
                        r = gm_cuda_fail(cu, cr, "cuDeviceTotalMem");
                        goto fail_free;
                }
                capacity = total;
        }
        cb->base = (gm_backend_t){
                .ops = &cuda_ops,
                .device = ordinal,
                .capacity = capacity,
                .granularity = granularity,
        };
        snprintf(cb->base.device_uuid, sizeof(cb->base.device_uuid), "%s", uuid);
        bool nvml = nvml_open(&cb->nvml, uuid);
        snprintf(cb->base.detail, sizeof(cb->base.detail), "%.48s, no CUDA context held, memory figures from %s%s",
                 uuid, nvml ? "NVML" : "a short-lived primary context (NVML unavailable)",
                 rdma ? ", GPUDirect RDMA capable allocations" : "");
        *ret_backend = &cb->base;
        return 0;

fail_free:
        free(cb);
fail:
        if (reterr && reterr_len > 0)
                snprintf(reterr, reterr_len, "%s", gm_cuda_last_error());
        return r;
}
