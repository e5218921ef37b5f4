/* libgpumem beyond allocation: the device a CUDA ordinal names, statistics
 * as a set and as memory_summary() text, resets, trims, snapshots, memory
 * history, sessions and quotas. Each call is one request of the wire protocol
 * (the ones gpumemctl sends) on the client's own session, so the daemon
 * applies the caller's kernel-verified rights. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "client-internal.h"
#include "cuda_loader.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "peer_check.h"
#include "stats.h"

void gpumem_buffer_free(void *buf) {
        free(buf);
}

/* One request on c's session: `body` is the message of oneof case
 * `body_case` (every body of the envelope is a pointer in one union), and the
 * reply must be of case `want`; see gm_client_call(). */
static int request(gpumem_client *c, Gpumem__Envelope__BodyCase body_case, void *body, Gpumem__Envelope__BodyCase want,
                   Gpumem__Envelope **ret_reply, int *ret_fd) {
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = body_case;
        env.hello = body;
        return gm_client_call(c, &env, want, ret_reply, ret_fd);
}

/* ---- the daemon of a CUDA ordinal ---- */

/* Socket indices searched for the daemon of a device, at most. */
#define MAX_DEVICES (GM_PEER_MAX_DEVICE + 1)

#ifdef GPUMEM_HAVE_CUDA
/* How long a daemon may take to answer the probe's hello, in seconds. */
#define PROBE_TIMEOUT_S 10

/* The GPU UUID the daemon at `path` names in its hello, over a short control
 * connection that holds no memory ("" when it names none: host backend). */
static int daemon_uuid(const char *path, char *buf, size_t len) {
        int fd;
        int r = gm_ipc_connect(path, &fd);
        if (r < 0)
                return r;
        struct timeval tv = {.tv_sec = PROBE_TIMEOUT_S};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = "libgpumem device probe";
        hello.admin = true;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 1;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        uint8_t *pkt = malloc(GM_IPC_MAX_PACKET_DEFAULT);
        int fds[GM_IPC_MAX_FDS_LIMIT];
        size_t n = 0, n_fds = 0;
        Gpumem__Envelope *reply = NULL;
        r = pkt ? gm_msg_send(fd, &env, NULL, 0, GM_IPC_MAX_PACKET_DEFAULT) : -ENOMEM;
        if (r == 0 &&
            (r = gm_ipc_recv(fd, pkt, GM_IPC_MAX_PACKET_DEFAULT, fds, GM_IPC_MAX_FDS_LIMIT, &n, &n_fds)) == 0) {
                gm_close_fds(fds, n_fds);
                r = gm_msg_unpack(pkt, n, &reply);
        }
        if (r == 0 && reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY)
                r = -EPROTO;
        if (r == 0)
                snprintf(buf, len, "%s", reply->hello_reply->device_uuid ? reply->hello_reply->device_uuid : "");
        gm_msg_free(reply);
        free(pkt);
        close(fd);
        return r;
}

typedef enum daemon_match {
        DAEMON_UNREACHABLE,
        DAEMON_NO_UUID, /* host backend, or a daemon that names no GPU */
        DAEMON_OTHER_GPU,
        DAEMON_THIS_GPU,
} daemon_match_t;

/* Whether the daemon at `path` serves this process's CUDA device `ordinal`. */
static daemon_match_t match_daemon(const gm_cuda_t *cu, const char *path, int ordinal) {
        char uuid[64];
        if (daemon_uuid(path, uuid, sizeof(uuid)) < 0)
                return DAEMON_UNREACHABLE;
        if (!uuid[0])
                return DAEMON_NO_UUID;
        CUdevice dev;
        int local = -1;
        return gm_cuda_find_device(cu, 0, uuid, &dev, &local) == 0 && local == ordinal ? DAEMON_THIS_GPU
                                                                                       : DAEMON_OTHER_GPU;
}
#endif

/* The socket of the daemon serving this process's device `ordinal`: the
 * template's, unless its daemon names another GPU or is not there and another
 * socket of the template names this one (CUDA_VISIBLE_DEVICES renumbers). */
