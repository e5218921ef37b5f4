/* A gpumem_admin: a control connection to gpumemd, as gpumemctl opens it. It
 * passes the peer checks every client connection does, says hello as an
 * admin-capable control session (no heap, no memory: the daemon grants admin
 * rights only where the kernel-verified credentials earn them) and then
 * carries one request at a time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control.h"
#include "ipc.h"
#include "peer_check.h"

_Static_assert(GPUMEM_MAX_DEVICE == GM_PEER_MAX_DEVICE, "the public bound is the peer check's");

struct gpumem_admin {
        char *socket_path;
        char client_name[64];
        int fd; /* -1 until connected */
        uint32_t max_packet;
        uint64_t next_id;
        int device;
        bool admin;
        char backend[16];
        char tenant[64];
        gpumem_admin_failure failure;
        char error[1024];
};

int gm_control_vfail(gpumem_admin *a, gpumem_admin_failure kind, int err, const char *fmt, va_list ap) {
        a->failure = kind;
        vsnprintf(a->error, sizeof(a->error), fmt, ap);
        return err;
}

int gm_control_fail(gpumem_admin *a, gpumem_admin_failure kind, int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        gm_control_vfail(a, kind, err, fmt, ap);
        va_end(ap);
        return err;
}

int gpumem_admin_socket(int device, char *buf, size_t len) {
        if (!buf || device < -1 || device > GPUMEM_MAX_DEVICE)
                return -EINVAL;
        return device >= 0 ? gm_peer_device_socket(device, buf, len) : gm_peer_default_socket(0, true, buf, len);
}

int gpumem_admin_new(const char *socket_path, const char *client_name, gpumem_admin **ret) {
        if (!socket_path || !client_name || !ret)
                return -EINVAL;
        gpumem_admin *a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a->socket_path = strdup(socket_path);
        if (!a->socket_path) {
                free(a);
                return -ENOMEM;
        }
        snprintf(a->client_name, sizeof(a->client_name), "%s", client_name);
        a->fd = -1;
        a->device = -1;
        *ret = a;
        return 0;
}

void gpumem_admin_free(gpumem_admin *a) {
        if (!a)
                return;
        if (a->fd >= 0)
                close(a->fd);
        free(a->socket_path);
        free(a);
}

/* One exchange: sends env (numbered here) and waits for its reply, skipping
 * replies to other requests; an Error about the connection itself (request
 * id 0) is the reply too. The reply's first fd goes to *ret_fd if asked. */
static int exchange(gpumem_admin *a, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply, int *ret_fd) {
        env->request_id = ++a->next_id;
        int r = gm_msg_send(a->fd, env, NULL, 0, a->max_packet);
        if (r == -EPIPE)
                r = 0; /* a daemon that refused the connection at once left its reason to read */
        uint8_t *buf = malloc(a->max_packet);
        if (!buf)
                return gm_control_fail(a, GPUMEM_ADMIN_FAILED, -ENOMEM, "out of memory");
        for (;;) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len = 0, n_fds = 0;
                if (r == 0)
                        r = gm_ipc_recv(a->fd, buf, a->max_packet, fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds);
                Gpumem__Envelope *reply = NULL;
                int kept_fd = -1;
                if (r == 0) {
                        if (ret_fd && n_fds > 0) {
                                kept_fd = fds[0];
                                fds[0] = -1;
                        }
                        gm_close_fds(fds, n_fds);
                        r = gm_msg_unpack(buf, len, &reply);
                        if (r < 0 && kept_fd >= 0)
                                close(kept_fd);
                }
                if (r < 0) {
                        free(buf);
                        return gm_control_fail(a, GPUMEM_ADMIN_LOST, r, "lost the connection to gpumemd: %s",
                                               strerror(-r));
                }
                bool for_connection = reply->request_id == 0 && reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR;
                if (reply->request_id != env->request_id && !for_connection) {
                        if (kept_fd >= 0)
                                close(kept_fd);
                        gm_msg_free(reply);
                        continue;
                }
                free(buf);
                if (reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                        int err = reply->error->code ? -(int) reply->error->code : -EPROTO;
                        gm_control_fail(a, GPUMEM_ADMIN_REFUSED, err, "%s", reply->error->message);
                        if (kept_fd >= 0)
                                close(kept_fd);
                        gm_msg_free(reply);
                        return err;
                }
                if (ret_fd)
                        *ret_fd = kept_fd;
                *ret_reply = reply;
                return 0;
        }
}

int gpumem_admin_connect(gpumem_admin *a) {
        if (!a)
                return -EINVAL;
        if (a->fd >= 0)
                return 0;
        char why[512];
        int r = gm_peer_connect(a->socket_path, &a->fd, why, sizeof(why));
        if (r < 0) {
                a->fd = -1;
                return gm_control_fail(a, GPUMEM_ADMIN_UNREACHABLE, r, "%s", why);
        }
        a->max_packet = GM_IPC_MAX_PACKET_DEFAULT;
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = a->client_name;
        hello.admin = true;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        Gpumem__Envelope *reply = NULL;
        r = exchange(a, &env, &reply, NULL);
        if (r == 0 && reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY) {
                gm_msg_free(reply);
                r = gm_control_fail(a, GPUMEM_ADMIN_UNEXPECTED, -EPROTO, "unexpected hello reply");
        }
        if (r < 0) { /* not connected: no request goes out without a hello */
                close(a->fd);
                a->fd = -1;
                return r;
        }
        a->max_packet = reply->hello_reply->max_packet;
        a->device = reply->hello_reply->device;
        snprintf(a->backend, sizeof(a->backend), "%s", reply->hello_reply->backend);
        snprintf(a->tenant, sizeof(a->tenant), "%s", reply->hello_reply->tenant);
        a->admin = reply->hello_reply->admin;
        gm_msg_free(reply);
        return 0;
}

int gm_control_call(gpumem_admin *a, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                    Gpumem__Envelope **ret_reply, int *ret_fd) {
        int r = gpumem_admin_connect(a);
        if (r < 0)
                return r;
        Gpumem__Envelope *reply;
        int fd = -1;
        r = exchange(a, env, &reply, ret_fd ? &fd : NULL);
        if (r < 0)
                return r;
        if (want != GPUMEM__ENVELOPE__BODY__NOT_SET && reply->body_case != want) {
                if (fd >= 0)
                        close(fd);
                gm_msg_free(reply);
                return gm_control_fail(a, GPUMEM_ADMIN_UNEXPECTED, -EPROTO, "unexpected reply from gpumemd");
        }
        if (ret_fd)
                *ret_fd = fd;
        *ret_reply = reply;
        return 0;
}

gpumem_admin_failure gpumem_admin_failure_kind(const gpumem_admin *a) {
        return a ? a->failure : GPUMEM_ADMIN_FAILED;
}

const char *gpumem_admin_error(const gpumem_admin *a) {
        return a ? a->error : "";
}

int gpumem_admin_device(const gpumem_admin *a) {
        return a && a->fd >= 0 ? a->device : -1;
}

const char *gpumem_admin_backend(const gpumem_admin *a) {
        return a && a->fd >= 0 ? a->backend : "";
}

const char *gpumem_admin_tenant(const gpumem_admin *a) {
        return a && a->fd >= 0 ? a->tenant : "";
}

bool gpumem_admin_rights(const gpumem_admin *a) {
        return a && a->fd >= 0 && a->admin;
}
