/* End-to-end tests: a real gpumemd, real client processes linked against
 * libgpumem, real sockets and fd passing. The backend comes from
 * $GPUMEM_TEST_BACKEND (host by default; cuda over the emulated driver). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"
#ifdef GPUMEM_HAVE_CUDA
#include "cuda_loader.h"
#endif

#define MiB (1024ull * 1024ull)

static gm_test_daemon_t daemon_;

static void setup(void) {
        gm_test_daemon_start(&daemon_, "256M", NULL);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static gpumem_client *connect_ok(void) {
        gpumem_client *c = NULL;
        int r = gpumem_connect(daemon_.socket_path, &c);
        ck_assert_msg(r == 0, "gpumem_connect: %s", gpumem_strerror(r));
        return c;
}

static int wait_child(pid_t pid) {
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

START_TEST(test_alloc_write_free_stats) {
        gpumem_client *c = connect_ok();
        static const size_t sizes[] = {1, 511, 512, 4096, 100000, 1 * MiB, 1 * MiB + 1, 3 * MiB, 12 * MiB};
        void *ptrs[sizeof(sizes) / sizeof(sizes[0])];
        int64_t requested = 0;
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
                int r = gpumem_alloc(c, sizes[i], 0, &ptrs[i]);
                ck_assert_msg(r == 0, "alloc %zu: %s (%s)", sizes[i], gpumem_strerror(r), gpumem_last_error(c));
                gm_test_fill(ptrs[i], sizes[i], i + 1); /* the whole block is writable */
                requested += (int64_t) sizes[i];
        }
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                ck_assert(gm_test_verify(ptrs[i], sizes[i], i + 1));
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "requested_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, requested);
        ck_assert_str_eq(gpumem_last_error(c), ""); /* a success leaves no failure message */
        ck_assert_int_eq(gpumem_stat(c, "allocation.all.current", &v), 0);
        ck_assert_int_eq(v, 9);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocation.all.current"), 9);
        ck_assert_int_eq(gpumem_stat(c, "no.such.stat", &v), -ENOENT);
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                ck_assert_int_eq(gpumem_free(c, ptrs[i]), 0);
        ck_assert_int_eq(gpumem_stat(c, "allocated_bytes.all.current", &v), 0);
        ck_assert_int_eq(gpumem_stat(c, "active_bytes.all.current", &v), 0);
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_gt(v, 0); /* freed blocks stay cached */
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_uint_eq(released, (uint64_t) v);
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
}
END_TEST

START_TEST(test_local_refusals) {
        gpumem_client *c = connect_ok();
        void *p;
        int x;
        ck_assert_int_eq(gpumem_alloc(c, 0, 0, &p), -EINVAL);
        ck_assert_int_eq(gpumem_free(c, &x), -EINVAL);
        ck_assert_str_ne(gpumem_last_error(c), "");
        ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gpumem_free(c, p), -EINVAL); /* double free */
        ck_assert_int_eq(gpumem_alloc(c, 1ull << 40, 0, &p), -ENOMEM);
        ck_assert_ptr_nonnull(strstr(gpumem_last_error(c), "capacity"));
        gpumem_disconnect(c);
}
END_TEST

/* Several processes write patterns into many blocks at once; each verifies
 * its blocks after all others have written: blocks never overlap. */
#define N_PROCS 4
#define N_BLOCKS 48
START_TEST(test_processes_never_overlap) {
        int go[2], ready[2];
        ck_assert_int_eq(pipe(go), 0);
        ck_assert_int_eq(pipe(ready), 0);
        pid_t pids[N_PROCS];
        for (int p = 0; p < N_PROCS; p++) {
                pids[p] = fork();
                ck_assert_int_ge(pids[p], 0);
                if (pids[p] == 0) {
                        gpumem_client *c = connect_ok();
                        void *ptr[N_BLOCKS];
                        size_t size[N_BLOCKS];
                        for (int i = 0; i < N_BLOCKS; i++) {
                                size[i] = 1000 + (size_t) ((i * 7919 + p * 104729) % (3 * MiB));
                                if (gpumem_alloc(c, size[i], (uint64_t) (i % 2), &ptr[i]) != 0)
                                        _exit(10);
                                gm_test_fill(ptr[i], size[i], (uint64_t) p << 32 | (uint64_t) i);
                        }
                        /* Free every third block and reallocate: reuse must not overlap either. */
                        for (int i = 0; i < N_BLOCKS; i += 3) {
                                if (gpumem_free(c, ptr[i]) != 0 || gpumem_alloc(c, size[i], 0, &ptr[i]) != 0)
                                        _exit(11);
                                gm_test_fill(ptr[i], size[i], (uint64_t) p << 32 | (uint64_t) i);
                        }
                        char ch = 'r';
                        if (write(ready[1], &ch, 1) != 1 || read(go[0], &ch, 1) != 1)
                                _exit(12);
                        for (int i = 0; i < N_BLOCKS; i++)
                                if (!gm_test_verify(ptr[i], size[i], (uint64_t) p << 32 | (uint64_t) i))
                                        _exit(13);
                        for (int i = 0; i < N_BLOCKS; i++)
                                if (gpumem_free(c, ptr[i]) != 0)
                                        _exit(14);
                        gpumem_disconnect(c);
                        _exit(0);
                }
        }
        for (int p = 0; p < N_PROCS; p++) {
                char ch;
                ck_assert_int_eq(read(ready[0], &ch, 1), 1);
        }
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocation.all.current"), N_PROCS * N_BLOCKS);
        char go_all[N_PROCS];
        memset(go_all, 'g', sizeof(go_all));
        ck_assert_int_eq(write(go[1], go_all, sizeof(go_all)), N_PROCS);
        for (int p = 0; p < N_PROCS; p++)
                ck_assert_int_eq(wait_child(pids[p]), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "allocated_bytes.all.current", 0), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "segment.all.current"), 0);
}
END_TEST

typedef struct thread_arg {
        gpumem_client *c;
        int id;
        int failures;
} thread_arg_t;

