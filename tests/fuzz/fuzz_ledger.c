/* The ledger journal parser (broker/ledger.c): the input is the journal a
 * previous daemon left in /run (a crash tears its last line; whatever can
 * write there can write anything), opened by a broker over the host backend
 * with no fd store. Properties: the broker's checker holds; every record a
 * re-attach could claim has a session token and a non-empty range inside its
 * segment, an id below the next one handed out, and a pool that is small,
 * large or not recorded; every known session has a token; the journal the
 * open rewrote reads back to the same records (pools included), sessions and
 * runtime quotas; nothing is left in the backend. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "broker-internal.h"
#include "fuzz.h"
#include "fuzz_broker.h"

#define MiB (1ull << 20)

static char dir_[64], path_[96];

static void remove_dir(void) {
        unlink(path_);
        rmdir(dir_);
}

static bool token_ok(const char *t) {
        if (strlen(t) != GM_TOKEN_LEN)
                return false;
        for (const char *c = t; *c; c++)
                if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
                        return false;
        return true;
}

static gm_broker_t *open_ledger(gm_backend_t *backend) {
        char err[256];
        gm_alloc_config_t conf;
        FUZZ_ASSERT(gm_alloc_config_parse(NULL, &conf, err, sizeof(err)) == 0);
        gm_broker_params_t params = {.backend = backend, .alloc_config = &conf, .limits = {.reattach_grace_ms = 1000}};
        gm_broker_t *b;
        FUZZ_ASSERT(gm_broker_new(&params, &b) == 0);
        int r = gm_ledger_open(b, path_);
        FUZZ_ASSERT(r == 0 || r == -ENOMEM);
        gm_orphan_adopt_done(b, 0);
        fuzz_check_broker(b);
        for (size_t i = 0; i < b->n_records; i++) {
                const gm_ledger_entry_t *e = &b->records[i];
                FUZZ_ASSERT(token_ok(e->token) && e->store_id != 0 && e->store_id <= b->next_store_id);
                FUZZ_ASSERT(e->size != 0 && e->offset + e->size > e->offset && e->offset + e->size <= e->va_size);
                FUZZ_ASSERT(e->pool == GM_POOL_UNKNOWN || e->pool == GM_POOL_SMALL || e->pool == GM_POOL_LARGE);
        }
        for (size_t i = 0; i < b->n_known_tokens; i++)
                FUZZ_ASSERT(token_ok(b->known_tokens[i].token));
        return b;
}

static bool same_entry(const gm_ledger_entry_t *x, const gm_ledger_entry_t *y) {
        return x->store_id == y->store_id && strcmp(x->token, y->token) == 0 && x->uid == y->uid &&
               x->segment_id == y->segment_id && x->offset == y->offset && x->size == y->size &&
               x->va_size == y->va_size && x->pool == y->pool;
}

/* Every record, known session and runtime quota of a is in b (as many times). */
static void assert_contains(const gm_broker_t *a, const gm_broker_t *b) {
        FUZZ_ASSERT(a->n_records == b->n_records && a->n_known_tokens == b->n_known_tokens);
        for (size_t i = 0; i < a->n_records; i++) {
                size_t in_a = 0, in_b = 0;
                for (size_t j = 0; j < a->n_records; j++)
                        in_a += same_entry(&a->records[i], &a->records[j]);
                for (size_t j = 0; j < b->n_records; j++)
                        in_b += same_entry(&a->records[i], &b->records[j]);
                FUZZ_ASSERT(in_a == in_b);
        }
        for (size_t i = 0; i < a->n_known_tokens; i++) {
                bool found = false;
                for (size_t j = 0; j < b->n_known_tokens && !found; j++)
                        found = strcmp(a->known_tokens[i].token, b->known_tokens[j].token) == 0 &&
                                a->known_tokens[i].uid == b->known_tokens[j].uid;
                FUZZ_ASSERT(found);
        }
        for (const gm_tenant_t *t = a->tenants; t; t = t->next) {
                if (!t->quota_set[GM_QUOTA_RUNTIME])
                        continue;
                const gm_tenant_t *u = gm_tenant_find((gm_broker_t *) b, t->name);
                FUZZ_ASSERT(u && u->quota_set[GM_QUOTA_RUNTIME] &&
                            u->quota_by_source[GM_QUOTA_RUNTIME] == t->quota_by_source[GM_QUOTA_RUNTIME]);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 64 * 1024)
                return 0;
        if (!dir_[0]) {
                /* tmpfs where there is one: every open rewrites and fsyncs the journal */
                snprintf(dir_, sizeof(dir_), "/dev/shm/gm-fuzz-ledger-XXXXXX");
                if (!mkdtemp(dir_)) {
                        snprintf(dir_, sizeof(dir_), "/tmp/gm-fuzz-ledger-XXXXXX");
                        FUZZ_ASSERT(mkdtemp(dir_));
                }
                snprintf(path_, sizeof(path_), "%s/gpu0.sock.ledger", dir_);
                atexit(remove_dir);
        }
        int fd = open(path_, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        FUZZ_ASSERT(fd >= 0);
        FUZZ_ASSERT(size == 0 || write(fd, data, size) == (ssize_t) size);
        close(fd);

        char err[256];
        gm_backend_t *backend;
        gm_backend_options_t bopts = {.kind = "host", .capacity = 64 * MiB};
        FUZZ_ASSERT(gm_backend_host_open(&bopts, &backend, err, sizeof(err)) == 0);
        gm_broker_t *first = open_ledger(backend);
        gm_broker_t *again = open_ledger(backend); /* reads what the first one rewrote */
        assert_contains(first, again);
        assert_contains(again, first);
        gm_broker_free(first);
        gm_broker_free(again);
        FUZZ_ASSERT(backend->in_use == 0);
        gm_backend_close(backend);
        unlink(path_);
        return 0;
}
