/* The cuda backend end to end over the emulated driver: a real gpumemd on
 * --backend cuda, this process as its client (libgpumem), and the emulator's
 * device pool shared by both, so what a GPU would show shows here: memory the
 * client still maps, releases acknowledged too early, ranges unmapped wrongly.
 * Every test ends with the client holding no driver object after its
 * disconnect and, once the daemon is gone, nothing in use on the device. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "cuda_loader.h"
#include "fakecuda_check.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

static gm_test_daemon_t daemon_;
static char pool_path[64];

static void setup(void) {
        gm_fake_new_pool(pool_path, sizeof(pool_path));
        setenv("FAKECUDA_CONTEXT_BYTES", "0", 1); /* device figures: memory alone */
}

/* Starts gpumemd with `name`=`value` in its environment only. */
static void start_daemon(const char *capacity, const char *const *args, const char *name, const char *value) {
        if (name)
                setenv(name, value, 1);
        gm_test_daemon_start(&daemon_, capacity, args);
        if (name)
                unsetenv(name);
}

static gpumem_client *connect_ok(void) {
        gpumem_client *c = NULL;
        int r = gpumem_connect(daemon_.socket_path, &c);
        ck_assert_msg(r == 0, "gpumem_connect: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        return c;
}

/* Disconnects, stops the daemon and asserts that nothing is left. */
static void finish(gpumem_client *c) {
        gpumem_disconnect(c);
        gm_fake_assert_no_objects();
        gm_test_daemon_stop(&daemon_);
        ck_assert_msg(gm_fake_device_bytes(0) == 0, "%llu bytes still in use on the device",
                      (unsigned long long) gm_fake_device_bytes(0));
        unlink(pool_path);
}

static fakecuda_usage_t usage(void) {
        fakecuda_usage_t u;
        ck_assert(gm_fake_usage(&u));
        return u;
}

/* Defect 1: one release of more than 512 pages (two ReleaseRequest
 * batches) leaves nothing mapped and the device's memory comes back. */
START_TEST(test_release_of_many_pages) {
        static const char *const args[] = {"--alloc-conf", "expandable_segments:True", NULL};
        setenv("FAKECUDA_CAPACITY", "16G", 1); /* the device, fixed by the daemon's pool */
        start_daemon("16G", args, NULL, NULL);
        gpumem_client *c = connect_ok();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 12000 * MiB, 0, &p), 0); /* 600 pages of 20 MiB */
        ck_assert_int_eq(usage().mappings, 600);
        gm_test_fill(p, MiB, 1);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_eq(released, 12000 * MiB);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        fakecuda_usage_t u = usage();
        ck_assert_msg(u.mappings == 0 && u.reservations == 0, "%ld pages, %ld ranges still mapped", u.mappings,
                      u.reservations);
        for (int i = 0; i < 500 && gm_fake_device_bytes(0) != 0; i++)
                usleep(10000);
        ck_assert_uint_eq(gm_fake_device_bytes(0), 0); /* the daemon released every handle, nothing maps */
        finish(c);
}
END_TEST

static gpumem_client *connect_heap(gpumem_heap_mode heap) {
        gpumem_client *c = NULL;
        int r = gpumem_connect_heap(daemon_.socket_path, heap, &c);
        ck_assert_msg(r == 0, "gpumem_connect_heap: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        ck_assert_int_eq(gpumem_heap(c), heap);
        return c;
}

/* The libgpumem session's field `name` in `gpumemctl clients --json`. */
static long long client_field(const char *name) {
        char out[8192], key[64];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        const char *at = strstr(out, "\"name\": \"libgpumem");
        ck_assert_ptr_nonnull(at);
        snprintf(key, sizeof(key), "\"%s\": ", name);
        at = strstr(at, key);
        ck_assert_msg(at != NULL, "no %s: %s", name, out);
        return strtoll(at + strlen(key), NULL, 10);
}

/* Defect 4: an unmap the driver refuses is not acknowledged as done: the
 * daemon keeps the memory (and its handle) until the session ends, and the
 * client's data stays intact. A central session's trim: the daemon asks for
 * both segments and keeps the refused one charged as releasing. */
START_TEST(test_failed_unmap_keeps_memory_central) {
        start_daemon("256M", NULL, NULL, NULL);
        setenv("FAKECUDA_FAIL_UNMAP_AT", "1", 1); /* this process's first cuMemUnmap fails */
        gpumem_client *c = connect_heap(GPUMEM_HEAP_CENTRAL);
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_alloc(c, 30 * MiB, 0, &q), 0);
        gm_test_fill(p, 12 * MiB, 4);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gpumem_free(c, q), 0);
        uint64_t released;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        /* One of the two segments stays mapped here, and the daemon keeps it
         * charged, as releasing, instead of giving it back to the driver. */
        fakecuda_usage_t u = usage();
        ck_assert_int_eq(u.mappings, 1);
        long long releasing = 0;
        for (int i = 0; i < 500 && releasing == 0; i++) {
                releasing = client_field("releasing_bytes");
                if (releasing == 0)
                        usleep(10000);
        }
        ck_assert_msg(releasing == 12 * (long long) MiB || releasing == 30 * (long long) MiB, "releasing %lld",
                      releasing);
        ck_assert_uint_eq(gm_fake_device_bytes(0), (uint64_t) releasing); /* the driver did not get it back */
        finish(c); /* the disconnect unmaps it; the session's end releases it */
}
END_TEST

/* The same in a local session: its heap gives both segments back, the one
 * whose unmap failed is not returned: it stays mapped here and granted (in
 * the session's reserved bytes and its tenant's charge), the driver never
 * gets it back under the mapping, and trim does not count it as released. */
START_TEST(test_failed_unmap_keeps_memory_local) {
        start_daemon("256M", NULL, NULL, NULL);
        setenv("FAKECUDA_FAIL_UNMAP_AT", "1", 1);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_alloc(c, 30 * MiB, 0, &q), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gpumem_free(c, q), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_msg(released == 12 * MiB || released == 30 * MiB, "released %llu", (unsigned long long) released);
        uint64_t kept = 42 * MiB - released;
        ck_assert_int_eq(usage().mappings, 1);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", (int64_t) kept),
                         (int64_t) kept);
        ck_assert_int_eq(client_field("reserved_bytes"), (long long) kept);
        for (int i = 0; i < 500 && gm_fake_device_bytes(0) != kept; i++)
                usleep(10000);
        ck_assert_uint_eq(gm_fake_device_bytes(0), kept); /* the returned one went back, the kept one did not */
        /* A second trim finds nothing more to give. */
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_eq(released, 0);
        ck_assert_int_eq(usage().mappings, 1);
        finish(c); /* the disconnect unmaps it; the session's end releases it */
}
END_TEST

/* Defect 5: disconnecting unmaps every mapped page on its own, holes in the
 * expandable range included. */
START_TEST(test_disconnect_with_holes) {
        static const char *const args[] = {"--alloc-conf", "expandable_segments:True", NULL};
        start_daemon("256M", args, NULL, NULL);
        gpumem_client *c = connect_ok();
        void *a, *b, *d;
        ck_assert_int_eq(gpumem_alloc(c, 40 * MiB, 0, &a), 0); /* pages 0-1 */
        ck_assert_int_eq(gpumem_alloc(c, 20 * MiB, 0, &b), 0); /* page 2 */
        ck_assert_int_eq(gpumem_alloc(c, 20 * MiB, 0, &d), 0); /* page 3 */
        ck_assert_int_eq(gpumem_free(c, b), 0);
        uint64_t released;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_eq(released, 20 * MiB); /* a hole between a's pages and d's */
        ck_assert_int_eq(usage().mappings, 3);
        gm_test_fill(a, 40 * MiB, 1);
        gm_test_fill(d, 20 * MiB, 2);
        finish(c); /* a, d still allocated: the disconnect unmaps them */
}
END_TEST

typedef struct free_job {
        gpumem_client *c;
        void *ptr;
        int result;
} free_job_t;

static void *free_thread(void *arg) {
        free_job_t *job = arg;
        job->result = gpumem_free(job->c, job->ptr);
        return NULL;
}

/* Synchronizing calls of this process wait while the file `hold` names (in
 * the daemon's directory) exists (fakecuda's syncs_held counts them). */
static void hold_syncs(char *hold, size_t len) {
        snprintf(hold, len, "%s/hold-sync", daemon_.dir);
        int fd = open(hold, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        setenv("FAKECUDA_HOLD_SYNC", hold, 1); /* stream work "takes" until the file goes */
}

/* Defect 11: while a release waits for a segment's stream, other threads'
 * calls that need no reply do not wait behind it. */
START_TEST(test_release_waits_outside_the_lock) {
        start_daemon("256M", NULL, NULL, NULL);
        char hold[400];
        hold_syncs(hold, sizeof(hold));
        gpumem_client *c = connect_ok();
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_alloc(c, 1 * MiB, 0, &q), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        /* An admin trim: the daemon asks this client for p's segment. */
        char out[4096];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "trim", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        usleep(100000); /* the service thread is in cuStreamSynchronize now */
        free_job_t job = {.c = c, .ptr = q, .result = 1};
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, free_thread, &job), 0);
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 10;
        int joined = pthread_timedjoin_np(t, NULL, &deadline);
        unlink(hold);
        if (joined != 0)
                pthread_join(t, NULL);
        ck_assert_msg(joined == 0, "gpumem_free waited for the release's stream synchronization");
        ck_assert_int_eq(job.result, 0);
        /* A local heap waits for the device before it takes its lock, so q's
         * free lands first and its segment is idle cache too by then; a
         * central release named p's segment alone. */
        int64_t left = gpumem_heap(c) == GPUMEM_HEAP_LOCAL ? 0 : 2 * (int64_t) MiB;
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", left), left);
        unsetenv("FAKECUDA_HOLD_SYNC");
        finish(c);
}
END_TEST