static void *thread_main(void *p) {
        thread_arg_t *a = p;
        for (int round = 0; round < 200; round++) {
                void *ptr[4];
                size_t size = 256 + (size_t) ((round * 131 + a->id * 977) % 300000);
                for (int i = 0; i < 4; i++) {
                        if (gpumem_alloc(a->c, size, 0, &ptr[i]) != 0) {
                                a->failures++;
                                return NULL;
                        }
                        gm_test_fill(ptr[i], size, (uint64_t) a->id << 40 | (uint64_t) round << 8 | (uint64_t) i);
                }
                for (int i = 0; i < 4; i++) {
                        if (!gm_test_verify(ptr[i], size,
                                            (uint64_t) a->id << 40 | (uint64_t) round << 8 | (uint64_t) i))
                                a->failures++;
                        if (gpumem_free(a->c, ptr[i]) != 0)
                                a->failures++;
                }
        }
        return NULL;
}

START_TEST(test_threads_share_a_client) {
        gpumem_client *c = connect_ok();
        enum { N_THREADS = 8 };
        pthread_t th[N_THREADS];
        thread_arg_t args[N_THREADS];
        for (int i = 0; i < N_THREADS; i++) {
                args[i] = (thread_arg_t){.c = c, .id = i};
                ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
        }
        for (int i = 0; i < N_THREADS; i++) {
                pthread_join(th[i], NULL);
                ck_assert_int_eq(args[i].failures, 0);
        }
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "allocation.all.allocated", &v), 0);
        ck_assert_int_eq(v, N_THREADS * 200 * 4);
        ck_assert_int_eq(gpumem_stat(c, "allocation.all.current", &v), 0);
        ck_assert_int_eq(v, 0);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_sigkilled_client_leaks_nothing) {
        int ready[2];
        ck_assert_int_eq(pipe(ready), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                gpumem_client *c = connect_ok();
                void *p;
                for (int i = 0; i < 10; i++) /* >= 10 MiB: one segment (one fd) each */
                        if (gpumem_alloc(c, 12 * MiB, 0, &p) != 0)
                                _exit(1);
                char ch = 'r';
                if (write(ready[1], &ch, 1) != 1)
                        _exit(2);
                pause();
                _exit(0);
        }
        char ch;
        ck_assert_int_eq(read(ready[0], &ch, 1), 1);
        int fds_with_client = gm_test_count_fds(daemon_.pid);
        ck_assert_int_gt(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), 0);
        ck_assert_int_eq(kill(pid, SIGKILL), 0);
        ck_assert_int_eq(wait_child(pid), 128 + SIGKILL);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocation.all.current"), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "segment.all.current"), 0);
        /* The segments' fds and the connection are closed in the daemon. */
        ck_assert_int_le(gm_test_count_fds(daemon_.pid), fds_with_client - 10);
        /* and the capacity is whole again: one client can take nearly all of it. */
        gpumem_client *c = connect_ok();
        void *big;
        ck_assert_int_eq(gpumem_alloc(c, 250 * MiB, 0, &big), 0);
        gpumem_disconnect(c);
}
END_TEST

/* ---- bad input over raw sockets: a clear error, and the daemon keeps serving ---- */

static void assert_daemon_serves(void) {
        gpumem_client *c = connect_ok();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 1000, 0, &p), 0);
        gm_test_fill(p, 1000, 7);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
}

static void assert_error_then_closed(int fd, int code) {
        Gpumem__Envelope *e = gm_test_raw_recv(fd);
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(e->error->code, code);
        ck_assert_str_ne(e->error->message, "");
        gm_msg_free(e);
        ck_assert_ptr_null(gm_test_raw_recv(fd)); /* the daemon closed the connection */
}

START_TEST(test_garbage_packet) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        static const char junk[] = "\xff\xff\xff\xff garbage that is no protobuf";
        ck_assert_int_eq(gm_ipc_send(fd, junk, sizeof(junk), NULL, 0), 0);
        assert_error_then_closed(fd, EBADMSG);
        close(fd);
        assert_daemon_serves();
}
END_TEST

START_TEST(test_oversized_packet) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        size_t len = GM_IPC_MAX_PACKET_DEFAULT + 1;
        char *big = calloc(1, len);
        ck_assert_int_eq(gm_ipc_send(fd, big, len, NULL, 0), 0);
        free(big);
        assert_error_then_closed(fd, EMSGSIZE);
        close(fd);
        assert_daemon_serves();
}
END_TEST

START_TEST(test_unexpected_fds_are_closed) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        int before = gm_test_count_fds(daemon_.pid);
        int sent[3];
        for (int i = 0; i < 3; i++)
                sent[i] = memfd_create("junk", MFD_CLOEXEC);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 4096;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 5;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        ck_assert_int_eq(gm_msg_send(fd, &env, sent, 3, GM_IPC_MAX_PACKET_DEFAULT), 0);
        gm_close_fds(sent, 3);
        assert_error_then_closed(fd, EBADMSG);
        close(fd);
        /* Neither the fds nor the connection stay open in the daemon. */
        int after = gm_test_count_fds(daemon_.pid);
        for (int i = 0; i < 200 && after >= before; i++) {
                usleep(10000);
                after = gm_test_count_fds(daemon_.pid);
        }
        ck_assert_int_lt(after, before);
        assert_daemon_serves();
}
END_TEST

