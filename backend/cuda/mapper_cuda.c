/* Cuda mapper: maps the daemon's exported allocations into this process's
 * device address space (import, map, grant read-write access to the device).
 * A mapping owns its physical memory: the imported handle is released right
 * after cuMemMap, so cuMemUnmap frees the memory once the daemon has released
 * its own handle.
 *
 * Calls run on application threads as well as on the library's service
 * thread, so none leaves a mark on the calling thread: a call that needs a
 * context pushes one and pops it again, and the thread's own current context
 * (another device's, or one the application made) is what it has afterwards.
 * In a fork()ed child no driver call is made at all (gm_cuda_check_process).
 * The text of a failure is left in gm_cuda_last_error(). */
#include "mapper.h"

#include <errno.h>

#ifdef GPUMEM_HAVE_CUDA
#include "cuda_loader.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cuda_mapper {
        gm_mapper_t base; /* first: the ops receive &base */
        const gm_cuda_t *cu;
        CUdevice dev;
        CUcontext ctx;          /* the device's primary context, retained */
        CUmemAccessDesc access; /* read-write for the device */
} cuda_mapper_t;

/* The library's own driver calls are no part of any stream capture the
 * application makes (a CUDA graph): each runs in relaxed capture mode, the
 * thread's own mode restored after. In the default global mode another
 * thread's capture would forbid them (the service thread's event queries,
 * a release's unmaps), and the refused call would invalidate that capture. */
typedef struct relaxed {
        const gm_cuda_t *cu;
        CUstreamCaptureMode mode;
} relaxed_t;

static relaxed_t relax_begin(const gm_cuda_t *cu) {
        relaxed_t r = {.cu = cu, .mode = CU_STREAM_CAPTURE_MODE_RELAXED};
        if (cu->ThreadExchangeStreamCaptureMode && cu->ThreadExchangeStreamCaptureMode(&r.mode) != CUDA_SUCCESS)
                r.cu = NULL;
        return r;
}

static void relax_end(relaxed_t *r) {
        if (r->cu && r->cu->ThreadExchangeStreamCaptureMode)
                r->cu->ThreadExchangeStreamCaptureMode(&r->mode);
}

#define RELAXED_CAPTURE(cu) relaxed_t relaxed_ __attribute__((cleanup(relax_end))) = relax_begin(cu)

static bool special_stream(uint64_t stream) {
        return stream == 0 || stream == (uint64_t) (uintptr_t) CU_STREAM_LEGACY ||
               stream == (uint64_t) (uintptr_t) CU_STREAM_PER_THREAD;
}

static int cuda_reserve(gm_mapper_t *m, uint64_t va_size, uint64_t *ret_base) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        if (va_size == 0 || va_size % m->granularity != 0)
                return gm_cuda_fail_errno(-EINVAL, "reservation of %llu bytes is not a multiple of the granularity",
                                          (unsigned long long) va_size);
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        CUdeviceptr base;
        CUresult cr = cm->cu->MemAddressReserve(&base, va_size, m->granularity, 0, 0);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cm->cu, cr, "cuMemAddressReserve");
        *ret_base = base;
        return 0;
}

/* Imports fd and maps it at base+offset with `access` for the device. */
static int map_with(cuda_mapper_t *cm, uint64_t base, uint64_t offset, uint64_t length, int fd,
                    const CUmemAccessDesc *access) {
        RELAXED_CAPTURE(cm->cu);
        const gm_cuda_t *cu = cm->cu;
        int r = gm_cuda_check_process();
        if (r < 0) {
                close(fd);
                return r;
        }
        CUmemGenericAllocationHandle handle;
        CUresult cr = cu->MemImportFromShareableHandle(&handle, (void *) (uintptr_t) fd,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cu, cr, "cuMemImportFromShareableHandle");

        CUdeviceptr at = base + offset;
        cr = cu->MemMap(at, length, 0, handle, 0);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemMap");
        } else {
                cr = cu->MemSetAccess(at, length, access, 1);
                if (cr != CUDA_SUCCESS) {
                        r = gm_cuda_fail(cu, cr, "cuMemSetAccess");
                        cu->MemUnmap(at, length);
                }
        }
        /* From here the mapping alone keeps the memory. */
        cu->MemRelease(handle);
        return r;
}