/* Events are not complete while the file `hold` names (in the daemon's
 * directory) exists. */
static void hold_events(char *hold, size_t len) {
        snprintf(hold, len, "%s/hold-events", daemon_.dir);
        int fd = open(hold, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        setenv("FAKECUDA_HOLD_EVENTS", hold, 1);
}

/* Waits until the session's blocks are all freed (deferred frees done). */
static void wait_no_active_bytes(gpumem_client *c) {
        int64_t v = -1;
        for (int i = 0; i < 500 && v != 0; i++) {
                ck_assert_int_eq(gpumem_stat(c, "active_bytes.all.current", &v), 0);
                usleep(10000);
        }
        ck_assert_int_eq(v, 0);
}

/* Defect 11: pending stream events are polled with a backoff, not every
 * millisecond. */
START_TEST(test_pending_events_back_off) {
        start_daemon("256M", NULL, NULL, NULL);
        char hold[400];
        hold_events(hold, sizeof(hold));
        gpumem_client *c = connect_ok();
        const gm_cuda_t *cu;
        CUcontext ctx;
        CUstream stream;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        ck_assert_int_eq(cu->DevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->CtxPushCurrent(ctx), CUDA_SUCCESS);
        ck_assert_int_eq(cu->StreamCreate(&stream, 0), CUDA_SUCCESS);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free_async(c, p, (uint64_t) (uintptr_t) stream), 0); /* another stream: an event */
        long before = usage().event_queries;
        usleep(1000000);
        long polls = usage().event_queries - before;
        ck_assert_msg(polls > 0 && polls < 100, "%ld event queries in a second", polls);
        unlink(hold);
        wait_no_active_bytes(c);
        unsetenv("FAKECUDA_HOLD_EVENTS");
        ck_assert_int_eq(cu->StreamDestroy(stream), CUDA_SUCCESS);
        ck_assert_int_eq(cu->CtxPopCurrent(&ctx), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRelease(0), CUDA_SUCCESS);
        finish(c);
}
END_TEST

/* Maps a segment's fd (consumed) through the driver itself, as a client that
 * keeps what it acknowledges would; the range's base. */
static CUdeviceptr driver_map(int seg_fd, uint64_t va_size, uint64_t length) {
        const gm_cuda_t *cu;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        CUdeviceptr base;
        ck_assert_int_eq(cu->MemAddressReserve(&base, va_size, 0, 0, 0), CUDA_SUCCESS);
        CUmemGenericAllocationHandle handle;
        ck_assert_int_eq(cu->MemImportFromShareableHandle(&handle, (void *) (uintptr_t) seg_fd,
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                         CUDA_SUCCESS);
        close(seg_fd);
        ck_assert_int_eq(cu->MemMap(base, length, 0, handle, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemRelease(handle), CUDA_SUCCESS); /* the mapping alone holds it now */
        return base;
}

static void driver_unmap(CUdeviceptr base, uint64_t va_size, uint64_t length) {
        const gm_cuda_t *cu;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        ck_assert_int_eq(cu->MemUnmap(base, length), CUDA_SUCCESS);
        ck_assert_int_eq(cu->MemAddressFree(base, va_size), CUDA_SUCCESS);
}

/* Polls a tenant's charge until it is `want` or ~10 s pass; the last figure. */
static uint64_t wait_charged(const char *tenant, uint64_t want) {
        uint64_t charged = gm_test_tenant_charged(daemon_.socket_path, tenant);
        for (int i = 0; i < 500 && charged != want; i++) {
                usleep(20000);
                charged = gm_test_tenant_charged(daemon_.socket_path, tenant);
        }
        return charged;
}

/* A raw central session's allocation of `size`, mapped through the driver. */
typedef struct raw_segment {
        uint64_t block, va_size, length;
        CUdeviceptr base;
} raw_segment_t;

static raw_segment_t raw_alloc_mapped(int fd, uint64_t request_id, uint64_t size) {
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = size;
        gm_test_raw_send_body(fd, request_id, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        int seg_fd;
        Gpumem__Envelope *e;
        while ((e = gm_test_raw_recv_fd(fd, &seg_fd)) && e->request_id != request_id) { /* earlier replies */
                if (seg_fd >= 0)
                        close(seg_fd);
                gm_msg_free(e);
        }
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_int_ge(seg_fd, 0);
        raw_segment_t seg = {
                .block = e->alloc_reply->block_id,
                .va_size = e->alloc_reply->new_mappings[0]->segment_va_size,
                .length = e->alloc_reply->new_mappings[0]->length,
        };
        gm_msg_free(e);
        seg.base = driver_map(seg_fd, seg.va_size, seg.length);
        return seg;
}

/* A raw local session granted one segment of `size`, which it maps through
 * the driver (*ret_base) and returns all the same, with a ReturnIntent first
 * (noted while the piece is mapped, as it stays) when `announced`; its
 * connection. */
static int raw_local_return_mapped(uint64_t size, bool announced, CUdeviceptr *ret_base) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello_local(fd);
        int seg_fd;
        Gpumem__Envelope *e = gm_test_raw_grant(fd, 2, 1, size, &seg_fd);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        gm_msg_free(e);
        *ret_base = driver_map(seg_fd, size, size);
        for (uint64_t id = 3; announced && id < 5; id++) {
                e = gm_test_raw_return_intent(fd, id); /* Ok, then refused: one is open */
                ck_assert_int_eq(e->body_case, id == 3 ? GPUMEM__ENVELOPE__BODY_OK : GPUMEM__ENVELOPE__BODY_ERROR);
                ck_assert_int_eq(id == 3 ? 0 : e->error->code, id == 3 ? 0 : EBUSY);
                gm_msg_free(e);
        }
        gm_test_raw_return_closing(fd, 5, 1, size, announced); /* "unmapped", and it is not */
        return fd;
}

/* Issue #17 item 1 on cuda: nobody can see who maps an exported handle, but
 * NVML gives each process's device memory. A client that acknowledges a
 * release while it keeps the mapping (a raw client mapping through the
 * driver itself) is caught by its process's figure: the session is closed
 * and the memory stays charged while that process holds device memory. An
 * honest release first shows the daemon that this driver counts mappings. */
START_TEST(test_lying_release_ack_caught_by_nvml) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_CENTRAL);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0); /* honest: its figure drops */
        ck_assert_uint_gt(released, 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);

        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        raw_segment_t seg = raw_alloc_mapped(fd, 2, MiB);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), seg.length);

        gm_test_raw_lying_release(fd, seg.block); /* and closed */
        close(fd);

        /* Session gone, memory not: still charged, and still on the device. */
        usleep(500000);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), seg.length);
        ck_assert_uint_ge(gm_fake_device_bytes(0), seg.length);
        driver_unmap(seg.base, seg.va_size, seg.length);
        ck_assert_uint_eq(wait_charged("uid:0", 0), 0);
        finish(connect_ok());
}
END_TEST

/* ---- issue #17: where nothing can check a release, its charge stays ---- */

/* The daemon's environment for "nothing can check": no NVML at all, or NVML
 * whose process list gives no per-process figure. */
static const char *const unchecked_env[][2] = {
        {"GPUMEM_LIBNVML", "/nonexistent/libnvidia-ml.so.1"},
        {"FAKENVML_NO_PROCESS_MEMORY", "1"},
};

/* The libgpumem session's released-but-unverified bytes, once they show. */
static long long wait_unverified(void) {
        long long unverified = client_field("release_unverified_bytes");
        for (int i = 0; i < 500 && unverified == 0; i++) {
                usleep(10000);
                unverified = client_field("release_unverified_bytes");
        }
        return unverified;
}

/* An honest client's release stays charged (and its memory held by the
 * daemon) until its session ends; then the charge goes to 0. */
static void check_unchecked_release(gpumem_heap_mode heap) {
        size_t n = sizeof(unchecked_env) / sizeof(unchecked_env[0]);
        for (size_t k = 0; k < n; k++) {
                start_daemon("256M", NULL, unchecked_env[k][0], unchecked_env[k][1]);
                gpumem_client *c = connect_heap(heap);
                void *p;
                ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, 0, &p), 0);
                gm_test_fill(p, 8 * MiB, 5);
                ck_assert_int_eq(gpumem_free(c, p), 0);
                uint64_t released = 0;
                ck_assert_int_eq(gpumem_trim(c, &released), 0);
                ck_assert_uint_gt(released, 0);
                ck_assert_int_eq(usage().mappings, 0); /* honest: nothing mapped here */
                ck_assert_int_eq(wait_unverified(), (long long) released);
                ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), released);
                ck_assert_uint_eq(gm_fake_device_bytes(0), released); /* the daemon keeps its handle */
                gpumem_disconnect(c);
                ck_assert_uint_eq(wait_charged("uid:0", 0), 0);
                if (k + 1 < n)
                        gm_test_daemon_stop(&daemon_); /* the next one on the same device */
        }
        finish(connect_ok());
}