START_TEST(test_protocol_errors_keep_session) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        /* Unknown block id: refused, session stays. */
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = 424242;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 7;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        Gpumem__Envelope *reply = gm_test_raw_call(fd, &env);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, EINVAL);
        gm_msg_free(reply);
        /* Size 0 and size above capacity. */
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.request_id = 8;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        reply = gm_test_raw_call(fd, &env);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, EINVAL);
        gm_msg_free(reply);
        alloc.size = 1ull << 50;
        env.request_id = 9;
        reply = gm_test_raw_call(fd, &env);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, ENOMEM);
        gm_msg_free(reply);
        /* A real allocation, then a double free over the wire. */
        alloc.size = 4096;
        env.request_id = 10;
        reply = gm_test_raw_call(fd, &env);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        f.block_id = reply->alloc_reply->block_id;
        gm_msg_free(reply);
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        env.request_id = 11;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0); /* no reply on success */
        env.request_id = 12;
        reply = gm_test_raw_call(fd, &env);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(reply->error->code, EINVAL);
        gm_msg_free(reply);
        /* A message that is not a request closes the session. */
        Gpumem__TrimReply tr = GPUMEM__TRIM_REPLY__INIT;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.request_id = 13;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM_REPLY;
        env.trim_reply = &tr;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
        assert_error_then_closed(fd, EPROTO);
        close(fd);
        assert_daemon_serves();
}
END_TEST

START_TEST(test_hello_required_and_version_checked) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = 4096;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 1;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
        assert_error_then_closed(fd, EPROTO);
        close(fd);

        fd = gm_test_raw_connect(daemon_.socket_path);
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = 99;
        env = (Gpumem__Envelope) GPUMEM__ENVELOPE__INIT;
        env.request_id = 1;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        ck_assert_int_eq(gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT), 0);
        assert_error_then_closed(fd, EPROTONOSUPPORT);
        close(fd);
        assert_daemon_serves();
}
END_TEST

/* A client whose cache holds most of the device gives it back (through its
 * service thread, while its main thread sleeps) when another needs it. */
START_TEST(test_idle_cache_reclaimed_for_another_client) {
        int ready[2], done[2];
        ck_assert_int_eq(pipe(ready), 0);
        ck_assert_int_eq(pipe(done), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                gpumem_client *c = connect_ok();
                void *p[10];
                for (int i = 0; i < 10; i++)
                        if (gpumem_alloc(c, 20 * MiB, 0, &p[i]) != 0)
                                _exit(1);
                for (int i = 0; i < 10; i++)
                        if (gpumem_free(c, p[i]) != 0)
                                _exit(2);
                int64_t reserved;
                if (gpumem_stat(c, "reserved_bytes.all.current", &reserved) != 0 || reserved != 200 * (int64_t) MiB)
                        _exit(3);
                char ch = 'r';
                if (write(ready[1], &ch, 1) != 1 || read(done[0], &ch, 1) != 1)
                        _exit(4);
                if (gpumem_stat(c, "reserved_bytes.all.current", &reserved) != 0 || reserved != 0)
                        _exit(5);
                gpumem_disconnect(c);
                _exit(0);
        }
        char ch;
        ck_assert_int_eq(read(ready[0], &ch, 1), 1);
        gpumem_client *c = connect_ok();
        void *p;
        int r = gpumem_alloc(c, 200 * MiB, 0, &p);
        ck_assert_msg(r == 0, "alloc after reclaim: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        gm_test_fill(p, 200 * MiB, 99);
        ck_assert(gm_test_verify(p, 200 * MiB, 99));
        ck_assert_int_eq(write(done[1], "d", 1), 1);
        ck_assert_int_eq(wait_child(pid), 0);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_oom_names_the_cause) {
        gpumem_client *c = connect_ok();
        void *p[20];
        int n = 0;
        while (n < 20 && gpumem_alloc(c, 20 * MiB, 0, &p[n]) == 0)
                n++;
        ck_assert_int_eq(n, 12); /* 256 MiB capacity / 20 MiB blocks, all live */
        void *q;
        ck_assert_int_eq(gpumem_alloc(c, 20 * MiB, 0, &q), -ENOMEM);
        const char *msg = gpumem_last_error(c);
        fprintf(stderr, "oom message: %s\n", msg);
        ck_assert_ptr_nonnull(strstr(msg, "CUDA out of memory. Tried to allocate 20.00 MiB."));
        ck_assert_ptr_nonnull(strstr(msg, "GPU 0 has a total capacity of 256.00 MiB"));
        if (strcmp(gm_test_backend(), "host") == 0) /* cuda: the driver's free memory, beyond --capacity */
                ck_assert_ptr_nonnull(strstr(msg, "of which 16.00 MiB is free"));
        ck_assert_ptr_nonnull(strstr(msg, "Of the allocated memory 240.00 MiB is allocated by PyTorch"));
        int64_t ooms;
        ck_assert_int_eq(gpumem_stat(c, "num_ooms", &ooms), 0);
        ck_assert_int_ge(ooms, 1);
        for (int i = 0; i < n; i++)
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_forked_child_gets_its_own_session) {
        gpumem_client *c = connect_ok();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &p), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                void *q;
                int64_t v;
                if (strcmp(gm_test_backend(), "cuda") == 0) {
                        /* CUDA cannot be used in a child forked after the parent
                         * initialised it: the first call is refused, clearly,
                         * before any driver call; the parent's session is
                         * untouched (checked below). */
                        int r = gpumem_free(c, p);
                        fprintf(stderr, "forked child on cuda: %d %s\n", r, gpumem_last_error(c));
                        _exit(r == -EOPNOTSUPP && strstr(gpumem_last_error(c), "fork") ? 0 : 2);
                }
                /* The parent's block is not the child's. */
                if (gpumem_free(c, p) != -EINVAL)
                        _exit(1);
                int r = gpumem_alloc(c, 8192, 0, &q);
                if (r != 0)
                        _exit(2);
                gm_test_fill(q, 8192, 5);
                if (gpumem_stat(c, "allocation.all.current", &v) != 0 || v != 1)
                        _exit(3);
                _exit(0);
        }
        ck_assert_int_eq(wait_child(pid), 0);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "allocation.all.current", &v), 0);
        ck_assert_int_eq(v, 1);
        gm_test_fill(p, 4096, 6);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_gpumemctl_stats_and_trim) {
        gpumem_client *c = connect_ok();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 3 * MiB, 0, &p), 0);
        char out[16384];
        const char *json_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), json_argv), 0);
        ck_assert_ptr_nonnull(strstr(out, "\"allocated_bytes.all.current\": 3145728"));
        ck_assert_ptr_nonnull(strstr(out, "\"requested_bytes.all.current\": 3145728"));
        ck_assert_ptr_nonnull(strstr(out, "\"active_bytes.all.current\": 3145728"));
        ck_assert_ptr_nonnull(strstr(out, "\"reserved_bytes.all.current\": 20971520"));
        ck_assert_ptr_nonnull(strstr(out, "\"segment.all.current\": 1"));
        ck_assert_ptr_nonnull(strstr(out, "\"allocation.all.current\": 1"));
        const char *text_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), text_argv), 0);
        ck_assert_ptr_nonnull(strstr(out, "PyTorch CUDA memory summary"));
        ck_assert_ptr_nonnull(strstr(out, "| Allocated memory      |   3072 KiB |"));
        ck_assert_int_eq(gpumem_free(c, p), 0);
        const char *trim_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "trim", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), trim_argv), 0);
        ck_assert_ptr_nonnull(strstr(out, "(20971520 bytes)"));
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 0);
        gpumem_disconnect(c);
        const char *bad_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "frobnicate", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), bad_argv), 2);
        const char *gone_argv[] = {GPUMEMCTL_BIN, "-s", "/nonexistent/sock", "stats", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), gone_argv), 3);
}
END_TEST