static int cuda_map(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length, int fd) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        return map_with(cm, base, offset, length, fd, &cm->access);
}

/* Read-only for this process's device access. Nothing stops a process that
 * holds the fd from importing and mapping it read-write itself: the driver
 * protects per mapping, not per handle (docs/security.md). */
static int cuda_map_read(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length, int fd) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        CUmemAccessDesc read = cm->access;
        read.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
        return map_with(cm, base, offset, length, fd, &read);
}

static int cuda_unmap(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        CUresult cr = cm->cu->MemUnmap(base + offset, length);
        return cr == CUDA_SUCCESS ? 0 : gm_cuda_fail(cm->cu, cr, "cuMemUnmap");
}

/* The handle behind the old place is retained, mapped at the new one, and
 * released again once the old place is unmapped: the mappings alone keep
 * the memory, as after cuda_map(). */
static int cuda_move(gm_mapper_t *m, uint64_t from, uint64_t to, uint64_t length) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        const gm_cuda_t *cu = cm->cu;
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        if (!cu->MemRetainAllocationHandle)
                return gm_cuda_fail_errno(-ENOSYS, "the driver has no cuMemRetainAllocationHandle");
        CUmemGenericAllocationHandle handle;
        CUresult cr = cu->MemRetainAllocationHandle(&handle, (void *) (uintptr_t) from);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cu, cr, "cuMemRetainAllocationHandle");
        if ((cr = cu->MemMap(to, length, 0, handle, 0)) != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemMap");
        } else if ((cr = cu->MemSetAccess(to, length, &cm->access, 1)) != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemSetAccess");
                cu->MemUnmap(to, length);
        } else if ((cr = cu->MemUnmap(from, length)) != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemUnmap");
                cu->MemUnmap(to, length);
        }
        cu->MemRelease(handle);
        return r;
}

static int cuda_sync(gm_mapper_t *m, uint64_t stream) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        const gm_cuda_t *cu = cm->cu;
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        /* A stream runs in its own context; the default stream (or one the
         * application destroyed since) is the device's primary context's.
         * The whole device is its primary context's every stream: the
         * legacy stream does not order non-blocking ones, cuCtxSynchronize
         * does (a driver without it gets the legacy stream's wait). */
        CUcontext ctx = cm->ctx;
        CUstream s = (CUstream) (uintptr_t) stream;
        bool device = stream == GM_MAPPER_SYNC_DEVICE;
        if (device || special_stream(stream) || cu->StreamGetCtx(s, &ctx) != CUDA_SUCCESS) {
                ctx = cm->ctx;
                s = NULL;
        }
        r = gm_cuda_push(cu, ctx);
        if (r < 0)
                return r;
        bool whole = device && cu->CtxSynchronize;
        CUresult cr = whole ? cu->CtxSynchronize() : cu->StreamSynchronize(s);
        gm_cuda_pop(cu);
        return cr == CUDA_SUCCESS ? 0 : gm_cuda_fail(cu, cr, whole ? "cuCtxSynchronize" : "cuStreamSynchronize");
}

/* One synchronous copy in the mapper's device context (relaxed capture). */
static int cuda_copy(cuda_mapper_t *cm, void *host, uint64_t device, uint64_t length, bool to_host) {
        RELAXED_CAPTURE(cm->cu);
        const gm_cuda_t *cu = cm->cu;
        int r = gm_cuda_check_process();
        if (r == 0)
                r = gm_cuda_push(cu, cm->ctx);
        if (r < 0)
                return r;
        CUresult cr = to_host ? cu->MemcpyDtoH(host, device, length) : cu->MemcpyHtoD(device, host, length);
        gm_cuda_pop(cu);
        return cr == CUDA_SUCCESS ? 0 : gm_cuda_fail(cu, cr, to_host ? "cuMemcpyDtoH" : "cuMemcpyHtoD");
}

static int cuda_copy_to_host(gm_mapper_t *m, void *host, uint64_t device, uint64_t length) {
        return cuda_copy((cuda_mapper_t *) m, host, device, length, true);
}