START_TEST(test_unchecked_release_charged_until_session_ends_central) {
        check_unchecked_release(GPUMEM_HEAP_CENTRAL);
}
END_TEST

START_TEST(test_unchecked_release_charged_until_session_ends_local) {
        check_unchecked_release(GPUMEM_HEAP_LOCAL);
}
END_TEST

/* The case: a client that acknowledged releases while keeping the
 * mapping held 480 MiB under a 64 MiB quota, charged 0. Where nothing can
 * check it, what it released stays charged: the quota holds, and the refusal
 * says why. */
static const char liar_tenant[] = "[tenant liar]\nuser = 0\nquota = 64M\n";

static void start_unchecked_with_quota(void) {
        setenv(unchecked_env[0][0], unchecked_env[0][1], 1);
        gm_test_daemon_start_config(&daemon_, "256M", NULL, liar_tenant);
        unsetenv(unchecked_env[0][0]);
}

static void assert_refused_unverified(const Gpumem__Envelope *e) {
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_msg(strstr(e->error->message, "released that cannot be checked as unmapped"), "%s",
                      e->error->message);
}

START_TEST(test_liar_held_to_quota_central) {
        start_unchecked_with_quota();
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        raw_segment_t seg = raw_alloc_mapped(fd, 2, 48 * MiB);
        gm_test_raw_acknowledge_mapped(fd, seg.block); /* nothing shows the lie: not closed, not believed */
        usleep(200000);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "liar"), seg.length);

        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 48 * MiB;
        gm_test_raw_send_body(fd, 6, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        Gpumem__Envelope *e = gm_test_raw_await_body(fd, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_uint_eq(e->request_id, 6);
        assert_refused_unverified(e);
        gm_msg_free(e);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "liar"), seg.length);

        driver_unmap(seg.base, seg.va_size, seg.length);
        close(fd); /* the session ends: the charge with it */
        ck_assert_uint_eq(wait_charged("liar", 0), 0);
        finish(connect_ok());
}
END_TEST

START_TEST(test_liar_held_to_quota_local) {
        start_unchecked_with_quota();
        CUdeviceptr base;
        int fd = raw_local_return_mapped(48 * MiB, false, &base);
        int seg_fd;
        Gpumem__Envelope *e = gm_test_raw_grant(fd, 4, 2, 48 * MiB, &seg_fd);
        ck_assert_int_eq(seg_fd, -1);
        assert_refused_unverified(e);
        gm_msg_free(e);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "liar"), 48 * MiB);

        driver_unmap(base, 48 * MiB, 48 * MiB);
        close(fd);
        ck_assert_uint_eq(wait_charged("liar", 0), 0);
        finish(connect_ok());
}
END_TEST

/* With NVML: a liar among the first releases after the daemon starts (the
 * driver not yet shown to count mappings) is held, not believed; an honest
 * release then drops at once and confirms it, and the next lie is caught. */
START_TEST(test_first_liar_held_until_driver_confirms) {
        start_daemon("256M", NULL, NULL, NULL);
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        raw_segment_t first = raw_alloc_mapped(fd, 2, MiB);
        gm_test_raw_acknowledge_mapped(fd, first.block); /* not closed, not believed */
        usleep(200000);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), first.length);

        gpumem_client *c = connect_heap(GPUMEM_HEAP_CENTRAL);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0); /* honest: its figure drops */
        ck_assert_uint_gt(released, 0);
        ck_assert_uint_eq(wait_charged("uid:0", first.length), first.length);
        ck_assert_int_eq(client_field("release_unverified_bytes"), 0);
        gpumem_disconnect(c);

        raw_segment_t second = raw_alloc_mapped(fd, 6, MiB);
        gm_test_raw_lying_release(fd, second.block); /* caught now, and closed */
        close(fd);
        usleep(200000);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), first.length + second.length);
        driver_unmap(first.base, first.va_size, first.length);
        driver_unmap(second.base, second.va_size, second.length);
        ck_assert_uint_eq(wait_charged("uid:0", 0), 0);
        finish(connect_ok());
}
END_TEST

/* A local session's honest return with NVML: its charge drops at once, not
 * at the session's end (and shows the driver counting mappings). */
static gpumem_client *honest_local_return(void) {
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_gt(released, 0);
        ck_assert_uint_eq(wait_charged("uid:0", 0), 0);
        return c;
}

/* With NVML, a local session: an honest return drops at once (and shows the
 * driver counting mappings); pieces returned while still mapped are caught
 * as a lying ReleaseAck is, with or without a ReturnIntent first: the
 * session is closed and their memory stays charged while the process holds
 * device memory. A second intent while one is open is refused, and so is one
 * from a central session. */
START_TEST(test_lying_return_caught_by_nvml) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_disconnect(honest_local_return());

        for (int announced = 0; announced < 2; announced++) { /* an older client's, then one with a ReturnIntent */
                CUdeviceptr base;
                int fd = raw_local_return_mapped(8 * MiB, announced, &base);
                gm_test_raw_assert_caught(fd); /* and closed */
                close(fd);
                usleep(200000);
                ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 8 * MiB);
                driver_unmap(base, 8 * MiB, 8 * MiB);
                ck_assert_uint_eq(wait_charged("uid:0", 0), 0);
        }
        int central = gm_test_raw_connect(daemon_.socket_path); /* a central session has no intent */
        gm_test_raw_hello(central, false);
        Gpumem__Envelope *e = gm_test_raw_return_intent(central, 2);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error->code, EPROTO);
        gm_msg_free(e);
        close(central);
        finish(connect_ok());
}
END_TEST

/* Issue #17, the local reference: an honest local client's own give-back
 * (empty_cache) was checked against the reference of its first Grant, so
 * device memory its process allocated itself since (lazily loaded kernels,
 * cuBLAS handles: here a cuMemCreate of its own) read as memory it kept: held
 * until the session ended, or, grown past the returned bytes, a lie that
 * closed it. Now each give-back announces itself (ReturnIntent) and is
 * checked against the figure of that moment: the charge drops at once and
 * the session carries on. */
START_TEST(test_own_device_memory_does_not_hold_returns) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = honest_local_return();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, 0, &p), 0);
        const gm_cuda_t *cu;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        CUmemAllocationProp prop = gm_cuda_alloc_prop(0, false);
        CUmemGenericAllocationHandle own;
        ck_assert_int_eq(cu->MemCreate(&own, 16 * MiB, &prop, 0), CUDA_SUCCESS); /* outside gpumemd */
        ck_assert_int_eq(gpumem_free(c, p), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_ge(released, 8 * MiB);
        ck_assert_uint_eq(wait_charged("uid:0", 0), 0); /* at once, not at the session's end */
        ck_assert_int_eq(client_field("release_unverified_bytes"), 0);
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, 0, &p), 0); /* still open */
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(cu->MemRelease(own), CUDA_SUCCESS);
        finish(c);
}
END_TEST

/* Defect 10: the refusal's figures are one view: the broker's capacity
 * within the device, and what is free of it. */
START_TEST(test_oom_figures_consistent) {
        start_daemon("256M", NULL, NULL, NULL); /* the device has 4 GiB */
        gpumem_client *c = connect_ok();
        void *p[12];
        for (int i = 0; i < 12; i++)
                ck_assert_int_eq(gpumem_alloc(c, 20 * MiB, 0, &p[i]), 0);
        void *q;
        ck_assert_int_eq(gpumem_alloc(c, 20 * MiB, 0, &q), -ENOMEM);
        const char *msg = gpumem_last_error(c);
        ck_assert_msg(strstr(msg, "GPU 0 has a total capacity of 256.00 MiB of which 16.00 MiB is free"), "%s", msg);
        ck_assert_msg(strstr(msg, "the device is full of live allocations"), "%s", msg);
        for (int i = 0; i < 12; i++)
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        finish(c);
}
END_TEST

/* Defect 9: a client whose CUDA_VISIBLE_DEVICES orders the GPUs otherwise
 * maps on the daemon's GPU, found by UUID. */
START_TEST(test_client_finds_daemon_gpu) {
        setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
        start_daemon("256M", NULL, NULL, NULL);   /* its device 0: the first GPU */
        setenv("CUDA_VISIBLE_DEVICES", "1,0", 1); /* here that GPU is ordinal 1 */
        gpumem_client *c = connect_ok();
        void *p;
        int r = gpumem_alloc(c, 4 * MiB, 0, &p);
        ck_assert_msg(r == 0, "alloc: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        gm_test_fill(p, 4 * MiB, 9);
        ck_assert(gm_test_verify(p, 4 * MiB, 9));
        ck_assert_int_eq(gpumem_free(c, p), 0);
        finish(c);
}
END_TEST

START_TEST(test_client_refuses_unseen_gpu) {
        setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
        start_daemon("256M", NULL, NULL, NULL);
        setenv("CUDA_VISIBLE_DEVICES", "1", 1); /* the daemon's GPU is hidden here */
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), -ENODEV);
        ck_assert_ptr_null(c);
        gm_test_daemon_stop(&daemon_);
        unlink(pool_path);
}
END_TEST