START_TEST(test_daemon_gone) {
        /* Re-attach after a restart is tried for this long before giving up. */
        setenv("GPUMEM_RECONNECT_TIMEOUT_MS", "300", 1);
        gpumem_client *c = connect_ok();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &p), 0);
        gm_test_fill(p, 4096, 1);
        gm_test_daemon_stop(&daemon_);
        /* The client's memory stays readable; requests report the daemon gone. */
        ck_assert(gm_test_verify(p, 4096, 1));
        void *q;
        if (gpumem_heap(c) == GPUMEM_HEAP_LOCAL) {
                /* The heap is here: its cache still serves; new memory needs the daemon. */
                ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &q), 0);
                ck_assert_int_eq(gpumem_free(c, q), 0);
                ck_assert_int_eq(gpumem_alloc(c, 64 * MiB, 0, &q), -ECONNRESET);
        } else {
                ck_assert_int_eq(gpumem_alloc(c, 4096, 0, &q), -ECONNRESET);
        }
        gpumem_disconnect(c);
        gm_test_daemon_start(&daemon_, "256M", NULL); /* for teardown */
}
END_TEST

/* History and snapshots through the daemon: the files load in Python's pickle
 * and json and pass the viewer checks (tests/lib/snapshot_check.py). */
START_TEST(test_history_and_snapshots) {
        char out[16384], file[400], cmd[1024];
        const char *on_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "history", "on", "--max-entries",
                                 "1000",        NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), on_argv), 0);
        ck_assert_ptr_nonnull(strstr(out, "history on (max 1000 entries"));
        gpumem_client *c = connect_ok();
        void *p[4];
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(gpumem_alloc(c, (size_t) (i + 1) * 300000, (uint64_t) i % 2, &p[i]), 0);
        ck_assert_int_eq(gpumem_free(c, p[1]), 0);
        ck_assert_int_eq(gpumem_alloc(c, 30 * MiB, 0, &p[1]), 0);
        /* By hand: 300000 and 900000 B share a small 2 MiB segment on stream 0,
         * 600000 B gets one on stream 1, 1200000 B a 20 MiB large one, 30 MiB
         * its own: 4 segments. */
        for (int f = 0; f < 2; f++) {
                const char *format = f ? "json" : "pickle";
                snprintf(file, sizeof(file), "%s/snap.%s", daemon_.dir, format);
                const char *snap_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "snapshot", "-o", file, "--format",
                                           format,        NULL};
                ck_assert_int_eq(gm_test_run(out, sizeof(out), snap_argv), 0);
                snprintf(cmd, sizeof(cmd),
                         "%s %s %s --segments 4 --states active_allocated,inactive --actions "
                         "segment_alloc,alloc,segment_alloc,alloc,alloc,segment_alloc,alloc,free_requested,"
                         "free_completed,segment_alloc,alloc",
                         GM_PYTHON3, GM_SNAPSHOT_CHECK, file);
                ck_assert_msg(system(cmd) == 0, "snapshot check failed: %s", cmd);
        }
        /* Off clears the history; the snapshot then has no trace entries. */
        const char *off_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "history", "off", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), off_argv), 0);
        snprintf(file, sizeof(file), "%s/snap2.json", daemon_.dir);
        const char *snap_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "snapshot", "-o", file, "--format",
                                   "json",        NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), snap_argv), 0);
        snprintf(cmd, sizeof(cmd),
                 "%s -c \"import json,sys; d=json.load(open('%s')); "
                 "sys.exit(0 if d['device_traces'][0] == [] and len(d['segments']) == 4 else 1)\"",
                 GM_PYTHON3, file);
        ck_assert_int_eq(system(cmd), 0);
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_alloc_conf_at_run_time) {
        char out[4096];
        gpumem_client *early = connect_ok(); /* connected before the change: told of it */
        const char *bad_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "alloc-conf", "max_split_size_mb:19", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), bad_argv), 1);
        const char *set_argv[] = {GPUMEMCTL_BIN,
                                  "-s",
                                  daemon_.socket_path,
                                  "alloc-conf",
                                  "max_split_size_mb:64,roundup_power2_divisions:4",
                                  NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), set_argv), 0);
        ck_assert_str_eq(out, "max_split_size_mb:64,roundup_power2_divisions:4\n");
        gpumem_client *c = connect_ok();
        void *p;
        /* 600 KiB with 4 divisions rounds to a 128 KiB step: 640 KiB. */
        ck_assert_int_eq(gpumem_alloc(c, 600 * 1024, 0, &p), 0);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "allocated_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 640 * 1024);
        ck_assert_int_eq(gpumem_stat(c, "max_split_size", &v), 0);
        ck_assert_int_eq(v, 64 * (int64_t) MiB);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
        for (int i = 0; i < 500 && (gpumem_stat(early, "max_split_size", &v) != 0 || v != 64 * (int64_t) MiB); i++)
                usleep(10000);
        ck_assert_int_eq(v, 64 * (int64_t) MiB);
        ck_assert_int_eq(gpumem_alloc(early, 600 * 1024, 0, &p), 0);
        ck_assert_int_eq(gpumem_stat(early, "allocated_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 640 * 1024); /* its heap rounds as the new settings say */
        ck_assert_int_eq(gpumem_free(early, p), 0);
        gpumem_disconnect(early);
        const char *get_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "alloc-conf", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), get_argv), 0);
        ck_assert_str_eq(out, "max_split_size_mb:64,roundup_power2_divisions:4\n");
        /* An empty conf, set, restores the defaults (as the protocol says). */
        const char *reset_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "alloc-conf", "", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), reset_argv), 0);
        ck_assert_str_eq(out, "\n");
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "max_split_size"), -1);
}
END_TEST

