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
#include <cudaTypedefs.h>

/* Every entry point gpumemd uses, each with the signature of the version
 * named in its type (cuGetProcAddress is asked for exactly that version, so a
 * newer driver whose default entry point changed signature, as
 * cuCtxSynchronize did in 13.0, still gives the one declared here). */
typedef struct gm_cuda {
        PFN_cuInit_v2000 Init;
        PFN_cuDriverGetVersion_v2020 DriverGetVersion;
        PFN_cuGetErrorName_v6000 GetErrorName;
        PFN_cuGetErrorString_v6000 GetErrorString;
        PFN_cuDeviceGet_v2000 DeviceGet;
        PFN_cuDeviceGetCount_v2000 DeviceGetCount;
        PFN_cuDeviceGetUuid_v11040 DeviceGetUuid;
        PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
        PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
        PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease;
        PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
        PFN_cuCtxSynchronize_v2000 CtxSynchronize; /* of the current context */
        PFN_cuMemGetInfo_v3020 MemGetInfo;
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
        PFN_cuStreamCreate_v2000 StreamCreate;
        PFN_cuStreamDestroy_v4000 StreamDestroy;
        PFN_cuEventCreate_v2000 EventCreate;
        PFN_cuEventRecord_v2000 EventRecord;
        PFN_cuEventQuery_v2000 EventQuery;
        PFN_cuEventSynchronize_v2000 EventSynchronize;
        PFN_cuEventDestroy_v4000 EventDestroy;
} gm_cuda_t;

/* Loads $GPUMEM_LIBCUDA (default "libcuda.so.1"), resolves every entry point
 * and calls cuInit(0), once per process (thread-safe; the library stays loaded
 * for the process's life). On success *ret_cuda is the process-wide table.
 * -ELIBACC when the library cannot be loaded, -ENOSYS when it lacks an entry
 * point, else cuInit's error as errno (-ENODEV: no device); the text goes to
 * gm_cuda_last_error(). */
int gm_cuda_load(const gm_cuda_t **ret_cuda);

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
 * device memory exportable as a POSIX file descriptor. */
CUmemAllocationProp gm_cuda_alloc_prop(int ordinal);
#endif