/* Defect 8: under exclusive-process compute mode the daemon (which holds no
 * context) does not lock its clients out. */
START_TEST(test_exclusive_process_mode) {
        setenv("FAKECUDA_COMPUTE_MODE", "exclusive_process", 1);
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_ok();
        void *p;
        int r = gpumem_alloc(c, 4 * MiB, 0, &p);
        ck_assert_msg(r == 0, "alloc: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        gm_test_fill(p, 4 * MiB, 3);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        finish(c);
}
END_TEST

/* Defect 11: segment and page sizes follow the backend's granularity (here
 * 8 MiB), not PyTorch's 2 MiB constants. */
static void check_granularity(const char *const *args) {
        setenv("FAKECUDA_GRANULARITY", "8M", 1);
        start_daemon("256M", args, NULL, NULL);
        gpumem_client *c = connect_ok();
        void *small, *large;
        int r = gpumem_alloc(c, 4096, 0, &small);
        ck_assert_msg(r == 0, "small alloc: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        r = gpumem_alloc(c, 5 * MiB, 0, &large);
        ck_assert_msg(r == 0, "large alloc: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        gm_test_fill(small, 4096, 1);
        gm_test_fill(large, 5 * MiB, 2);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 8 * (int64_t) MiB + 24 * (int64_t) MiB);
        ck_assert_int_eq(gpumem_free(c, small), 0);
        ck_assert_int_eq(gpumem_free(c, large), 0);
        finish(c);
}

START_TEST(test_granularity_segments) {
        check_granularity(NULL);
}
END_TEST

START_TEST(test_granularity_pages) {
        static const char *const args[] = {"--alloc-conf", "expandable_segments:True", NULL};
        check_granularity(args);
}
END_TEST

/* ---- a GPU finishes its work later (issue 23) ----
 * A kernel queued just before a free may still run when the library
 * unmaps: every path that unmaps must wait for it (the emulator makes the
 * kernel fault otherwise, which fails finish()). */

/* Device `ordinal`'s primary context, retained and current here. */
static const gm_cuda_t *push_device(int ordinal, CUcontext *ret_ctx) {
        const gm_cuda_t *cu;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        ck_assert_int_eq(cu->DevicePrimaryCtxRetain(ret_ctx, ordinal), CUDA_SUCCESS);
        ck_assert_int_eq(cu->CtxPushCurrent(*ret_ctx), CUDA_SUCCESS);
        return cu;
}

static void pop_device(const gm_cuda_t *cu, int ordinal) {
        CUcontext ctx;
        ck_assert_int_eq(cu->CtxPopCurrent(&ctx), CUDA_SUCCESS);
        ck_assert_int_eq(cu->DevicePrimaryCtxRelease(ordinal), CUDA_SUCCESS);
}

static uint64_t new_stream(const gm_cuda_t *cu, unsigned flags) {
        CUstream s;
        ck_assert_int_eq(cu->StreamCreate(&s, flags), CUDA_SUCCESS);
        return (uint64_t) (uintptr_t) s;
}

/* A kernel on `stream` that writes `value` over [p, +bytes) after `ms`. */
static void late_write(uint64_t stream, void *p, size_t bytes, unsigned ms, unsigned char value) {
        fakecuda_launch_spin_fn spin;
        fakecuda_launch_fill_fn fill;
        void *a = gm_fake_symbol("fakecuda_launch_spin"), *b = gm_fake_symbol("fakecuda_launch_fill");
        memcpy(&spin, &a, sizeof(a));
        memcpy(&fill, &b, sizeof(b));
        ck_assert_int_eq(spin((void *) (uintptr_t) stream, ms), CUDA_SUCCESS);
        ck_assert_int_eq(fill((void *) (uintptr_t) stream, (uint64_t) (uintptr_t) p, bytes, value), CUDA_SUCCESS);
}

/* Waits for all work; no kernel may have faulted. */
static void assert_no_fault(const gm_cuda_t *cu) {
        ck_assert_int_eq(cu->CtxSynchronize(), CUDA_SUCCESS);
        ck_assert_int_eq(usage().faults, 0);
}

static void destroy_stream(const gm_cuda_t *cu, uint64_t stream) {
        ck_assert_int_eq(cu->StreamDestroy((CUstream) (uintptr_t) stream), CUDA_SUCCESS);
}

/* The ways a local heap gives cached memory back, each right after a free
 * whose block a queued kernel still writes. */
typedef enum { VIA_TRIM, VIA_RECLAIM, VIA_OOM_LADDER, VIA_GC, VIA_MAX_SPLIT } give_back_path_t;

static void check_give_back_waits(give_back_path_t path) {
        static const char *const gc[] = {"--alloc-conf", "garbage_collection_threshold:0.5", NULL};
        static const char *const split[] = {"--alloc-conf", "max_split_size_mb:20", NULL};
        start_daemon("256M", path == VIA_GC ? gc : path == VIA_MAX_SPLIT ? split : NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t s = new_stream(cu, CU_STREAM_NON_BLOCKING), other = new_stream(cu, CU_STREAM_NON_BLOCKING);
        void *p, *q = NULL;
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, s, &p), 0);
        late_write(s, p, 100 * MiB, 500, 0x77);
        ck_assert_int_eq(gpumem_free(c, p), 0); /* stream-ordered: reusable on s, still written */
        uint64_t released = 0;
        if (path == VIA_TRIM) {
                ck_assert_int_eq(gpumem_trim(c, &released), 0);
                ck_assert_uint_eq(released, 100 * MiB);
        } else if (path == VIA_RECLAIM) {
                gpumem_client *admin = connect_ok();
                ck_assert_int_eq(gpumem_trim_tenant(admin, "*", &released), 0); /* the daemon's Reclaim */
                ck_assert_uint_ge(released, 100 * MiB);
                gpumem_disconnect(admin);
        } else if (path == VIA_MAX_SPLIT) {
                /* An oversize block is not split: the cached one is released for a smaller one. */
                ck_assert_int_eq(gpumem_alloc(c, 200 * MiB, other, &q), 0);
        } else {
                /* Another stream cannot reuse the cached block: the heap frees cache to fit. */
                ck_assert_int_eq(gpumem_alloc(c, 200 * MiB, other, &q), 0);
        }
        assert_no_fault(cu);
        if (q)
                ck_assert_int_eq(gpumem_free(c, q), 0);
        destroy_stream(cu, s);
        destroy_stream(cu, other);
        pop_device(cu, 0);
        finish(c);
}

START_TEST(test_trim_waits_for_queued_kernel) {
        check_give_back_waits(VIA_TRIM);
}
END_TEST

START_TEST(test_reclaim_waits_for_queued_kernel) {
        check_give_back_waits(VIA_RECLAIM);
}
END_TEST

START_TEST(test_oom_ladder_waits_for_queued_kernel) {
        check_give_back_waits(VIA_OOM_LADDER);
}
END_TEST

START_TEST(test_gc_waits_for_queued_kernel) {
        check_give_back_waits(VIA_GC);
}
END_TEST

START_TEST(test_max_split_waits_for_queued_kernel) {
        check_give_back_waits(VIA_MAX_SPLIT);
}
END_TEST

/* Disconnecting unmaps everything: the work still queued on it first. */
START_TEST(test_disconnect_waits_for_queued_kernel) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_ok();
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t s = new_stream(cu, CU_STREAM_NON_BLOCKING);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, s, &p), 0);
        late_write(s, p, 8 * MiB, 500, 0x77);
        gpumem_disconnect(c);
        assert_no_fault(cu);
        destroy_stream(cu, s);
        pop_device(cu, 0);
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        finish(c);
}
END_TEST

/* A release naming segments of more than 16 streams waits for all of them,
 * non-blocking ones included (the legacy stream does not order those). */
