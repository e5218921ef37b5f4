/* The CUDA driver API, loaded at run time: libcuda is dlopen'd (never linked),
 * so one binary runs with or without a GPU. Shared by the cuda backend (daemon)
 * and the cuda mapper (client library). Errors are negative errno; the text of
 * the calling thread's last CUDA failure is kept for the caller to log or
 * forward. Nothing here prints. */
#pragma once

/* The calling thread's last failure in this module, e.g. "cuMemCreate:
 * CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; "" if none. Valid until the
 * thread's next call into the cuda backend or mapper. Usable without cuda.h
 * (always "" when built without the cuda backend). */
const char *gm_cuda_last_error(void);

#ifdef GPUMEM_HAVE_CUDA
#include <stdbool.h>
#include <cudaTypedefs.h>

/* Every entry point gpumemd uses, each with the signature of the version
 * named in its type (cuGetProcAddress is asked for exactly that version, so a
 * newer driver whose default entry point changed signature, as
 * cuCtxSynchronize did in 13.0, still gives the one declared here). Entries
 * marked optional are NULL when the driver lacks them (only tests and tools
 * use them); every other one is required at load time. */
typedef struct gm_cuda {
        PFN_cuInit_v2000 Init;
        PFN_cuDriverGetVersion_v2020 DriverGetVersion;
        PFN_cuGetErrorName_v6000 GetErrorName;
        PFN_cuGetErrorString_v6000 GetErrorString;
        PFN_cuDeviceGet_v2000 DeviceGet;
        PFN_cuDeviceGetCount_v2000 DeviceGetCount;
        PFN_cuDeviceGetUuid_v11040 DeviceGetUuid;
        PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
        PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
        PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
        PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease;
        PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
        PFN_cuCtxPushCurrent_v4000 CtxPushCurrent;
        PFN_cuCtxPopCurrent_v4000 CtxPopCurrent;
        PFN_cuMemGetInfo_v3020 MemGetInfo; /* of the current context's device */
        PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
        PFN_cuMemCreate_v10020 MemCreate;
        PFN_cuMemRelease_v10020 MemRelease;
        PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
        PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
        PFN_cuMemAddressReserve_v10020 MemAddressReserve;
        PFN_cuMemAddressFree_v10020 MemAddressFree;
        PFN_cuMemMap_v10020 MemMap;
        PFN_cuMemUnmap_v10020 MemUnmap;
        PFN_cuMemSetAccess_v10020 MemSetAccess;
        PFN_cuMemcpyDtoH_v3020 MemcpyDtoH; /* sleep: kept data to host memory */
        PFN_cuMemcpyHtoD_v3020 MemcpyHtoD; /* wake: and back */
        PFN_cuStreamGetCtx_v9020 StreamGetCtx;
        PFN_cuStreamSynchronize_v2000 StreamSynchronize;
        PFN_cuEventCreate_v2000 EventCreate;
        PFN_cuEventRecord_v2000 EventRecord;
        PFN_cuEventQuery_v2000 EventQuery;
        PFN_cuEventDestroy_v4000 EventDestroy;
        PFN_cuStreamCreate_v2000 StreamCreate;                            /* optional */
        PFN_cuStreamDestroy_v4000 StreamDestroy;                          /* optional */
        PFN_cuEventSynchronize_v2000 EventSynchronize;                    /* optional */
        PFN_cuCtxSynchronize_v2000 CtxSynchronize;                        /* optional; of the current context */
        PFN_cuMemRetainAllocationHandle_v11000 MemRetainAllocationHandle; /* optional: page reuse moves pages */
        PFN_cuThreadExchangeStreamCaptureMode_v10010 ThreadExchangeStreamCaptureMode; /* optional */
        PFN_cuStreamIsCapturing_v10000 StreamIsCapturing;                             /* optional */
        PFN_cuMemHostAlloc_v2020 MemHostAlloc; /* optional: sleep keeps data in page-locked memory */
        PFN_cuMemFreeHost_v2000 MemFreeHost;   /* optional: with MemHostAlloc */
} gm_cuda_t;

/* Loads $GPUMEM_LIBCUDA (default "libcuda.so.1"), resolves every entry point
 * and calls cuInit(0), once per process (thread-safe; the library stays loaded
 * for the process's life). On success *ret_cuda is the process-wide table.
 * -ELIBACC when the library cannot be loaded, -ENOSYS when it lacks a required
 * entry point, -EOPNOTSUPP in a fork()ed child of a process that loaded it
 * (CUDA does not survive fork without exec: nothing is called in the child),
 * else cuInit's error as errno (-ENODEV: no device); the text goes to
 * gm_cuda_last_error(). */
int gm_cuda_load(const gm_cuda_t **ret_cuda);

/* 0 in the process that loaded the driver; in a fork()ed child -EOPNOTSUPP
 * with the explanation as the thread's last error. Every driver call on an
 * object made before a fork must ask this first. */
int gm_cuda_check_process(void);

/* Makes `ctx` current on the calling thread for the driver calls that follow
 * and gm_cuda_pop() gives the thread back its own context: calls on an
 * application's thread never change what it has current. */
int gm_cuda_push(const gm_cuda_t *cu, CUcontext ctx);
void gm_cuda_pop(const gm_cuda_t *cu);

/* The UUID of `dev` as nvidia-smi prints it, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-
 * xxxxxxxxxxxx" (41 bytes with the NUL). */
#define GM_CUDA_UUID_LEN 41
int gm_cuda_device_uuid(const gm_cuda_t *cu, CUdevice dev, char ret_uuid[GM_CUDA_UUID_LEN]);

/* The negative errno for a CUDA error: out of memory -ENOMEM, invalid value
 * -EINVAL, no/invalid device -ENODEV, not ready -EAGAIN, not supported
 * -EOPNOTSUPP, not permitted -EPERM, anything else -EIO. */
int gm_cuda_errno(CUresult r);

/* Records "<what>: <CUDA error name> (<description>)" as the thread's last
 * error and returns gm_cuda_errno(r). */
int gm_cuda_fail(const gm_cuda_t *cu, CUresult r, const char *what);

/* Records a printf-style message as the thread's last error; returns err. */
__attribute__((format(printf, 2, 3))) int gm_cuda_fail_errno(int err, const char *fmt, ...);

/* Finds a device by ordinal, or by `uuid` when non-NULL ("GPU-xxxxxxxx-xxxx-
 * xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints it; the "GPU-" prefix and the
 * dashes are optional). *ret_ordinal is its ordinal. -ENODEV when there is no
 * such device, -EINVAL for a malformed UUID. */
int gm_cuda_find_device(const gm_cuda_t *cu, int ordinal, const char *uuid, CUdevice *ret_dev, int *ret_ordinal);

/* The properties of every gpumemd allocation on device `ordinal`: pinned
 * device memory exportable as a POSIX file descriptor, GPUDirect RDMA capable
 * when `rdma` (the device supports it with VMM: NCCL over InfiniBand needs it). */
CUmemAllocationProp gm_cuda_alloc_prop(int ordinal, bool rdma);

/* Refuses a device gpumemd cannot serve: without virtual memory management,
 * without POSIX-fd export, or in compute-prohibited mode (-EOPNOTSUPP, the
 * reason as the thread's last error). *ret_rdma says whether allocations can
 * be GPUDirect RDMA capable. */
int gm_cuda_check_device(const gm_cuda_t *cu, CUdevice dev, int ordinal, bool *ret_rdma);
#endif