static int find_device_socket(int ordinal, char *path, size_t len) {
        int r = gm_peer_device_socket(ordinal, path, len);
        if (r < 0)
                return r;
#ifdef GPUMEM_HAVE_CUDA
        const gm_cuda_t *cu;
        if (gm_cuda_load(&cu) < 0)
                return 0; /* no driver here: nothing to check the template's pick against */
        daemon_match_t m = match_daemon(cu, path, ordinal);
        if (m == DAEMON_THIS_GPU || m == DAEMON_NO_UUID)
                return 0;
        for (int i = 0; i < MAX_DEVICES; i++) {
                char other[108];
                struct stat st;
                if (i == ordinal || gm_peer_device_socket(i, other, sizeof(other)) < 0 || stat(other, &st) < 0)
                        continue;
                if (match_daemon(cu, other, ordinal) == DAEMON_THIS_GPU) {
                        snprintf(path, len, "%s", other);
                        return 0;
                }
        }
        if (m == DAEMON_UNREACHABLE)
                return 0; /* connecting says why */
        return gm_client_set_error(NULL, -ENODEV,
                                   "gpumem: no gpumemd serves this process's CUDA device %d: '%s' serves another GPU "
                                   "and no other socket of its kind (indices 0..%d) names this device's UUID",
                                   ordinal, path, MAX_DEVICES - 1);
#else
        return 0;
#endif
}

int gpumem_connect_device(int ordinal, gpumem_client **ret) {
        if (ordinal < 0 || ordinal >= MAX_DEVICES || !ret)
                return -EINVAL;
        char path[108];
        int r = find_device_socket(ordinal, path, sizeof(path));
        if (r == -EINVAL)
                return gm_client_set_error(NULL, r,
                                           "gpumem: GPUMEM_SOCKET_TEMPLATE must hold one %%d and no other "
                                           "%% (e.g. /run/gpumem/gpu%%d.sock)");
        if (r < 0)
                return r == -ENODEV ? r
                                    : gm_client_set_error(NULL, r, "gpumem: no socket for device %d: %s", ordinal,
                                                          strerror(-r));
        r = gpumem_connect(path, ret);
        if (r == -ENOENT || r == -ECONNREFUSED)
                r = -ENODEV;
        return r;
}

/* ---- statistics ---- */

struct gpumem_stats {
        int device;
        uint64_t capacity;
        uint64_t sessions;
        size_t n;
        struct {
                char *name; /* into the same allocation */
                int64_t value;
        } entries[];
};

/* Builds a gpumem_stats from one gm_stats_t in two passes (sizes, then copies). */
typedef struct stats_build {
        gpumem_stats *s; /* NULL: first pass */
        size_t n, text;
        char *names;
} stats_build_t;

static void stats_build_visit(const char *name, int64_t value, void *userdata) {
        stats_build_t *b = userdata;
        size_t len = strlen(name) + 1;
        if (b->s) {
                b->s->entries[b->n].name = memcpy(b->names, name, len);
                b->s->entries[b->n].value = value;
                b->names += len;
        }
        b->n++;
        b->text += len;
}

/* A local session's own statistics: its heap's, here. */
static int local_session_stats(gpumem_client *c, gpumem_stats **ret) {
        gm_stats_t st;
        int device;
        uint64_t capacity;
        int r = gm_client_local_stats(c, &st, &device, &capacity);
        if (r < 0)
                return r;
        stats_build_t b = {0};
        gm_stats_foreach(&st, stats_build_visit, &b);
        gpumem_stats *s = malloc(sizeof(*s) + b.n * sizeof(s->entries[0]) + b.text);
        if (!s)
                return gm_client_set_error(c, -ENOMEM, "gpumem: out of memory");
        *s = (gpumem_stats){.device = device, .capacity = capacity, .sessions = 1, .n = b.n};
        b = (stats_build_t){.s = s, .names = (char *) &s->entries[s->n]};
        gm_stats_foreach(&st, stats_build_visit, &b);
        *ret = s;
        return 0;
}

