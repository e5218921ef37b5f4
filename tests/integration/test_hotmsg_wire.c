/* The fixed-layout codec on the wire (ipc/hotmsg.h), against a real
 * gpumemd: the daemon offers it to central sessions only, answers a
 * fixed-layout Alloc in protobuf while the reply carries mappings and in the
 * fixed layout once it is the cached case, takes carried frees in a
 * fixed-layout Free, and closes the connection on a malformed packet as it
 * does on bytes protobuf cannot parse. */
#include <check.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "hotmsg.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

static gm_test_daemon_t daemon_;

static void setup(void) {
        gm_test_daemon_start(&daemon_, "256M", NULL);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static int connect_hello(Gpumem__HeapMode mode, uint32_t *ret_fixed_codec) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        Gpumem__Envelope *reply = gm_test_raw_hello_mode(fd, false, "hotmsg", NULL, mode);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        *ret_fixed_codec = reply->hello_reply->fixed_codec;
        gm_msg_free(reply);
        return fd;
}

static void send_fixed(int fd, Gpumem__Envelope *env) {
        uint8_t buf[GM_HOTMSG_MAX_SIZE];
        size_t len;
        ck_assert_int_eq(gm_hotmsg_encode(env, buf, sizeof(buf), &len), 0);
        ck_assert_int_eq(gm_ipc_send(fd, buf, len, NULL, 0), 0);
}

static void send_fixed_alloc(int fd, uint64_t request_id, uint64_t size, uint64_t *freed, size_t n_freed) {
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        a.size = size;
        a.freed_block_ids = freed;
        a.n_freed_block_ids = n_freed;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = request_id;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &a;
        send_fixed(fd, &env);
}

/* Receives one packet: whether it was in the fixed layout, and its envelope
 * (its fds closed). */
static Gpumem__Envelope *recv_packet(int fd, bool *ret_fixed) {
        static uint8_t buf[GM_IPC_MAX_PACKET_DEFAULT];
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t len, n_fds;
        ck_assert_int_eq(gm_ipc_recv(fd, buf, sizeof(buf), fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds), 0);
        gm_close_fds(fds, n_fds);
        *ret_fixed = gm_hotmsg_is(buf, len);
        Gpumem__Envelope *env = NULL;
        ck_assert_int_eq(gm_msg_unpack(buf, len, &env), 0);
        return env;
}

START_TEST(test_offered_to_central_sessions_only) {
        uint32_t fixed;
        int fd = connect_hello(GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL, &fixed);
        ck_assert_uint_eq(fixed, GM_HOTMSG_VERSION);
        close(fd);
        fd = connect_hello(GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL, &fixed);
        ck_assert_uint_eq(fixed, 0);
        close(fd);
}
END_TEST

START_TEST(test_cached_reply_is_fixed_mapping_reply_is_protobuf) {
        uint32_t fixed_codec;
        int fd = connect_hello(GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL, &fixed_codec);
        bool fixed;
        /* A new segment: its mapping and fd need protobuf. */
        send_fixed_alloc(fd, 2, 4096, NULL, 0);
        Gpumem__Envelope *r = recv_packet(fd, &fixed);
        ck_assert(!fixed);
        ck_assert_int_eq(r->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(r->request_id, 2);
        ck_assert_uint_ge(r->alloc_reply->n_new_mappings, 1);
        uint64_t block = r->alloc_reply->block_id, segment = r->alloc_reply->segment_id;
        uint64_t offset = r->alloc_reply->offset;
        gm_msg_free(r);
        /* Freed, then carried on the next Alloc: the cached block, in the fixed layout. */
        for (uint64_t id = 3; id < 10; id++) {
                send_fixed_alloc(fd, id, 4096, &block, 1);
                r = recv_packet(fd, &fixed);
                ck_assert(fixed);
                ck_assert_int_eq(r->body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
                ck_assert_uint_eq(r->request_id, id);
                ck_assert_uint_eq(r->alloc_reply->segment_id, segment);
                ck_assert_uint_eq(r->alloc_reply->offset, offset);
                ck_assert_uint_eq(r->alloc_reply->n_new_mappings, 0);
                block = r->alloc_reply->block_id;
                gm_msg_free(r);
        }
        /* A fixed-layout Free of it, then a protobuf Alloc (as a tagged or
         * history one is sent): served, the reply fixed (the cached case). */
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = block;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 10;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        send_fixed(fd, &env);
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        a.size = 4096;
        gm_test_raw_send_body(fd, 11, GPUMEM__ENVELOPE__BODY_ALLOC, &a);
        r = recv_packet(fd, &fixed);
        ck_assert(fixed);
        ck_assert_uint_eq(r->request_id, 11);
        ck_assert_uint_eq(r->alloc_reply->offset, offset);
        block = r->alloc_reply->block_id;
        gm_msg_free(r);
        /* A free the daemon refuses (a double free): the Error stays protobuf. */
        send_fixed(fd, &env);
        send_fixed(fd, &env);
        r = recv_packet(fd, &fixed);
        ck_assert(!fixed);
        ck_assert_int_eq(r->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
        ck_assert_int_eq(r->error->code, EINVAL);
        gm_msg_free(r);
        close(fd);
}
END_TEST

/* Malformed: a truncated packet, a bad version, too many carried frees. */
START_TEST(test_malformed_packet_closes_the_connection) {
        uint8_t buf[GM_HOTMSG_MAX_SIZE];
        size_t len;
        Gpumem__Alloc a = GPUMEM__ALLOC__INIT;
        a.size = 4096;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 2;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = &a;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), 0);
        for (int bad = 0; bad < 3; bad++) {
                uint32_t fixed_codec;
                int fd = connect_hello(GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL, &fixed_codec);
                uint8_t pkt[sizeof(buf) + 8];
                memcpy(pkt, buf, len);
                size_t n = len;
                if (bad == 0)
                        n--;
                else if (bad == 1)
                        pkt[1] = GM_HOTMSG_VERSION + 1;
                else
                        pkt[4] = GM_CARRIED_FREES_MAX + 1; /* the ids missing as well */
                ck_assert_int_eq(gm_ipc_send(fd, pkt, n, NULL, 0), 0);
                bool fixed;
                Gpumem__Envelope *r = recv_packet(fd, &fixed);
                ck_assert(!fixed);
                ck_assert_int_eq(r->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
                ck_assert_int_eq(r->error->code, EBADMSG);
                gm_msg_free(r);
                uint8_t rest[64];
                int fds[1];
                size_t got, n_fds;
                ck_assert_int_eq(gm_ipc_recv(fd, rest, sizeof(rest), fds, 1, &got, &n_fds), -ECONNRESET);
                close(fd);
        }
}
END_TEST

int main(void) {
        Suite *s = suite_create("hotmsg_wire");
        TCase *tc = tcase_create("wire");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_offered_to_central_sessions_only);
        tcase_add_test(tc, test_cached_reply_is_fixed_mapping_reply_is_protobuf);
        tcase_add_test(tc, test_malformed_packet_closes_the_connection);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