static int cuda_copy_from_host(gm_mapper_t *m, uint64_t device, const void *host, uint64_t length) {
        return cuda_copy((cuda_mapper_t *) m, (void *) host, device, length, false);
}

/* The driver's page-locked host memory, portable: usable by every context
 * (the copies run in the mapper's). */
static int cuda_pinned_alloc(gm_mapper_t *m, uint64_t length, void **ret_host) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        const gm_cuda_t *cu = cm->cu;
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        if (!cu->MemHostAlloc || !cu->MemFreeHost)
                return gm_cuda_fail_errno(-EOPNOTSUPP, "the driver has no cuMemHostAlloc");
        r = gm_cuda_push(cu, cm->ctx);
        if (r < 0)
                return r;
        void *host = NULL;
        CUresult cr = cu->MemHostAlloc(&host, length ? length : 1, CU_MEMHOSTALLOC_PORTABLE);
        gm_cuda_pop(cu);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cu, cr, "cuMemHostAlloc");
        *ret_host = host;
        return 0;
}

/* In a fork()ed child the driver is not this process's: the memory is left. */
static void cuda_pinned_free(gm_mapper_t *m, void *host) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        if (!host || !cm->cu->MemFreeHost || gm_cuda_check_process() < 0)
                return;
        RELAXED_CAPTURE(cm->cu);
        if (gm_cuda_push(cm->cu, cm->ctx) == 0) {
                cm->cu->MemFreeHost(host);
                gm_cuda_pop(cm->cu);
        }
}

static int cuda_unreserve(gm_mapper_t *m, uint64_t base, uint64_t va_size) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        CUresult cr = cm->cu->MemAddressFree(base, va_size);
        return cr == CUDA_SUCCESS ? 0 : gm_cuda_fail(cm->cu, cr, "cuMemAddressFree");
}

static int cuda_event_record(gm_mapper_t *m, uint64_t stream, uint64_t *ret_event) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        const gm_cuda_t *cu = cm->cu;
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        /* The event must belong to the stream's context (cuEventRecord
         * refuses another's): a special stream is this mapper's device's
         * primary context's (whatever context, of whichever device, the
         * calling thread has current: the memory is this device's). */
        CUcontext ctx = cm->ctx;
        CUresult cr;
        if (!special_stream(stream)) {
                cr = cu->StreamGetCtx((CUstream) (uintptr_t) stream, &ctx);
                if (cr != CUDA_SUCCESS)
                        return gm_cuda_fail(cu, cr, "cuStreamGetCtx");
        }
        r = gm_cuda_push(cu, ctx);
        if (r < 0)
                return r;
        CUevent ev;
        cr = cu->EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuEventCreate");
        } else if ((cr = cu->EventRecord(ev, (CUstream) (uintptr_t) stream)) != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuEventRecord");
                cu->EventDestroy(ev);
        }
        gm_cuda_pop(cu);
        if (r < 0)
                return r;
        *ret_event = (uint64_t) (uintptr_t) ev;
        return 0;
}

static int cuda_event_query(gm_mapper_t *m, uint64_t event) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        RELAXED_CAPTURE(cm->cu);
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        CUresult cr = cm->cu->EventQuery((CUevent) (uintptr_t) event);
        if (cr == CUDA_SUCCESS)
                return 1;
        if (cr == CUDA_ERROR_NOT_READY)
                return 0;
        return gm_cuda_fail(cm->cu, cr, "cuEventQuery");
}

static void cuda_event_destroy(gm_mapper_t *m, uint64_t event) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        if (gm_cuda_check_process() == 0)
                cm->cu->EventDestroy((CUevent) (uintptr_t) event);
}

/* The legacy stream (0, CU_STREAM_LEGACY) cannot be captured, and asking
 * about it while a blocking stream captures is itself illegal: it answers
 * 0 unasked. The per-thread default stream can be captured and is asked
 * about: the calling thread's, in this mapper's device's primary context
 * (the context a special stream's event is recorded in, as the runtime's
 * cudaStreamPerThread is). */