START_TEST(test_release_of_many_streams_waits_for_all) {
        start_daemon("512M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_CENTRAL);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        enum { N = 17 };
        uint64_t s[N];
        void *p[N];
        for (int i = 0; i < N; i++) {
                s[i] = new_stream(cu, CU_STREAM_NON_BLOCKING);
                ck_assert_int_eq(gpumem_alloc(c, 4 * MiB, s[i], &p[i]), 0);
        }
        late_write(s[N - 1], p[N - 1], 4 * MiB, 500, 0x77);
        for (int i = 0; i < N; i++)
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_ge(released, N * 4 * MiB);
        assert_no_fault(cu);
        for (int i = 0; i < N; i++)
                destroy_stream(cu, s[i]);
        pop_device(cu, 0);
        finish(c);
}
END_TEST

/* A block used on a side stream (gpumem_record_stream) is not handed out
 * again while that stream still writes it; `special` uses stream 0 of the
 * daemon's device as the side stream while another device's context is
 * current in the caller (its event belongs to the daemon's device). */
static void check_no_early_reuse(bool special) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t a = new_stream(cu, CU_STREAM_NON_BLOCKING);
        uint64_t side = special ? 0 : new_stream(cu, CU_STREAM_NON_BLOCKING);
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 4 * MiB, a, &p), 0);
        late_write(side, p, 4 * MiB, 800, 0x77);
        CUcontext other;
        if (special)
                push_device(1, &other); /* the application works on another GPU now */
        ck_assert_int_eq(gpumem_record_stream(c, p, side), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        usleep(100000); /* the library's event polls ran, the side stream still spins */
        ck_assert_int_eq(gpumem_alloc(c, 4 * MiB, a, &q), 0);
        if (special)
                pop_device(cu, 1);
        fakecuda_launch_pattern_fn pattern; /* the new owner's data, written on its own stream */
        void *fn = gm_fake_symbol("fakecuda_launch_pattern");
        memcpy(&pattern, &fn, sizeof(fn));
        ck_assert_int_eq(pattern((void *) (uintptr_t) a, (uint64_t) (uintptr_t) q, 4 * MiB, 5), CUDA_SUCCESS);
        assert_no_fault(cu);
        ck_assert_msg(gm_test_verify(q, 4 * MiB, 5), "the side stream's late write landed in a reused block");
        ck_assert_int_eq(gpumem_free(c, q), 0);
        destroy_stream(cu, a);
        if (!special)
                destroy_stream(cu, side);
        pop_device(cu, 0);
        finish(c);
}

START_TEST(test_record_stream_no_early_reuse) {
        check_no_early_reuse(false);
}
END_TEST

START_TEST(test_default_stream_event_on_daemon_device) {
        setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
        check_no_early_reuse(true);
}
END_TEST

/* The emulator's stream capture entry points (not in gm_cuda_t). */
typedef struct capture_api {
        CUresult (*begin)(CUstream, CUstreamCaptureMode);
        CUresult (*end)(CUstream, CUgraph *);
        CUresult (*destroy)(CUgraph);
        CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
        CUresult (*launch)(CUgraphExec, CUstream);
        CUresult (*exec_destroy)(CUgraphExec);
} capture_api_t;

static capture_api_t capture_api(void) {
        capture_api_t cap;
        void *a = gm_fake_symbol("cuStreamBeginCapture_v2"), *b = gm_fake_symbol("cuStreamEndCapture"),
             *d = gm_fake_symbol("cuGraphDestroy");
        memcpy(&cap.begin, &a, sizeof(a));
        memcpy(&cap.end, &b, sizeof(b));
        memcpy(&cap.destroy, &d, sizeof(d));
        void *i = gm_fake_symbol("cuGraphInstantiateWithFlags"), *l = gm_fake_symbol("cuGraphLaunch"),
             *x = gm_fake_symbol("cuGraphExecDestroy");
        memcpy(&cap.instantiate, &i, sizeof(i));
        memcpy(&cap.launch, &l, sizeof(l));
        memcpy(&cap.exec_destroy, &x, sizeof(x));
        return cap;
}

/* While the application captures a CUDA graph in global mode, the library's
 * own driver calls (the service thread polling a pending free's event) do
 * not invalidate the capture. */
START_TEST(test_capture_survives_library_calls) {
        start_daemon("256M", NULL, NULL, NULL);
        char hold[400];
        hold_events(hold, sizeof(hold));
        gpumem_client *c = connect_ok();
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t side = new_stream(cu, CU_STREAM_NON_BLOCKING), graph = new_stream(cu, CU_STREAM_NON_BLOCKING);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free_async(c, p, side), 0); /* an event the service thread polls */
        capture_api_t cap = capture_api();
        long polls = usage().event_queries;
        ck_assert_int_eq(cap.begin((CUstream) (uintptr_t) graph, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        for (int i = 0; i < 300 && usage().event_queries == polls; i++)
                usleep(10000);
        ck_assert_int_gt(usage().event_queries, polls); /* the service thread queried during the capture */
        CUgraph g = NULL;
        ck_assert_int_eq(cap.end((CUstream) (uintptr_t) graph, &g), CUDA_SUCCESS);
        ck_assert_int_eq(cap.destroy(g), CUDA_SUCCESS);
        ck_assert_int_eq(usage().capture_refusals, 0);
        unlink(hold);
        unsetenv("FAKECUDA_HOLD_EVENTS");
        wait_no_active_bytes(c);
        destroy_stream(cu, side);
        destroy_stream(cu, graph);
        pop_device(cu, 0);
        finish(c);
}
END_TEST

/* During a global-mode capture of `graph` (a created stream, or the
 * calling thread's per-thread default stream, CU_STREAM_PER_THREAD),
 * allocations on it that hit the cache or miss with room (new memory:
 * import, map, set-access in relaxed mode) succeed; one only the retry
 * ladder could serve (the release of the cached block freed before the
 * capture: a local heap's synchronize and unmap, a central heap's
 * ReleaseRequest, whose synchronize and unmap in the client are the same)
 * is refused with -ENOMEM and says why, with nothing released or moved
 * (with `page_reuse`, no page of the cached block moves either: the client
 * also records no fence event inside the capture); the capture stays
 * valid, and after it the same allocation succeeds through the ladder
 * (a central heap's waits for its client's release of the cached block) or
 * a page move. */
static void check_capture_miss(gpumem_heap_mode heap, bool per_thread, bool page_reuse) {
        static const char *const reuse[] = {"--alloc-conf", "expandable_segments:True,gpumemd_page_reuse:True", NULL};
        start_daemon("256M", page_reuse ? reuse : NULL, NULL, NULL);
        gpumem_client *c = connect_heap(heap);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t other = new_stream(cu, CU_STREAM_NON_BLOCKING);
        uint64_t graph =
                per_thread ? (uint64_t) (uintptr_t) CU_STREAM_PER_THREAD : new_stream(cu, CU_STREAM_NON_BLOCKING);
        capture_api_t cap = capture_api();
        void *cached, *live, *hit, *room, *big = NULL;
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, graph, &cached), 0);
        ck_assert_int_eq(gpumem_alloc(c, 60 * MiB, other, &live), 0);
        late_write(other, live, 60 * MiB, 0, 0x55);
        ck_assert_int_eq(gpumem_free(c, cached), 0); /* 100 MiB cached on the captured stream */
        int64_t retries = -1, after = -1, reserved = -1, reserved_after = -1;
        ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &retries), 0);

        ck_assert_int_eq(cap.begin((CUstream) (uintptr_t) graph, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, graph, &hit), 0); /* a hit */
        ck_assert_ptr_eq(hit, cached);
        ck_assert_int_eq(gpumem_alloc(c, 40 * MiB, graph, &room), 0); /* a miss with room: new memory */
        ck_assert_int_eq(gpumem_free(c, hit), 0);                     /* cached again */
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &reserved), 0);
        long mappings = usage().mappings;
        /* 56 MiB free on the device: only releasing the cached 100 MiB fits 120. */
        ck_assert_int_eq(gpumem_alloc(c, 120 * MiB, graph, &big), -ENOMEM);
        ck_assert_msg(strstr(gpumem_last_error(c), "refused during a capture") != NULL, "%s", gpumem_last_error(c));
        ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &after), 0);
        ck_assert_int_eq(after, retries); /* the ladder did not run */
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &reserved_after), 0);
        ck_assert_int_eq(reserved_after, reserved);                   /* the cached block was not released */
        ck_assert_int_eq(usage().mappings, mappings);                 /* nor unmapped, nor moved */
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, graph, &hit), 0); /* still where it was */
        ck_assert_ptr_eq(hit, cached);
        ck_assert_int_eq(gpumem_free(c, hit), 0);
        CUgraph g = NULL;
        ck_assert_int_eq(cap.end((CUstream) (uintptr_t) graph, &g), CUDA_SUCCESS);
        ck_assert_int_eq(cap.destroy(g), CUDA_SUCCESS);
        ck_assert_int_eq(usage().capture_refusals, 0);

        /* Now through the ladder (a central heap's waits for its client's
         * ReleaseAck of the cached block), or with page reuse by moving the
         * cached block's pages. */
        ck_assert_int_eq(gpumem_alloc(c, 120 * MiB, graph, &big), 0);
        ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &after), 0);
        ck_assert_int_eq(after, page_reuse ? retries : retries + 1);
        assert_no_fault(cu);
        ck_assert_int_eq(gpumem_free(c, big), 0);
        ck_assert_int_eq(gpumem_free(c, room), 0);
        ck_assert_int_eq(gpumem_free(c, live), 0);
        if (!per_thread)
                destroy_stream(cu, graph);
        destroy_stream(cu, other);
        pop_device(cu, 0);
        finish(c);
}

START_TEST(test_capture_miss_skips_the_ladder) {
        check_capture_miss(GPUMEM_HEAP_LOCAL, false, false);
}
END_TEST

/* The same in a central session: the client says the stream captures
 * (Alloc.capturing) and the daemon's heap skips its ladder. */
START_TEST(test_capture_miss_skips_the_ladder_central) {
        check_capture_miss(GPUMEM_HEAP_CENTRAL, false, false);
}
END_TEST

/* A capture of the per-thread default stream is seen like any other. */
START_TEST(test_capture_of_per_thread_stream_seen_local) {
        check_capture_miss(GPUMEM_HEAP_LOCAL, true, false);
}
END_TEST

