/* gpumemctl: administer a gpumemd daemon.
 * Exit codes: 0 success, 1 the daemon refused or failed the request,
 * 2 usage error, 3 the daemon cannot be reached. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumemctl.h"
#include "ipc.h"
#include "json.h"
#include "msg.h"
#include "peer_check.h"
#include "size.h"
#include "stats.h"

static void usage(FILE *f) {
        fprintf(f, "Usage: gpumemctl [-s SOCKET | -d N] COMMAND [ARGS]\n"
                   "       gpumemctl --version | --help\n"
                   "Commands:\n"
                   "  stats [--json] [--tenant T | --pid P]   memory statistics (PyTorch memory_summary layout):\n"
                   "                                          the device's for an admin, else your tenant's\n"
                   "  stats --reset-peak|--reset-accumulated [--tenant T]\n"
                   "  trim [--tenant T]                       release idle cached memory\n"
                   "  snapshot -o FILE [--format pickle|json|pickle-1.13] [--pid P] [--category tenant|pid]\n"
                   "                                          PyTorch memory snapshot (torch.cuda.memory._snapshot())\n"
                   "  history on [--max-entries N] | off | status\n"
                   "                                          record allocation history for snapshots\n"
                   "  alloc-conf [STR]                        show or set PYTORCH_CUDA_ALLOC_CONF-style settings\n"
                   "  quota list [--json] | get T [--json] | set T BYTES [--runtime]\n"
                   "                                          tenant quotas (set: persistent unless --runtime;\n"
                   "                                          BYTES 0 removes that quota)\n"
                   "  clients [--json]                        sessions: pid, tenant, unit, memory, command\n"
                   "  diagnose [--pid P | --tenant T] [--window D] [--json]\n"
                   "                                          per process: leak, fragmentation, streams, idle cache\n"
                   "  top [--once] [--json] [--interval S]    live table of the device and its processes\n"
                   "  status                                  one-screen summary of the device\n"
                   "Options:\n"
                   "  -s, --socket SOCKET                     the daemon's socket\n"
                   "  -d, --device N                          the daemon of GPU N ($GPUMEM_SOCKET_TEMPLATE,\n"
                   "                                          else GPU N's default socket)\n"
                   "The socket defaults to $GPUMEM_SOCKET, else GPU 0's: the system daemon's\n"
                   "(/run/gpumem/gpu0.sock) when it runs, else your own daemon's.\n");
}

/* A usage error about one argument: the message, then a pointer to --help. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        fputs("gpumemctl: ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputs("\nTry 'gpumemctl --help'.\n", stderr);
        return EXIT_USAGE;
}

/* Parses the decimal value of `flag` into [min, max]: no sign, no spaces,
 * no suffix, no wrap-around. 0, or a usage error (printed). */
static int parse_number(const char *flag, const char *text, uint64_t min, uint64_t max, uint64_t *ret) {
        if (gm_parse_uint(text, min, max, ret) < 0)
                return usage_error("%s: expected a whole number from %" PRIu64 " to %" PRIu64 ", not '%s'", flag, min,
                                   max, text);
        return 0;
}

/* A pid given by --pid. */
static int parse_pid(const char *text, uint32_t *ret) {
        uint64_t v;
        int r = parse_number("--pid", text, 1, INT_MAX, &v);
        if (r == 0)
                *ret = (uint32_t) v;
        return r;
}

/* Refuses arguments left after a command's own (argv[first..argc)). */
static int no_more_args(const char *cmd, int argc, char **argv, int first) {
        return first < argc ? usage_error("%s: unexpected argument '%s'", cmd, argv[first]) : 0;
}

