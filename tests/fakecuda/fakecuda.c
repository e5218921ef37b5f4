/* fakecuda: an emulated CUDA driver, built as a test-only libcuda.so.1 so that
 * CI runs the cuda backend's real code path without a GPU. It implements
 * exactly the entry points gpumemd uses, over memfd and mmap:
 *   - physical memory (cuMemCreate) is one memfd, charged against the capacity
 *     in the process that created it; exporting dups the memfd, importing
 *     wraps a received fd;
 *   - device addresses are CPU addresses: cuMemAddressReserve is a PROT_NONE
 *     mmap, cuMemMap maps the memfd there (still PROT_NONE), cuMemSetAccess
 *     makes it readable/writable, cuMemUnmap puts PROT_NONE back; so a test can
 *     read and write through a device pointer;
 *   - an allocation lives while its handle is open or any mapping uses it;
 *   - like device mappings, reserved ranges are not inherited by fork()
 *     (MADV_DONTFORK); a forked child must not use its parent's CUDA state.
 * Configuration (read by cuInit): FAKECUDA_DEVICE_COUNT (default 1; 0 makes
 * cuInit fail with CUDA_ERROR_NO_DEVICE), FAKECUDA_CAPACITY (bytes per process,
 * suffixes K/M/G/T, default 4G), FAKECUDA_GRANULARITY (default 2M),
 * FAKECUDA_FAIL_{CREATE,IMPORT,MAP}_AT=N (the Nth such call in this process
 * fails with FAKECUDA_FAIL_{CREATE,IMPORT,MAP}_ERROR, an error name, default
 * CUDA_ERROR_OUT_OF_MEMORY), FAKECUDA_HOLD_EVENTS=path (while the file exists
 * events are not complete), FAKECUDA_UUID_PREFIX (hex; a device's UUID is
 * these bytes, then zeros, then the ordinal in the last byte; default
 * fa4ec0da). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#pragma GCC visibility push(default)
#include <cuda.h>

#define FAKE_DRIVER_VERSION 13000
#define FAKE_MAX_DEVICES 16

typedef struct alloc {
        struct alloc *next;
        int fd;            /* the memfd, owned */
        size_t size;       /* bytes */
        bool handle_open;  /* the handle was not released yet */
        int mappings;      /* cuMemMap ranges using it */
        bool charged;      /* created here: counts against the capacity */
        bool exportable;   /* created with POSIX fd handles requested */
} alloc_t;

/* A reservation, a mapping (alloc set) or a cuMemAlloc block. */
typedef struct range {
        struct range *next;
        uintptr_t addr;
        size_t size;
        alloc_t *alloc;
} range_t;

struct CUctx_st {
        int device;
        int refs; /* primary context retains */
};
struct CUstream_st {
        int device;
};
struct CUevent_st {
        bool recorded;
};

static struct {
        pthread_mutex_t lock; /* guards everything below but the config */
        bool initialized;
        /* configuration, fixed by the first successful cuInit */
        int device_count;
        uint64_t capacity, granularity;
        long fail_create_at, fail_import_at, fail_map_at;
        CUresult fail_create_error, fail_import_error, fail_map_error;
        const char *hold_events;
        unsigned char uuid_prefix[15];
        size_t uuid_prefix_len;
        /* state */
        uint64_t in_use; /* bytes charged: created allocations and cuMemAlloc blocks */
        long creates, imports, maps;
        struct CUctx_st ctx[FAKE_MAX_DEVICES];
        alloc_t *allocs;
        range_t *reservations, *mappings, *blocks;
} fake = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local CUcontext current;

static void unlock(pthread_mutex_t **m) {
        pthread_mutex_unlock(*m);
}
#define LOCKED()                                                                                   \
        pthread_mutex_t *locked_ __attribute__((cleanup(unlock))) = &fake.lock;                    \
        pthread_mutex_lock(locked_)
#define REQUIRE_INIT()                                                                             \
        do {                                                                                       \
                if (!fake.initialized)                                                             \
                        return CUDA_ERROR_NOT_INITIALIZED;                                         \
        } while (0)

