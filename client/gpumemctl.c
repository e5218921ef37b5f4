/* gpumemctl: administer a gpumemd daemon.
 * Exit codes: 0 success, 1 the daemon refused or failed the request,
 * 2 usage error, 3 the daemon cannot be reached. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipc.h"
#include "msg.h"
#include "size.h"
#include "stats.h"

enum { EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

typedef struct ctl {
        int fd;
        uint32_t max_packet;
        uint64_t next_id;
        int device;
        char backend[16];
        char tenant[64];
} ctl_t;

static void usage(FILE *f) {
        fprintf(f, "Usage: gpumemctl [-s SOCKET] COMMAND [ARGS]\n"
                   "Commands:\n"
                   "  stats [--json] [--tenant T | --pid P]   memory statistics (PyTorch memory_summary layout)\n"
                   "  trim [--tenant T]                       release idle cached memory\n"
                   "The socket defaults to $GPUMEM_SOCKET, else the default path of GPU 0.\n");
}

/* Sends a request and returns its reply; an Error reply is printed and turned
 * into EXIT_REFUSED. */
static int ctl_call(ctl_t *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply) {
        env->request_id = ++c->next_id;
        int r = gm_msg_send(c->fd, env, NULL, 0, c->max_packet);
        uint8_t *buf = malloc(c->max_packet);
        if (!buf)
                return EXIT_REFUSED;
        for (;;) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len = 0, n_fds = 0;
                if (r == 0)
                        r = gm_ipc_recv(c->fd, buf, c->max_packet, fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds);
                Gpumem__Envelope *reply = NULL;
                if (r == 0) {
                        gm_close_fds(fds, n_fds);
                        r = gm_msg_unpack(buf, len, &reply);
                }
                if (r < 0) {
                        free(buf);
                        fprintf(stderr, "gpumemctl: lost the connection to gpumemd: %s\n", strerror(-r));
                        return EXIT_UNREACHABLE;
                }
                if (reply->request_id != env->request_id) {
                        gm_msg_free(reply);
                        continue;
                }
                free(buf);
                if (reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                        fprintf(stderr, "gpumemctl: %s (%s)\n", reply->error->message,
                                strerror((int) reply->error->code));
                        gm_msg_free(reply);
                        return EXIT_REFUSED;
                }
                *ret_reply = reply;
                return 0;
        }
}

static int ctl_open(const char *path, ctl_t *c) {
        char buf[108];
        if (!path) {
                int r = gm_ipc_default_socket_path(0, true, buf, sizeof(buf));
                if (r < 0) {
                        fprintf(stderr, "gpumemctl: no socket path: %s\n", strerror(-r));
                        return EXIT_UNREACHABLE;
                }
                path = buf;
        }
        int r = gm_ipc_connect(path, &c->fd);
        if (r < 0) {
                fprintf(stderr, "gpumemctl: cannot connect to gpumemd at '%s': %s\n", path, strerror(-r));
                return EXIT_UNREACHABLE;
        }
        c->max_packet = GM_IPC_MAX_PACKET_DEFAULT;
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.client_name = "gpumemctl";
        hello.admin = true;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        Gpumem__Envelope *reply;
        r = ctl_call(c, &env, &reply);
        if (r)
                return r;
        if (reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY) {
                gm_msg_free(reply);
                fprintf(stderr, "gpumemctl: unexpected hello reply\n");
                return EXIT_UNREACHABLE;
        }
        c->max_packet = reply->hello_reply->max_packet;
        c->device = reply->hello_reply->device;
        snprintf(c->backend, sizeof(c->backend), "%s", reply->hello_reply->backend);
        snprintf(c->tenant, sizeof(c->tenant), "%s", reply->hello_reply->tenant);
        gm_msg_free(reply);
        return 0;
}

static void print_json_string(const char *s) {
        putchar('"');
        for (; *s; s++) {
                unsigned char ch = (unsigned char) *s;
                if (ch == '"' || ch == '\\')
                        printf("\\%c", ch);
                else if (ch < 0x20)
                        printf("\\u%04x", ch);
                else
                        putchar(ch);
        }
        putchar('"');
}

