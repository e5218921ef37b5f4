/* libgpumem beyond allocation: the device a CUDA ordinal names, statistics
 * as a set and as memory_summary() text, resets, trims, snapshots, memory
 * history, sessions and quotas. Each call is one request of the wire protocol
 * on a channel: a client's own session (gpumem_*) or a control connection
 * (gpumem_admin_*, control.c: the requests gpumemctl sends), so the daemon
 * applies the caller's kernel-verified rights either way. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "claim.h"
#include "client-internal.h"
#include "control.h"
#include "cuda_loader.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "peer_check.h"
#include "stats.h"

void gpumem_buffer_free(void *buf) {
        free(buf);
}

/* Where a call's requests go: a client's session, or else a control
 * connection. */
typedef struct channel {
        gpumem_client *client;
        gpumem_admin *admin;
} channel_t;

#define CLIENT_CHANNEL(c) (&(channel_t){.client = (c)})
#define ADMIN_CHANNEL(a) (&(channel_t){.admin = (a)})

/* Records a failure's text where the channel's caller reads it
 * (gpumem_last_error() or gpumem_admin_error()); returns err. */
static int channel_error(const channel_t *ch, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int channel_error(const channel_t *ch, int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        if (ch->client) {
                char msg[1024];
                vsnprintf(msg, sizeof(msg), fmt, ap);
                gm_client_set_error(ch->client, err, "%s", msg);
        } else {
                gm_control_vfail(ch->admin, GPUMEM_ADMIN_FAILED, err, fmt, ap);
        }
        va_end(ap);
        return err;
}

/* One request on the channel: `body` is the message of oneof case
 * `body_case` (every body of the envelope is a pointer in one union), and the
 * reply must be of case `want`; see gm_client_call() and gm_control_call(). */
static int request(const channel_t *ch, Gpumem__Envelope__BodyCase body_case, void *body,
                   Gpumem__Envelope__BodyCase want, Gpumem__Envelope **ret_reply, int *ret_fd) {
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = body_case;
        env.hello = body;
        return ch->client ? gm_client_call(ch->client, &env, want, ret_reply, ret_fd)
                          : gm_control_call(ch->admin, &env, want, ret_reply, ret_fd);
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
        uint64_t claimed; /* the scope's unconsumed claims */
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

/* The daemon's statistics of `scope` as a set. */
static int stats_request(const channel_t *ch, gpumem_scope scope, const char *tenant, uint32_t pid, const char *tag,
                         gpumem_stats **ret) {
        Gpumem__Stats req = GPUMEM__STATS__INIT;
        req.tagged = tag != NULL;
        req.tag = (char *) (tag ? tag : "");
        req.scope = (Gpumem__StatsScope) scope;
        req.tenant = (char *) (scope == GPUMEM_SCOPE_TENANT && tenant ? tenant : "");
        req.pid = scope == GPUMEM_SCOPE_PID ? pid : 0;
        Gpumem__Envelope *reply;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_STATS, &req, GPUMEM__ENVELOPE__BODY_STATS_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        const Gpumem__StatsReply *sr = reply->stats_reply;
        size_t text = 0;
        for (size_t i = 0; i < sr->n_stats; i++)
                text += strlen(sr->stats[i]->name) + 1;
        gpumem_stats *s = malloc(sizeof(*s) + sr->n_stats * sizeof(s->entries[0]) + text);
        if (!s) {
                gm_msg_free(reply);
                return channel_error(ch, -ENOMEM, "gpumem: out of memory");
        }
        s->device = sr->device;
        s->capacity = sr->capacity;
        s->sessions = sr->sessions;
        s->claimed = sr->claimed;
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

int gpumem_stats_get(gpumem_client *c, gpumem_scope scope, const char *tenant, uint32_t pid, gpumem_stats **ret) {
        if (!c || !ret || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        if (scope == GPUMEM_SCOPE_SESSION) {
                int r = local_session_stats(c, ret);
                if (r != -EOPNOTSUPP)
                        return r;
        }
        return stats_request(CLIENT_CHANNEL(c), scope, tenant, pid, NULL, ret);
}

int gpumem_admin_stats(gpumem_admin *a, gpumem_scope scope, const char *tenant, uint32_t pid, gpumem_stats **ret) {
        if (!a || !ret || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        return stats_request(ADMIN_CHANNEL(a), scope, tenant, pid, NULL, ret);
}

int gpumem_admin_stats_tag(gpumem_admin *a, gpumem_scope scope, const char *tenant, uint32_t pid, const char *tag,
                           gpumem_stats **ret) {
        if (!a || !ret || !tag || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        return stats_request(ADMIN_CHANNEL(a), scope, tenant, pid, tag, ret);
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

uint64_t gpumem_stats_claimed(const gpumem_stats *s) {
        return s ? s->claimed : 0;
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

static int reset_request(const channel_t *ch, gpumem_scope scope, const char *tenant, bool peak, bool accumulated) {
        Gpumem__ResetStats req = GPUMEM__RESET_STATS__INIT;
        req.scope = (Gpumem__StatsScope) scope;
        req.tenant = (char *) (tenant ? tenant : "");
        req.peak = peak;
        req.accumulated = accumulated;
        Gpumem__Envelope *reply;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_RESET_STATS, &req, GPUMEM__ENVELOPE__BODY_OK, &reply, NULL);
        gm_msg_free(r == 0 ? reply : NULL);
        return r;
}

int gpumem_reset_stats(gpumem_client *c, gpumem_scope scope, const char *tenant, bool peak, bool accumulated) {
        if (!c || scope == GPUMEM_SCOPE_PID || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        if (scope == GPUMEM_SCOPE_SESSION)
                gm_client_reset_local_stats(c, peak, accumulated); /* a local heap's figures are here */
        return reset_request(CLIENT_CHANNEL(c), scope, tenant, peak, accumulated);
}

int gpumem_admin_reset_stats(gpumem_admin *a, gpumem_scope scope, const char *tenant, bool peak, bool accumulated) {
        if (!a || scope > GPUMEM_SCOPE_PID)
                return -EINVAL;
        return reset_request(ADMIN_CHANNEL(a), scope, tenant, peak, accumulated);
}

static int trim_request(const channel_t *ch, const char *tenant, uint64_t *ret_released_bytes) {
        Gpumem__Trim req = GPUMEM__TRIM__INIT;
        req.tenant = (char *) tenant;
        Gpumem__Envelope *reply;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_TRIM, &req, GPUMEM__ENVELOPE__BODY_TRIM_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        if (ret_released_bytes)
                *ret_released_bytes = reply->trim_reply->released_bytes;
        gm_msg_free(reply);
        return 0;
}

int gpumem_trim_tenant(gpumem_client *c, const char *tenant, uint64_t *ret_released_bytes) {
        if (!c)
                return -EINVAL;
        if (!tenant)
                return gpumem_trim(c, ret_released_bytes);
        if (!*tenant)
                return gm_client_set_error(c, -EINVAL, "gpumem: trim: empty tenant name (NULL is this session)");
        return trim_request(CLIENT_CHANNEL(c), tenant, ret_released_bytes);
}

int gpumem_admin_trim(gpumem_admin *a, const char *tenant, uint64_t *ret_released_bytes) {
        if (!a || !tenant)
                return -EINVAL;
        return trim_request(ADMIN_CHANNEL(a), tenant, ret_released_bytes);
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

/* Reads the `size` bytes a reply's fd carries (a sealed memfd, or a pipe the
 * daemon fills) into a NUL-terminated buffer, and closes the fd. -EPROTO when
 * there is none (fd -1), or it is a file of another size, or size is over
 * `max`; else a read's error. */
static int reply_fd_read(int fd, uint64_t size, uint64_t max, char **ret_data) {
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || (S_ISREG(st.st_mode) && (uint64_t) st.st_size != size) || size > max) {
                if (fd >= 0)
                        close(fd);
                return -EPROTO;
        }
        char *data = malloc(size + 1);
        int r = data ? read_all(fd, data, size) : -ENOMEM;
        close(fd);
        if (r < 0) {
                free(data);
                return r;
        }
        data[size] = '\0';
        *ret_data = data;
        return 0;
}

/* The daemon's snapshot: its reply's figures and the fd its bytes come in
 * (-1: the reply carried none). */
static int snapshot_request(const channel_t *ch, gpumem_snapshot_format format, gpumem_snapshot_category category,
                            uint32_t pid, int *ret_fd, gpumem_snapshot_info *ret_info) {
        Gpumem__Snapshot req = GPUMEM__SNAPSHOT__INIT;
        req.format = format == GPUMEM_SNAPSHOT_JSON          ? GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_JSON
                     : format == GPUMEM_SNAPSHOT_PICKLE_1_13 ? GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE_1_13
                                                             : GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE;
        req.category = (Gpumem__SnapshotCategory) category;
        req.pid = pid;
        Gpumem__Envelope *reply;
        int fd = -1;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_SNAPSHOT, &req, GPUMEM__ENVELOPE__BODY_SNAPSHOT_REPLY, &reply, &fd);
        if (r < 0)
                return r;
        gpumem_snapshot_info info = {.size = reply->snapshot_reply->size,
                                     .local_asked = reply->snapshot_reply->local_asked,
                                     .local_unanswered = reply->snapshot_reply->local_unanswered};
        gm_msg_free(reply);
        *ret_fd = fd;
        *ret_info = info;
        return 0;
}

int gpumem_admin_snapshot(gpumem_admin *a, gpumem_snapshot_format format, gpumem_snapshot_category category,
                          uint32_t pid, int *ret_fd, gpumem_snapshot_info *ret_info) {
        if (!a || !ret_fd || !ret_info || format > GPUMEM_SNAPSHOT_PICKLE_1_13 ||
            (category > GPUMEM_SNAPSHOT_CATEGORY_PID && category != GPUMEM_SNAPSHOT_CATEGORY_TAG))
                return -EINVAL;
        int fd;
        gpumem_snapshot_info info;
        int r = snapshot_request(ADMIN_CHANNEL(a), format, category, pid, &fd, &info);
        if (r < 0)
                return r;
        if (fd < 0)
                return gm_control_fail(a, GPUMEM_ADMIN_FAILED, -EPROTO, "the daemon sent no snapshot");
        *ret_fd = fd;
        *ret_info = info;
        return 0;
}

int gpumem_snapshot(gpumem_client *c, gpumem_snapshot_format format, uint32_t pid, void **ret_data, size_t *ret_len) {
        if (!c || !ret_data || !ret_len || format > GPUMEM_SNAPSHOT_PICKLE_1_13)
                return -EINVAL;
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
        int fd = -1;
        gpumem_snapshot_info info;
        int r = snapshot_request(CLIENT_CHANNEL(c), format, GPUMEM_SNAPSHOT_CATEGORY_NONE, pid, &fd, &info);
        if (r < 0)
                return r;
        uint64_t size = info.size;
        char *data;
        r = reply_fd_read(fd, size, MAX_SNAPSHOT_BYTES, &data); /* a JSON snapshot reads as a C string too */
        if (r == -EPROTO)
                return gm_client_set_error(c, -EPROTO, "gpumem: the daemon's snapshot is missing or not %llu bytes",
                                           (unsigned long long) size);
        if (r < 0)
                return gm_client_set_error(c, r, "gpumem: cannot read the snapshot: %s", strerror(-r));
        *ret_data = data;
        *ret_len = size;
        return 0;
}

int gpumem_admin_snapshot_data(gpumem_admin *a, gpumem_snapshot_format format, gpumem_snapshot_category category,
                               uint32_t pid, void **ret_data, size_t *ret_len) {
        if (!ret_data || !ret_len)
                return -EINVAL;
        int fd;
        gpumem_snapshot_info info;
        int r = gpumem_admin_snapshot(a, format, category, pid, &fd, &info);
        if (r < 0)
                return r;
        char *data;
        r = reply_fd_read(fd, info.size, MAX_SNAPSHOT_BYTES, &data);
        if (r < 0)
                return gm_control_fail(a, GPUMEM_ADMIN_UNEXPECTED, r, "unexpected reply from gpumemd");
        *ret_data = data;
        *ret_len = info.size;
        return 0;
}

/* ---- samples ---- */

/* The largest SampleSet accepted from the daemon (it sends far less). */
#define MAX_SAMPLE_SET_BYTES (256u << 20)

/* A gpumem_sample_set over the unpacked message its strings and samples are in. */
typedef struct sample_set {
        gpumem_sample_set set; /* first: what the caller holds */
        Gpumem__SampleSet *msg;
        gpumem_session_samples *sessions;
        gpumem_refusal *refusals;
} sample_set_t;

void gpumem_sample_set_free(gpumem_sample_set *set) {
        sample_set_t *s = (sample_set_t *) set;
        if (!s)
                return;
        if (s->msg)
                gpumem__sample_set__free_unpacked(s->msg, NULL);
        free(s->sessions);
        free(s->refusals);
        free(s);
}

/* The set as the caller reads it; NULL when out of memory. */
static gpumem_sample_set *sample_set_of(Gpumem__SampleSet *m) {
        sample_set_t *s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        s->msg = m;
        s->sessions = calloc(m->n_sessions + 1, sizeof(*s->sessions));
        s->refusals = calloc(m->n_refusals + 1, sizeof(*s->refusals));
        if (!s->sessions || !s->refusals) {
                s->msg = NULL;
                gpumem_sample_set_free(&s->set);
                return NULL;
        }
        for (size_t i = 0; i < m->n_sessions; i++) {
                const Gpumem__SessionSamples *ss = m->sessions[i];
                s->sessions[i] = (gpumem_session_samples){
                        .session_id = ss->session_id,
                        .pid = ss->pid,
                        .tenant = ss->tenant,
                        .unit = ss->unit,
                        .name = ss->name,
                        .heap_mode = ss->heap_mode,
                        .stride = ss->stride,
                        .samples = ss->samples,
                        .n_samples = ss->n_samples,
                        .last_refusal_ms = ss->last_refusal_ms,
                };
        }
        for (size_t i = 0; i < m->n_refusals; i++) {
                const Gpumem__RefusalEvent *e = m->refusals[i];
                s->refusals[i] = (gpumem_refusal){.t_ms = e->t_ms,
                                                  .session_id = e->session_id,
                                                  .pid = e->pid,
                                                  .tenant = e->tenant,
                                                  .reason = e->reason,
                                                  .size = e->size};
        }
        s->set = (gpumem_sample_set){
                .now_ms = m->now_ms,
                .period_ms = m->period_ms,
                .capacity = m->capacity,
                .device_free = m->device_free,
                .reserved = m->reserved,
                .allocated = m->allocated,
                .refusals_total = m->refusals_total,
                .device_scope = m->device_scope,
                .sessions = s->sessions,
                .n_sessions = m->n_sessions,
                .refusals = s->refusals,
                .n_refusals = m->n_refusals,
        };
        return &s->set;
}

int gpumem_admin_samples(gpumem_admin *a, uint32_t pid, const char *tenant, uint64_t window_ms,
                         gpumem_sample_set **ret) {
        if (!a || !ret)
                return -EINVAL;
        Gpumem__Samples req = GPUMEM__SAMPLES__INIT;
        req.pid = pid;
        req.tenant = (char *) (tenant ? tenant : "");
        req.window_ms = window_ms;
        Gpumem__Envelope *reply;
        int fd = -1;
        int r = request(ADMIN_CHANNEL(a), GPUMEM__ENVELOPE__BODY_SAMPLES, &req, GPUMEM__ENVELOPE__BODY_SAMPLES_REPLY,
                        &reply, &fd);
        if (r < 0)
                return r;
        uint64_t size = reply->samples_reply->size;
        gm_msg_free(reply);
        char *data;
        r = reply_fd_read(fd, size, MAX_SAMPLE_SET_BYTES, &data);
        if (r < 0)
                return gm_control_fail(a, GPUMEM_ADMIN_UNEXPECTED, r, "unexpected reply from gpumemd");
        Gpumem__SampleSet *m = gpumem__sample_set__unpack(NULL, size, (const uint8_t *) data);
        free(data);
        if (!m)
                return gm_control_fail(a, GPUMEM_ADMIN_UNEXPECTED, -EPROTO, "unexpected samples reply from gpumemd");
        gpumem_sample_set *set = sample_set_of(m);
        if (!set) {
                gpumem__sample_set__free_unpacked(m, NULL);
                return gm_control_fail(a, GPUMEM_ADMIN_FAILED, -ENOMEM, "out of memory");
        }
        *ret = set;
        return 0;
}

_Static_assert(GPUMEM_HISTORY_MAX_ENTRIES == GM_HISTORY_MAX_ENTRIES, "the public bound is the daemon's");

/* HistoryControl: on, off, or (status_only) the state alone. */
static int history_request(const channel_t *ch, gpumem_history_op op, uint64_t max_entries,
                           gpumem_history_state *ret_state) {
        Gpumem__HistoryControl req = GPUMEM__HISTORY_CONTROL__INIT;
        req.enabled = op == GPUMEM_HISTORY_ON;
        req.status_only = op == GPUMEM_HISTORY_STATUS;
        req.max_entries = max_entries;
        Gpumem__Envelope *reply;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_HISTORY_CONTROL, &req, GPUMEM__ENVELOPE__BODY_HISTORY_REPLY, &reply,
                        NULL);
        if (r < 0)
                return r;
        /* The daemon's ring holds central heaps' events; a local heap keeps its own. */
        r = ch->client ? gm_client_local_history(ch->client, reply->history_reply->enabled,
                                                 reply->history_reply->max_entries)
                       : 0;
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

int gpumem_history(gpumem_client *c, bool enabled, uint64_t max_entries, gpumem_history_state *ret_state) {
        if (!c)
                return -EINVAL;
        return history_request(CLIENT_CHANNEL(c), enabled ? GPUMEM_HISTORY_ON : GPUMEM_HISTORY_OFF, max_entries,
                               ret_state);
}

int gpumem_admin_history(gpumem_admin *a, gpumem_history_op op, uint64_t max_entries, gpumem_history_state *ret_state) {
        if (!a || op > GPUMEM_HISTORY_STATUS)
                return -EINVAL;
        return history_request(ADMIN_CHANNEL(a), op, max_entries, ret_state);
}

int gpumem_admin_alloc_conf(gpumem_admin *a, const char *conf, char **ret_conf) {
        if (!a || !ret_conf)
                return -EINVAL;
        Gpumem__AllocConf req = GPUMEM__ALLOC_CONF__INIT;
        req.set = conf != NULL;
        req.conf = (char *) (conf ? conf : "");
        Gpumem__Envelope *reply;
        int r = request(ADMIN_CHANNEL(a), GPUMEM__ENVELOPE__BODY_ALLOC_CONF, &req,
                        GPUMEM__ENVELOPE__BODY_ALLOC_CONF_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        char *text = strdup(reply->alloc_conf_reply->conf ? reply->alloc_conf_reply->conf : "");
        gm_msg_free(reply);
        if (!text)
                return gm_control_fail(a, GPUMEM_ADMIN_FAILED, -ENOMEM, "out of memory");
        *ret_conf = text;
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

/* The Clients reply as one buffer of entries of `stride` bytes: a
 * gpumem_client_info each, or (`detailed`) a gpumem_session_info. */
static int clients_request(const channel_t *ch, bool detailed, void **ret_list, size_t *ret_n) {
        Gpumem__Clients req = GPUMEM__CLIENTS__INIT;
        Gpumem__Envelope *reply;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_CLIENTS, &req, GPUMEM__ENVELOPE__BODY_CLIENTS_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        const Gpumem__ClientsReply *cr = reply->clients_reply;
        size_t stride = detailed ? sizeof(gpumem_session_info) : sizeof(gpumem_client_info);
        size_t text = 0, n_tags = 0;
        for (size_t i = 0; i < cr->n_clients; i++) {
                text += str_size(cr->clients[i]->tenant) + str_size(cr->clients[i]->unit) +
                        str_size(cr->clients[i]->name) + str_size(heap_name(cr->clients[i])) +
                        (detailed ? str_size(cr->clients[i]->command) : 0);
                for (size_t k = 0; detailed && k < cr->clients[i]->n_tags; k++) {
                        text += str_size(cr->clients[i]->tags[k]->tag);
                        n_tags++;
                }
        }
        char *list = malloc(cr->n_clients * stride + n_tags * sizeof(gpumem_tag_bytes) + text + 1);
        if (!list) {
                gm_msg_free(reply);
                return channel_error(ch, -ENOMEM, "gpumem: out of memory");
        }
        gpumem_tag_bytes *tag_area = (gpumem_tag_bytes *) (void *) (list + cr->n_clients * stride);
        char *area = (char *) (tag_area + n_tags);
        for (size_t i = 0; i < cr->n_clients; i++) {
                const Gpumem__ClientInfo *ci = cr->clients[i];
                gpumem_session_info *e = (gpumem_session_info *) (list + i * stride);
                e->info = (gpumem_client_info){
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
                        .asleep = ci->asleep,
                        .sleeping_bytes = ci->sleeping_bytes,
                };
                if (detailed) {
                        e->command = put_str(&area, ci->command);
                        e->unresponsive = ci->unresponsive;
                        e->unresponsive_ms = ci->unresponsive_ms;
                        e->release_unverified_bytes = ci->release_unverified;
                        e->claimed_bytes = ci->claimed;
                        e->tags = tag_area;
                        e->n_tags = ci->n_tags;
                        for (size_t k = 0; k < ci->n_tags; k++)
                                *tag_area++ = (gpumem_tag_bytes){.tag = put_str(&area, ci->tags[k]->tag),
                                                                 .bytes = ci->tags[k]->bytes};
                }
        }
        *ret_n = cr->n_clients;
        *ret_list = list;
        gm_msg_free(reply);
        return 0;
}

int gpumem_list_clients(gpumem_client *c, gpumem_client_info **ret_list, size_t *ret_n) {
        if (!c || !ret_list || !ret_n)
                return -EINVAL;
        return clients_request(CLIENT_CHANNEL(c), false, (void **) ret_list, ret_n);
}

int gpumem_admin_list_clients(gpumem_admin *a, gpumem_session_info **ret_list, size_t *ret_n) {
        if (!a || !ret_list || !ret_n)
                return -EINVAL;
        return clients_request(ADMIN_CHANNEL(a), true, (void **) ret_list, ret_n);
}

/* One Quota request; with ret_list, its tenants as one buffer of
 * gpumem_tenant_info or (`detailed`) gpumem_tenant_usage entries. */
static int quota_call(const channel_t *ch, Gpumem__Quota *req, bool detailed, void **ret_list, size_t *ret_n) {
        Gpumem__Envelope *reply;
        int r = request(ch, GPUMEM__ENVELOPE__BODY_QUOTA, req, GPUMEM__ENVELOPE__BODY_QUOTA_REPLY, &reply, NULL);
        if (r < 0)
                return r;
        const Gpumem__QuotaReply *qr = reply->quota_reply;
        size_t stride = detailed ? sizeof(gpumem_tenant_usage) : sizeof(gpumem_tenant_info);
        size_t text = 0;
        for (size_t i = 0; i < qr->n_tenants; i++)
                text += str_size(qr->tenants[i]->tenant) + str_size(qr->tenants[i]->quota_source) +
                        (detailed ? str_size(qr->tenants[i]->release_check) : 0);
        char *list = ret_list ? malloc(qr->n_tenants * stride + text + 1) : NULL;
        if (ret_list && !list) {
                gm_msg_free(reply);
                return channel_error(ch, -ENOMEM, "gpumem: out of memory");
        }
        char *area = list ? list + qr->n_tenants * stride : NULL;
        for (size_t i = 0; i < qr->n_tenants && list; i++) {
                const Gpumem__TenantInfo *t = qr->tenants[i];
                gpumem_tenant_usage *e = (gpumem_tenant_usage *) (list + i * stride);
                e->info = (gpumem_tenant_info){
                        .tenant = put_str(&area, t->tenant),
                        .quota = t->quota,
                        .quota_source = put_str(&area, t->quota_source),
                        .charged_bytes = t->charged,
                        .allocated_bytes = t->allocated,
                        .cached_bytes = t->cached,
                        .sessions = t->sessions,
                };
                if (detailed) {
                        e->release_unverified_bytes = t->release_unverified;
                        e->release_check = put_str(&area, t->release_check);
                        e->audited_bytes = t->audited;
                        e->claimed_bytes = t->claimed;
                }
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
        return quota_call(CLIENT_CHANNEL(c), &req, false, (void **) ret_list, ret_n);
}

int gpumem_quota_set(gpumem_client *c, const char *tenant, uint64_t bytes, bool runtime) {
        if (!c || !tenant || !*tenant)
                return -EINVAL;
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        req.op = GPUMEM__QUOTA_OP__QUOTA_OP_SET;
        req.tenant = (char *) tenant;
        req.bytes = bytes;
        req.runtime = runtime;
        return quota_call(CLIENT_CHANNEL(c), &req, false, NULL, NULL);
}

int gpumem_admin_quota(gpumem_admin *a, gpumem_quota_op op, const char *tenant, uint64_t bytes, bool runtime,
                       gpumem_tenant_usage **ret_list, size_t *ret_n) {
        if (!a || op > GPUMEM_QUOTA_SET || !ret_list || !ret_n)
                return -EINVAL;
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        req.op = (Gpumem__QuotaOp) op;
        req.tenant = (char *) (tenant ? tenant : "");
        req.bytes = bytes;
        req.runtime = runtime;
        return quota_call(ADMIN_CHANNEL(a), &req, true, (void **) ret_list, ret_n);
}

/* The caller's own tenant: its quota (0: none), charged and claimed bytes. */
static int own_tenant(gpumem_client *c, uint64_t *ret_quota, uint64_t *ret_charged, uint64_t *ret_claimed) {
        gpumem_tenant_usage *list;
        size_t n;
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        req.op = GPUMEM__QUOTA_OP__QUOTA_OP_GET;
        req.tenant = ""; /* the daemon reads it as the caller's */
        int r = quota_call(CLIENT_CHANNEL(c), &req, true, (void **) &list, &n);
        if (r < 0)
                return r;
        *ret_quota = n ? list[0].info.quota : 0;
        *ret_charged = n ? list[0].info.charged_bytes : 0;
        *ret_claimed = n ? list[0].claimed_bytes : 0;
        free(list);
        return 0;
}

/* b less a, or 0. */
static uint64_t less(uint64_t b, uint64_t a) {
        return a < b ? b - a : 0;
}

int gpumem_mem_get_info(gpumem_client *c, uint64_t *ret_free, uint64_t *ret_total) {
        if (!c || !ret_free || !ret_total)
                return -EINVAL;
        gpumem_stats *st = NULL;
        int r = gpumem_stats_get(c, GPUMEM_SCOPE_DEVICE, NULL, 0, &st);
        bool device_seen = r != -EPERM;
        if (!device_seen) /* the device is not the caller's to see: its tenant is */
                r = gpumem_stats_get(c, GPUMEM_SCOPE_TENANT, NULL, 0, &st);
        uint64_t quota = 0, charged = 0, tenant_claimed = 0, own_claim = 0, available = 0;
        if (r == 0)
                r = own_tenant(c, &quota, &charged, &tenant_claimed);
        if (r == 0)
                r = gm_claim_query(c, &own_claim, &available);
        int64_t reserved = 0;
        if (r == 0 && gpumem_stats_find(st, "reserved_bytes.all.current", &reserved) < 0)
                r = gm_client_set_error(c, -EPROTO, "gpumem: the daemon sent no reserved_bytes.all.current");
        if (r == 0) {
                uint64_t total = gpumem_stats_capacity(st);
                /* Others' claims are taken, this session's own is its to use. */
                uint64_t used = (reserved > 0 ? (uint64_t) reserved : 0) + less(gpumem_stats_claimed(st), own_claim);
                uint64_t avail = less(total, used);
                if (quota) {
                        uint64_t left = less(quota, charged + less(tenant_claimed, own_claim));
                        avail = left < avail ? left : avail;
                }
                /* Nor more than the daemon could give it now: the device's
                 * memory and claims the caller may not see count too. */
                if (!device_seen && available < avail)
                        avail = available;
                *ret_free = avail;
                *ret_total = total;
        }
        gpumem_stats_free(st);
        return r;
}

/* ---- shared objects ---- */

/* Bytes one SharedInfo takes in a listing's buffer beyond its entry. */
static size_t shared_info_size(const Gpumem__SharedInfo *o) {
        size_t n = str_size(o->name) + str_size(o->tenant) + str_size(o->state) + o->n_readers * sizeof(char *) +
                   o->n_sessions * sizeof(gpumem_shared_mapper);
        for (size_t i = 0; i < o->n_readers; i++)
                n += str_size(o->readers[i]);
        for (size_t i = 0; i < o->n_sessions; i++)
                n += str_size(o->sessions[i]->tenant);
        return n;
}

/* Copies o into e, its arrays and text into *area (aligned for pointers first). */
static void shared_info_put(gpumem_shared_info *e, const Gpumem__SharedInfo *o, char **area) {
        const char **readers = (const char **) *area;
        *area += o->n_readers * sizeof(char *);
        gpumem_shared_mapper *sessions = (gpumem_shared_mapper *) *area;
        *area += o->n_sessions * sizeof(gpumem_shared_mapper);
        for (size_t i = 0; i < o->n_readers; i++)
                readers[i] = put_str(area, o->readers[i]);
        for (size_t i = 0; i < o->n_sessions; i++)
                sessions[i] = (gpumem_shared_mapper){.session_id = o->sessions[i]->session_id,
                                                     .pid = o->sessions[i]->pid,
                                                     .tenant = put_str(area, o->sessions[i]->tenant),
                                                     .opens = o->sessions[i]->opens};
        *e = (gpumem_shared_info){
                .object_id = o->object_id,
                .name = put_str(area, o->name),
                .version = o->version,
                .tenant = put_str(area, o->tenant),
                .size = o->size,
                .state = put_str(area, o->state),
                .mappers = o->mappers,
                .created_unix_ms = o->created_unix_ms,
                .retention_s = o->retention_s,
                .readers = o->n_readers ? readers : NULL,
                .n_readers = o->n_readers,
                .meta_len = o->meta_len,
                .sessions = o->n_sessions ? sessions : NULL,
                .n_sessions = o->n_sessions,
        };
}

int gpumem_admin_shared_list(gpumem_admin *a, const char *name, uint64_t version, gpumem_shared_info **ret_list,
                             size_t *ret_n, bool *ret_truncated) {
        if (!a || !ret_list || !ret_n || !ret_truncated || (version && !name))
                return -EINVAL;
        Gpumem__SharedList req = GPUMEM__SHARED_LIST__INIT;
        req.name = (char *) (name ? name : "");
        req.version = version;
        Gpumem__Envelope *reply;
        const channel_t *ch = ADMIN_CHANNEL(a);
        int r = request(ch, GPUMEM__ENVELOPE__BODY_SHARED_LIST, &req, GPUMEM__ENVELOPE__BODY_SHARED_LIST_REPLY, &reply,
                        NULL);
        if (r < 0)
                return r;
        const Gpumem__SharedListReply *lr = reply->shared_list_reply;
        size_t extra = 0;
        for (size_t i = 0; i < lr->n_objects; i++) /* each entry's arrays start pointer-aligned */
                extra += (shared_info_size(lr->objects[i]) + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
        char *list = malloc(lr->n_objects * sizeof(gpumem_shared_info) + extra + 1);
        if (!list) {
                gm_msg_free(reply);
                return channel_error(ch, -ENOMEM, "gpumem: out of memory");
        }
        char *area = list + lr->n_objects * sizeof(gpumem_shared_info);
        for (size_t i = 0; i < lr->n_objects; i++) {
                char *start = area;
                shared_info_put((gpumem_shared_info *) list + i, lr->objects[i], &area);
                size_t used = (size_t) (area - start);
                area = start + (used + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
        }
        *ret_list = (gpumem_shared_info *) list;
        *ret_n = lr->n_objects;
        *ret_truncated = lr->truncated;
        gm_msg_free(reply);
        return 0;
}

int gpumem_admin_shared_unpublish(gpumem_admin *a, const char *name, uint64_t version) {
        if (!a || !name)
                return -EINVAL;
        Gpumem__SharedUnpublish req = GPUMEM__SHARED_UNPUBLISH__INIT;
        req.name = (char *) name;
        req.version = version;
        Gpumem__Envelope *reply;
        int r = request(ADMIN_CHANNEL(a), GPUMEM__ENVELOPE__BODY_SHARED_UNPUBLISH, &req, GPUMEM__ENVELOPE__BODY_OK,
                        &reply, NULL);
        if (r == 0)
                gm_msg_free(reply);
        return r;
}
