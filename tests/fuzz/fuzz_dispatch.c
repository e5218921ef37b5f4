/* The request table (daemon/requests.c) behind the decoder: a sequence of
 * packets from one client on a real broker over the host backend, the
 * server's sender replaced by a sink. Input: [flags byte] then packets, each
 * a 2-byte little-endian length and that many bytes (an envelope, protobuf
 * or in the fixed layout of ipc/hotmsg.h, or garbage).
 * Flags: bit 0 the connection has admin rights; bit 1 the harness says Hello
 * first (bit 2: with a local heap, so every input reaches the local-heap
 * requests: Grant runs, ReturnPieces, ReturnIntent, MovePieces, ReclaimAck,
 * SnapshotAnswer to the snapshot jobs it starts); bits 3-7, n > 0: the
 * client hangs up at the daemon's n-th send (it fails, and the connection is
 * closed inside the handler, as the server does). Properties: the broker's
 * checker holds after every request, every reply has a body and only fds
 * the daemon still holds, nothing is sent once closed, and once the session
 * ends (as the server ends it, from the loop) and the broker is freed
 * nothing is left in the backend. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_broker.h"
#include "local.h"
#include "msg.h"
#include "req_snapshot.h"
#include "requests.h"

#define MiB (1ull << 20)

/* The client's side: the send at which it hangs up (0: never), the sends so far. */
static unsigned hang_up_at, sends;

static int sink_send(void *userdata, gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds,
                     size_t n_fds) {
        FUZZ_ASSERT(!c->closed); /* gm_request_send() sends nothing once closed */
        FUZZ_ASSERT(env->body_case != GPUMEM__ENVELOPE__BODY__NOT_SET);
        for (size_t i = 0; i < n_fds; i++)
                FUZZ_ASSERT(fcntl(fds[i], F_GETFD) >= 0); /* the daemon's own, still open */
        if (hang_up_at && ++sends >= hang_up_at) {
                c->closed = true; /* the server's conn_close(): its state stays valid */
                return -EPIPE;
        }
        return 0;
}

/* Hello, as a client starts: local heap or central. */
static void say_hello(gm_request_conn_t *conn, bool local) {
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = "fuzz";
        hello.resume_token = "";
        hello.heap_mode = local ? GPUMEM__HEAP_MODE__HEAP_MODE_LOCAL : GPUMEM__HEAP_MODE__HEAP_MODE_CENTRAL;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 1;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        if (gm_requests_dispatch(conn, &env, NULL, 0) < 0)
                conn->closed = true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 64 * 1024)
                return 0;
        uint8_t flags = data[0];
        data++, size--;
        hang_up_at = flags >> 3;
        sends = 0;

        char err[256];
        gm_backend_t *backend;
        gm_backend_options_t bopts = {.kind = "host", .capacity = 64 * MiB};
        FUZZ_ASSERT(gm_backend_host_open(&bopts, &backend, err, sizeof(err)) == 0);
        gm_alloc_config_t conf;
        FUZZ_ASSERT(gm_alloc_config_parse(NULL, &conf, err, sizeof(err)) == 0);
        gm_broker_params_t params = {
                .backend = backend,
                .alloc_config = &conf,
                .limits = {.max_blocks_per_session = 256,
                           .max_parked_per_session = 4,
                           .park_timeout_ms = 1000,
                           .release_timeout_ms = 1000,
                           .max_reattach_items = 256,
                           .max_ranges_per_release = 8},
        };
        gm_broker_t *broker;
        FUZZ_ASSERT(gm_broker_new(&params, &broker) == 0);
        gm_request_config_t config = {.max_packet = 65536, .max_fds = 4};
        gm_localstats_totals_t local = {0};
        gm_snapjobs_t snapjobs = {.limits = GM_SNAPSHOT_DEFAULT_LIMITS};
        snapjobs.limits.answer_max_bytes = 64 * 1024;
        gm_requests_t rq = {
                .broker = broker, .config = &config, .local = &local, .send = sink_send, .snapjobs = &snapjobs};
        gm_request_conn_t conn = {.rq = &rq};
        snprintf(conn.tenant_name, sizeof(conn.tenant_name), "fuzz");
        gm_session_params_t sp = {.pid = getpid(), .uid = 4242, .admin = flags & 1, .userdata = &conn};
        FUZZ_ASSERT(gm_session_new(broker, &sp, &conn.session) == 0);
        if (flags & 2) {
                say_hello(&conn, flags & 4);
                fuzz_check_broker(broker);
        }

        while (size >= 2 && !conn.closed) {
                size_t len = (size_t) data[0] | ((size_t) data[1] << 8);
                data += 2, size -= 2;
                if (len > size)
                        len = size;
                Gpumem__Envelope *env = NULL;
                if (gm_msg_unpack(data, len, &env) == 0) {
                        int r = gm_requests_dispatch(&conn, env, NULL, 0);
                        gm_msg_free(env);
                        if (r < 0)
                                conn.closed = true; /* the server would close the connection */
                        else
                                gm_session_flush_releases(conn.session);
                        fuzz_check_broker(broker);
                }
                data += len, size -= len;
        }
        /* As the server's conn_end(), from the loop: no handler on the stack. */
        gm_local_end(&conn);
        gm_req_snapshot_conn_end(&conn);
        gm_session_end(conn.session);
        fuzz_check_broker(broker);
        gm_session_free(conn.session);
        gm_req_snapshot_free_all(&rq);
        gm_localstats_free_all(&rq);
        fuzz_check_broker(broker);
        broker = gm_broker_free(broker);
        FUZZ_ASSERT(backend->in_use == 0);
        gm_backend_close(backend);
        return 0;
}
