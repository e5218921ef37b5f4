/* The request table (daemon/requests.c) behind the decoder: a sequence of
 * packets from one client on a real broker over the host backend, the
 * server's sender replaced by a sink. Input: [flags byte] then packets, each
 * a 2-byte little-endian length and that many bytes (an envelope or garbage).
 * Properties: the broker's checker holds after every request, every reply has
 * a body and only fds the daemon still holds, and once the session ends and
 * the broker is freed nothing is left in the backend. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_broker.h"
#include "local.h"
#include "msg.h"
#include "requests.h"

#define MiB (1ull << 20)

static int sink_send(void *userdata, gm_request_conn_t *c, uint64_t request_id, Gpumem__Envelope *env, const int *fds,
                     size_t n_fds) {
        FUZZ_ASSERT(env->body_case != GPUMEM__ENVELOPE__BODY__NOT_SET);
        for (size_t i = 0; i < n_fds; i++)
                FUZZ_ASSERT(fcntl(fds[i], F_GETFD) >= 0); /* the daemon's own, still open */
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 64 * 1024)
                return 0;
        uint8_t flags = data[0];
        data++, size--;

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
        gm_requests_t rq = {.broker = broker, .config = &config, .local = &local, .send = sink_send};
        gm_request_conn_t conn = {.rq = &rq};
        snprintf(conn.tenant_name, sizeof(conn.tenant_name), "fuzz");
        gm_session_params_t sp = {.pid = getpid(), .uid = 4242, .admin = flags & 1, .userdata = &conn};
        FUZZ_ASSERT(gm_session_new(broker, &sp, &conn.session) == 0);

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
        gm_local_end(&conn);
        gm_session_free(conn.session);
        gm_localstats_free_all(&rq);
        fuzz_check_broker(broker);
        broker = gm_broker_free(broker);
        FUZZ_ASSERT(backend->in_use == 0);
        gm_backend_close(backend);
        return 0;
}