START_TEST(test_reset_stats) {
        gpumem_client *c = connect_ok();
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 5 * MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocated_bytes.all.peak"), 5 * (int64_t) MiB);
        char out[4096];
        const char *peak_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--reset-peak", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), peak_argv), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocated_bytes.all.peak"), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocation.all.allocated"), 1);
        const char *acc_argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--reset-accumulated", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), acc_argv), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "allocation.all.allocated"), 0);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), 20 * (int64_t) MiB);
        gpumem_disconnect(c);
}
END_TEST

/* Polls a session statistic until it equals `want` (or ~10 s pass). */
static int64_t wait_session_stat(gpumem_client *c, const char *name, int64_t want) {
        int64_t v = -1;
        for (int i = 0; i < 1000; i++) {
                ck_assert_int_eq(gpumem_stat(c, name, &v), 0);
                if (v == want)
                        break;
                usleep(10000);
        }
        return v;
}

/* Stream-ordered frees: on cuda the block stays active (active_pending_free)
 * until the events on the used streams complete; the emulated driver holds
 * every event back while FAKECUDA_HOLD_EVENTS names an existing file. Host
 * memory has no device streams, so there the free completes at once. */
/* Two device streams: on cuda real CUstreams of the primary context (the
 * driver refuses anything else), on host any values. */
static void test_streams(bool cuda, uint64_t ret[2]) {
        ret[0] = 7;
        ret[1] = 9;
#ifdef GPUMEM_HAVE_CUDA
        const gm_cuda_t *cu;
        CUcontext ctx;
        if (!cuda)
                return;
        ck_assert_int_eq(gm_cuda_load(&cu), 0);
        ck_assert_int_eq(cu->DevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        ck_assert_int_eq(cu->CtxPushCurrent(ctx), CUDA_SUCCESS);
        for (int i = 0; i < 2; i++) {
                CUstream s;
                ck_assert_int_eq(cu->StreamCreate(&s, 0), CUDA_SUCCESS);
                ret[i] = (uint64_t) (uintptr_t) s;
        }
        ck_assert_int_eq(cu->CtxPopCurrent(&ctx), CUDA_SUCCESS);
#endif
}

START_TEST(test_stream_ordered_free) {
        bool cuda = strcmp(gm_test_backend(), "cuda") == 0;
        char hold[400];
        snprintf(hold, sizeof(hold), "%s/hold-events", daemon_.dir);
        int fd = open(hold, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        setenv("FAKECUDA_HOLD_EVENTS", hold, 1); /* read when this process loads the driver */
        gpumem_client *c = connect_ok();
        void *p, *q;
        int x;
        ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &p), 0);
        ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &q), 0);
        ck_assert_int_eq(gpumem_record_stream(c, &x, 7), -EINVAL);
        uint64_t streams[2];
        test_streams(cuda, streams);
        ck_assert_int_eq(gpumem_record_stream(c, p, streams[0]), 0);
        ck_assert_int_eq(gpumem_free(c, p), 0);
        ck_assert_int_eq(gpumem_free_async(c, q, streams[1]), 0);
        ck_assert_int_eq(gpumem_free(c, q), -EINVAL); /* already freed */
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "allocated_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 0);
        ck_assert_int_eq(gpumem_stat(c, "active_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, cuda ? 2 * (int64_t) MiB : 0);
        if (cuda) {
                usleep(50000);
                ck_assert_int_eq(gpumem_stat(c, "active_bytes.all.current", &v), 0);
                ck_assert_int_eq(v, 2 * (int64_t) MiB); /* still held back */
        }
        ck_assert_int_eq(unlink(hold), 0);
        ck_assert_int_eq(wait_session_stat(c, "active_bytes.all.current", 0), 0);
        ck_assert_int_eq(gpumem_stat(c, "requested_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 0);
        gpumem_disconnect(c);
}
END_TEST

/* ---- the cuda backend's faults, injected through the emulated driver ---- */

static void start_with_env(const char *name, const char *value) {
        setenv(name, value, 1);
        gm_test_daemon_start(&daemon_, "256M", NULL);
        unsetenv(name); /* the daemon has it; the clients must not */
}

START_TEST(test_cuda_create_oom_is_retried) {
        start_with_env("FAKECUDA_FAIL_CREATE_AT", "2");
        gpumem_client *c = connect_ok();
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        /* The second cuMemCreate fails with out-of-memory: the retry ladder
         * releases the cache and tries again, which succeeds. */
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &q), 0);
        gm_test_fill(q, 12 * MiB, 3);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &v), 0);
        ck_assert_int_eq(v, 1);
        ck_assert_int_eq(gpumem_stat(c, "segment.all.current", &v), 0);
        ck_assert_int_eq(v, 2);
        gpumem_disconnect(c);
        gm_test_daemon_stop(&daemon_);
}
END_TEST

