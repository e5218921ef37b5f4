// gpu_client: the GPU side of scripts/gpu-check.sh, on a real device.
//
//   gpu_client check SOCKET DEVICE SEED DIR   allocate blocks through gpumemd, fill them
//        with a kernel, meet the peer client (DIR/ready-SEED), hold (DIR/held-SEED holds
//        the bytes requested) until DIR/go exists, verify with a kernel, free; exit 0 when
//        every check held.
//   gpu_client bench SOCKET DEVICE             print a table of median times (us) per size:
//        create+export+import+map of a segment (driver calls), a cached alloc+free through
//        the daemon, and cuMemAlloc+cuMemFree.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpumem/gpumem.h"

#define CK_CUDA(call)                                                                        \
        do {                                                                                 \
                cudaError_t e_ = (call);                                                     \
                if (e_ != cudaSuccess) {                                                     \
                        fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));          \
                        exit(2);                                                             \
                }                                                                            \
        } while (0)
#define CK_CU(call)                                                                          \
        do {                                                                                 \
                CUresult r_ = (call);                                                        \
                if (r_ != CUDA_SUCCESS) {                                                    \
                        const char *n_ = "?";                                                \
                        cuGetErrorName(r_, &n_);                                             \
                        fprintf(stderr, "%s: %s\n", #call, n_);                              \
                        exit(2);                                                             \
                }                                                                            \
        } while (0)
#define CK_GM(call)                                                                          \
        do {                                                                                 \
                int r_ = (call);                                                             \
                if (r_ < 0) {                                                                \
                        fprintf(stderr, "%s: %s (%s)\n", #call, gpumem_strerror(r_),         \
                                gpumem_last_error(c));                                       \
                        exit(2);                                                             \
                }                                                                            \
        } while (0)

__device__ unsigned char pattern(unsigned seed, size_t i) {
        return (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

__global__ void fill(unsigned char *p, size_t n, unsigned seed) {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
                p[i] = pattern(seed, i);
}

__global__ void verify(const unsigned char *p, size_t n, unsigned seed, unsigned long long *bad) {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
                if (p[i] != pattern(seed, i))
                        atomicAdd(bad, 1ull);
}

static bool wait_for(const std::string &path, int seconds) {
        for (int i = 0; i < seconds * 100; i++) {
                if (access(path.c_str(), F_OK) == 0)
                        return true;
                usleep(10000);
        }
        return false;
}

static void touch(const std::string &path, const std::string &content) {
        FILE *f = fopen(path.c_str(), "w");
        if (!f || fputs(content.c_str(), f) < 0 || fclose(f) != 0) {
                perror(path.c_str());
                exit(2);
        }
}

static int check(const char *socket, unsigned seed, const std::string &dir) {
        // Odd sizes on purpose: small pool, large pool, a split remainder.
        const size_t sizes[] = {512, 4097, 1 << 20, 2 << 20, (3 << 20) + 123, 16 << 20, 64 << 20, 200 << 20};
        const size_t n = sizeof(sizes) / sizeof(sizes[0]);
        int failures = 0;

        gpumem_client *c = nullptr;
        CK_GM(gpumem_connect(socket, &c));
        std::vector<unsigned char *> ptrs(n);
        size_t requested = 0, rounded = 0;
        for (size_t i = 0; i < n; i++) {
                void *p;
                CK_GM(gpumem_alloc(c, sizes[i], 0, &p));
                ptrs[i] = static_cast<unsigned char *>(p);
                requested += sizes[i];
                rounded += (sizes[i] + 511) / 512 * 512;
        }
        for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++)
                        if (i != j && ptrs[i] < ptrs[j] + sizes[j] && ptrs[j] < ptrs[i] + sizes[i]) {
                                fprintf(stderr, "client %u: blocks %zu and %zu overlap\n", seed, i, j);
                                failures++;
                        }
        int64_t allocated = -1;
        CK_GM(gpumem_stat(c, "allocated_bytes.all.current", &allocated));
        if (allocated != (int64_t)rounded) {
                fprintf(stderr, "client %u: allocated_bytes.all.current %lld, expected %zu\n", seed,
                        (long long)allocated, rounded);
                failures++;
        }

        for (size_t i = 0; i < n; i++)
                fill<<<256, 256>>>(ptrs[i], sizes[i], seed + (unsigned)i);
        CK_CUDA(cudaGetLastError());
        CK_CUDA(cudaDeviceSynchronize());

        // Both clients have written their blocks before either verifies: shared
        // physical memory would show up as the other's pattern.
        touch(dir + "/ready-" + std::to_string(seed), "");
        touch(dir + "/held-" + std::to_string(seed), std::to_string(rounded) + "\n");
        if (!wait_for(dir + "/go", 120)) {
                fprintf(stderr, "client %u: no go from the script\n", seed);
                return 1;
        }

        unsigned long long *bad;
        CK_CUDA(cudaMalloc(&bad, sizeof(*bad)));
        for (size_t i = 0; i < n; i++) {
                unsigned long long h = 0;
                CK_CUDA(cudaMemset(bad, 0, sizeof(*bad)));
                verify<<<256, 256>>>(ptrs[i], sizes[i], seed + (unsigned)i, bad);
                CK_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
                if (h) {
                        fprintf(stderr, "client %u: block %zu (%zu bytes): %llu bytes differ\n", seed, i, sizes[i], h);
                        failures++;
                }
        }
        CK_CUDA(cudaFree(bad));

        for (size_t i = 0; i < n; i++)
                CK_GM(gpumem_free(c, ptrs[i]));
        CK_GM(gpumem_stat(c, "allocated_bytes.all.current", &allocated));
        if (allocated != 0) {
                fprintf(stderr, "client %u: %lld bytes still allocated after freeing\n", seed, (long long)allocated);
                failures++;
        }
        if (gpumem_free(c, ptrs[0]) != -EINVAL) {
                fprintf(stderr, "client %u: a double free was not refused\n", seed);
                failures++;
        }
        gpumem_disconnect(c);
        printf("client %u: %zu blocks, %zu bytes, %d failures\n", seed, n, requested, failures);
        return failures ? 1 : 0;
}

static double now_us() {
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
}

static int bench(const char *socket, int device) {
        const size_t sizes[] = {2 << 20, 32 << 20, 256 << 20};
        CUdevice dev;
        CK_CU(cuDeviceGet(&dev, device));
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        size_t gran = 0;
        CK_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUmemAccessDesc access = {};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

        gpumem_client *c = nullptr;
        CK_GM(gpumem_connect(socket, &c));
        printf("%-10s %28s %28s %24s\n", "size", "create+export+import+map", "cached alloc+free (daemon)",
               "cuMemAlloc+cuMemFree");
        for (size_t size : sizes) {
                size_t seg = (size + gran - 1) / gran * gran;
                std::vector<double> vmm, cached, classic;
                for (int i = 0; i < 30; i++) {
                        CUmemGenericAllocationHandle h, imported;
                        CUdeviceptr va;
                        int fd = -1;
                        double t0 = now_us();
                        CK_CU(cuMemCreate(&h, seg, &prop, 0));
                        CK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
                        CK_CU(cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
                                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
                        close(fd);
                        CK_CU(cuMemAddressReserve(&va, seg, gran, 0, 0));
                        CK_CU(cuMemMap(va, seg, 0, imported, 0));
                        CK_CU(cuMemSetAccess(va, seg, &access, 1));
                        vmm.push_back(now_us() - t0);
                        CK_CU(cuMemUnmap(va, seg));
                        CK_CU(cuMemAddressFree(va, seg));
                        CK_CU(cuMemRelease(imported));
                        CK_CU(cuMemRelease(h));
                }
                void *warm;
                CK_GM(gpumem_alloc(c, size, 0, &warm)); // the segment stays cached after the free
                CK_GM(gpumem_free(c, warm));
                for (int i = 0; i < 200; i++) {
                        void *p;
                        double t0 = now_us();
                        CK_GM(gpumem_alloc(c, size, 0, &p));
                        CK_GM(gpumem_free(c, p));
                        cached.push_back(now_us() - t0);
                }
                for (int i = 0; i < 200; i++) {
                        CUdeviceptr p;
                        double t0 = now_us();
                        CK_CU(cuMemAlloc(&p, size));
                        CK_CU(cuMemFree(p));
                        classic.push_back(now_us() - t0);
                }
                printf("%-10s %25.1f us %25.1f us %21.1f us\n", (std::to_string(size >> 20) + " MiB").c_str(),
                       median(vmm), median(cached), median(classic));
        }
        gpumem_disconnect(c);
        return 0;
}

int main(int argc, char **argv) {
        if (argc < 4 || (strcmp(argv[1], "check") == 0 && argc != 6)) {
                fprintf(stderr, "usage: %s check SOCKET DEVICE SEED DIR | bench SOCKET DEVICE\n", argv[0]);
                return 2;
        }
        int device = atoi(argv[3]);
        CK_CUDA(cudaSetDevice(device));
        CK_CUDA(cudaFree(nullptr)); // the primary context, which libgpumem maps into
        if (strcmp(argv[1], "check") == 0)
                return check(argv[2], (unsigned)atoi(argv[4]), argv[5]);
        if (strcmp(argv[1], "bench") == 0)
                return bench(argv[2], device);
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
}
