// gpumem_torch_malloc, PyTorch's alloc_fn as gpumem.torch.use() installs it,
// called through the std::function CUDAPluggableAllocator keeps: a refusal
// throws (a std::runtime_error, or c10::OutOfMemoryError when the library is
// built against PyTorch) whose message is "CUDA out of memory." and the
// diagnosis gpumem_torch_last_refusal() keeps; size 0 is NULL, no throw.
// Device 70 is outside the library's range, so no daemon is needed.
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>

#include "gpumem/torch.h"

static int failures;

static void expect(bool ok, const char *what) {
        if (!ok) {
                std::fprintf(stderr, "FAIL: %s\n", what);
                failures++;
        }
}

int main() {
        const std::function<void *(size_t, int, CUstream_st *)> alloc_fn = gpumem_torch_malloc;
        expect(gpumem_torch_oom_mode() != GPUMEM_TORCH_OOM_NULL, "built with its C++ entry point");
        expect(alloc_fn(0, 70, nullptr) == nullptr, "size 0 is NULL");
        bool thrown = false;
        try {
                alloc_fn(4096, 70, nullptr);
        } catch (const std::exception &e) {
                thrown = true;
                char why[512];
                gpumem_torch_last_refusal(0, why, sizeof(why), nullptr); /* out-of-range devices count as 0 */
                std::printf("%s\n", e.what());
                expect(std::strncmp(e.what(), "CUDA out of memory.", 19) == 0, "the message starts as PyTorch's");
                expect(std::strstr(e.what(), "cuda:70") != nullptr, "the message names the device");
                expect(std::strstr(e.what(), why) != nullptr, "the message holds the kept diagnosis");
        }
        expect(thrown, "a refusal throws");
        return failures ? 1 : 0;
}