START_TEST(test_cuda_create_error_is_clear) {
        setenv("FAKECUDA_FAIL_CREATE_ERROR", "CUDA_ERROR_ILLEGAL_ADDRESS", 1);
        start_with_env("FAKECUDA_FAIL_CREATE_AT", "2");
        unsetenv("FAKECUDA_FAIL_CREATE_ERROR");
        gpumem_client *c = connect_ok();
        void *p, *q;
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        int r = gpumem_alloc(c, 12 * MiB, 0, &q);
        ck_assert_int_eq(r, -EIO);
        ck_assert_msg(strstr(gpumem_last_error(c), "CUDA_ERROR_ILLEGAL_ADDRESS"), "message: %s", gpumem_last_error(c));
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &q), 0); /* the daemon keeps serving */
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "reserved_bytes.all.current"), 24 * (int64_t) MiB);
        gpumem_disconnect(c);
        gm_test_daemon_stop(&daemon_);
}
END_TEST

static void check_client_map_fault(const char *variable) {
        gm_test_daemon_start(&daemon_, "256M", NULL);
        setenv(variable, "1", 1); /* read when this client process loads the driver */
        int fds_before = gm_test_count_fds(getpid());
        gpumem_client *c = connect_ok();
        void *p;
        int r = gpumem_alloc(c, 12 * MiB, 0, &p);
        if (gpumem_heap(c) == GPUMEM_HEAP_LOCAL && r == 0) {
                /* The heap's retry ladder runs in this process: the unmappable
                 * piece went back to the daemon and the retry got another. */
                int64_t v;
                ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &v), 0);
                ck_assert_int_eq(v, 1);
                ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
                ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", v), v);
                ck_assert_int_eq(gpumem_free(c, p), 0);
                gpumem_disconnect(c);
                ck_assert_int_eq(gm_test_count_fds(getpid()), fds_before);
                gm_test_daemon_stop(&daemon_);
                return;
        }
        ck_assert_int_lt(r, 0);
        ck_assert_msg(strstr(gpumem_last_error(c), "mapping memory from gpumemd failed"), "message: %s",
                      gpumem_last_error(c));
        /* The block went back and the unmappable segment was released. */
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "allocation.all.current", 0), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p), 0);
        gm_test_fill(p, 12 * MiB, 4);
        ck_assert(gm_test_verify(p, 12 * MiB, 4));
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_count_fds(getpid()), fds_before); /* nothing leaked here either */
        gm_test_daemon_stop(&daemon_);
}

START_TEST(test_cuda_import_failure) {
        check_client_map_fault("FAKECUDA_FAIL_IMPORT_AT");
}
END_TEST

START_TEST(test_cuda_map_failure) {
        check_client_map_fault("FAKECUDA_FAIL_MAP_AT");
}
END_TEST

/* ---- startup ---- */

START_TEST(test_backend_auto_without_gpu_uses_host) {
        gm_test_daemon_t d;
        setenv("GPUMEM_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        setenv("GPUMEM_TEST_BACKEND", "auto", 1);
        gm_test_daemon_start(&d, "64M", NULL);
        char cmd[512], out[4096];
        snprintf(cmd, sizeof(cmd), "%s", d.log_path);
        FILE *f = fopen(cmd, "re");
        ck_assert_ptr_nonnull(f);
        size_t n = fread(out, 1, sizeof(out) - 1, f);
        out[n] = '\0';
        fclose(f);
        ck_assert_msg(strstr(out, "using host"), "log: %s", out); /* logged before it listens */
        const char *argv[] = {GPUMEMCTL_BIN, "-s", d.socket_path, "stats", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        ck_assert_msg(strstr(out, "\"backend\": \"host\""), "stats: %s", out);
        gm_test_daemon_stop(&d);
}
END_TEST

START_TEST(test_no_binary_links_libcuda) {
        const char *bins[] = {GPUMEMD_BIN_PATH, GPUMEMCTL_BIN, GPUMEM_LIB_PATH};
        for (size_t i = 0; i < 3; i++) {
                char out[8192];
                const char *argv[] = {"/usr/bin/ldd", bins[i], NULL};
                ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
                ck_assert_msg(!strstr(out, "libcuda"), "%s links libcuda:\n%s", bins[i], out);
        }
}
END_TEST

START_TEST(test_bad_flags_refused) {
        char out[4096];
        const char *argv[] = {GPUMEMD_BIN_PATH, "--capacity", "lots", NULL};
        ck_assert_int_ne(gm_test_run(out, sizeof(out), argv), 0);
        const char *argv2[] = {GPUMEMD_BIN_PATH, "--alloc-conf", "max_split_size_mb:1",
                               "--socket",       "/tmp/x.sock",  NULL};
        ck_assert_int_ne(gm_test_run(out, sizeof(out), argv2), 0);
}
END_TEST

/* Expandable segments through the daemon: pages are separate pieces mapped
 * contiguously into one reserved range by the client, and trim unmaps them. */
START_TEST(test_expandable_segments) {
        gm_test_daemon_stop(&daemon_);
        static const char *const args[] = {"--alloc-conf", "expandable_segments:True", NULL};
        /* At most 4 fds a packet: a 6-page reply needs a MapSegments packet first. */
        gm_test_daemon_start_config(&daemon_, "256M", args, "max_fds = 4\n");
        gpumem_client *c = connect_ok();
        void *a, *b, *big;
        ck_assert_int_eq(gpumem_alloc(c, 30 * MiB, 0, &a), 0); /* 2 pages of 20 MiB */
        ck_assert_int_eq(gpumem_alloc(c, 5 * MiB, 0, &b), 0);  /* in the same range, after a */
        ck_assert_ptr_eq((char *) b, (char *) a + 30 * MiB);
        gm_test_fill(a, 30 * MiB, 1);
        gm_test_fill(b, 5 * MiB, 2);
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 40 * (int64_t) MiB);
        ck_assert_int_eq(gpumem_stat(c, "segment.all.current", &v), 0);
        ck_assert_int_eq(v, 0); /* mapped pages are not segments (PyTorch) */
        void *smalls[40];       /* the small pool's own range, 2 MiB pages */
        for (int i = 0; i < 40; i++)
                ck_assert_int_eq(gpumem_alloc(c, MiB, 0, &smalls[i]), 0);
        for (int i = 0; i < 40; i++)
                gm_test_fill(smalls[i], MiB, (uint64_t) i + 10);
        ck_assert_int_eq(gpumem_alloc(c, 120 * MiB, 0, &big), 0); /* 6 pages in one reply */
        gm_test_fill(big, 120 * MiB, 3);
        ck_assert(gm_test_verify(a, 30 * MiB, 1) && gm_test_verify(b, 5 * MiB, 2));
        for (int i = 0; i < 40; i++) {
                ck_assert(gm_test_verify(smalls[i], MiB, (uint64_t) i + 10));
                ck_assert_int_eq(gpumem_free(c, smalls[i]), 0);
        }
        ck_assert_int_eq(gpumem_free(c, a), 0);
        ck_assert_int_eq(gpumem_free(c, big), 0);
        uint64_t released;
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_int_gt(released, 0);
        ck_assert(gm_test_verify(b, 5 * MiB, 2)); /* the live block's pages stay */
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 20 * (int64_t) MiB); /* only b's page remains mapped */
        ck_assert_int_eq(gpumem_free(c, b), 0);
        ck_assert_int_eq(gpumem_trim(c, &released), 0);
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, 0);
        gpumem_disconnect(c);
        ck_assert_int_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
}
END_TEST