START_TEST(test_capture_of_per_thread_stream_seen_central) {
        check_capture_miss(GPUMEM_HEAP_CENTRAL, true, false);
}
END_TEST

/* With page reuse, the cached block's free pages are not moved under the
 * capture either (local and central heaps). */
START_TEST(test_capture_miss_moves_no_page_local) {
        check_capture_miss(GPUMEM_HEAP_LOCAL, false, true);
}
END_TEST

START_TEST(test_capture_miss_moves_no_page_central) {
        check_capture_miss(GPUMEM_HEAP_CENTRAL, false, true);
}
END_TEST

/* A block record_stream'd to a stream being captured and freed during the
 * capture: its event on that stream is recorded only once the capture ends
 * (one recorded inside would be part of the graph, and the service thread's
 * query of it would invalidate the capture); the free completes after. */
START_TEST(test_capture_free_waits_for_its_end) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_ok();
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t graph = new_stream(cu, CU_STREAM_NON_BLOCKING), other = new_stream(cu, CU_STREAM_NON_BLOCKING);
        capture_api_t cap = capture_api();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4 * MiB, other, &p), 0);
        ck_assert_int_eq(gpumem_record_stream(c, p, graph), 0);
        ck_assert_int_eq(cap.begin((CUstream) (uintptr_t) graph, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        long polls = usage().event_queries;
        ck_assert_int_eq(gpumem_free(c, p), 0);
        usleep(300000); /* the service thread polls meanwhile */
        int64_t active = -1;
        ck_assert_int_eq(gpumem_stat(c, "active_bytes.all.current", &active), 0);
        ck_assert_int_eq(active, 4 * MiB); /* pending until the capture ends */
        CUgraph g = NULL;
        ck_assert_int_eq(cap.end((CUstream) (uintptr_t) graph, &g), CUDA_SUCCESS);
        ck_assert_int_eq(cap.destroy(g), CUDA_SUCCESS);
        ck_assert_int_eq(usage().capture_refusals, 0);
        wait_no_active_bytes(c);
        ck_assert_int_gt(usage().event_queries, polls);
        destroy_stream(cu, graph);
        destroy_stream(cu, other);
        pop_device(cu, 0);
        finish(c);
}
END_TEST

/* Whether [p, +bytes) holds `value` once `stream`'s work so far is done. */
static bool holds(const gm_cuda_t *cu, uint64_t stream, void *p, size_t bytes, unsigned char value) {
        fakecuda_launch_verify_fn verify;
        void *v = gm_fake_symbol("fakecuda_launch_verify");
        memcpy(&verify, &v, sizeof(v));
        int ok = -1;
        ck_assert_int_eq(verify((void *) (uintptr_t) stream, (uint64_t) (uintptr_t) p, bytes, value, &ok),
                         CUDA_SUCCESS);
        ck_assert_int_eq(cu->StreamSynchronize((CUstream) (uintptr_t) stream), CUDA_SUCCESS);
        ck_assert_int_ne(ok, -1);
        return ok == 1;
}

/* The emulator replays a captured graph: its kernels do not run at capture,
 * they run at every cuGraphLaunch; so a block freed after the capture and
 * handed out again (no private pool) is overwritten by the next replay: the
 * hazard private pools exist for, shown. */
START_TEST(test_graph_replay_shows_reuse_hazard) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t graph = new_stream(cu, CU_STREAM_NON_BLOCKING);
        capture_api_t cap = capture_api();
        void *x, *y;
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, graph, &x), 0);
        late_write(graph, x, 8 * MiB, 0, 0x00);
        ck_assert_int_eq(cap.begin((CUstream) (uintptr_t) graph, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        late_write(graph, x, 8 * MiB, 0, 0xab); /* two nodes: spin 0 ms, fill */
        CUgraph g = NULL;
        CUgraphExec exec = NULL;
        ck_assert_int_eq(cap.end((CUstream) (uintptr_t) graph, &g), CUDA_SUCCESS);
        ck_assert_int_eq(cap.instantiate(&exec, g, 0), CUDA_SUCCESS);
        ck_assert(holds(cu, graph, x, 8 * MiB, 0x00)); /* not run at capture */
        ck_assert_int_eq(cap.launch(exec, (CUstream) (uintptr_t) graph), CUDA_SUCCESS);
        ck_assert(holds(cu, graph, x, 8 * MiB, 0xab)); /* run at the replay */
        ck_assert_int_eq(gpumem_free(c, x), 0);
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, graph, &y), 0);
        ck_assert_ptr_eq(y, x); /* the cache hands the graph's block out again */
        late_write(graph, y, 8 * MiB, 0, 0x11);
        ck_assert_int_eq(cap.launch(exec, (CUstream) (uintptr_t) graph), CUDA_SUCCESS);
        ck_assert(!holds(cu, graph, y, 8 * MiB, 0x11)); /* the replay overwrote the new owner's data */
        ck_assert_int_eq(cap.exec_destroy(exec), CUDA_SUCCESS);
        ck_assert_int_eq(cap.destroy(g), CUDA_SUCCESS);
        ck_assert_int_eq(usage().capture_refusals, 0);
        assert_no_fault(cu);
        ck_assert_int_eq(gpumem_free(c, y), 0);
        destroy_stream(cu, graph);
        pop_device(cu, 0);
        finish(c);
}
END_TEST

/* ---- another thread's capture vs Reclaim and trim (issue 23) ---- */

/* Runs gpumemctl against the daemon; asserts it succeeded. */
static void ctl_ok(const char *const *args) {
        const char *argv[12] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path};
        size_t n = 3;
        for (; args[n - 3]; n++)
                argv[n] = args[n - 3];
        argv[n] = NULL;
        char out[4096];
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
}

/* What another thread (or the daemon) starts during thread A's capture. */
typedef enum held_work {
        HELD_TRIM,            /* thread B's gpumem_trim() */
        HELD_LADDER,          /* thread B's allocation that only the retry ladder could serve */
        HELD_CENTRAL_LADDER,  /* the same through a central session (the daemon's ladder) */
        HELD_CENTRAL_RELEASE, /* a central session's ReleaseRequest (an admin's trim) */
        HELD_SLEEP,           /* thread B's gpumem_sleep() */
} held_work_t;

typedef struct held_thread {
        gpumem_client *c;
        held_work_t what;
        uint64_t stream;
        void *p;
        int r;
        char error[512];
} held_thread_t;

static void *held_thread(void *arg) {
        held_thread_t *t = arg;
        uint64_t released = 0;
        if (t->what == HELD_TRIM)
                t->r = gpumem_trim(t->c, &released);
        else if (t->what == HELD_LADDER || t->what == HELD_CENTRAL_LADDER)
                t->r = gpumem_alloc(t->c, 140 * MiB, t->stream, &t->p);
        else
                t->r = gpumem_sleep(t->c, NULL, NULL, NULL);
        snprintf(t->error, sizeof(t->error), "%s", gpumem_last_error(t->c));
        return NULL;
}

/* Thread A (the caller) starts a global-mode capture of `graph`, declared
 * (gpumem_capture_begin) or, undeclared, seen by c's allocation that misses
 * the cache on it (*ret_seen: that block), and launches the graph's nodes
 * into it: a kernel writing 0xab over x. */
static void capture_start(gpumem_client *c, const capture_api_t *cap, uint64_t graph, void *x, bool declared,
                          void **ret_seen) {
        if (declared)
                ck_assert_int_eq(gpumem_capture_begin(), 0);
        ck_assert_int_eq(cap->begin((CUstream) (uintptr_t) graph, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        if (!declared) /* a miss (no small block cached): the heap asks, and notes the stream */
                ck_assert_int_eq(gpumem_alloc(c, 512 * 1024, graph, ret_seen), 0);
        late_write(graph, x, 8 * MiB, 0, 0xab); /* the graph's nodes */
}

/* Ends capture_start()'s capture: it is valid (nothing refused during it),
 * and its graph's nodes ran not at the capture but at the replay. */
static void capture_end_replay(const gm_cuda_t *cu, const capture_api_t *cap, uint64_t graph, void *x, bool declared,
                               CUgraph *ret_graph, CUgraphExec *ret_exec) {
        ck_assert_int_eq(cap->end((CUstream) (uintptr_t) graph, ret_graph), CUDA_SUCCESS);
        if (declared)
                ck_assert_int_eq(gpumem_capture_end(), 0);
        ck_assert_int_eq(usage().capture_refusals, 0);
        ck_assert_int_eq(cap->instantiate(ret_exec, *ret_graph, 0), CUDA_SUCCESS);
        ck_assert(holds(cu, graph, x, 8 * MiB, 0x00)); /* not run at capture */
        ck_assert_int_eq(cap->launch(*ret_exec, (CUstream) (uintptr_t) graph), CUDA_SUCCESS);
        ck_assert(holds(cu, graph, x, 8 * MiB, 0xab)); /* run at the replay */
}

/* Destroys capture_end_replay()'s graph, checks that nothing faulted, and
 * frees capture_start()'s blocks. */
static void capture_forget(const gm_cuda_t *cu, const capture_api_t *cap, CUgraph g, CUgraphExec exec, gpumem_client *c,
                           void *x, void *seen) {
        ck_assert_int_eq(cap->exec_destroy(exec), CUDA_SUCCESS);
        ck_assert_int_eq(cap->destroy(g), CUDA_SUCCESS);
        assert_no_fault(cu);
        if (seen)
                ck_assert_int_eq(gpumem_free(c, seen), 0);
        ck_assert_int_eq(gpumem_free(c, x), 0);
}

/* c's 8 MiB block *ret_x on `graph` (one 20 MiB segment, zeroed by the
 * device) and 100 MiB idle in c's cache on `stream`. */
static void x_and_idle_cache(gpumem_client *c, uint64_t graph, uint64_t stream, void **ret_x) {
        void *cached;
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, graph, ret_x), 0);
        late_write(graph, *ret_x, 8 * MiB, 0, 0x00);
        ck_assert_int_eq(gpumem_alloc(c, 100 * MiB, stream, &cached), 0);
        ck_assert_int_eq(gpumem_free(c, cached), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 120 * MiB),
                         120 * MiB);
}

