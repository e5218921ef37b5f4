/* Run-time loading of the CUDA driver API. The table is filled once per
 * process and never changes afterwards, so readers need no lock. Each entry
 * point is asked of cuGetProcAddress at the version whose signature the table
 * declares; drivers without cuGetProcAddress fall back to dlsym of the
 * versioned export names. */
#include "cuda_loader.h"

#define LAST_ERROR_MAX 256 /* bytes of error text kept per thread */

static _Thread_local char last_error[LAST_ERROR_MAX];

const char *gm_cuda_last_error(void) {
        return last_error;
}

#ifdef GPUMEM_HAVE_CUDA
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define DEFAULT_LIBCUDA "libcuda.so.1"

typedef struct sym {
        const char *name;     /* base name, as cuGetProcAddress wants it */
        int version;          /* CUDA version of the signature in gm_cuda_t */
        const char *exported; /* the library's export of that version, for dlsym */
        size_t offset;        /* of the slot in gm_cuda_t */
        bool optional;        /* only tests and tools use it: NULL when missing */
} sym_t;

#define SYM(field, version, exported) \
        { "cu" #field, version, exported, offsetof(gm_cuda_t, field), false }
#define OPTIONAL(field, version, exported) \
        { "cu" #field, version, exported, offsetof(gm_cuda_t, field), true }

static const sym_t syms[] = {
        SYM(Init, 2000, "cuInit"),
        SYM(DriverGetVersion, 2020, "cuDriverGetVersion"),
        SYM(GetErrorName, 6000, "cuGetErrorName"),
        SYM(GetErrorString, 6000, "cuGetErrorString"),
        SYM(DeviceGet, 2000, "cuDeviceGet"),
        SYM(DeviceGetCount, 2000, "cuDeviceGetCount"),
        SYM(DeviceGetUuid, 11040, "cuDeviceGetUuid_v2"),
        SYM(DeviceGetAttribute, 2000, "cuDeviceGetAttribute"),
        SYM(DeviceTotalMem, 3020, "cuDeviceTotalMem_v2"),
        SYM(DevicePrimaryCtxRetain, 7000, "cuDevicePrimaryCtxRetain"),
        SYM(DevicePrimaryCtxRelease, 11000, "cuDevicePrimaryCtxRelease_v2"),
        SYM(CtxGetCurrent, 4000, "cuCtxGetCurrent"),
        SYM(CtxPushCurrent, 4000, "cuCtxPushCurrent_v2"),
        SYM(CtxPopCurrent, 4000, "cuCtxPopCurrent_v2"),
        SYM(MemGetInfo, 3020, "cuMemGetInfo_v2"),
        SYM(MemGetAllocationGranularity, 10020, "cuMemGetAllocationGranularity"),
        SYM(MemCreate, 10020, "cuMemCreate"),
        SYM(MemRelease, 10020, "cuMemRelease"),
        SYM(MemExportToShareableHandle, 10020, "cuMemExportToShareableHandle"),
        SYM(MemImportFromShareableHandle, 10020, "cuMemImportFromShareableHandle"),
        SYM(MemAddressReserve, 10020, "cuMemAddressReserve"),
        SYM(MemAddressFree, 10020, "cuMemAddressFree"),
        SYM(MemMap, 10020, "cuMemMap"),
        SYM(MemUnmap, 10020, "cuMemUnmap"),
        SYM(MemSetAccess, 10020, "cuMemSetAccess"),
        SYM(MemcpyDtoH, 3020, "cuMemcpyDtoH_v2"),
        SYM(MemcpyHtoD, 3020, "cuMemcpyHtoD_v2"),
        SYM(StreamGetCtx, 9020, "cuStreamGetCtx"),
        SYM(StreamSynchronize, 2000, "cuStreamSynchronize"),
        SYM(EventCreate, 2000, "cuEventCreate"),
        SYM(EventRecord, 2000, "cuEventRecord"),
        SYM(EventQuery, 2000, "cuEventQuery"),
        SYM(EventDestroy, 4000, "cuEventDestroy_v2"),
        OPTIONAL(StreamCreate, 2000, "cuStreamCreate"),
        OPTIONAL(StreamDestroy, 4000, "cuStreamDestroy_v2"),
        OPTIONAL(EventSynchronize, 2000, "cuEventSynchronize"),
        OPTIONAL(CtxSynchronize, 2000, "cuCtxSynchronize"),
        OPTIONAL(MemRetainAllocationHandle, 11000, "cuMemRetainAllocationHandle"),
        OPTIONAL(ThreadExchangeStreamCaptureMode, 10010, "cuThreadExchangeStreamCaptureMode"),
        OPTIONAL(StreamIsCapturing, 10000, "cuStreamIsCapturing"),
        OPTIONAL(MemHostAlloc, 2020, "cuMemHostAlloc"),
        OPTIONAL(MemFreeHost, 2000, "cuMemFreeHost"),
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static gm_cuda_t cuda;  /* filled by load(), read-only afterwards */
static int load_result; /* 0 or the negative errno of the one load */
static pid_t load_pid;  /* the process that loaded it (a fork child inherits all of this) */
static char load_error[LAST_ERROR_MAX];

int gm_cuda_fail_errno(int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(last_error, sizeof(last_error), fmt, ap);
        va_end(ap);
        return err;
}

int gm_cuda_errno(CUresult r) {
        switch (r) {
        case CUDA_SUCCESS:
                return 0;
        case CUDA_ERROR_OUT_OF_MEMORY:
                return -ENOMEM;
        case CUDA_ERROR_INVALID_VALUE:
        case CUDA_ERROR_INVALID_HANDLE:
                return -EINVAL;
        case CUDA_ERROR_NO_DEVICE:
        case CUDA_ERROR_INVALID_DEVICE:
        case CUDA_ERROR_DEVICE_UNAVAILABLE:
        case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
                return -ENODEV;
        case CUDA_ERROR_NOT_READY:
                return -EAGAIN;
        case CUDA_ERROR_NOT_SUPPORTED:
                return -EOPNOTSUPP;
        case CUDA_ERROR_NOT_PERMITTED:
                return -EPERM;
        default:
                return -EIO;
        }
}

int gm_cuda_fail(const gm_cuda_t *cu, CUresult r, const char *what) {
        const char *name = NULL, *desc = NULL;
        if (cu->GetErrorName(r, &name) != CUDA_SUCCESS)
                name = NULL;
        if (cu->GetErrorString(r, &desc) != CUDA_SUCCESS)
                desc = NULL;
        if (name)
                return gm_cuda_fail_errno(gm_cuda_errno(r), "%s: %s (%s)", what, name, desc ? desc : "no description");
        return gm_cuda_fail_errno(gm_cuda_errno(r), "%s: CUDA error %d", what, (int) r);
}

/* One entry point of `lib`, or NULL when the library lacks it. A driver with
 * cuGetProcAddress is trusted alone: a symbol it does not give at the version
 * asked must not be taken from an export of another signature. */
static void *resolve(void *lib, PFN_cuGetProcAddress_v12000 getproc_v2, PFN_cuGetProcAddress_v11030 getproc_v1,
                     const sym_t *s) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (getproc_v2)
                return getproc_v2(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS &&
                                       status == CU_GET_PROC_ADDRESS_SUCCESS
                               ? fn
                               : NULL;
        if (getproc_v1)
                return getproc_v1(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT) == CUDA_SUCCESS ? fn : NULL;
        return dlsym(lib, s->exported);
}

static int load(void) {
        const char *path = getenv("GPUMEM_LIBCUDA");
        if (!path || !*path)
                path = DEFAULT_LIBCUDA;
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib)
                return gm_cuda_fail_errno(-ELIBACC, "cannot load %s: %s", path, dlerror());

        PFN_cuGetProcAddress_v12000 getproc_v2 = NULL;
        PFN_cuGetProcAddress_v11030 getproc_v1 = NULL;
        void *p = dlsym(lib, "cuGetProcAddress_v2");
        memcpy(&getproc_v2, &p, sizeof(p));
        if (!getproc_v2) {
                p = dlsym(lib, "cuGetProcAddress");
                memcpy(&getproc_v1, &p, sizeof(p));
        }
        for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
                void *fn = resolve(lib, getproc_v2, getproc_v1, &syms[i]);
                if (!fn && !syms[i].optional) {
                        dlclose(lib);
                        return gm_cuda_fail_errno(-ENOSYS, "%s lacks %s (driver older than CUDA 11.4?)", path,
                                                  syms[i].name);
                }
                memcpy((char *) &cuda + syms[i].offset, &fn, sizeof(fn));
        }

        CUresult r = cuda.Init(0);
        return r == CUDA_SUCCESS ? 0 : gm_cuda_fail(&cuda, r, "cuInit");
}

static void load_once_fn(void) {
        load_pid = getpid();
        load_result = load();
        if (load_result < 0)
                snprintf(load_error, sizeof(load_error), "%s", last_error);
}

int gm_cuda_check_process(void) {
        if (load_pid == 0 || load_pid == getpid())
                return 0;
        return gm_cuda_fail_errno(-EOPNOTSUPP,
                                  "CUDA cannot be used in this process: it was fork()ed from process %d, which had "
                                  "initialised CUDA (the driver does not support use after fork without exec); "
                                  "exec a new program, or start the child before using gpumemd",
                                  (int) load_pid);
}

int gm_cuda_load(const gm_cuda_t **ret_cuda) {
        int r = gm_cuda_check_process();
        if (r < 0)
                return r;
        pthread_once(&load_once, load_once_fn);
        if (load_result < 0)
                return gm_cuda_fail_errno(load_result, "%s", load_error);
        *ret_cuda = &cuda;
        return 0;
}

static int hex_value(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        c = (char) tolower((unsigned char) c);
        return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Parses the 16 bytes of a UUID string (see gm_cuda_find_device). */
static bool parse_uuid(const char *s, unsigned char ret_bytes[16]) {
        unsigned char bytes[16];
        size_t digits = 0;
        if (strncasecmp(s, "GPU-", 4) == 0)
                s += 4;
        for (; *s; s++) {
                if (*s == '-')
                        continue;
                int v = hex_value(*s);
                if (v < 0 || digits == 32)
                        return false;
                if (digits % 2 == 0)
                        bytes[digits / 2] = (unsigned char) (v << 4);
                else
                        bytes[digits / 2] |= (unsigned char) v;
                digits++;
        }
        if (digits != 32)
                return false;
        memcpy(ret_bytes, bytes, sizeof(bytes));
        return true;
}

int gm_cuda_find_device(const gm_cuda_t *cu, int ordinal, const char *uuid, CUdevice *ret_dev, int *ret_ordinal) {
        int count = 0;
        CUresult r = cu->DeviceGetCount(&count);
        if (r != CUDA_SUCCESS)
                return gm_cuda_fail(cu, r, "cuDeviceGetCount");

        if (!uuid) {
                if (ordinal < 0 || ordinal >= count)
                        return gm_cuda_fail_errno(-ENODEV, "no cuda device %d (%d present)", ordinal, count);
                CUdevice dev;
                r = cu->DeviceGet(&dev, ordinal);
                if (r != CUDA_SUCCESS)
                        return gm_cuda_fail(cu, r, "cuDeviceGet");
                *ret_dev = dev;
                *ret_ordinal = ordinal;
                return 0;
        }

        unsigned char want[16];
        if (!parse_uuid(uuid, want))
                return gm_cuda_fail_errno(
                        -EINVAL, "malformed device UUID '%s' (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                        uuid);
        for (int i = 0; i < count; i++) {
                CUdevice dev;
                CUuuid have;
                r = cu->DeviceGet(&dev, i);
                if (r == CUDA_SUCCESS)
                        r = cu->DeviceGetUuid(&have, dev);
                if (r != CUDA_SUCCESS)
                        return gm_cuda_fail(cu, r, "cuDeviceGetUuid");
                if (memcmp(have.bytes, want, sizeof(want)) == 0) {
                        *ret_dev = dev;
                        *ret_ordinal = i;
                        return 0;
                }
        }
        return gm_cuda_fail_errno(-ENODEV, "no cuda device has UUID '%s' (%d present)", uuid, count);
}

CUmemAllocationProp gm_cuda_alloc_prop(int ordinal, bool rdma) {
        return (CUmemAllocationProp){
                .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ordinal},
                .allocFlags = {.gpuDirectRDMACapable = rdma},
        };
}

int gm_cuda_push(const gm_cuda_t *cu, CUcontext ctx) {
        CUresult r = cu->CtxPushCurrent(ctx);
        return r == CUDA_SUCCESS ? 0 : gm_cuda_fail(cu, r, "cuCtxPushCurrent");
}

void gm_cuda_pop(const gm_cuda_t *cu) {
        CUcontext ignored;
        cu->CtxPopCurrent(&ignored);
}

int gm_cuda_device_uuid(const gm_cuda_t *cu, CUdevice dev, char ret_uuid[GM_CUDA_UUID_LEN]) {
        CUuuid u;
        CUresult r = cu->DeviceGetUuid(&u, dev);
        if (r != CUDA_SUCCESS)
                return gm_cuda_fail(cu, r, "cuDeviceGetUuid");
        const unsigned char *b = (const unsigned char *) u.bytes;
        snprintf(ret_uuid, GM_CUDA_UUID_LEN, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        return 0;
}

static int device_attribute(const gm_cuda_t *cu, CUdevice dev, CUdevice_attribute attr, const char *name, int *ret) {
        CUresult r = cu->DeviceGetAttribute(ret, attr, dev);
        return r == CUDA_SUCCESS ? 0 : gm_cuda_fail(cu, r, name);
}

int gm_cuda_check_device(const gm_cuda_t *cu, CUdevice dev, int ordinal, bool *ret_rdma) {
        int vmm = 0, posix_fd = 0, mode = 0, rdma = 0;
        int r = device_attribute(cu, dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", &vmm);
        if (r == 0)
                r = device_attribute(cu, dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                     "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)", &posix_fd);
        if (r == 0)
                r = device_attribute(cu, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, "cuDeviceGetAttribute(COMPUTE_MODE)",
                                     &mode);
        if (r < 0)
                return r;
        if (!vmm)
                return gm_cuda_fail_errno(-EOPNOTSUPP,
                                          "cuda device %d does not support virtual memory management "
                                          "(cuMemCreate/cuMemMap)",
                                          ordinal);
        if (!posix_fd)
                return gm_cuda_fail_errno(-EOPNOTSUPP,
                                          "cuda device %d cannot export memory as POSIX file "
                                          "descriptors",
                                          ordinal);
        if (mode == CU_COMPUTEMODE_PROHIBITED)
                return gm_cuda_fail_errno(-EOPNOTSUPP, "cuda device %d is in compute-prohibited mode", ordinal);
        /* An old driver may not know the attribute: then no RDMA flag. */
        if (cu->DeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev) !=
            CUDA_SUCCESS)
                rdma = 0;
        *ret_rdma = rdma != 0;
        return 0;
}
#endif