static int cmd_stats(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {
                {"json", no_argument, NULL, 'j'},
                {"tenant", required_argument, NULL, 't'},
                {"pid", required_argument, NULL, 'p'},
                {},
        };
        bool json = false;
        Gpumem__Stats req = GPUMEM__STATS__INIT;
        req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE;
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "jt:p:", opts, NULL)) != -1) {
                switch (o) {
                case 'j':
                        json = true;
                        break;
                case 't':
                        req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT;
                        req.tenant = optarg;
                        break;
                case 'p': {
                        char *end;
                        unsigned long pid = strtoul(optarg, &end, 10);
                        if (*end || pid == 0) {
                                fprintf(stderr, "gpumemctl: invalid pid '%s'\n", optarg);
                                return EXIT_USAGE;
                        }
                        req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_PID;
                        req.pid = (uint32_t) pid;
                        break;
                }
                default:
                        usage(stderr);
                        return EXIT_USAGE;
                }
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        env.stats = &req;
        Gpumem__Envelope *reply;
        int r = ctl_call(c, &env, &reply);
        if (r)
                return r;
        if (reply->body_case != GPUMEM__ENVELOPE__BODY_STATS_REPLY) {
                gm_msg_free(reply);
                return EXIT_REFUSED;
        }
        const Gpumem__StatsReply *sr = reply->stats_reply;
        if (json) {
                printf("{\"device\": %d, \"backend\": ", sr->device);
                print_json_string(c->backend);
                printf(", \"capacity_bytes\": %" PRIu64 ", \"sessions\": %" PRIu64, sr->capacity, sr->sessions);
                if (req.scope == GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT) {
                        printf(", \"tenant\": ");
                        print_json_string(req.tenant);
                }
                for (size_t i = 0; i < sr->n_stats; i++) {
                        printf(", ");
                        print_json_string(sr->stats[i]->name);
                        printf(": %" PRId64, sr->stats[i]->value);
                }
                printf("}\n");
        } else {
                gm_stats_t st;
                gm_stats_init(&st);
                for (size_t i = 0; i < sr->n_stats; i++)
                        gm_stats_set(&st, sr->stats[i]->name, sr->stats[i]->value);
                char text[8192];
                if (gm_stats_summary(&st, sr->device, false, text, sizeof(text)) < 0) {
                        gm_msg_free(reply);
                        return EXIT_REFUSED;
                }
                fputs(text, stdout);
        }
        gm_msg_free(reply);
        return 0;
}

static int cmd_trim(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {{"tenant", required_argument, NULL, 't'}, {}};
        Gpumem__Trim req = GPUMEM__TRIM__INIT;
        req.tenant = "*";
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "t:", opts, NULL)) != -1) {
                if (o != 't') {
                        usage(stderr);
                        return EXIT_USAGE;
                }
                req.tenant = optarg;
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        env.trim = &req;
        Gpumem__Envelope *reply;
        int r = ctl_call(c, &env, &reply);
        if (r)
                return r;
        char buf[32];
        uint64_t released = reply->body_case == GPUMEM__ENVELOPE__BODY_TRIM_REPLY ? reply->trim_reply->released_bytes : 0;
        printf("released %s (%" PRIu64 " bytes)\n", gm_format_size(released, buf, sizeof(buf)), released);
        gm_msg_free(reply);
        return 0;
}

int main(int argc, char **argv) {
        const char *socket_path = getenv("GPUMEM_SOCKET");
        int i = 1;
        for (; i < argc && argv[i][0] == '-'; i++) {
                if ((strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--socket") == 0) && i + 1 < argc) {
                        socket_path = argv[++i];
                } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
                        usage(stdout);
                        return 0;
                } else {
                        usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (i >= argc) {
                usage(stderr);
                return EXIT_USAGE;
        }
        const char *cmd = argv[i];
        int sub_argc = argc - i;
        char **sub_argv = argv + i;
        int (*fn)(ctl_t *, int, char **) = NULL;
        if (strcmp(cmd, "stats") == 0)
                fn = cmd_stats;
        else if (strcmp(cmd, "trim") == 0)
                fn = cmd_trim;
        if (!fn) {
                fprintf(stderr, "gpumemctl: unknown command '%s'\n", cmd);
                usage(stderr);
                return EXIT_USAGE;
        }
        ctl_t c = {.fd = -1};
        int r = ctl_open(socket_path, &c);
        if (r == 0)
                r = fn(&c, sub_argc, sub_argv);
        if (c.fd >= 0)
                close(c.fd);
        return r;
}