/* Thread A (this one) captures a stream in global mode and launches a
 * kernel into it; the library knows of the capture by its declaration
 * (gpumem_capture_begin) or, undeclared, by an allocation that missed the
 * cache on the captured stream. Meanwhile another process (gpumemctl trim)
 * makes the daemon send this session a Reclaim of its idle 100 MiB, and
 * thread B calls gpumem_trim: neither synchronizes (which invalidates the
 * capture), the Reclaim waits and trim is refused with -EBUSY. The capture
 * ends valid and its graph replays; then the Reclaim completes (the daemon
 * gets the memory back) and a trim releases again. */
static void check_capture_holds_off_releases(bool declared) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t graph = new_stream(cu, CU_STREAM_NON_BLOCKING);
        capture_api_t cap = capture_api();
        void *x, *seen = NULL, *later;
        x_and_idle_cache(c, graph, graph, &x);

        capture_start(c, &cap, graph, x, declared, &seen);
        int64_t reserved = gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current");

        /* (a) The Reclaim: once the snapshot (which this session's service
         * thread answers after the Reclaim that came before it) is back, the
         * Reclaim was looked at, and waits. */
        ctl_ok((const char *const[]){"trim", NULL});
        char snap[300];
        snprintf(snap, sizeof(snap), "%s/snap.json", daemon_.dir);
        ctl_ok((const char *const[]){"snapshot", "-o", snap, "--format", "json", NULL});
        ck_assert_int_eq(usage().capture_refusals, 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), reserved);

        /* (b) Another thread's trim. */
        held_thread_t t = {.c = c, .what = HELD_TRIM, .r = 1};
        pthread_t b;
        ck_assert_int_eq(pthread_create(&b, NULL, held_thread, &t), 0);
        ck_assert_int_eq(pthread_join(b, NULL), 0);
        ck_assert_int_eq(usage().capture_refusals, 0);
        ck_assert_int_eq(t.r, -EBUSY);
        ck_assert_msg(strstr(t.error, "capture is in progress") != NULL, "%s", t.error);

        CUgraph g = NULL;
        CUgraphExec exec = NULL;
        capture_end_replay(cu, &cap, graph, x, declared, &g, &exec);

        /* The Reclaim is answered now: the cached 100 MiB went back. */
        int64_t want = reserved - (int64_t) (100 * MiB);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", want), want);
        ck_assert_int_eq(gpumem_alloc(c, 60 * MiB, graph, &later), 0);
        ck_assert_int_eq(gpumem_free(c, later), 0);
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_eq(released, 60 * MiB);
        capture_forget(cu, &cap, g, exec, c, x, seen);
        destroy_stream(cu, graph);
        pop_device(cu, 0);
        finish(c);
}

START_TEST(test_declared_capture_holds_off_releases) {
        check_capture_holds_off_releases(true);
}
END_TEST

START_TEST(test_seen_capture_holds_off_releases) {
        check_capture_holds_off_releases(false);
}
END_TEST

/* Thread A (this one) captures a stream in global mode, declared or seen
 * (as in check_capture_holds_off_releases()), with 100 MiB idle in a cache:
 * the local session's on another stream, or (HELD_CENTRAL_RELEASE) a central
 * session's of this process on the captured stream. Meanwhile thread B
 * allocates 140 MiB on the other stream, which only the ladder's release of
 * the idle 100 MiB could serve (it is refused with -ENOMEM, saying another
 * capture is in progress; HELD_CENTRAL_LADDER: a central session's, at once,
 * not after the daemon waited for a release held until the capture ends),
 * or an admin's trim makes the daemon ask the
 * central session for its idle segment (the ReleaseRequest is held), or
 * thread B calls gpumem_sleep() (-EBUSY): none synchronizes or unmaps, which
 * would invalidate A's capture. The capture ends valid and its graph
 * replays; then the held work completes (the allocation succeeds through
 * the ladder, the release is acknowledged and its memory goes back to the
 * device, the session sleeps and wakes with its data). */
static void check_capture_holds_off_more(bool declared, held_work_t what) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        bool central_ladder = what == HELD_CENTRAL_LADDER;
        gpumem_client *central =
                what == HELD_CENTRAL_RELEASE || central_ladder ? connect_heap(GPUMEM_HEAP_CENTRAL) : NULL;
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t graph = new_stream(cu, CU_STREAM_NON_BLOCKING), other = new_stream(cu, CU_STREAM_NON_BLOCKING);
        capture_api_t cap = capture_api();
        void *x, *cached, *seen = NULL, *later;
        ck_assert_int_eq(gpumem_alloc(c, 8 * MiB, graph, &x), 0); /* one 20 MiB segment */
        late_write(graph, x, 8 * MiB, 0, 0x00);
        gpumem_client *owner = central ? central : c;
        ck_assert_int_eq(gpumem_alloc(owner, 100 * MiB, central && !central_ladder ? graph : other, &cached), 0);
        ck_assert_int_eq(gpumem_free(owner, cached), 0); /* 100 MiB idle in a cache */
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 120 * MiB),
                         120 * MiB);
        uint64_t device_bytes = gm_fake_device_bytes(0);

        capture_start(c, &cap, graph, x, declared, &seen);
        long mappings = usage().mappings;
        if (what == HELD_CENTRAL_RELEASE) {
                ctl_ok((const char *const[]){"trim", NULL});
                /* A round trip on the central session: the ReleaseRequest the
                 * daemon sent before its reply was dispatched before it. */
                int64_t reserved = -1;
                ck_assert_int_eq(gpumem_stat(central, "reserved_bytes.all.current", &reserved), 0);
        } else {
                held_thread_t t = {.c = central_ladder ? central : c, .what = what, .stream = other, .r = 1};
                pthread_t b;
                ck_assert_int_eq(pthread_create(&b, NULL, held_thread, &t), 0);
                ck_assert_int_eq(pthread_join(b, NULL), 0);
                bool ladder = what == HELD_LADDER || central_ladder;
                ck_assert_int_eq(t.r, ladder ? -ENOMEM : -EBUSY);
                ck_assert_msg(strstr(t.error, ladder ? "refused during a capture in progress"
                                                     : "capture is in progress") != NULL,
                              "%s", t.error);
        }
        ck_assert_int_eq(usage().capture_refusals, 0);
        ck_assert_int_eq(usage().mappings, mappings); /* nothing unmapped */
        if (central)
                ck_assert_uint_eq(gm_fake_device_bytes(0), device_bytes + (declared ? 0 : 2 * MiB));

        CUgraph g = NULL;
        CUgraphExec exec = NULL;
        capture_end_replay(cu, &cap, graph, x, declared, &g, &exec);

        /* The held work, now. */
        if (what == HELD_LADDER || central_ladder) {
                /* the ladder released the 100 MiB */
                ck_assert_int_eq(gpumem_alloc(owner, 140 * MiB, other, &later), 0);
                ck_assert_int_eq(gpumem_free(owner, later), 0);
        } else if (what == HELD_CENTRAL_RELEASE) {
                /* The service thread answers the release: unmapped here, the
                 * daemon hands the 100 MiB back to the device. */
                for (int i = 0; i < 500 && usage().mappings == mappings; i++)
                        usleep(10000);
                ck_assert_int_eq(usage().mappings, mappings - 1);
                uint64_t want = device_bytes - 100 * MiB + (declared ? 0 : 2 * MiB);
                for (int i = 0; i < 500 && gm_fake_device_bytes(0) != want; i++)
                        usleep(10000);
                ck_assert_uint_eq(gm_fake_device_bytes(0), want);
        } else {
                static const char *const keep[] = {"*", NULL};
                uint64_t released = 0;
                ck_assert_int_eq(gpumem_sleep(c, NULL, keep, &released), 0);
                ck_assert_uint_ge(released, 100 * MiB);
                ck_assert_int_eq(gpumem_wake(c, 0), 0);
                ck_assert(holds(cu, graph, x, 8 * MiB, 0xab)); /* kept over the sleep */
        }
        ck_assert_int_eq(usage().capture_refusals, 0);
        capture_forget(cu, &cap, g, exec, c, x, seen);
        gpumem_disconnect(central);
        destroy_stream(cu, graph);
        destroy_stream(cu, other);
        pop_device(cu, 0);
        finish(c);
}