/* Reads the daemon's log whole into buf. */
static void read_log(char *buf, size_t len) {
        FILE *f = fopen(daemon_.log_path, "re");
        size_t n = f ? fread(buf, 1, len - 1, f) : 0;
        if (f)
                fclose(f);
        buf[n] = '\0';
}

/* SIGHUP takes a new alloc_conf into every statistic (device, tenant,
 * central and live local sessions, a session connected after it), and
 * reloading an unchanged file again and again stays quiet. */
START_TEST(test_sighup_reload_is_complete_and_repeatable) {
        gm_test_daemon_stop(&daemon_);
        char conf[256];
        snprintf(conf, sizeof(conf), "backend = %s\nalloc_conf = max_split_size_mb:32\n", gm_test_backend());
        gm_test_daemon_start_config(&daemon_, "256M", NULL, conf);
        gpumem_client *c = connect_ok();
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "max_split_size", &v), 0);
        ck_assert_int_eq(v, 32 * (int64_t) MiB);
        FILE *f = fopen(daemon_.config_path, "we");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "[daemon]\nstate_dir = %s/state\nbackend = %s\nalloc_conf = max_split_size_mb:64\n", daemon_.dir,
                gm_test_backend());
        fclose(f);
        static char log[1 << 16];
        for (int round = 1; round <= 3; round++) {
                ck_assert_int_eq(kill(daemon_.pid, SIGHUP), 0);
                size_t reloads = 0;
                for (int i = 0; i < 500 && reloads < (size_t) round; i++) {
                        read_log(log, sizeof(log));
                        reloads = gm_test_count(log, "configuration reloaded");
                        if (reloads < (size_t) round)
                                usleep(10000);
                }
                ck_assert_uint_eq(reloads, (size_t) round);
        }
        ck_assert_msg(!strstr(log, "need a restart"), "log: %s", log);
        ck_assert_int_eq(gm_test_device_stat(daemon_.socket_path, "max_split_size"), 64 * (int64_t) MiB);
        ck_assert_int_eq(gpumem_stat(c, "max_split_size", &v), 0);
        /* A local heap runs in its process: the daemon tells it (AllocConfUpdate),
         * and its service thread applies it; a central one changed at once. */
        for (int i = 0; i < 500 && v != 64 * (int64_t) MiB; i++) {
                usleep(10000);
                ck_assert_int_eq(gpumem_stat(c, "max_split_size", &v), 0);
        }
        ck_assert_int_eq(v, 64 * (int64_t) MiB);
        gpumem_client *late = connect_ok(); /* and a session connected after it */
        ck_assert_int_eq(gpumem_stat(late, "max_split_size", &v), 0);
        ck_assert_int_eq(v, 64 * (int64_t) MiB);
        gpumem_disconnect(late);
        char out[8192], tenant[32];
        snprintf(tenant, sizeof(tenant), "uid:%u", (unsigned) getuid());
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--json", "--tenant", tenant, NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        ck_assert_msg(strstr(out, "\"max_split_size\": 67108864"), "tenant stats: %s", out);
        gpumem_disconnect(c);
}
END_TEST

/* PyTorch's workload at its limit (its cache holds two freed big blocks,
 * a bigger one fits only once both are released): the allocation is served
 * at once, with no trim. A central heap's ladder releases its own cached
 * segments and the request waits for its client's ReleaseAck (the library's
 * unmap), a local heap unmaps them itself. `quota`: the tenant's quota is
 * the limit (200 MiB), else the device (256 MiB). Charged bytes are exact
 * and the statistics count one retry and no OOM, as PyTorch's do. */
static void check_miss_needs_own_cache(bool quota) {
        gm_test_daemon_start(&daemon_, "256M", NULL);
        gpumem_client *c = connect_ok();
        uint64_t big = quota ? 100 * MiB : 128 * MiB, want = quota ? 150 * MiB : 192 * MiB;
        if (quota)
                ck_assert_int_eq(gpumem_quota_set(c, "uid:0", 200 * MiB, true), 0);
        void *a, *b, *p;
        ck_assert_int_eq(gpumem_alloc(c, big, 0, &a), 0);
        ck_assert_int_eq(gpumem_alloc(c, big, 0, &b), 0);
        ck_assert_int_eq(gpumem_free(c, a), 0);
        ck_assert_int_eq(gpumem_free(c, b), 0);
        int64_t retries = -1, ooms = -1, v = -1;
        ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &retries), 0);
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, (int64_t) (2 * big)); /* both cached: at the limit */
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 2 * big);

        int r = gpumem_alloc(c, want, 0, &p);
        ck_assert_msg(r == 0, "alloc needing its own cache: %s (%s)", gpumem_strerror(r), gpumem_last_error(c));
        gm_test_fill(p, want, 42);
        ck_assert(gm_test_verify(p, want, 42));
        ck_assert_int_eq(gpumem_stat(c, "num_alloc_retries", &v), 0);
        ck_assert_int_eq(v, retries + 1);
        ck_assert_int_eq(gpumem_stat(c, "num_ooms", &ooms), 0);
        ck_assert_int_eq(ooms, 0);
        ck_assert_int_eq(gpumem_stat(c, "reserved_bytes.all.current", &v), 0);
        ck_assert_int_eq(v, (int64_t) want);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), want); /* exact: both went back */
        ck_assert_int_eq(gpumem_free(c, p), 0);
        gpumem_disconnect(c);
        gm_test_daemon_stop(&daemon_);
}