static int cuda_capturing(gm_mapper_t *m, uint64_t stream) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        bool per_thread = stream == (uint64_t) (uintptr_t) CU_STREAM_PER_THREAD;
        if ((special_stream(stream) && !per_thread) || !cm->cu->StreamIsCapturing)
                return 0;
        int r = gm_cuda_check_process();
        if (r == 0 && per_thread)
                r = gm_cuda_push(cm->cu, cm->ctx);
        if (r < 0)
                return r;
        CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
        CUresult cr = cm->cu->StreamIsCapturing((CUstream) (uintptr_t) stream, &status);
        if (per_thread)
                gm_cuda_pop(cm->cu);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cm->cu, cr, "cuStreamIsCapturing");
        return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void cuda_destroy(gm_mapper_t *m) {
        cuda_mapper_t *cm = (cuda_mapper_t *) m;
        if (!cm)
                return;
        if (gm_cuda_check_process() == 0) /* a fork child's driver state is not its own */
                cm->cu->DevicePrimaryCtxRelease(cm->dev);
        free(cm);
}

static const gm_mapper_ops_t cuda_mapper_ops = {
        .backend = "cuda",
        .caps = &gm_kind_cuda_caps,
        .reserve = cuda_reserve,
        .map = cuda_map,
        .map_read = cuda_map_read,
        .unmap = cuda_unmap,
        .move = cuda_move,
        .sync = cuda_sync,
        .copy_to_host = cuda_copy_to_host,
        .copy_from_host = cuda_copy_from_host,
        .pinned_alloc = cuda_pinned_alloc,
        .pinned_free = cuda_pinned_free,
        .unreserve = cuda_unreserve,
        .event_record = cuda_event_record,
        .event_query = cuda_event_query,
        .event_destroy = cuda_event_destroy,
        .capturing = cuda_capturing,
        .destroy = cuda_destroy,
};

int gm_mapper_cuda_new(int device, const char *device_uuid, uint64_t granularity, gm_mapper_t **ret) {
        if (granularity == 0)
                return gm_cuda_fail_errno(-EINVAL, "granularity 0");
        const gm_cuda_t *cu;
        int r = gm_cuda_load(&cu);
        if (r < 0)
                return r;
        cuda_mapper_t *cm = calloc(1, sizeof(*cm));
        if (!cm)
                return gm_cuda_fail_errno(-ENOMEM, "out of memory");
        cm->cu = cu;
        int ordinal;
        bool by_uuid = device_uuid && *device_uuid;
        r = gm_cuda_find_device(cu, device, by_uuid ? device_uuid : NULL, &cm->dev, &ordinal);
        if (r == -ENODEV && by_uuid) {
                const char *visible = getenv("CUDA_VISIBLE_DEVICES");
                r = gm_cuda_fail_errno(-ENODEV,
                                       "gpumemd serves %s (its device %d), which this process cannot see "
                                       "(CUDA_VISIBLE_DEVICES=%s)",
                                       device_uuid, device, visible ? visible : "unset");
        }
        if (r < 0)
                goto fail_free;
        CUresult cr = cu->DevicePrimaryCtxRetain(&cm->ctx, cm->dev);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuDevicePrimaryCtxRetain");
                goto fail_free;
        }

        /* The daemon's granularity must suit this device. */
        CUmemAllocationProp prop = gm_cuda_alloc_prop(ordinal, false);
        size_t minimum = 0;
        cr = cu->MemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemGetAllocationGranularity");
                goto fail_ctx;
        }
        if (minimum == 0 || granularity % minimum != 0) {
                r = gm_cuda_fail_errno(-EINVAL, "granularity %llu is not a multiple of device %d's %zu",
                                       (unsigned long long) granularity, ordinal, minimum);
                goto fail_ctx;
        }

        cm->access = (CUmemAccessDesc){
                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ordinal},
                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        cm->base = (gm_mapper_t){.ops = &cuda_mapper_ops, .granularity = granularity};
        *ret = &cm->base;
        return 0;

fail_ctx:
        cu->DevicePrimaryCtxRelease(cm->dev);
fail_free:
        free(cm);
        return r;
}

#else

int gm_mapper_cuda_new(int device, const char *device_uuid, uint64_t granularity, gm_mapper_t **ret) {
        return -ENOSYS;
}

#endif