int gpumem_stats_get(gpumem_client *c, gpumem_scope scope, const char *tenant, uint32_t pid, gpumem_stats **ret) {
        if (!c || !ret || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        if (scope == GPUMEM_SCOPE_SESSION) {
                int r = local_session_stats(c, ret);
                if (r != -EOPNOTSUPP)
                        return r;
        }
        Gpumem__Stats req = GPUMEM__STATS__INIT;
        req.scope = (Gpumem__StatsScope) scope;
        req.tenant = (char *) (scope == GPUMEM_SCOPE_TENANT && tenant ? tenant : "");
        req.pid = scope == GPUMEM_SCOPE_PID ? pid : 0;
        Gpumem__Envelope *reply;
        int r = request(c, GPUMEM__ENVELOPE__BODY_STATS, &req, GPUMEM__ENVELOPE__BODY_STATS_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        const Gpumem__StatsReply *sr = reply->stats_reply;
        size_t text = 0;
        for (size_t i = 0; i < sr->n_stats; i++)
                text += strlen(sr->stats[i]->name) + 1;
        gpumem_stats *s = malloc(sizeof(*s) + sr->n_stats * sizeof(s->entries[0]) + text);
        if (!s) {
                gm_msg_free(reply);
                return gm_client_set_error(c, -ENOMEM, "gpumem: out of memory");
        }
        s->device = sr->device;
        s->capacity = sr->capacity;
        s->sessions = sr->sessions;
        s->n = sr->n_stats;
        char *names = (char *) &s->entries[s->n];
        for (size_t i = 0; i < s->n; i++) {
                size_t len = strlen(sr->stats[i]->name) + 1;
                s->entries[i].name = memcpy(names, sr->stats[i]->name, len);
                s->entries[i].value = sr->stats[i]->value;
                names += len;
        }
        gm_msg_free(reply);
        *ret = s;
        return 0;
}

void gpumem_stats_free(gpumem_stats *s) {
        free(s);
}

size_t gpumem_stats_count(const gpumem_stats *s) {
        return s ? s->n : 0;
}

const char *gpumem_stats_name(const gpumem_stats *s, size_t i) {
        return s && i < s->n ? s->entries[i].name : NULL;
}

int64_t gpumem_stats_value(const gpumem_stats *s, size_t i) {
        return s && i < s->n ? s->entries[i].value : 0;
}

int gpumem_stats_find(const gpumem_stats *s, const char *name, int64_t *ret_value) {
        if (!s || !name || !ret_value)
                return -EINVAL;
        for (size_t i = 0; i < s->n; i++)
                if (strcmp(s->entries[i].name, name) == 0) {
                        *ret_value = s->entries[i].value;
                        return 0;
                }
        return -ENOENT;
}

int gpumem_stats_device(const gpumem_stats *s) {
        return s ? s->device : -1;
}

uint64_t gpumem_stats_capacity(const gpumem_stats *s) {
        return s ? s->capacity : 0;
}

uint64_t gpumem_stats_sessions(const gpumem_stats *s) {
        return s ? s->sessions : 0;
}

int gpumem_stats_summary(const gpumem_stats *s, bool abbreviated, char **ret_text) {
        if (!s || !ret_text)
                return -EINVAL;
        gm_stats_t st;
        gm_stats_init(&st);
        for (size_t i = 0; i < s->n; i++)
                gm_stats_set(&st, s->entries[i].name, s->entries[i].value); /* names it lacks are not shown */
        for (size_t cap = 8192; cap <= (1u << 20); cap *= 2) {
                char *text = malloc(cap);
                if (!text)
                        return -ENOMEM;
                int r = gm_stats_summary(&st, s->device, abbreviated, text, cap);
                if (r >= 0) {
                        *ret_text = text;
                        return 0;
                }
                free(text);
                if (r != -ENOSPC)
                        return r;
        }
        return -ENOSPC;
}

int gpumem_reset_stats(gpumem_client *c, gpumem_scope scope, const char *tenant, bool peak, bool accumulated) {
        if (!c || scope == GPUMEM_SCOPE_PID || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        if (scope == GPUMEM_SCOPE_SESSION)
                gm_client_reset_local_stats(c, peak, accumulated); /* a local heap's figures are here */
        Gpumem__ResetStats req = GPUMEM__RESET_STATS__INIT;
        req.scope = (Gpumem__StatsScope) scope;
        req.tenant = (char *) (tenant ? tenant : "");
        req.peak = peak;
        req.accumulated = accumulated;
        Gpumem__Envelope *reply;
        int r = request(c, GPUMEM__ENVELOPE__BODY_RESET_STATS, &req, GPUMEM__ENVELOPE__BODY_OK, &reply, NULL);
        gm_msg_free(r == 0 ? reply : NULL);
        return r;
}

int gpumem_trim_tenant(gpumem_client *c, const char *tenant, uint64_t *ret_released_bytes) {
        if (!c)
                return -EINVAL;
        if (!tenant)
                return gpumem_trim(c, ret_released_bytes);
        if (!*tenant)
                return gm_client_set_error(c, -EINVAL, "gpumem: trim: empty tenant name (NULL is this session)");
        Gpumem__Trim req = GPUMEM__TRIM__INIT;
        req.tenant = (char *) tenant;
        Gpumem__Envelope *reply;
        int r = request(c, GPUMEM__ENVELOPE__BODY_TRIM, &req, GPUMEM__ENVELOPE__BODY_TRIM_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        if (ret_released_bytes)
                *ret_released_bytes = reply->trim_reply->released_bytes;
        gm_msg_free(reply);
        return 0;
}

/* ---- snapshots and history ---- */

/* Largest snapshot the library reads (the daemon's history is bounded too). */
#define MAX_SNAPSHOT_BYTES (4ull << 30)

/* Reads exactly `len` bytes of fd (a pipe the daemon fills, or a file at
 * offset 0). */
static int read_all(int fd, char *buf, size_t len) {
        size_t done = 0;
        while (done < len) {
                ssize_t n = read(fd, buf + done, len - done);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n < 0 ? -errno : -EPROTO;
                done += (size_t) n;
        }
        return 0;
}

int gpumem_snapshot(gpumem_client *c, gpumem_snapshot_format format, uint32_t pid, void **ret_data, size_t *ret_len) {
        if (!c || !ret_data || !ret_len || format > GPUMEM_SNAPSHOT_PICKLE_1_13)
                return -EINVAL;
        Gpumem__Snapshot req = GPUMEM__SNAPSHOT__INIT;
        req.format = format == GPUMEM_SNAPSHOT_JSON          ? GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_JSON
                     : format == GPUMEM_SNAPSHOT_PICKLE_1_13 ? GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE_1_13
                                                             : GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE;
        req.pid = pid;
        if (pid == (uint32_t) getpid() && format != GPUMEM_SNAPSHOT_PICKLE_1_13) {
                /* This process's memory: a local heap is here, not in the daemon. */
                char *buf;
                size_t len;
                int r = gm_client_local_snapshot(c, format == GPUMEM_SNAPSHOT_JSON, &buf, &len);
                if (r == 0) {
                        char *data = realloc(buf, len + 1);
                        if (!data) {
                                free(buf);
                                return gm_client_set_error(c, -ENOMEM, "gpumem: out of memory");
                        }
                        data[len] = '\0'; /* a JSON snapshot reads as a C string too */
                        *ret_data = data;
                        *ret_len = len;
                        return 0;
                }
                if (r != -EOPNOTSUPP)
                        return r;
        }
        Gpumem__Envelope *reply;
        int fd = -1;
        int r = request(c, GPUMEM__ENVELOPE__BODY_SNAPSHOT, &req, GPUMEM__ENVELOPE__BODY_SNAPSHOT_REPLY, &reply, &fd);
        if (r < 0)
                return r;
        uint64_t size = reply->snapshot_reply->size;
        gm_msg_free(reply);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || (S_ISREG(st.st_mode) && (uint64_t) st.st_size != size) ||
            size > MAX_SNAPSHOT_BYTES) {
                if (fd >= 0)
                        close(fd);
                return gm_client_set_error(c, -EPROTO, "gpumem: the daemon's snapshot is missing or not %llu bytes",
                                           (unsigned long long) size);
        }
        char *data = malloc(size + 1);
        r = data ? read_all(fd, data, size) : -ENOMEM;
        close(fd);
        if (r < 0) {
                free(data);
                return gm_client_set_error(c, r, "gpumem: cannot read the snapshot: %s", strerror(-r));
        }
        data[size] = '\0'; /* a JSON snapshot reads as a C string too */
        *ret_data = data;
        *ret_len = size;
        return 0;
}

int gpumem_history(gpumem_client *c, bool enabled, uint64_t max_entries, gpumem_history_state *ret_state) {
        if (!c)
                return -EINVAL;
        Gpumem__HistoryControl req = GPUMEM__HISTORY_CONTROL__INIT;
        req.enabled = enabled;
        req.max_entries = max_entries;
        Gpumem__Envelope *reply;
        int r = request(c, GPUMEM__ENVELOPE__BODY_HISTORY_CONTROL, &req, GPUMEM__ENVELOPE__BODY_HISTORY_REPLY, &reply,
                        NULL);
        if (r < 0)
                return r;
        /* The daemon's ring holds central heaps' events; a local heap keeps its own. */
        r = gm_client_local_history(c, reply->history_reply->enabled, reply->history_reply->max_entries);
        if (r < 0) {
                gm_msg_free(reply);
                return r;
        }
        if (ret_state)
                *ret_state = (gpumem_history_state){.enabled = reply->history_reply->enabled,
                                                    .max_entries = reply->history_reply->max_entries,
                                                    .entries = reply->history_reply->entries};
        gm_msg_free(reply);
        return 0;
}

/* ---- sessions and quotas ---- */

/* Copies a reply's string into a list buffer's string area. */
static const char *put_str(char **area, const char *s) {
        size_t len = strlen(s ? s : "") + 1;
        char *dst = memcpy(*area, s ? s : "", len);
        *area += len;
        return dst;
}

static size_t str_size(const char *s) {
        return strlen(s ? s : "") + 1;
}

/* A session's heap mode as gpumemctl names it (a daemon that names none has central heaps only). */
static const char *heap_name(const Gpumem__ClientInfo *ci) {
        return ci->heap_mode && ci->heap_mode[0] ? ci->heap_mode : "central";
}

int gpumem_list_clients(gpumem_client *c, gpumem_client_info **ret_list, size_t *ret_n) {
        if (!c || !ret_list || !ret_n)
                return -EINVAL;
        Gpumem__Clients req = GPUMEM__CLIENTS__INIT;
        Gpumem__Envelope *reply;
        int r = request(c, GPUMEM__ENVELOPE__BODY_CLIENTS, &req, GPUMEM__ENVELOPE__BODY_CLIENTS_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        const Gpumem__ClientsReply *cr = reply->clients_reply;
        size_t text = 0;
        for (size_t i = 0; i < cr->n_clients; i++)
                text += str_size(cr->clients[i]->tenant) + str_size(cr->clients[i]->unit) +
                        str_size(cr->clients[i]->name) + str_size(heap_name(cr->clients[i]));
        gpumem_client_info *list = malloc(cr->n_clients * sizeof(*list) + text + 1);
        if (!list) {
                gm_msg_free(reply);
                return gm_client_set_error(c, -ENOMEM, "gpumem: out of memory");
        }
        char *area = (char *) &list[cr->n_clients];
        for (size_t i = 0; i < cr->n_clients; i++) {
                const Gpumem__ClientInfo *ci = cr->clients[i];
                list[i] = (gpumem_client_info){
                        .session_id = ci->session_id,
                        .pid = ci->pid,
                        .uid = ci->uid,
                        .tenant = put_str(&area, ci->tenant),
                        .unit = put_str(&area, ci->unit),
                        .name = put_str(&area, ci->name),
                        .reserved_bytes = ci->reserved,
                        .allocated_bytes = ci->allocated,
                        .cached_bytes = ci->cached,
                        .segments = ci->segments,
                        .releasing_bytes = ci->releasing,
                        .control = ci->admin,
                        .heap = put_str(&area, heap_name(ci)),
                        .stats_page_invalid = ci->stats_page_invalid,
                        .requests = ci->requests,
                };
        }
        *ret_n = cr->n_clients;
        *ret_list = list;
        gm_msg_free(reply);
        return 0;
}

static int quota_call(gpumem_client *c, Gpumem__Quota *req, gpumem_tenant_info **ret_list, size_t *ret_n) {
        Gpumem__Envelope *reply;
        int r = request(c, GPUMEM__ENVELOPE__BODY_QUOTA, req, GPUMEM__ENVELOPE__BODY_QUOTA_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        const Gpumem__QuotaReply *qr = reply->quota_reply;
        size_t text = 0;
        for (size_t i = 0; i < qr->n_tenants; i++)
                text += str_size(qr->tenants[i]->tenant) + str_size(qr->tenants[i]->quota_source);
        gpumem_tenant_info *list = ret_list ? malloc(qr->n_tenants * sizeof(*list) + text + 1) : NULL;
        if (ret_list && !list) {
                gm_msg_free(reply);
                return gm_client_set_error(c, -ENOMEM, "gpumem: out of memory");
        }
        char *area = list ? (char *) &list[qr->n_tenants] : NULL;
        for (size_t i = 0; i < qr->n_tenants && list; i++) {
                const Gpumem__TenantInfo *t = qr->tenants[i];
                list[i] = (gpumem_tenant_info){
                        .tenant = put_str(&area, t->tenant),
                        .quota = t->quota,
                        .quota_source = put_str(&area, t->quota_source),
                        .charged_bytes = t->charged,
                        .allocated_bytes = t->allocated,
                        .cached_bytes = t->cached,
                        .sessions = t->sessions,
                };
        }
        if (ret_list) {
                *ret_list = list;
                *ret_n = qr->n_tenants;
        }
        gm_msg_free(reply);
        return 0;
}

int gpumem_quota_list(gpumem_client *c, const char *tenant, gpumem_tenant_info **ret_list, size_t *ret_n) {
        if (!c || !ret_list || !ret_n)
                return -EINVAL;
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        req.op = tenant ? GPUMEM__QUOTA_OP__QUOTA_OP_GET : GPUMEM__QUOTA_OP__QUOTA_OP_LIST;
        req.tenant = (char *) (tenant ? tenant : "");
        return quota_call(c, &req, ret_list, ret_n);
}

int gpumem_quota_set(gpumem_client *c, const char *tenant, uint64_t bytes, bool runtime) {
        if (!c || !tenant || !*tenant)
                return -EINVAL;
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        req.op = GPUMEM__QUOTA_OP__QUOTA_OP_SET;
        req.tenant = (char *) tenant;
        req.bytes = bytes;
        req.runtime = runtime;
        return quota_call(c, &req, NULL, NULL);
}

/* The caller's own tenant: its quota (0: none) and charged bytes. */
static int own_tenant(gpumem_client *c, uint64_t *ret_quota, uint64_t *ret_charged) {
        gpumem_tenant_info *list;
        size_t n;
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        req.op = GPUMEM__QUOTA_OP__QUOTA_OP_GET;
        req.tenant = ""; /* the daemon reads it as the caller's */
        int r = quota_call(c, &req, &list, &n);
        if (r < 0)
                return r;
        *ret_quota = n ? list[0].quota : 0;
        *ret_charged = n ? list[0].charged_bytes : 0;
        free(list);
        return 0;
}

int gpumem_mem_get_info(gpumem_client *c, uint64_t *ret_free, uint64_t *ret_total) {
        if (!c || !ret_free || !ret_total)
                return -EINVAL;
        gpumem_stats *st = NULL;
        int r = gpumem_stats_get(c, GPUMEM_SCOPE_DEVICE, NULL, 0, &st);
        if (r == -EPERM) /* the device is not the caller's to see: its tenant is */
                r = gpumem_stats_get(c, GPUMEM_SCOPE_TENANT, NULL, 0, &st);
        uint64_t quota = 0, charged = 0;
        if (r == 0)
                r = own_tenant(c, &quota, &charged);
        int64_t reserved = 0;
        if (r == 0 && gpumem_stats_find(st, "reserved_bytes.all.current", &reserved) < 0)
                r = gm_client_set_error(c, -EPROTO, "gpumem: the daemon sent no reserved_bytes.all.current");
        if (r == 0) {
                uint64_t total = gpumem_stats_capacity(st);
                uint64_t used = reserved > 0 ? (uint64_t) reserved : 0;
                uint64_t avail = used < total ? total - used : 0;
                if (quota) {
                        uint64_t left = charged < quota ? quota - charged : 0;
                        avail = left < avail ? left : avail;
                }
                *ret_free = avail;
                *ret_total = total;
        }
        gpumem_stats_free(st);
        return r;
}
