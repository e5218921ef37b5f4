/* Issue #25, "nobody in where they don't belong, part two": each attack a
 * hostile local user tried, run as a separate process of another uid (this
 * binary again, through setpriv, with the attack's name as its first
 * argument), and what the daemon must do about it. Needs root (to act as
 * other uids); reports and skips otherwise. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "msg.h"
#include "testutil.h"

#define ATTACKER 65534
#define VICTIM 65533

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

/* ---- the attacks (run as ATTACKER; exit 0 when carried out) ---- */

/* A local session stops reading, then names a piece it was never granted:
 * the refusal's send fails and closes the connection inside the handler. */
static int attack_move_unknown_piece(const char *socket_path) {
        int fd = gm_test_raw_connect(socket_path);
        gm_test_raw_hello_local(fd);
        if (shutdown(fd, SHUT_RD) < 0)
                return 2;
        Gpumem__PageMove move = GPUMEM__PAGE_MOVE__INIT;
        move.from_segment_id = 77;
        move.to_segment_id = 78;
        move.to_segment_va_size = 2 << 20;
        move.length = 2 << 20;
        Gpumem__PageMove *moves[] = {&move};
        Gpumem__MovePieces mp = GPUMEM__MOVE_PIECES__INIT;
        mp.n_moves = 1;
        mp.moves = moves;
        gm_test_raw_send_body(fd, 2, GPUMEM__ENVELOPE__BODY_MOVE_PIECES, &mp);
        sleep_ms(300); /* the daemon handles it while this end is still open */
        close(fd);
        return 0;
}

/* Replies not in within this long count as a daemon that stopped serving. */
#define REPLY_TIMEOUT_S 5

static void set_reply_timeout(int fd) {
        struct timeval tv = {.tv_sec = REPLY_TIMEOUT_S};
        ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
}

/* Segments granted one by one: each is a notification to the service
 * manager (FDSTORE), more than its socket queues while nobody reads. */
#define FDSTORE_FLOOD 64

static int attack_fdstore_flood(const char *socket_path) {
        int fd = gm_test_raw_connect(socket_path);
        set_reply_timeout(fd);
        gm_test_raw_hello_local(fd);
        for (uint64_t i = 0; i < FDSTORE_FLOOD; i++) {
                int seg_fd = -1;
                Gpumem__Envelope *reply = gm_test_raw_grant(fd, 2 + i, 1 + i, 2 << 20, &seg_fd);
                ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
                gm_msg_free(reply);
                if (seg_fd >= 0)
                        close(seg_fd);
        }
        close(fd);
        return 0;
}

/* Segments a keeper is granted, touches and returns, keeping copies. */
#define KEPT_SEGMENTS 3
#define KEPT_SEGMENT_SIZE (16u << 20)

/* Pages of [p, p+len) resident in the page cache. */
static size_t resident_pages(void *p, size_t len) {
        unsigned char vec[KEPT_SEGMENT_SIZE / 4096];
        ck_assert_int_eq(mincore(p, len, vec), 0);
        size_t n = 0;
        for (size_t i = 0; i < len / 4096; i++)
                n += vec[i] & 1;
        return n;
}

/* How a keeper lets go of its memory. */
typedef enum keep_how {
        KEEP_RETURN,  /* a local session returns it (ReturnPieces) */
        KEEP_HANG_UP, /* a local session hangs up */
        KEEP_TRIM,    /* a central session frees it, trims and acknowledges the release */
} keep_how_t;

/* A central session's allocation of a whole segment; its fd in *ret_fd. */
static uint64_t central_segment(int fd, uint64_t request_id, int *ret_fd) {
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = KEPT_SEGMENT_SIZE;
        gm_test_raw_send_body(fd, request_id, GPUMEM__ENVELOPE__BODY_ALLOC, &alloc);
        Gpumem__Envelope *reply = gm_test_raw_recv_fd(fd, ret_fd);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(reply->alloc_reply->n_new_mappings, 1);
        ck_assert_uint_eq(reply->alloc_reply->new_mappings[0]->length, KEPT_SEGMENT_SIZE);
        uint64_t block = reply->alloc_reply->block_id;
        gm_msg_free(reply);
        return block;
}