static const struct {
        CUresult code;
        const char *name, *text;
} errors[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
        {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
        {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
        {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
        {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
        {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* ---- configuration ---- */

static bool env_size(const char *name, uint64_t dflt, uint64_t *ret) {
        const char *s = getenv(name);
        if (!s || !*s) {
                *ret = dflt;
                return true;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s)
                return false;
        unsigned shift = 0;
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        case 'T': case 't': shift = 40; end++; break;
        }
        if (shift && *end == 'i')
                end++;
        if (*end == 'B')
                end++;
        if (*end || (shift && v > (UINT64_MAX >> shift)))
                return false;
        *ret = (uint64_t)v << shift;
        return true;
}

static bool env_error(const char *name, CUresult *ret) {
        const char *s = getenv(name);
        if (!s || !*s) {
                *ret = CUDA_ERROR_OUT_OF_MEMORY;
                return true;
        }
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
                if (strcmp(errors[i].name, s) == 0) {
                        *ret = errors[i].code;
                        return true;
                }
        return false;
}

static bool parse_hex(const char *s, unsigned char *bytes, size_t max, size_t *ret_len) {
        size_t n = 0;
        for (; s[0] && s[1]; s += 2) {
                char pair[3] = {s[0], s[1], 0};
                char *end;
                unsigned long v = strtoul(pair, &end, 16);
                if (*end || n == max)
                        return false;
                bytes[n++] = (unsigned char)v;
        }
        if (*s)
                return false;
        *ret_len = n;
        return true;
}

static bool configure(void) {
        uint64_t count, fail_create, fail_import, fail_map;
        const char *prefix = getenv("FAKECUDA_UUID_PREFIX");
        if (!env_size("FAKECUDA_DEVICE_COUNT", 1, &count) || count > FAKE_MAX_DEVICES ||
            !env_size("FAKECUDA_CAPACITY", 4ull << 30, &fake.capacity) ||
            !env_size("FAKECUDA_GRANULARITY", 2ull << 20, &fake.granularity) || fake.granularity == 0 ||
            fake.granularity % (uint64_t)sysconf(_SC_PAGESIZE) != 0 ||
            !env_size("FAKECUDA_FAIL_CREATE_AT", 0, &fail_create) ||
            !env_size("FAKECUDA_FAIL_IMPORT_AT", 0, &fail_import) ||
            !env_size("FAKECUDA_FAIL_MAP_AT", 0, &fail_map) ||
            !env_error("FAKECUDA_FAIL_CREATE_ERROR", &fake.fail_create_error) ||
            !env_error("FAKECUDA_FAIL_IMPORT_ERROR", &fake.fail_import_error) ||
            !env_error("FAKECUDA_FAIL_MAP_ERROR", &fake.fail_map_error) ||
            !parse_hex(prefix ? prefix : "fa4ec0da", fake.uuid_prefix, sizeof(fake.uuid_prefix),
                       &fake.uuid_prefix_len))
                return false;
        fake.device_count = (int)count;
        fake.fail_create_at = (long)fail_create;
        fake.fail_import_at = (long)fail_import;
        fake.fail_map_at = (long)fail_map;
        fake.hold_events = getenv("FAKECUDA_HOLD_EVENTS");
        for (int i = 0; i < FAKE_MAX_DEVICES; i++)
                fake.ctx[i].device = i;
        return true;
}

/* ---- bookkeeping ---- */

static bool valid_device(CUdevice dev) {
        return dev >= 0 && dev < fake.device_count;
}

static bool have_context(void) {
        return current && current->refs > 0;
}

static alloc_t *find_alloc(CUmemGenericAllocationHandle handle) {
        for (alloc_t *a = fake.allocs; a; a = a->next)
                if ((uintptr_t)a == handle && a->handle_open)
                        return a;
        return NULL;
}

/* Frees the allocation once neither its handle nor a mapping uses it. */
static void alloc_maybe_free(alloc_t *a) {
        if (a->handle_open || a->mappings > 0)
                return;
        for (alloc_t **p = &fake.allocs; *p; p = &(*p)->next)
                if (*p == a) {
                        *p = a->next;
                        break;
                }
        close(a->fd);
        if (a->charged)
                fake.in_use -= a->size;
        free(a);
}

static alloc_t *alloc_new(int fd, size_t size, bool charged, bool exportable) {
        alloc_t *a = calloc(1, sizeof(*a));
        if (!a)
                return NULL;
        *a = (alloc_t){.next = fake.allocs, .fd = fd, .size = size, .handle_open = true, .charged = charged,
                       .exportable = exportable};
        fake.allocs = a;
        return a;
}

static range_t *range_add(range_t **list, uintptr_t addr, size_t size, alloc_t *a) {
        range_t *r = calloc(1, sizeof(*r));
        if (!r)
                return NULL;
        *r = (range_t){.next = *list, .addr = addr, .size = size, .alloc = a};
        *list = r;
        return r;
}

static range_t **range_find(range_t **list, uintptr_t addr) {
        for (; *list; list = &(*list)->next)
                if ((*list)->addr == addr)
                        return list;
        return NULL;
}

static bool overlaps(const range_t *r, uintptr_t addr, size_t size) {
        return r->addr < addr + size && addr < r->addr + r->size;
}

/* Bytes of [addr, +size) covered by mappings; -1 if one sticks out. */
static long long mapped_bytes(uintptr_t addr, size_t size) {
        long long n = 0;
        for (range_t *r = fake.mappings; r; r = r->next) {
                if (!overlaps(r, addr, size))
                        continue;
                if (r->addr < addr || r->addr + r->size > addr + size)
                        return -1;
                n += (long long)r->size;
        }
        return n;
}

static bool inside_reservation(uintptr_t addr, size_t size) {
        for (range_t *r = fake.reservations; r; r = r->next)
                if (addr >= r->addr && addr + size <= r->addr + r->size)
                        return true;
        return false;
}

static bool prop_valid(const CUmemAllocationProp *prop) {
        return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
               prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(prop->location.id) &&
               (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ||
                prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

/* Turns [addr, +size) back into reserved, inaccessible, not inherited pages. */
static void reserve_pages(uintptr_t addr, size_t size) {
        mmap((void *)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        madvise((void *)addr, size, MADV_DONTFORK);
}

static bool events_held(void) {
        return fake.hold_events && access(fake.hold_events, F_OK) == 0;
}

/* ---- initialization, errors, devices, contexts ---- */

CUresult CUDAAPI cuInit(unsigned int flags) {
        LOCKED();
        if (flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (!fake.initialized) {
                if (!configure())
                        return CUDA_ERROR_INVALID_VALUE;
                if (fake.device_count == 0)
                        return CUDA_ERROR_NO_DEVICE;
                fake.initialized = true;
        }
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *version) {
        if (!version)
                return CUDA_ERROR_INVALID_VALUE;
        *version = FAKE_DRIVER_VERSION;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **str) {
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
                if (errors[i].code == error) {
                        *str = errors[i].name;
                        return CUDA_SUCCESS;
                }
        *str = NULL;
        return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **str) {
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
                if (errors[i].code == error) {
                        *str = errors[i].text;
                        return CUDA_SUCCESS;
                }
        *str = NULL;
        return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
        LOCKED();
        REQUIRE_INIT();
        *count = fake.device_count;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(ordinal))
                return CUDA_ERROR_INVALID_DEVICE;
        *device = ordinal;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        memset(uuid->bytes, 0, sizeof(uuid->bytes));
        memcpy(uuid->bytes, fake.uuid_prefix, fake.uuid_prefix_len);
        uuid->bytes[15] = (char)dev;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        *bytes = fake.capacity;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        fake.ctx[dev].refs++;
        *ctx = &fake.ctx[dev];
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        if (fake.ctx[dev].refs == 0)
                return CUDA_ERROR_INVALID_CONTEXT;
        fake.ctx[dev].refs--;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
        LOCKED();
        REQUIRE_INIT();
        if (ctx && (ctx < &fake.ctx[0] || ctx >= &fake.ctx[FAKE_MAX_DEVICES] || ctx->refs == 0))
                return CUDA_ERROR_INVALID_CONTEXT;
        current = ctx;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void) {
        LOCKED();
        REQUIRE_INIT();
        return have_context() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
        LOCKED();
        REQUIRE_INIT();
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        *free_bytes = fake.capacity - fake.in_use;
        *total_bytes = fake.capacity;
        return CUDA_SUCCESS;
}

/* ---- virtual memory management ---- */

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
        LOCKED();
        REQUIRE_INIT();
        if (!granularity || !prop_valid(prop))
                return CUDA_ERROR_INVALID_VALUE;
        *granularity = fake.granularity;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (!handle || !prop_valid(prop) || flags != 0 || size == 0 || size % fake.granularity != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (++fake.creates == fake.fail_create_at)
                return fake.fail_create_error;
        if (size > fake.capacity - fake.in_use)
                return CUDA_ERROR_OUT_OF_MEMORY;
        int fd = memfd_create("fakecuda", MFD_CLOEXEC);
        if (fd < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        alloc_t *a = NULL;
        if (ftruncate(fd, (off_t)size) < 0 ||
            !(a = alloc_new(fd, size, true, prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))) {
                close(fd);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        fake.in_use += size;
        *handle = (uintptr_t)a;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
        LOCKED();
        REQUIRE_INIT();
        alloc_t *a = find_alloc(handle);
        if (!a)
                return CUDA_ERROR_INVALID_VALUE;
        a->handle_open = false;
        alloc_maybe_free(a);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type, unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        alloc_t *a = find_alloc(handle);
        if (!shareable || !a || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !a->exportable)
                return CUDA_ERROR_INVALID_VALUE;
        /* Deliberately without CLOEXEC: the real driver promises none. */
        int fd = dup(a->fd);
        if (fd < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *(int *)shareable = fd;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                CUmemAllocationHandleType type) {
        LOCKED();
        REQUIRE_INIT();
        if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                return CUDA_ERROR_INVALID_VALUE;
        if (++fake.imports == fake.fail_import_at)
                return fake.fail_import_error;
        int fd = (int)(intptr_t)os_handle;
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
            (uint64_t)st.st_size % fake.granularity != 0)
                return CUDA_ERROR_INVALID_HANDLE;
        int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        alloc_t *a = alloc_new(own, (size_t)st.st_size, false, true);
        if (!a) {
                close(own);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *handle = (uintptr_t)a;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (alignment == 0)
                alignment = fake.granularity;
        if (!ptr || size == 0 || size % fake.granularity != 0 || alignment % fake.granularity != 0)
                return CUDA_ERROR_INVALID_VALUE;
        size_t span = size + alignment;
        char *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        uintptr_t start = ((uintptr_t)raw + alignment - 1) / alignment * alignment;
        if (start > (uintptr_t)raw)
                munmap(raw, start - (uintptr_t)raw);
        munmap((void *)(start + size), (uintptr_t)raw + span - (start + size));
        madvise((void *)start, size, MADV_DONTFORK);
        if (!range_add(&fake.reservations, start, size, NULL)) {
                munmap((void *)start, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *ptr = start;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
        LOCKED();
        REQUIRE_INIT();
        range_t **p = range_find(&fake.reservations, ptr);
        if (!p || (*p)->size != size || mapped_bytes(ptr, size) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        range_t *r = *p;
        *p = r->next;
        munmap((void *)r->addr, r->size);
        free(r);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (++fake.maps == fake.fail_map_at)
                return fake.fail_map_error;
        alloc_t *a = find_alloc(handle);
        if (!a || offset != 0 || flags != 0 || size == 0 || size > a->size || size % fake.granularity != 0 ||
            !inside_reservation(ptr, size) || mapped_bytes(ptr, size) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0) == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        madvise((void *)ptr, size, MADV_DONTFORK);
        if (!range_add(&fake.mappings, ptr, size, a)) {
                reserve_pages(ptr, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->mappings++;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
        LOCKED();
        REQUIRE_INIT();
        if (!desc || count == 0 || size == 0 || mapped_bytes(ptr, size) != (long long)size)
                return CUDA_ERROR_INVALID_VALUE;
        int prot = PROT_NONE;
        for (size_t i = 0; i < count; i++) {
                if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(desc[i].location.id))
                        return CUDA_ERROR_INVALID_DEVICE;
                if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
                        prot |= PROT_READ;
                else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                        prot |= PROT_READ | PROT_WRITE;
                else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
                        return CUDA_ERROR_INVALID_VALUE;
        }
        if (mprotect((void *)ptr, size, prot) < 0)
                return CUDA_ERROR_INVALID_VALUE;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
        LOCKED();
        REQUIRE_INIT();
        /* The range must consist of whole mappings. */
        if (size == 0 || mapped_bytes(ptr, size) != (long long)size)
                return CUDA_ERROR_INVALID_VALUE;
        for (range_t **p = &fake.mappings; *p;) {
                range_t *r = *p;
                if (!overlaps(r, ptr, size)) {
                        p = &r->next;
                        continue;
                }
                reserve_pages(r->addr, r->size);
                *p = r->next;
                r->alloc->mappings--;
                alloc_maybe_free(r->alloc);
                free(r);
        }
        return CUDA_SUCCESS;
}

/* ---- streams and events ---- */

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
        LOCKED();
        REQUIRE_INIT();
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!stream || !(*stream = calloc(1, sizeof(**stream))))
                return CUDA_ERROR_OUT_OF_MEMORY;
        (*stream)->device = current->device;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
        if (!stream)
                return CUDA_ERROR_INVALID_HANDLE;
        free(stream);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int flags) {
        LOCKED();
        REQUIRE_INIT();
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!event || !(*event = calloc(1, sizeof(**event))))
                return CUDA_ERROR_OUT_OF_MEMORY;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
        LOCKED();
        REQUIRE_INIT();
        if (!event)
                return CUDA_ERROR_INVALID_HANDLE;
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        event->recorded = true;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent event) {
        if (!event)
                return CUDA_ERROR_INVALID_HANDLE;
        return event->recorded && events_held() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
        if (!event)
                return CUDA_ERROR_INVALID_HANDLE;
        while (event->recorded && events_held())
                nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent event) {
        if (!event)
                return CUDA_ERROR_INVALID_HANDLE;
        free(event);
        return CUDA_SUCCESS;
}

/* ---- classic allocation (what the GPU check compares against) ---- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size) {
        LOCKED();
        REQUIRE_INIT();
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!dptr || size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (size > fake.capacity - fake.in_use)
                return CUDA_ERROR_OUT_OF_MEMORY;
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        if (!range_add(&fake.blocks, (uintptr_t)p, size, NULL)) {
                munmap(p, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        fake.in_use += size;
        *dptr = (uintptr_t)p;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
        LOCKED();
        REQUIRE_INIT();
        range_t **p = range_find(&fake.blocks, dptr);
        if (!p)
                return CUDA_ERROR_INVALID_VALUE;
        range_t *r = *p;
        *p = r->next;
        munmap((void *)r->addr, r->size);
        fake.in_use -= r->size;
        free(r);
        return CUDA_SUCCESS;
}

/* ---- entry point lookup ---- */

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status);

static const struct {
        const char *name;
        void *fn;
} entry_points[] = {
#define ENTRY(name) {#name, (void *)name}
        ENTRY(cuInit),
        ENTRY(cuDriverGetVersion),
        ENTRY(cuGetProcAddress),
        ENTRY(cuGetErrorName),
        ENTRY(cuGetErrorString),
        ENTRY(cuDeviceGet),
        ENTRY(cuDeviceGetCount),
        ENTRY(cuDeviceGetUuid),
        ENTRY(cuDeviceTotalMem),
        ENTRY(cuDevicePrimaryCtxRetain),
        ENTRY(cuDevicePrimaryCtxRelease),
        ENTRY(cuCtxSetCurrent),
        ENTRY(cuCtxSynchronize),
        ENTRY(cuMemGetInfo),
        ENTRY(cuMemGetAllocationGranularity),
        ENTRY(cuMemCreate),
        ENTRY(cuMemRelease),
        ENTRY(cuMemExportToShareableHandle),
        ENTRY(cuMemImportFromShareableHandle),
        ENTRY(cuMemAddressReserve),
        ENTRY(cuMemAddressFree),
        ENTRY(cuMemMap),
        ENTRY(cuMemUnmap),
        ENTRY(cuMemSetAccess),
        ENTRY(cuStreamCreate),
        ENTRY(cuStreamDestroy),
        ENTRY(cuEventCreate),
        ENTRY(cuEventRecord),
        ENTRY(cuEventQuery),
        ENTRY(cuEventSynchronize),
        ENTRY(cuEventDestroy),
        ENTRY(cuMemAlloc),
        ENTRY(cuMemFree),
#undef ENTRY
};

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status) {
        if (!symbol || !pfn)
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < sizeof(entry_points) / sizeof(entry_points[0]); i++)
                if (strcmp(entry_points[i].name, symbol) == 0) {
                        *pfn = entry_points[i].fn;
                        if (status)
                                *status = CU_GET_PROC_ADDRESS_SUCCESS;
                        return CUDA_SUCCESS;
                }
        *pfn = NULL;
        if (status)
                *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
}