START_TEST(test_declared_capture_holds_off_ladder) {
        check_capture_holds_off_more(true, HELD_LADDER);
}
END_TEST

START_TEST(test_seen_capture_holds_off_ladder) {
        check_capture_holds_off_more(false, HELD_LADDER);
}
END_TEST

START_TEST(test_declared_capture_holds_off_central_ladder) {
        check_capture_holds_off_more(true, HELD_CENTRAL_LADDER);
}
END_TEST

START_TEST(test_seen_capture_holds_off_central_ladder) {
        check_capture_holds_off_more(false, HELD_CENTRAL_LADDER);
}
END_TEST

START_TEST(test_declared_capture_holds_off_central_release) {
        check_capture_holds_off_more(true, HELD_CENTRAL_RELEASE);
}
END_TEST

START_TEST(test_seen_capture_holds_off_central_release) {
        check_capture_holds_off_more(false, HELD_CENTRAL_RELEASE);
}
END_TEST

START_TEST(test_declared_capture_refuses_sleep) {
        check_capture_holds_off_more(true, HELD_SLEEP);
}
END_TEST

START_TEST(test_seen_capture_refuses_sleep) {
        check_capture_holds_off_more(false, HELD_SLEEP);
}
END_TEST

/* Thread A of test_capture_waits_for_heaps_own_release(): declares a
 * capture, notes how many synchronizes were held when its begin returned,
 * and says so on `returned` (an eventfd). */
typedef struct begin_thread {
        int returned;
        int r;
        long syncs_held; /* at the begin's return */
} begin_thread_t;

static void *begin_thread(void *arg) {
        begin_thread_t *t = arg;
        t->r = gpumem_capture_begin();
        t->syncs_held = usage().syncs_held;
        ck_assert_int_eq(eventfd_write(t->returned, 1), 0);
        return NULL;
}

/* Issue 23: a local heap's own release for a miss (here the retry ladder's
 * release of 100 MiB idle in the cache, for a 140 MiB allocation on another
 * stream) registers as a release under way. Thread B's allocation is held
 * inside the ladder's synchronize (FAKECUDA_HOLD_SYNC); thread A then calls
 * gpumem_capture_begin(), which returns only once B's release is over (no
 * synchronize is held any more when it returns; without the registration it
 * returns at once, while B is still held). The hold goes once A returned,
 * or, while A waits, after a grace period (which only decides how soon a
 * waiting A is let go, never the verdict). Then A captures on its own stream:
 * B's allocation was served through the ladder, and the capture ends valid,
 * nothing refused during it, and replays. */
START_TEST(test_capture_waits_for_heaps_own_release) {
        start_daemon("256M", NULL, NULL, NULL);
        gpumem_client *c = connect_heap(GPUMEM_HEAP_LOCAL);
        CUcontext ctx;
        const gm_cuda_t *cu = push_device(0, &ctx);
        uint64_t graph = new_stream(cu, CU_STREAM_NON_BLOCKING), other = new_stream(cu, CU_STREAM_NON_BLOCKING);
        capture_api_t cap = capture_api();
        void *x;
        x_and_idle_cache(c, graph, other, &x);

        char hold[400];
        hold_syncs(hold, sizeof(hold));
        held_thread_t bt = {.c = c, .what = HELD_LADDER, .stream = other, .r = 1};
        pthread_t b, a;
        ck_assert_int_eq(pthread_create(&b, NULL, held_thread, &bt), 0);
        for (int i = 0; i < 1000 && usage().syncs_held == 0; i++) /* B is inside its ladder's synchronize */
                usleep(10000);
        ck_assert_int_eq(usage().syncs_held, 1);

        begin_thread_t at = {.returned = eventfd(0, EFD_CLOEXEC), .r = 1, .syncs_held = -1};
        ck_assert_int_ge(at.returned, 0);
        ck_assert_int_eq(pthread_create(&a, NULL, begin_thread, &at), 0);
        struct pollfd pfd = {.fd = at.returned, .events = POLLIN};
        ck_assert_int_ge(poll(&pfd, 1, 500), 0); /* returned (without the fix), or waits for B */
        unlink(hold);
        ck_assert_int_eq(pthread_join(a, NULL), 0);
        close(at.returned);
        unsetenv("FAKECUDA_HOLD_SYNC");
        ck_assert_int_eq(at.r, 0);
        ck_assert_msg(at.syncs_held == 0, "gpumem_capture_begin returned during the heap's own release");

        /* A's capture, declared by its begin above. */
        ck_assert_int_eq(cap.begin((CUstream) (uintptr_t) graph, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        late_write(graph, x, 8 * MiB, 0, 0xab);
        ck_assert_int_eq(pthread_join(b, NULL), 0);
        ck_assert_msg(bt.r == 0, "%s", bt.error); /* served through the ladder */
        CUgraph g = NULL;
        CUgraphExec exec = NULL;
        capture_end_replay(cu, &cap, graph, x, true, &g, &exec);
        ck_assert_int_eq(gpumem_free(c, bt.p), 0);
        capture_forget(cu, &cap, g, exec, c, x, NULL);
        destroy_stream(cu, graph);
        destroy_stream(cu, other);
        pop_device(cu, 0);
        finish(c);
}
END_TEST

static Suite *e2e_suite(void) {
        Suite *s = suite_create("cuda_e2e");
        TCase *tc = tcase_create("defects");
        tcase_add_checked_fixture(tc, setup, NULL);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_release_of_many_pages);
        tcase_add_test(tc, test_failed_unmap_keeps_memory_central);
        tcase_add_test(tc, test_failed_unmap_keeps_memory_local);
        tcase_add_test(tc, test_disconnect_with_holes);
        tcase_add_test(tc, test_release_waits_outside_the_lock);
        tcase_add_test(tc, test_pending_events_back_off);
        tcase_add_test(tc, test_lying_release_ack_caught_by_nvml);
        tcase_add_test(tc, test_unchecked_release_charged_until_session_ends_central);
        tcase_add_test(tc, test_unchecked_release_charged_until_session_ends_local);
        tcase_add_test(tc, test_liar_held_to_quota_central);
        tcase_add_test(tc, test_liar_held_to_quota_local);
        tcase_add_test(tc, test_first_liar_held_until_driver_confirms);
        tcase_add_test(tc, test_lying_return_caught_by_nvml);
        tcase_add_test(tc, test_own_device_memory_does_not_hold_returns);
        tcase_add_test(tc, test_oom_figures_consistent);
        tcase_add_test(tc, test_client_finds_daemon_gpu);
        tcase_add_test(tc, test_client_refuses_unseen_gpu);
        tcase_add_test(tc, test_exclusive_process_mode);
        tcase_add_test(tc, test_granularity_segments);
        tcase_add_test(tc, test_granularity_pages);
        tcase_add_test(tc, test_trim_waits_for_queued_kernel);
        tcase_add_test(tc, test_reclaim_waits_for_queued_kernel);
        tcase_add_test(tc, test_oom_ladder_waits_for_queued_kernel);
        tcase_add_test(tc, test_gc_waits_for_queued_kernel);
        tcase_add_test(tc, test_max_split_waits_for_queued_kernel);
        tcase_add_test(tc, test_disconnect_waits_for_queued_kernel);
        tcase_add_test(tc, test_release_of_many_streams_waits_for_all);
        tcase_add_test(tc, test_record_stream_no_early_reuse);
        tcase_add_test(tc, test_default_stream_event_on_daemon_device);
        tcase_add_test(tc, test_capture_survives_library_calls);
        tcase_add_test(tc, test_capture_miss_skips_the_ladder);
        tcase_add_test(tc, test_capture_miss_skips_the_ladder_central);
        tcase_add_test(tc, test_capture_of_per_thread_stream_seen_local);
        tcase_add_test(tc, test_capture_of_per_thread_stream_seen_central);
        tcase_add_test(tc, test_capture_miss_moves_no_page_local);
        tcase_add_test(tc, test_capture_miss_moves_no_page_central);
        tcase_add_test(tc, test_capture_free_waits_for_its_end);
        tcase_add_test(tc, test_graph_replay_shows_reuse_hazard);
        suite_add_tcase(s, tc);
        /* Another thread's capture against the service thread's releases. */
        TCase *held = tcase_create("capture_releases");
        tcase_add_checked_fixture(held, setup, NULL);
        tcase_set_timeout(held, 120);
        tcase_add_test(held, test_declared_capture_holds_off_releases);
        tcase_add_test(held, test_seen_capture_holds_off_releases);
        tcase_add_test(held, test_declared_capture_holds_off_ladder);
        tcase_add_test(held, test_seen_capture_holds_off_ladder);
        tcase_add_test(held, test_declared_capture_holds_off_central_ladder);
        tcase_add_test(held, test_seen_capture_holds_off_central_ladder);
        tcase_add_test(held, test_declared_capture_holds_off_central_release);
        tcase_add_test(held, test_seen_capture_holds_off_central_release);
        tcase_add_test(held, test_declared_capture_refuses_sleep);
        tcase_add_test(held, test_seen_capture_refuses_sleep);
        tcase_add_test(held, test_capture_waits_for_heaps_own_release);
        suite_add_tcase(s, held);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(e2e_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
