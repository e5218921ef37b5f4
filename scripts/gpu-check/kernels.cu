// Kernels of the GPU check, compiled to PTX by scripts/gpu-check-bundle.sh
// (nvcc -ptx) and loaded by gpu_client through the driver (cuModuleLoadData),
// so the check machine needs no compiler. Patterns match gpu_client.c's
// host-side pattern().
extern "C" __global__ void gm_fill(unsigned *p, unsigned long long n, unsigned seed) {
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
             i += (unsigned long long)gridDim.x * blockDim.x)
                p[i] = seed ^ (unsigned)(i * 2654435761u);
}

extern "C" __global__ void gm_check(const unsigned *p, unsigned long long n, unsigned seed, unsigned *bad) {
        unsigned local = 0;
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
             i += (unsigned long long)gridDim.x * blockDim.x)
                local += p[i] != (seed ^ (unsigned)(i * 2654435761u));
        if (local)
                atomicAdd(bad, local);
}

// Spins for `ns` nanoseconds (globaltimer), then fills: work that is still
// running when the host goes on.
extern "C" __global__ void gm_spin_fill(unsigned *p, unsigned long long n, unsigned seed, unsigned long long ns) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        do {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        } while (now - start < ns);
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
             i += (unsigned long long)gridDim.x * blockDim.x)
                p[i] = seed ^ (unsigned)(i * 2654435761u);
}