int ctl_call_fd(ctl_t *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply, int *ret_fd) {
        int r = ctl_connect(c);
        if (r)
                return r;
        env->request_id = ++c->next_id;
        r = gm_msg_send(c->fd, env, NULL, 0, c->max_packet);
        if (r == -EPIPE)
                r = 0; /* a daemon that refused the connection at once left its reason to read */
        uint8_t *buf = malloc(c->max_packet);
        if (!buf)
                return EXIT_REFUSED;
        for (;;) {
                int fds[GM_IPC_MAX_FDS_LIMIT];
                size_t len = 0, n_fds = 0;
                if (r == 0)
                        r = gm_ipc_recv(c->fd, buf, c->max_packet, fds, GM_IPC_MAX_FDS_LIMIT, &len, &n_fds);
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
                        fprintf(stderr, "gpumemctl: lost the connection to gpumemd: %s\n", strerror(-r));
                        return EXIT_UNREACHABLE;
                }
                /* Request id 0: an error about the connection itself (a refusal). */
                bool for_connection = reply->request_id == 0 && reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR;
                if (reply->request_id != env->request_id && !for_connection) {
                        if (kept_fd >= 0)
                                close(kept_fd);
                        gm_msg_free(reply);
                        continue;
                }
                free(buf);
                if (reply->body_case == GPUMEM__ENVELOPE__BODY_ERROR) {
                        fprintf(stderr, "gpumemctl: %s (%s)\n", reply->error->message,
                                strerror((int) reply->error->code));
                        if (kept_fd >= 0)
                                close(kept_fd);
                        gm_msg_free(reply);
                        return EXIT_REFUSED;
                }
                if (ret_fd)
                        *ret_fd = kept_fd;
                *ret_reply = reply;
                return 0;
        }
}

static int ctl_call(ctl_t *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply) {
        return ctl_call_fd(c, env, ret_reply, NULL);
}

int ctl_expect(ctl_t *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want, Gpumem__Envelope **ret_reply) {
        int r = ctl_call(c, env, ret_reply);
        if (r)
                return r;
        if ((*ret_reply)->body_case != want) {
                fprintf(stderr, "gpumemctl: unexpected reply from gpumemd\n");
                gm_msg_free(*ret_reply);
                return EXIT_REFUSED;
        }
        return 0;
}

