/* gm-diag-workload: client processes that produce each case of `gpumemctl
 * diagnose` (docs/diagnosis.md), for tests/integration/test_diagnose.c.
 *
 *   gm-diag-workload SOCKET leak BYTES STEP_MS N  allocate N blocks of BYTES, STEP_MS apart, and keep
 *                                                 them all (a growing live list; frames train.py:42
 *                                                 keep_activations), each beside a freed one of BYTES/2
 *                                                 (train.py:57 scratch); print "ready"
 *   gm-diag-workload SOCKET frag                  the 16 MiB / 32 MiB pattern: one 256 MiB segment cut
 *                                                 into 16 MiB blocks, every other one freed, then 32 MiB
 *                                                 requests (one fits a new segment, the next is refused
 *                                                 on a 300 MiB device); print "ready refused=R"
 *   gm-diag-workload SOCKET pending BYTES         a central session (raw protocol) whose block of BYTES
 *                                                 is freed while work on another stream is pending
 *                                                 (Free deferred, FreeCompleted at the end); "ready"
 *   gm-diag-workload SOCKET stream-free BYTES     (cuda backend) a block of BYTES freed with gpumem_free_async
 *                                                 on another stream whose work is pending (the emulated
 *                                                 driver's FAKECUDA_HOLD_EVENTS); "ready"
 * Then each waits for stdin to close, frees everything and exits 0 (1 on failure). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef GPUMEM_HAVE_CUDA
#include "cuda_loader.h"
#endif
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

static void wait_stdin_closed(void) {
        char buf[64];
        while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
        }
}

static void ready(const char *extra) {
        printf("ready%s\n", extra);
        fflush(stdout);
}

static int leak(gpumem_client *c, uint64_t bytes, unsigned step_ms, unsigned n) {
        /* The kept blocks come from one stack, the freed ones from another. */
        static const gpumem_frame keeper[] = {{"train.py", 42, "keep_activations"}, {"train.py", 90, "step"}};
        static const gpumem_frame scratch[] = {{"train.py", 57, "scratch"}};
        void **kept = calloc(n, sizeof(*kept));
        for (unsigned i = 0; kept && i < n; i++) {
                void *tmp;
                if (gpumem_alloc_frames(c, bytes, 0, keeper, 2, &kept[i]) < 0 ||
                    gpumem_alloc_frames(c, bytes / 2, 0, scratch, 1, &tmp) < 0) {
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                gpumem_free(c, tmp);
                usleep(step_ms * 1000u);
        }
        ready("");
        wait_stdin_closed();
        for (unsigned i = 0; kept && i < n; i++)
                gpumem_free(c, kept[i]);
        free(kept);
        return kept ? 0 : 1;
}

static int frag(gpumem_client *c) {
        void *big, *blocks[16], *wide[2] = {NULL, NULL};
        if (gpumem_alloc(c, 256 * MiB, 0, &big) < 0 || gpumem_free(c, big) < 0)
                return fprintf(stderr, "256 MiB: %s\n", gpumem_last_error(c)), 1;
        for (int i = 0; i < 16; i++)
                if (gpumem_alloc(c, 16 * MiB, 0, &blocks[i]) < 0)
                        return fprintf(stderr, "16 MiB: %s\n", gpumem_last_error(c)), 1;
        for (int i = 0; i < 16; i += 2)
                gpumem_free(c, blocks[i]); /* free 16 MiB holes between live neighbours */
        int refused = 0;
        for (int i = 0; i < 2; i++)
                if (gpumem_alloc(c, 32 * MiB, 0, &wide[i]) < 0) {
                        wide[i] = NULL;
                        refused++;
                }
        char extra[32];
        snprintf(extra, sizeof(extra), " refused=%d", refused);
        ready(extra);
        wait_stdin_closed();
        for (int i = 1; i < 16; i += 2)
                gpumem_free(c, blocks[i]);
        for (int i = 0; i < 2; i++)
                if (wide[i])
                        gpumem_free(c, wide[i]);
        return 0;
}

/* One request and its reply on a raw connection (NULL: none came). */
static Gpumem__Envelope *raw_call(int fd, Gpumem__Envelope *env) {
        static uint8_t buf[GM_IPC_MAX_PACKET_DEFAULT];
        if (gm_msg_send(fd, env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT) < 0)
                return NULL;
        for (;;) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len, n_fds;
                Gpumem__Envelope *reply = NULL;
                if (gm_ipc_recv(fd, buf, sizeof(buf), fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds) < 0)
                        return NULL;
                gm_close_fds(fds, n_fds);
                if (gm_msg_unpack(buf, len, &reply) < 0)
                        return NULL;
                if (reply->request_id == env->request_id)
                        return reply;
                gm_msg_free(reply);
        }
}

