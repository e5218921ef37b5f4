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
                fprintf(stderr, "demo[%d]: %s\n", id, gpumem_last_error(NULL));
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

static void usage(FILE *f) {
        fprintf(f, "Usage: gpumem-demo [SOCKET [PROCESSES [ROUNDS]]]\n"
                   "Runs PROCESSES client processes (default 3, at most 64) that allocate, write, verify and free\n"
                   "blocks of mixed sizes for ROUNDS operations each (default 2000) through the gpumemd at SOCKET\n"
                   "(default: $GPUMEM_SOCKET, else GPU 0's default socket; \"\" is the default too).\n");
}

/* A whole number in [1, max] for argument `what`; -1 (printed) otherwise. */
static int count_arg(const char *what, const char *text, int max) {
        char *end;
        long v = strtol(text, &end, 10);
        if (!*text || *end || v < 1 || v > max) {
                fprintf(stderr, "gpumem-demo: %s: expected a whole number from 1 to %d, not '%s'\n", what, max, text);
                return -1;
        }
        return (int) v;
}

int main(int argc, char **argv) {
        if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
                usage(stdout);
                return 0;
        }
        if (argc > 4 || (argc > 1 && argv[1][0] == '-')) {
                usage(stderr);
                return 2;
        }
        const char *socket_path = argc > 1 && argv[1][0] ? argv[1] : NULL;
        int procs = argc > 2 ? count_arg("PROCESSES", argv[2], 64) : 3;
        int rounds = argc > 3 ? count_arg("ROUNDS", argv[3], 100000000) : 2000;
        if (procs < 0 || rounds < 0)
                return 2;
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
