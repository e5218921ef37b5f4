/* gpumem-demo: a small workload for `make run`. A few client processes
 * allocate blocks of mixed sizes, write and verify them, free some, and print
 * what their sessions hold. Uses only the public API. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"

static int worker(const char *socket_path, int id, int rounds) {
        gpumem_client *c;
        int r = gpumem_connect(socket_path, &c);
        if (r < 0) {
                fprintf(stderr, "demo[%d]: connect: %s\n", id, gpumem_strerror(r));
                return 1;
        }
        enum { SLOTS = 32 };
        void *ptr[SLOTS] = {0};
        size_t size[SLOTS] = {0};
        unsigned seed = (unsigned) (id * 7919 + 1);
        for (int round = 0; round < rounds; round++) {
                int i = rand_r(&seed) % SLOTS;
                if (ptr[i]) {
                        for (size_t k = 0; k < size[i]; k += 4096)
                                if (((unsigned char *) ptr[i])[k] != (unsigned char) (i + id)) {
                                        fprintf(stderr, "demo[%d]: corrupted block!\n", id);
                                        return 1;
                                }
                        gpumem_free(c, ptr[i]);
                        ptr[i] = NULL;
                        continue;
                }
                size[i] = 512 + (size_t) (rand_r(&seed) % (8 << 20));
                r = gpumem_alloc(c, size[i], 0, &ptr[i]);
                if (r < 0) {
                        fprintf(stderr, "demo[%d]: alloc %zu: %s\n", id, size[i], gpumem_last_error(c));
                        ptr[i] = NULL;
                        continue;
                }
                memset(ptr[i], i + id, size[i]);
        }
        int64_t allocated = 0, reserved = 0;
        gpumem_stat(c, "allocated_bytes.all.current", &allocated);
        gpumem_stat(c, "reserved_bytes.all.current", &reserved);
        printf("demo[%d] pid %d: %d operations; holds %" PRId64 " bytes allocated, %" PRId64 " reserved\n", id,
               (int) getpid(), rounds, allocated, reserved);
        fflush(stdout);
        for (int i = 0; i < SLOTS; i++)
                if (ptr[i])
                        gpumem_free(c, ptr[i]);
        gpumem_disconnect(c);
        return 0;
}

int main(int argc, char **argv) {
        const char *socket_path = argc > 1 ? argv[1] : NULL;
        int procs = argc > 2 ? atoi(argv[2]) : 3;
        int rounds = argc > 3 ? atoi(argv[3]) : 2000;
        int failed = 0;
        for (int p = 0; p < procs; p++)
                if (fork() == 0)
                        _exit(worker(socket_path, p, rounds));
        for (int p = 0; p < procs; p++) {
                int status;
                if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                        failed++;
        }
        printf("demo: %d client processes done, %d failed\n", procs, failed);
        return failed ? 1 : 0;
}