/* A session touches its segments, keeps the fd, a read-only shared mapping
 * (through a read-only reopen, which write seals do not see) and a private
 * mapping of each, unmaps its writable mapping and lets go of them (`how`;
 * after a hang-up it waits for a line on stdin: the daemon saw the session
 * end). Prints the memory its copies still hold (memfd blocks, resident
 * pages of the kept mappings), then the file's size and whether it could
 * grow it back (a touch of a kept mapping past the end would be SIGBUS),
 * and holds on to everything until its stdin closes. */
static int attack_keep(const char *socket_path, keep_how_t how) {
        int fd = gm_test_raw_connect(socket_path);
        set_reply_timeout(fd);
        if (how == KEEP_TRIM) {
                Gpumem__Envelope *reply =
                        gm_test_raw_hello_mode(fd, false, "keeper", NULL, GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL);
                ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
                gm_msg_free(reply);
        } else {
                gm_test_raw_hello_local(fd);
        }
        int kept_fd[KEPT_SEGMENTS];
        uint64_t block[KEPT_SEGMENTS];
        char *shared_ro[KEPT_SEGMENTS], *private_ro[KEPT_SEGMENTS];
        for (uint64_t i = 0; i < KEPT_SEGMENTS; i++) {
                if (how == KEEP_TRIM) {
                        block[i] = central_segment(fd, 2 + i, &kept_fd[i]);
                } else {
                        Gpumem__Envelope *reply = gm_test_raw_grant(fd, 2 + i, 1 + i, KEPT_SEGMENT_SIZE, &kept_fd[i]);
                        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
                        gm_msg_free(reply);
                }
                ck_assert_int_ge(kept_fd[i], 0);
                char *w = mmap(NULL, KEPT_SEGMENT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, kept_fd[i], 0);
                ck_assert_ptr_ne(w, MAP_FAILED);
                memset(w, 0x5a, KEPT_SEGMENT_SIZE);
                char path[64];
                snprintf(path, sizeof(path), "/proc/self/fd/%d", kept_fd[i]);
                int ro = open(path, O_RDONLY | O_CLOEXEC);
                ck_assert_int_ge(ro, 0);
                shared_ro[i] = mmap(NULL, KEPT_SEGMENT_SIZE, PROT_READ, MAP_SHARED, ro, 0);
                private_ro[i] = mmap(NULL, KEPT_SEGMENT_SIZE, PROT_READ, MAP_PRIVATE, kept_fd[i], 0);
                close(ro);
                ck_assert_ptr_ne(shared_ro[i], MAP_FAILED);
                ck_assert_ptr_ne(private_ro[i], MAP_FAILED);
                volatile char sum = 0;
                for (size_t off = 0; off < KEPT_SEGMENT_SIZE; off += 4096)
                        sum += shared_ro[i][off] + private_ro[i][off];
                (void) sum;
                munmap(w, KEPT_SEGMENT_SIZE); /* "unmapped" */
        }
        char c;
        if (how == KEEP_HANG_UP) {
                close(fd);
                fd = -1;
                printf("hung up\n");
                fflush(stdout);
                ck_assert_int_eq(read(STDIN_FILENO, &c, 1), 1);
        } else if (how == KEEP_TRIM) {
                for (int i = 0; i < KEPT_SEGMENTS; i++)
                        gm_test_raw_acknowledge_mapped(fd, block[i]); /* "unmapped": its writable mapping is */
                /* One more trim's reply after them: they were handled. */
                Gpumem__Trim trim = GPUMEM__TRIM__INIT;
                trim.tenant = "";
                gm_test_raw_send_body(fd, 20, GPUMEM__ENVELOPE__BODY_TRIM, &trim);
                Gpumem__Envelope *e;
                while ((e = gm_test_raw_recv(fd)) && e->request_id != 20)
                        gm_msg_free(e);
                ck_assert_ptr_nonnull(e);
                gm_msg_free(e);
        } else {
                for (uint64_t i = 0; i < KEPT_SEGMENTS; i++)
                        gm_test_raw_return(fd, 10 + i, 1 + i, KEPT_SEGMENT_SIZE);
                /* A request with a reply after them: they were handled. */
                Gpumem__Envelope *reply = gm_test_raw_return_intent(fd, 20);
                ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_OK);
                gm_msg_free(reply);
        }
        uint64_t blocks = 0, resident = 0;
        for (int i = 0; i < KEPT_SEGMENTS; i++) {
                struct stat st;
                ck_assert_int_eq(fstat(kept_fd[i], &st), 0);
                blocks += (uint64_t) st.st_blocks * 512u;
                resident += resident_pages(shared_ro[i], KEPT_SEGMENT_SIZE) +
                            resident_pages(private_ro[i], KEPT_SEGMENT_SIZE);
        }
        printf("kept %llu bytes %llu pages\n", (unsigned long long) blocks, (unsigned long long) resident);
        long long size = 0;
        int regrown = 0;
        for (int i = 0; i < KEPT_SEGMENTS; i++) {
                struct stat st;
                ck_assert_int_eq(fstat(kept_fd[i], &st), 0);
                size += st.st_size;
                regrown += fallocate(kept_fd[i], 0, 0, KEPT_SEGMENT_SIZE) == 0;
        }
        printf("size %lld regrown %d\n", size, regrown);
        fflush(stdout);
        while (read(STDIN_FILENO, &c, 1) > 0)
                ;
        if (fd >= 0)
                close(fd);
        return 0;
}