START_TEST(test_miss_at_quota_releases_own_cache) {
        check_miss_needs_own_cache(true);
}
END_TEST

START_TEST(test_miss_on_full_device_releases_own_cache) {
        check_miss_needs_own_cache(false);
}
END_TEST

/* A central client that never acknowledges the release of its own cache
 * (a raw connection that does not unmap): the allocation that waits for it
 * is refused at park_timeout_ms, and the refusal says what it waited for;
 * the memory stays charged until the session ends. */
START_TEST(test_own_release_never_acknowledged_is_refused_clearly) {
        gm_test_daemon_start_config(&daemon_, "256M", NULL, "park_timeout_ms = 300\n");
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(fd, false);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        alloc.size = 128 * MiB;
        uint64_t blocks[2];
        for (int i = 0; i < 2; i++) {
                env.request_id = 10 + (uint64_t) i;
                Gpumem__Envelope *reply = gm_test_raw_call(fd, &env);
                ck_assert_ptr_nonnull(reply);
                ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
                blocks[i] = reply->alloc_reply->block_id;
                gm_msg_free(reply);
        }
        for (int i = 0; i < 2; i++) {
                Gpumem__Free f = GPUMEM__FREE__INIT;
                f.block_id = blocks[i];
                gm_test_raw_send_body(fd, 20 + (uint64_t) i, GPUMEM__ENVELOPE__BODY_FREE, &f);
        }
        alloc.size = 192 * MiB;
        gm_test_raw_send_body(fd, 30, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        Gpumem__Envelope *e = gm_test_raw_await_body(fd, GPUMEM__ENVELOPE__BODY_RELEASE_REQUEST);
        ck_assert_uint_eq(e->release_request->n_ranges, 2); /* its own two segments */
        gm_msg_free(e);
        e = gm_test_raw_await_body(fd, GPUMEM__ENVELOPE__BODY_ERROR); /* not acknowledged */
        ck_assert_uint_eq(e->request_id, 30);
        ck_assert_int_eq(e->error->code, ENOMEM);
        ck_assert_msg(strstr(e->error->message, "256.00 MiB of this session's own cache was released, but its client "
                                                "has not acknowledged unmapping it (ReleaseAck)"),
                      "%s", e->error->message);
        gm_msg_free(e);
        ck_assert_uint_eq(gm_test_tenant_charged(daemon_.socket_path, "uid:0"), 256 * MiB); /* still mapped */
        close(fd);
        ck_assert_uint_eq(gm_test_wait_device_stat(daemon_.socket_path, "reserved_bytes.all.current", 0), 0);
        gm_test_daemon_stop(&daemon_);
}
END_TEST

static Suite *integration_suite(void) {
        Suite *s = suite_create("integration");
        TCase *tc = tcase_create("broker");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_alloc_write_free_stats);
        tcase_add_test(tc, test_local_refusals);
        tcase_add_test(tc, test_processes_never_overlap);
        tcase_add_test(tc, test_threads_share_a_client);
        tcase_add_test(tc, test_sigkilled_client_leaks_nothing);
        tcase_add_test(tc, test_garbage_packet);
        tcase_add_test(tc, test_oversized_packet);
        tcase_add_test(tc, test_unexpected_fds_are_closed);
        tcase_add_test(tc, test_protocol_errors_keep_session);
        tcase_add_test(tc, test_hello_required_and_version_checked);
        tcase_add_test(tc, test_idle_cache_reclaimed_for_another_client);
        tcase_add_test(tc, test_oom_names_the_cause);
        tcase_add_test(tc, test_forked_child_gets_its_own_session);
        tcase_add_test(tc, test_gpumemctl_stats_and_trim);
        tcase_add_test(tc, test_daemon_gone);
        tcase_add_test(tc, test_history_and_snapshots);
        tcase_add_test(tc, test_alloc_conf_at_run_time);
        tcase_add_test(tc, test_reset_stats);
        tcase_add_test(tc, test_stream_ordered_free);
        tcase_add_test(tc, test_expandable_segments);
        tcase_add_test(tc, test_sighup_reload_is_complete_and_repeatable);
        suite_add_tcase(s, tc);

        TCase *own = tcase_create("own_cache"); /* each test starts its daemon */
        tcase_set_timeout(own, 120);
        tcase_add_test(own, test_miss_at_quota_releases_own_cache);
        tcase_add_test(own, test_miss_on_full_device_releases_own_cache);
        tcase_add_test(own, test_own_release_never_acknowledged_is_refused_clearly);
        suite_add_tcase(s, own);

        if (strcmp(gm_test_backend(), "cuda") == 0) {
                TCase *faults = tcase_create("cuda_faults");
                tcase_set_timeout(faults, 120);
                tcase_add_test(faults, test_cuda_create_oom_is_retried);
                tcase_add_test(faults, test_cuda_create_error_is_clear);
                tcase_add_test(faults, test_cuda_import_failure);
                tcase_add_test(faults, test_cuda_map_failure);
                suite_add_tcase(s, faults);
        } else {
                TCase *startup = tcase_create("startup");
                tcase_set_timeout(startup, 60);
                tcase_add_test(startup, test_backend_auto_without_gpu_uses_host);
                tcase_add_test(startup, test_no_binary_links_libcuda);
                tcase_add_test(startup, test_bad_flags_refused);
                suite_add_tcase(s, startup);
        }
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(integration_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