static int pending(const char *socket_path, uint64_t bytes) {
        int fd;
        if (gm_ipc_connect(socket_path, &fd) < 0)
                return fprintf(stderr, "connect failed\n"), 1;
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = "pending-free";
        hello.heap_mode = GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL;
        Gpumem__Envelope he = GPUMEM__ENVELOPE__INIT;
        he.request_id = 1;
        he.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        he.hello = &hello;
        Gpumem__Envelope *reply = raw_call(fd, &he);
        if (!reply || reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY)
                return fprintf(stderr, "hello refused\n"), 1;
        gm_msg_free(reply);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = bytes;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        reply = raw_call(fd, &env);
        if (!reply || reply->body_case != GPUMEM__ENVELOPE__BODY_ALLOC_REPLY)
                return fprintf(stderr, "raw alloc refused\n"), 1;
        uint64_t block = reply->alloc_reply->block_id;
        gm_msg_free(reply);
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = block;
        f.deferred = true; /* stream work on it is pending */
        Gpumem__Envelope fe = GPUMEM__ENVELOPE__INIT;
        fe.request_id = 3;
        fe.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        fe.free = &f;
        if (gm_msg_send(fd, &fe, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT) < 0)
                return fprintf(stderr, "raw free failed\n"), 1;
        ready("");
        wait_stdin_closed();
        Gpumem__FreeCompleted fc = GPUMEM__FREE_COMPLETED__INIT;
        fc.block_id = block;
        Gpumem__Envelope ce = GPUMEM__ENVELOPE__INIT;
        ce.request_id = 4;
        ce.body_case = GPUMEM__ENVELOPE__BODY_FREE_COMPLETED;
        ce.free_completed = &fc;
        int r = gm_msg_send(fd, &ce, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT);
        close(fd);
        return r < 0;
}

#ifdef GPUMEM_HAVE_CUDA
static int stream_free(gpumem_client *c, uint64_t bytes) {
        const gm_cuda_t *cu;
        CUcontext ctx;
        CUstream stream;
        void *p;
        if (gm_cuda_load(&cu) < 0 || cu->DevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
            cu->CtxPushCurrent(ctx) != CUDA_SUCCESS || !cu->StreamCreate ||
            cu->StreamCreate(&stream, 0) != CUDA_SUCCESS)
                return fprintf(stderr, "no stream\n"), 1;
        if (gpumem_alloc(c, bytes, 0, &p) < 0 || gpumem_free_async(c, p, (uint64_t) (uintptr_t) stream) < 0)
                return fprintf(stderr, "alloc/free: %s\n", gpumem_last_error(c)), 1;
        ready("");
        wait_stdin_closed();
        int64_t active = -1;
        for (int i = 0; i < 500 && active != 0; i++) { /* the stream's work is done: the free completes */
                gpumem_stat(c, "active_bytes.all.current", &active);
                usleep(10000);
        }
        if (cu->StreamDestroy)
                cu->StreamDestroy(stream);
        cu->CtxPopCurrent(&ctx);
        cu->DevicePrimaryCtxRelease(0);
        return active == 0 ? 0 : 1;
}
#endif

int main(int argc, char **argv) {
        if (argc < 3) {
                fprintf(stderr, "usage: gm-diag-workload SOCKET leak|frag|pending ARGS\n");
                return 2;
        }
        const char *cmd = argv[2];
        if (strcmp(cmd, "pending") == 0 && argc == 4)
                return pending(argv[1], strtoull(argv[3], NULL, 10));
        gpumem_client *c;
        int r = gpumem_connect(argv[1], &c);
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", gpumem_strerror(r));
                return 1;
        }
        int status = 2;
        if (strcmp(cmd, "leak") == 0 && argc == 6)
                status = leak(c, strtoull(argv[3], NULL, 10), (unsigned) atoi(argv[4]), (unsigned) atoi(argv[5]));
        else if (strcmp(cmd, "frag") == 0)
                status = frag(c);
#ifdef GPUMEM_HAVE_CUDA
        else if (strcmp(cmd, "stream-free") == 0 && argc == 4)
                status = stream_free(c, strtoull(argv[3], NULL, 10));
#endif
        gpumem_disconnect(c);
        return status;
}