int ctl_connect(ctl_t *c) {
        if (c->fd >= 0)
                return 0; /* (the hello's own request comes here too) */
        const char *path = c->socket_path;
        int device = c->device;
        char buf[108];
        bool named = path != NULL; /* by -s or $GPUMEM_SOCKET */
        if (!path) {
                int r = device >= 0 ? gm_peer_device_socket(device, buf, sizeof(buf))
                                    : gm_peer_default_socket(0, true, buf, sizeof(buf));
                if (r < 0) {
                        fprintf(stderr, "gpumemctl: no socket path%s: %s\n",
                                r == -EINVAL && device >= 0 ? " ($GPUMEM_SOCKET_TEMPLATE needs one %d)" : "",
                                strerror(-r));
                        return EXIT_UNREACHABLE;
                }
                path = buf;
        }
        char why[512];
        int r = gm_peer_connect(path, &c->fd, why, sizeof(why));
        if (r < 0) {
                fprintf(stderr, "gpumemctl: %s\n", why);
                if ((r == -ENOENT || r == -ECONNREFUSED) && named)
                        fprintf(stderr,
                                "gpumemctl: start gpumemd there (gpumemd --socket %s), or name another "
                                "daemon with -s SOCKET or -d N\n",
                                path);
                else if (r == -ENOENT || r == -ECONNREFUSED)
                        fprintf(stderr,
                                "gpumemctl: start the system's (systemctl start gpumemd@%d) or your own "
                                "(gpumemd --device %d), or name another daemon with -s SOCKET or "
                                "$GPUMEM_SOCKET\n",
                                device >= 0 ? device : 0, device >= 0 ? device : 0);
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
        Gpumem__Envelope *reply = NULL;
        r = ctl_call(c, &env, &reply);
        if (r == 0 && reply->body_case != GPUMEM__ENVELOPE__BODY_HELLO_REPLY) {
                gm_msg_free(reply);
                fprintf(stderr, "gpumemctl: unexpected hello reply\n");
                r = EXIT_UNREACHABLE;
        }
        if (r) { /* not connected: no request goes out without a hello */
                close(c->fd);
                c->fd = -1;
                return r;
        }
        c->max_packet = reply->hello_reply->max_packet;
        c->device = reply->hello_reply->device;
        snprintf(c->backend, sizeof(c->backend), "%s", reply->hello_reply->backend);
        snprintf(c->tenant, sizeof(c->tenant), "%s", reply->hello_reply->tenant);
        c->admin = reply->hello_reply->admin;
        gm_msg_free(reply);
        return 0;
}

static void print_json_string(const char *s) {
        gm_json_print_string(stdout, s);
}

static int cmd_stats(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {
                {"json", no_argument, NULL, 'j'},
                {"tenant", required_argument, NULL, 't'},
                {"pid", required_argument, NULL, 'p'},
                {"reset-peak", no_argument, NULL, 'P'},
                {"reset-accumulated", no_argument, NULL, 'A'},
                {},
        };
        bool json = false, reset_peak = false, reset_accumulated = false, scoped = false;
        Gpumem__Stats req = GPUMEM__STATS__INIT;
        req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE;
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "jt:p:", opts, NULL)) != -1) {
                switch (o) {
                case 'j':
                        json = true;
                        break;
                case 'P':
                        reset_peak = true;
                        break;
                case 'A':
                        reset_accumulated = true;
                        break;
                case 't':
                        req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT;
                        req.tenant = optarg;
                        scoped = true;
                        break;
                case 'p':
                        if (parse_pid(optarg, &req.pid))
                                return EXIT_USAGE;
                        req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_PID;
                        scoped = true;
                        break;
                default:
                        usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (no_more_args("stats", argc, argv, optind))
                return EXIT_USAGE;
        int r = ctl_connect(c);
        if (r)
                return r;
        if (!scoped && !c->admin && !reset_peak && !reset_accumulated) {
                /* A tenant sees its own figures: those, rather than a refusal. */
                req.scope = GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT;
                req.tenant = c->tenant;
                fprintf(stderr, "gpumemctl: statistics of your tenant '%s' (the device's need admin rights)\n",
                        c->tenant);
        }
        if (reset_peak || reset_accumulated) {
                Gpumem__ResetStats reset = GPUMEM__RESET_STATS__INIT;
                reset.scope = req.scope;
                reset.tenant = req.tenant;
                reset.peak = reset_peak;
                reset.accumulated = reset_accumulated;
                Gpumem__Envelope renv = GPUMEM__ENVELOPE__INIT;
                renv.body_case = GPUMEM__ENVELOPE__BODY_RESET_STATS;
                renv.reset_stats = &reset;
                Gpumem__Envelope *reply;
                r = ctl_expect(c, &renv, GPUMEM__ENVELOPE__BODY_OK, &reply);
                if (r == 0)
                        gm_msg_free(reply);
                return r;
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_STATS;
        env.stats = &req;
        Gpumem__Envelope *reply;
        r = ctl_call(c, &env, &reply);
        if (r)
                return r;
        if (reply->body_case != GPUMEM__ENVELOPE__BODY_STATS_REPLY) {
                gm_msg_free(reply);
                return EXIT_REFUSED;
        }
        const Gpumem__StatsReply *sr = reply->stats_reply;
        if (req.scope == GPUMEM__STATS_SCOPE__STATS_SCOPE_PID && sr->sessions == 0) {
                fprintf(stderr, "gpumemctl: --pid names no session on this daemon%s\n",
                        c->admin ? "" : " (that your tenant may see)");
                gm_msg_free(reply);
                return EXIT_REFUSED;
        }
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
        if (no_more_args("trim", argc, argv, optind))
                return EXIT_USAGE;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        env.trim = &req;
        Gpumem__Envelope *reply;
        int r = ctl_call(c, &env, &reply);
        if (r)
                return r;
        char buf[32];
        uint64_t released =
                reply->body_case == GPUMEM__ENVELOPE__BODY_TRIM_REPLY ? reply->trim_reply->released_bytes : 0;
        printf("released %s (%" PRIu64 " bytes)\n", gm_format_size(released, buf, sizeof(buf)), released);
        gm_msg_free(reply);
        return 0;
}

static int cmd_snapshot(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {
                {"output", required_argument, NULL, 'o'},
                {"format", required_argument, NULL, 'f'},
                {"pid", required_argument, NULL, 'p'},
                {"category", required_argument, NULL, 'c'},
                {},
        };
        const char *output = NULL;
        Gpumem__Snapshot req = GPUMEM__SNAPSHOT__INIT;
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "o:f:p:c:", opts, NULL)) != -1) {
                switch (o) {
                case 'o':
                        output = optarg;
                        break;
                case 'f':
                        if (strcmp(optarg, "pickle") == 0)
                                req.format = GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE;
                        else if (strcmp(optarg, "json") == 0)
                                req.format = GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_JSON;
                        else if (strcmp(optarg, "pickle-1.13") == 0)
                                req.format = GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE_1_13;
                        else {
                                fprintf(stderr, "gpumemctl: --format is pickle, json or pickle-1.13\n");
                                return EXIT_USAGE;
                        }
                        break;
                case 'c':
                        if (strcmp(optarg, "tenant") == 0)
                                req.category = GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_TENANT;
                        else if (strcmp(optarg, "pid") == 0)
                                req.category = GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_PID;
                        else if (strcmp(optarg, "none") == 0)
                                req.category = GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_NONE;
                        else {
                                fprintf(stderr, "gpumemctl: --category is tenant, pid or none\n");
                                return EXIT_USAGE;
                        }
                        break;
                case 'p':
                        req.pid = (uint32_t) strtoul(optarg, NULL, 10);
                        if (!req.pid) {
                                fprintf(stderr, "gpumemctl: invalid pid '%s'\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                default:
                        usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (!output || optind < argc) {
                fprintf(stderr, "gpumemctl: snapshot needs -o FILE\n");
                return EXIT_USAGE;
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT;
        env.snapshot = &req;
        Gpumem__Envelope *reply;
        int fd = -1;
        int r = ctl_call_fd(c, &env, &reply, &fd);
        if (r)
                return r;
        bool ok = reply->body_case == GPUMEM__ENVELOPE__BODY_SNAPSHOT_REPLY && fd >= 0;
        uint64_t size = ok ? reply->snapshot_reply->size : 0;
        if (ok && reply->snapshot_reply->local_unanswered)
                fprintf(stderr,
                        "gpumemctl: %u of %u local sessions did not answer in time: their blocks are unknown, "
                        "their segments are shown (marked gpumemd_blocks_unknown)\n",
                        reply->snapshot_reply->local_unanswered, reply->snapshot_reply->local_asked);
        gm_msg_free(reply);
        if (!ok) {
                if (fd >= 0)
                        close(fd);
                fprintf(stderr, "gpumemctl: the daemon sent no snapshot\n");
                return EXIT_REFUSED;
        }
        FILE *out = strcmp(output, "-") == 0 ? stdout : fopen(output, "wbe");
        if (!out) {
                fprintf(stderr, "gpumemctl: cannot write '%s': %s\n", output, strerror(errno));
                close(fd);
                return EXIT_REFUSED;
        }
        uint64_t copied = 0;
        char buf[65536];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0 && fwrite(buf, 1, (size_t) n, out) == (size_t) n)
                copied += (uint64_t) n;
        close(fd);
        bool write_failed = (out == stdout ? fflush(out) : fclose(out)) != 0;
        if (copied != size || write_failed) {
                fprintf(stderr, "gpumemctl: snapshot incomplete (%" PRIu64 " of %" PRIu64 " bytes)\n", copied, size);
                return EXIT_REFUSED;
        }
        if (out != stdout)
                fprintf(stderr, "wrote %" PRIu64 " bytes to %s\n", size, output);
        return 0;
}

static int cmd_history(ctl_t *c, int argc, char **argv) {
        Gpumem__HistoryControl req = GPUMEM__HISTORY_CONTROL__INIT;
        const char *what = argc >= 2 ? argv[1] : "";
        if (strcmp(what, "on") != 0 && strcmp(what, "off") != 0 && strcmp(what, "status") != 0)
                return usage_error("history on [--max-entries N] | off | status");
        req.enabled = strcmp(what, "on") == 0;
        req.status_only = strcmp(what, "status") == 0;
        int i = 2;
        if (req.enabled && i < argc && strcmp(argv[i], "--max-entries") == 0) {
                if (i + 1 >= argc)
                        return usage_error("--max-entries needs a number");
                if (parse_number("--max-entries", argv[i + 1], 1, GM_HISTORY_MAX_ENTRIES, &req.max_entries))
                        return EXIT_USAGE;
                i += 2;
        }
        if (no_more_args(req.enabled       ? "history on"
                         : req.status_only ? "history status"
                                           : "history off",
                         argc, argv, i))
                return EXIT_USAGE;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_HISTORY_CONTROL;
        env.history_control = &req;
        Gpumem__Envelope *reply;
        int r = ctl_expect(c, &env, GPUMEM__ENVELOPE__BODY_HISTORY_REPLY, &reply);
        if (r)
                return r;
        printf("history %s (max %" PRIu64 " entries, %" PRIu64 " recorded)\n",
               reply->history_reply->enabled ? "on" : "off", reply->history_reply->max_entries,
               reply->history_reply->entries);
        gm_msg_free(reply);
        return 0;
}

static int cmd_alloc_conf(ctl_t *c, int argc, char **argv) {
        if (no_more_args("alloc-conf", argc, argv, 2))
                return EXIT_USAGE;
        Gpumem__AllocConf req = GPUMEM__ALLOC_CONF__INIT;
        req.set = argc == 2;
        req.conf = argc == 2 ? argv[1] : "";
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_CONF;
        env.alloc_conf = &req;
        Gpumem__Envelope *reply;
        int r = ctl_expect(c, &env, GPUMEM__ENVELOPE__BODY_ALLOC_CONF_REPLY, &reply);
        if (r)
                return r;
        printf("%s\n", reply->alloc_conf_reply->conf);
        gm_msg_free(reply);
        return 0;
}

/* Compact sizes for tables that fit 80 columns: "512B", "20.0M", "7.5G". */
static const char *fmt_size(uint64_t v, char *buf, size_t len) {
        return gm_format_size_as(v, GM_SIZE_COMPACT, buf, len);
}

static void print_quota_json(const Gpumem__QuotaReply *qr) {
        printf("[");
        for (size_t i = 0; i < qr->n_tenants; i++) {
                const Gpumem__TenantInfo *t = qr->tenants[i];
                printf("%s{\"tenant\": ", i ? ", " : "");
                print_json_string(t->tenant);
                printf(", \"quota_bytes\": %" PRIu64 ", \"quota_source\": ", t->quota);
                print_json_string(t->quota_source);
                printf(", \"reserved_bytes\": %" PRIu64 ", \"allocated_bytes\": %" PRIu64 ", \"cached_bytes\": %" PRIu64
                       ", \"sessions\": %u, \"release_unverified_bytes\": %" PRIu64 "}",
                       t->charged, t->allocated, t->cached, t->sessions, t->release_unverified);
        }
        printf("]\n");
}

static int cmd_quota(ctl_t *c, int argc, char **argv) {
        Gpumem__Quota req = GPUMEM__QUOTA__INIT;
        bool json = false;
        if (argc >= 2 && strcmp(argv[1], "list") == 0) {
                req.op = GPUMEM__QUOTA_OP__QUOTA_OP_LIST;
                json = argc >= 3 && strcmp(argv[2], "--json") == 0;
                if (no_more_args("quota list", argc, argv, json ? 3 : 2))
                        return EXIT_USAGE;
        } else if (argc >= 3 && strcmp(argv[1], "get") == 0) {
                req.op = GPUMEM__QUOTA_OP__QUOTA_OP_GET;
                req.tenant = argv[2];
                json = argc >= 4 && strcmp(argv[3], "--json") == 0;
                if (no_more_args("quota get", argc, argv, json ? 4 : 3))
                        return EXIT_USAGE;
        } else if ((argc == 4 || argc == 5) && strcmp(argv[1], "set") == 0) {
                req.op = GPUMEM__QUOTA_OP__QUOTA_OP_SET;
                req.tenant = argv[2];
                if (gm_parse_size(argv[3], &req.bytes) < 0) {
                        fprintf(stderr, "gpumemctl: invalid size '%s' (e.g. 8G, 512M, 0 to remove)\n", argv[3]);
                        return EXIT_USAGE;
                }
                if (argc == 5) {
                        if (strcmp(argv[4], "--runtime") != 0) {
                                usage(stderr);
                                return EXIT_USAGE;
                        }
                        req.runtime = true;
                }
        } else {
                usage(stderr);
                return EXIT_USAGE;
        }
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_QUOTA;
        env.quota = &req;
        Gpumem__Envelope *reply;
        int r = ctl_expect(c, &env, GPUMEM__ENVELOPE__BODY_QUOTA_REPLY, &reply);
        if (r)
                return r;
        const Gpumem__QuotaReply *qr = reply->quota_reply;
        if (json) {
                print_quota_json(qr);
                gm_msg_free(reply);
                return 0;
        }
        printf("%-20s %8s %-10s %8s %9s %8s %4s\n", "TENANT", "QUOTA", "SOURCE", "RESERVED", "ALLOCATED", "CACHED",
               "SESS");
        for (size_t i = 0; i < qr->n_tenants; i++) {
                const Gpumem__TenantInfo *t = qr->tenants[i];
                char q[32], ch[32], a[32], ca[32];
                printf("%-20.20s %8s %-10s %8s %9s %8s %4u\n", t->tenant,
                       t->quota ? fmt_size(t->quota, q, sizeof(q)) : "-", t->quota_source,
                       fmt_size(t->charged, ch, sizeof(ch)), fmt_size(t->allocated, a, sizeof(a)),
                       fmt_size(t->cached, ca, sizeof(ca)), t->sessions);
        }
        gm_msg_free(reply);
        return 0;
}

static const char *heap_mode_name(const Gpumem__ClientInfo *ci) {
        return ci->heap_mode && ci->heap_mode[0] ? ci->heap_mode : "central";
}

static int cmd_clients(ctl_t *c, int argc, char **argv) {
        bool json = argc >= 2 && strcmp(argv[1], "--json") == 0;
        if (no_more_args("clients", argc, argv, json ? 2 : 1))
                return EXIT_USAGE;
        Gpumem__Clients req = GPUMEM__CLIENTS__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_CLIENTS;
        env.clients = &req;
        Gpumem__Envelope *reply;
        int r = ctl_expect(c, &env, GPUMEM__ENVELOPE__BODY_CLIENTS_REPLY, &reply);
        if (r)
                return r;
        const Gpumem__ClientsReply *cr = reply->clients_reply;
        if (json)
                printf("[");
        else
                printf("%7s %-16s %-18s %8s %9s %8s %5s %-7s %s\n", "PID", "TENANT", "UNIT", "RESERVED", "ALLOCATED",
                       "CACHED", "SEGS", "HEAP", "COMMAND");
        for (size_t i = 0; i < cr->n_clients; i++) {
                const Gpumem__ClientInfo *ci = cr->clients[i];
                if (json) {
                        printf("%s{\"session_id\": %" PRIu64 ", \"pid\": %u, \"uid\": %u, \"tenant\": ", i ? ", " : "",
                               ci->session_id, ci->pid, ci->uid);
                        print_json_string(ci->tenant);
                        printf(", \"unit\": ");
                        print_json_string(ci->unit);
                        printf(", \"name\": ");
                        print_json_string(ci->name);
                        printf(", \"command\": ");
                        print_json_string(ci->command);
                        printf(", \"reserved_bytes\": %" PRIu64 ", \"allocated_bytes\": %" PRIu64
                               ", \"cached_bytes\": %" PRIu64 ", \"segments\": %" PRIu64
                               ", \"releasing_bytes\": %" PRIu64
                               ", \"control\": %s, \"heap\": \"%s\", \"stats_page_invalid\": %s, \"requests\": %" PRIu64
                               ", \"unresponsive\": %s, \"unresponsive_ms\": %" PRIu64
                               ", \"release_unverified_bytes\": %" PRIu64 "}",
                               ci->reserved, ci->allocated, ci->cached, ci->segments, ci->releasing,
                               ci->admin ? "true" : "false", heap_mode_name(ci),
                               ci->stats_page_invalid ? "true" : "false", ci->requests,
                               ci->unresponsive ? "true" : "false", ci->unresponsive_ms, ci->release_unverified);
                        continue;
                }
                char rs[32], a[32], ca[32], uv[48] = "";
                if (ci->release_unverified)
                        snprintf(uv, sizeof(uv), " (%s released, unverified)",
                                 fmt_size(ci->release_unverified, rs, sizeof(rs)));
                printf("%7u %-16.16s %-18.18s %8s %9s %8s %5" PRIu64 " %-7s %s%s%s%s\n", ci->pid, ci->tenant,
                       ci->unit[0] ? ci->unit : (ci->admin ? "(control)" : "-"), fmt_size(ci->reserved, rs, sizeof(rs)),
                       fmt_size(ci->allocated, a, sizeof(a)), fmt_size(ci->cached, ca, sizeof(ca)), ci->segments,
                       heap_mode_name(ci), ci->command[0] ? ci->command : "-",
                       ci->stats_page_invalid ? " (stats page invalid)" : "", ci->unresponsive ? " (unresponsive)" : "",
                       uv);
        }
        if (json)
                printf("]\n");
        gm_msg_free(reply);
        return 0;
}

int main(int argc, char **argv) {
        const char *socket_path = getenv("GPUMEM_SOCKET");
        bool socket_given = false;
        int device = -1;
        int i = 1;
        for (; i < argc && argv[i][0] == '-'; i++) {
                const char *a = argv[i];
                bool socket_opt = strcmp(a, "-s") == 0 || strcmp(a, "--socket") == 0;
                if (socket_opt || strcmp(a, "-d") == 0 || strcmp(a, "--device") == 0) {
                        if (i + 1 >= argc)
                                return usage_error("%s needs a value", a);
                        const char *v = argv[++i];
                        uint64_t n;
                        if (socket_opt) {
                                socket_path = v;
                                socket_given = true;
                        } else if (parse_number(a, v, 0, GM_PEER_MAX_DEVICE, &n)) {
                                return EXIT_USAGE;
                        } else {
                                device = (int) n;
                        }
                } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                        usage(stdout);
                        return 0;
                } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
                        printf("gpumemctl %s\n", GPUMEM_VERSION);
                        return 0;
                } else {
                        return usage_error("unknown option '%s'", a);
                }
        }
        if (socket_given && device >= 0)
                return usage_error("-s and -d both name the daemon: give one");
        if (device >= 0)
                socket_path = NULL; /* -d names the daemon, not $GPUMEM_SOCKET */
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
        else if (strcmp(cmd, "snapshot") == 0)
                fn = cmd_snapshot;
        else if (strcmp(cmd, "history") == 0)
                fn = cmd_history;
        else if (strcmp(cmd, "alloc-conf") == 0)
                fn = cmd_alloc_conf;
        else if (strcmp(cmd, "quota") == 0)
                fn = cmd_quota;
        else if (strcmp(cmd, "clients") == 0)
                fn = cmd_clients;
        else if (strcmp(cmd, "diagnose") == 0)
                fn = cmd_diagnose;
        else if (strcmp(cmd, "top") == 0)
                fn = cmd_top;
        else if (strcmp(cmd, "status") == 0)
                fn = cmd_status;
        if (!fn)
                return usage_error("unknown command '%s'", cmd);
        ctl_t c = {.socket_path = socket_path, .device = device, .fd = -1};
        int r = fn(&c, sub_argc, sub_argv);
        if (c.fd >= 0)
                close(c.fd);
        return r;
}