/* A victim's trace entries: a central session allocates a distinctive
 * size, then ends. */
#define VICTIM_SIZE (3u << 20)

static int attack_alloc_and_leave(const char *socket_path) {
        int fd = gm_test_raw_connect(socket_path);
        set_reply_timeout(fd);
        Gpumem__Envelope *reply =
                gm_test_raw_hello_mode(fd, false, "victim", NULL, GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        gm_msg_free(reply);
        Gpumem__Alloc alloc = GPUMEM__ALLOC__INIT;
        alloc.size = VICTIM_SIZE;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &alloc;
        reply = gm_test_raw_call(fd, &env);
        ck_assert_ptr_nonnull(reply);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        gm_msg_free(reply);
        close(fd);
        return 0;
}

/* A session of `mode` records its own history without admin rights: an
 * allocation with a frame of its own shows, frames included, in its own
 * snapshot, and nothing else does. Prints "own N frames F", then holds its
 * session until its stdin closes. */
#define OWN_SIZE (5u << 20)
#define OWN_FRAME "attacker_own_frame.py"

static int attack_own_history(const char *socket_path, gpumem_heap_mode mode) {
        gpumem_client *c = NULL;
        ck_assert_int_eq(gpumem_connect_heap(socket_path, mode, &c), 0);
        gpumem_history_state st;
        ck_assert_int_eq(gpumem_history(c, true, 1000, &st), 0);
        ck_assert(st.enabled);
        gpumem_frame frame = {.filename = OWN_FRAME, .line = 7, .name = "own"};
        void *ptr = NULL;
        ck_assert_int_eq(gpumem_alloc_frames(c, OWN_SIZE, 0, &frame, 1, &ptr), 0);
        void *data = NULL;
        size_t len = 0;
        ck_assert_int_eq(gpumem_snapshot(c, GPUMEM_SNAPSHOT_JSON, 0, &data, &len), 0);
        char size[32];
        snprintf(size, sizeof(size), "%u", OWN_SIZE);
        printf("own %d frames %d\n", memmem(data, len, size, strlen(size)) != NULL,
               memmem(data, len, OWN_FRAME, strlen(OWN_FRAME)) != NULL);
        fflush(stdout);
        gpumem_buffer_free(data);
        char ch;
        while (read(STDIN_FILENO, &ch, 1) > 0)
                ;
        gpumem_free(c, ptr);
        gpumem_disconnect(c);
        return 0;
}

/* A local session maps its segments writable, hangs up without unmapping
 * and, once the daemon has seen the session end, writes every page again:
 * memory it would hold outside its quota if the end of its session
 * released it. Holds on until its stdin closes. */
static int attack_keep_writable(const char *socket_path) {
        int fd = gm_test_raw_connect(socket_path);
        set_reply_timeout(fd);
        gm_test_raw_hello_local(fd);
        char *w[KEPT_SEGMENTS];
        for (uint64_t i = 0; i < KEPT_SEGMENTS; i++) {
                int seg_fd = -1;
                Gpumem__Envelope *reply = gm_test_raw_grant(fd, 2 + i, 1 + i, KEPT_SEGMENT_SIZE, &seg_fd);
                ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
                gm_msg_free(reply);
                ck_assert_int_ge(seg_fd, 0);
                w[i] = mmap(NULL, KEPT_SEGMENT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
                ck_assert_ptr_ne(w[i], MAP_FAILED);
                close(seg_fd);
                memset(w[i], 0x5a, KEPT_SEGMENT_SIZE);
        }
        close(fd);
        printf("hung up\n");
        fflush(stdout);
        char c;
        ck_assert_int_eq(read(STDIN_FILENO, &c, 1), 1);
        for (int i = 0; i < KEPT_SEGMENTS; i++)
                memset(w[i], 0x77, KEPT_SEGMENT_SIZE);
        printf("rewrote\n");
        fflush(stdout);
        while (read(STDIN_FILENO, &c, 1) > 0)
                ;
        return 0;
}

static const char *attack_name, *attack_socket;

/* The testutil helpers assert with check: an attack runs as a test of its own. */
START_TEST(test_attack) {
        int r = 64;
        if (strcmp(attack_name, "move-unknown-piece") == 0)
                r = attack_move_unknown_piece(attack_socket);
        else if (strcmp(attack_name, "alloc-and-leave") == 0)
                r = attack_alloc_and_leave(attack_socket);
        else if (strcmp(attack_name, "keep-returned") == 0)
                r = attack_keep(attack_socket, KEEP_RETURN);
        else if (strcmp(attack_name, "keep-and-hang-up") == 0)
                r = attack_keep(attack_socket, KEEP_HANG_UP);
        else if (strcmp(attack_name, "keep-writable-and-hang-up") == 0)
                r = attack_keep_writable(attack_socket);
        else if (strcmp(attack_name, "keep-trimmed") == 0)
                r = attack_keep(attack_socket, KEEP_TRIM);
        else if (strcmp(attack_name, "own-history-central") == 0)
                r = attack_own_history(attack_socket, GPUMEM_HEAP_CENTRAL);
        else if (strcmp(attack_name, "own-history-local") == 0)
                r = attack_own_history(attack_socket, GPUMEM_HEAP_LOCAL);
        else if (strcmp(attack_name, "fdstore-flood") == 0)
                r = attack_fdstore_flood(attack_socket);
        ck_assert_msg(r == 0, "attack %s: %d", attack_name, r);
}
END_TEST

static int attack_main(int argc, char **argv) {
        if (argc < 3)
                return 64;
        unsetenv("CK_RUN_SUITE"); /* the parent's choice of its own cases */
        unsetenv("CK_RUN_CASE");
        attack_name = argv[1];
        attack_socket = argv[2];
        return gm_test_run_in_process(test_attack, 60);
}

/* Runs attack `name` against d as ATTACKER; asserts it was carried out. */
static void run_attack(const gm_test_daemon_t *d, const char *name) {
        char out[4096];
        const char *argv[] = {SECURITY_BIN, name, d->socket_path, NULL};
        int status = gm_test_run_as(out, sizeof(out), ATTACKER, argv);
        ck_assert_msg(status == 0, "attack %s exited %d: %s", name, status, out);
}

/* Starts attack `name` against d as ATTACKER, to go on while the test
 * looks; its first line of report (past check's banner) that starts with
 * one of `firsts` ("a|b") goes in line. */
static void spawn_attack(const gm_test_daemon_t *d, const char *name, const char *firsts, gm_test_proc_t *ret_proc,
                         char *line, size_t len) {
        const char *argv[] = {SECURITY_BIN, name, d->socket_path, NULL};
        gm_test_spawn(argv, ATTACKER, ret_proc);
        for (;;) {
                ck_assert_msg(gm_test_proc_read_line(ret_proc, line, len), "attack %s reported nothing", name);
                for (const char *f = firsts; *f; f += strcspn(f, "|"), f += *f == '|')
                        if (strncmp(line, f, strcspn(f, "|")) == 0)
                                return;
        }
}

/* The daemon is still running and serves a new session. */
static void assert_daemon_serves(const gm_test_daemon_t *d) {
        int status;
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid) {
                char cmd[400];
                snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", d->log_path);
                gm_test_shell(cmd);
        }
        ck_assert_msg(r == 0, "gpumemd died (status %d)", status);
        int fd = gm_test_raw_connect(d->socket_path);
        gm_test_raw_hello(fd, false);
        close(fd);
}

/* ---- 1: a handler never sees its connection's state freed ---- */

START_TEST(test_refusal_to_hung_up_local_session) {
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        for (int i = 0; i < 3; i++) {
                run_attack(&d, "move-unknown-piece");
                assert_daemon_serves(&d);
        }
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- 4: snapshots show only what the caller may see ---- */

/* gpumemctl as uid (0: root) against d; its exit status, stdout in out. */
static int ctl_as(const gm_test_daemon_t *d, uid_t uid, char *out, size_t len, const char *args) {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "exec '%s' -s '%s' %s", GPUMEMCTL_BIN, d->socket_path, args);
        const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        return uid ? gm_test_run_as(out, len, uid, argv) : gm_test_run(out, len, argv);
}

/* A JSON snapshot as uid (through a file of its own), in out; gpumemctl's status. */
static int snapshot_as(const gm_test_daemon_t *d, uid_t uid, char *out, size_t len, const char *args) {
        char shell[700];
        snprintf(shell, sizeof(shell),
                 "f=$(mktemp) && '%s' -s '%s' snapshot -o \"$f\" --format json %s >/dev/null; r=$?; cat \"$f\"; "
                 "rm -f \"$f\"; exit $r",
                 GPUMEMCTL_BIN, d->socket_path, args);
        const char *argv[] = {"/bin/sh", "-c", shell, NULL};
        return uid ? gm_test_run_as(out, len, uid, argv) : gm_test_run(out, len, argv);
}

START_TEST(test_snapshot_hides_ended_sessions_of_others) {
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        static char out[1 << 20];
        ck_assert_int_eq(ctl_as(&d, 0, out, sizeof(out), "history on"), 0);
        char out_small[4096];
        const char *argv[] = {SECURITY_BIN, "alloc-and-leave", d.socket_path, NULL};
        ck_assert_int_eq(gm_test_run_as(out_small, sizeof(out_small), VICTIM, argv), 0);
        char size[32];
        snprintf(size, sizeof(size), "%u", VICTIM_SIZE);
        /* The admin sees the ended session's entries; another tenant does not. */
        ck_assert_int_eq(snapshot_as(&d, 0, out, sizeof(out), ""), 0);
        ck_assert_msg(strstr(out, size), "the victim's allocation is not in the admin's snapshot");
        ck_assert_int_eq(snapshot_as(&d, ATTACKER, out, sizeof(out), ""), 0);
        ck_assert_msg(!strstr(out, size), "another tenant's ended session shows in a snapshot");
        /* A pid that names nothing (here: the ended victim's) is an error, as for stats. */
        ck_assert_int_ne(snapshot_as(&d, ATTACKER, out, sizeof(out), "--pid 1"), 0);
        ck_assert_int_ne(snapshot_as(&d, 0, out, sizeof(out), "--pid 1"), 0);
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- 5: one's own history needs no admin; the device's stays admin-only ---- */

/* Runs `attack` (own-history-central or -local) against a daemon of its own. */
static void own_history_is_own(const char *attack) {
        gm_test_daemon_t d;
        char line[256];
        gm_test_daemon_start(&d, "64M", NULL);
        gm_test_proc_t recorder;
        spawn_attack(&d, attack, "own ", &recorder, line, sizeof(line));
        ck_assert_str_eq(line, "own 1 frames 1");
        static char out[1 << 20];
        /* The device's history is not on, and a non-admin cannot turn it on. */
        ck_assert_int_eq(ctl_as(&d, 0, out, sizeof(out), "history status"), 0);
        ck_assert_msg(strstr(out, "history off"), "%s", out);
        ck_assert_int_ne(ctl_as(&d, ATTACKER, out, sizeof(out), "history on"), 0);
        ck_assert_int_eq(ctl_as(&d, 0, out, sizeof(out), "history status"), 0);
        ck_assert_msg(strstr(out, "history off"), "%s", out);
        /* Another tenant does not see it; an admin does, frames included. */
        ck_assert_int_eq(snapshot_as(&d, VICTIM, out, sizeof(out), ""), 0);
        ck_assert_msg(!strstr(out, OWN_FRAME), "another tenant sees a session's own history");
        ck_assert_int_eq(snapshot_as(&d, 0, out, sizeof(out), ""), 0);
        ck_assert_msg(strstr(out, OWN_FRAME), "the admin's snapshot lacks a session's own history");
        ck_assert_int_eq(gm_test_proc_finish(&recorder), 0);
        gm_test_daemon_stop(&d);
}

START_TEST(test_own_history_without_admin_central) {
        own_history_is_own("own-history-central");
}
END_TEST

START_TEST(test_own_history_without_admin_local) {
        own_history_is_own("own-history-local");
}
END_TEST

/* ---- 2: the daemon never blocks on the service manager ---- */

/* A stand-in service manager that never reads: an abstract datagram socket
 * whose queue (net.unix.max_dgram_qlen datagrams) is filled here first. */
static int stuck_manager(char *name, size_t len) {
        snprintf(name, len, "@gpumem-test-stuck-%d", (int) getpid());
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        memcpy(sa.sun_path + 1, name + 1, strlen(name) - 1);
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(
                bind(fd, (struct sockaddr *) &sa, (socklen_t) (offsetof(struct sockaddr_un, sun_path) + strlen(name))),
                0);
        /* Each sender's own buffer bounds what it queues: fresh senders until
         * the first datagram of one finds the queue full. */
        socklen_t sa_len = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + strlen(name));
        for (int sent = 1; sent > 0;) {
                int filler = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                ck_assert_int_ge(filler, 0);
                for (sent = 0; sendto(filler, "X=1", 3, 0, (struct sockaddr *) &sa, sa_len) == 3;)
                        sent++;
                ck_assert_int_eq(errno, EAGAIN);
                close(filler);
        }
        return fd;
}

/* Polls d's log for `what` for up to ~10 s. */
static bool log_shows(const gm_test_daemon_t *d, const char *what) {
        char cmd[512], out[64];
        snprintf(cmd, sizeof(cmd), "grep -c -F '%s' '%s'", what, d->log_path);
        const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        for (int i = 0; i < 100; i++) {
                if (gm_test_run(out, sizeof(out), argv) == 0)
                        return true;
                sleep_ms(100);
        }
        return false;
}

START_TEST(test_stuck_service_manager_does_not_stop_loop) {
        char name[64], metrics[400];
        int manager = stuck_manager(name, sizeof(name));
        ck_assert_int_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
        gm_test_daemon_t d;
        memset(&d, 0, sizeof(d));
        snprintf(d.dir, sizeof(d.dir), "/tmp/gpumemd-test-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(d.dir));
        snprintf(metrics, sizeof(metrics), "unix:%s/metrics.sock", d.dir);
        const char *args[] = {"--metrics-listen", metrics, NULL};
        gm_test_daemon_launch(&d, "1G", args);
        unsetenv("NOTIFY_SOCKET");
        run_attack(&d, "fdstore-flood"); /* each of its grants answered in time */
        int fd = gm_test_raw_connect(d.socket_path);
        set_reply_timeout(fd);
        gm_test_raw_hello(fd, false); /* and the loop serves everyone else */
        close(fd);
        char cmd[600], out[16384];
        if (!log_shows(&d, "the service manager has read no notification")) {
                snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", d.log_path);
                gm_test_shell(cmd);
                ck_abort_msg("no log line for the stuck manager");
        }
        snprintf(cmd, sizeof(cmd),
                 "curl -s --unix-socket '%s/metrics.sock' http://localhost/metrics | grep '^gpumem_notify_queued{'",
                 d.dir);
        const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        char *q = strchr(out, '}');
        ck_assert_msg(q, "no gpumem_notify_queued in the scrape");
        long queued = strtol(q + 1, NULL, 10);
        ck_assert_int_gt(queued, 0);
        close(manager); /* the manager gone: the queue drains (dropped) */
        gm_test_daemon_stop(&d);
}
END_TEST

/* ---- 3: host backend: released memory is gone for every holder ---- */

/* Polls until d charges `tenant` nothing (its session's end handled). */
static void wait_uncharged(const gm_test_daemon_t *d, const char *tenant) {
        for (int i = 0; i < 250 && gm_test_tenant_charged(d->socket_path, tenant) != 0; i++)
                sleep_ms(20);
        ck_assert_uint_eq(gm_test_tenant_charged(d->socket_path, tenant), 0);
}

/* The keeper `attack` (keep-returned, keep-and-hang-up, keep-trimmed) lets go of its
 * memory and keeps copies: they hold no memory, the file is cut to nothing
 * and cannot be grown back, while another tenant is granted the whole
 * capacity. */
static void kept_copies_hold_nothing(const char *attack) {
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        gm_test_proc_t keeper;
        char line[256];
        spawn_attack(&d, attack, "kept |hung up", &keeper, line, sizeof(line));
        if (strcmp(line, "hung up") == 0) {
                wait_uncharged(&d, "uid:65534");
                ck_assert_int_eq(write(keeper.stdin_fd, "\n", 1), 1);
                ck_assert(gm_test_proc_read_line(&keeper, line, sizeof(line)));
        }
        unsigned long long bytes = 1, pages = 1;
        ck_assert_int_eq(sscanf(line, "kept %llu bytes %llu pages", &bytes, &pages), 2);
        ck_assert_msg(bytes == 0 && pages == 0, "released memory still held by its client's copies: %s", line);
        ck_assert(gm_test_proc_read_line(&keeper, line, sizeof(line)));
        ck_assert_str_eq(line, "size 0 regrown 0");
        ck_assert_uint_eq(gm_test_tenant_charged(d.socket_path, "uid:65534"), 0);
        /* Another tenant gets the whole capacity while the keeper holds on. */
        int fd = gm_test_raw_connect(d.socket_path);
        gm_test_raw_hello_local(fd);
        int seg_fd = -1;
        Gpumem__Envelope *reply = gm_test_raw_grant(fd, 2, 1, 64u << 20, &seg_fd);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        gm_msg_free(reply);
        if (seg_fd >= 0)
                close(seg_fd);
        close(fd);
        ck_assert_int_eq(gm_test_proc_finish(&keeper), 0);
        gm_test_daemon_stop(&d);
}

START_TEST(test_returned_memory_gone_for_every_holder) {
        kept_copies_hold_nothing("keep-returned");
}
END_TEST

START_TEST(test_ended_session_memory_gone_for_every_holder) {
        kept_copies_hold_nothing("keep-and-hang-up");
}
END_TEST

/* A process that ends its session but keeps its writable mappings stays
 * charged for them while it maps them: it cannot write pages back outside
 * its quota, nor is another tenant granted memory that is still in use.
 * Before, the end of the session released them (charged 0) and the keeper
 * wrote 48 MiB back while another tenant was granted the whole capacity. */
START_TEST(test_kept_writable_mapping_stays_charged) {
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        gm_test_proc_t keeper;
        char line[256];
        spawn_attack(&d, "keep-writable-and-hang-up", "hung up", &keeper, line, sizeof(line));
        /* The daemon sees the session end (its session count drops)... */
        for (int i = 0; i < 250 && gm_test_tenant_sessions(d.socket_path, "uid:65534") != 0; i++)
                sleep_ms(20);
        ck_assert_uint_eq(gm_test_tenant_sessions(d.socket_path, "uid:65534"), 0);
        ck_assert_int_eq(write(keeper.stdin_fd, "\n", 1), 1);
        ck_assert(gm_test_proc_read_line(&keeper, line, sizeof(line)));
        ck_assert_str_eq(line, "rewrote");
        /* ...and keeps the mapped memory charged to the keeper's tenant. */
        ck_assert_uint_eq(gm_test_tenant_charged(d.socket_path, "uid:65534"),
                          (uint64_t) KEPT_SEGMENTS * KEPT_SEGMENT_SIZE);
        int fd = gm_test_raw_connect(d.socket_path);
        gm_test_raw_hello_local(fd);
        int seg_fd = -1;
        Gpumem__Envelope *reply = gm_test_raw_grant(fd, 2, 1, 64u << 20, &seg_fd);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_ERROR); /* only 16 MiB is free */
        gm_msg_free(reply);
        /* Once the keeper's mappings are gone, so is the charge. */
        ck_assert_int_eq(gm_test_proc_finish(&keeper), 0);
        wait_uncharged(&d, "uid:65534");
        reply = gm_test_raw_grant(fd, 3, 2, 64u << 20, &seg_fd);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        gm_msg_free(reply);
        if (seg_fd >= 0)
                close(seg_fd);
        close(fd);
        gm_test_daemon_stop(&d);
}
END_TEST

START_TEST(test_trimmed_memory_gone_for_every_holder) {
        kept_copies_hold_nothing("keep-trimmed"); /* a central session's released segments */
}
END_TEST

static Suite *security_suite(void) {
        Suite *s = suite_create("security");
        TCase *conn = tcase_create("connections");
        tcase_set_timeout(conn, 60);
        tcase_add_test(conn, test_refusal_to_hung_up_local_session);
        suite_add_tcase(s, conn);
        TCase *snap = tcase_create("snapshots");
        tcase_set_timeout(snap, 60);
        tcase_add_test(snap, test_snapshot_hides_ended_sessions_of_others);
        tcase_add_test(snap, test_own_history_without_admin_central);
        tcase_add_test(snap, test_own_history_without_admin_local);
        suite_add_tcase(s, snap);
        TCase *sd = tcase_create("service-manager");
        tcase_set_timeout(sd, 60);
        tcase_add_test(sd, test_stuck_service_manager_does_not_stop_loop);
        suite_add_tcase(s, sd);
        TCase *host = tcase_create("host-backend");
        tcase_set_timeout(host, 60);
        tcase_add_test(host, test_returned_memory_gone_for_every_holder);
        tcase_add_test(host, test_ended_session_memory_gone_for_every_holder);
        tcase_add_test(host, test_kept_writable_mapping_stays_charged);
        tcase_add_test(host, test_trimmed_memory_gone_for_every_holder);
        suite_add_tcase(s, host);
        return s;
}

int main(int argc, char **argv) {
        if (argc > 1)
                return attack_main(argc, argv);
        if (geteuid() != 0) {
                fprintf(stderr, "test_security: needs root to act as other users\n");
                return getenv("CI") ? EXIT_FAILURE : 77;
        }
        return gm_test_run_suite(security_suite());
}
