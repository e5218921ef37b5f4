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
#include "json.h"
#include "size.h"

static void usage(FILE *f) {
        fprintf(f, "Usage: gpumemctl [-s SOCKET | -d N] COMMAND [ARGS]\n"
                   "       gpumemctl --version | --help\n"
                   "Commands:\n"
                   "  stats [--json] [--tenant T | --pid P] [--tag NAME]\n"
                   "                                          memory statistics (PyTorch memory_summary layout):\n"
                   "                                          the device's for an admin, else your tenant's;\n"
                   "                                          --tag: one tagged pool's ('' the default)\n"
                   "  stats --reset-peak|--reset-accumulated [--tenant T]\n"
                   "  trim [--tenant T]                       release idle cached memory\n"
                   "  snapshot -o FILE [--format pickle|json|pickle-1.13] [--pid P] [--category tenant|pid|tag]\n"
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
                   "  shared list [--json] | show NAME[@VERSION] [--json] | rm NAME[@VERSION]\n"
                   "                                          shared objects: list, one with its mappers, unpublish\n"
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
                {"tag", required_argument, NULL, 'g'},
                {},
        };
        bool json = false, reset_peak = false, reset_accumulated = false, scoped = false;
        gpumem_scope scope = GPUMEM_SCOPE_DEVICE;
        const char *tenant = "", *tag = NULL;
        uint32_t pid = 0;
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
                case 'g':
                        tag = optarg;
                        break;
                case 't':
                        scope = GPUMEM_SCOPE_TENANT;
                        tenant = optarg;
                        scoped = true;
                        break;
                case 'p':
                        if (parse_pid(optarg, &pid))
                                return EXIT_USAGE;
                        scope = GPUMEM_SCOPE_PID;
                        scoped = true;
                        break;
                default:
                        usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (no_more_args("stats", argc, argv, optind))
                return EXIT_USAGE;
        if (tag && (reset_peak || reset_accumulated))
                return usage_error("stats: --tag reads a pool's figures; resets are the session's as a whole");
        int r = ctl_connect(c);
        if (r)
                return r;
        if (!scoped && !gpumem_admin_rights(c->admin) && !reset_peak && !reset_accumulated) {
                /* A tenant sees its own figures: those, rather than a refusal. */
                scope = GPUMEM_SCOPE_TENANT;
                tenant = gpumem_admin_tenant(c->admin);
                fprintf(stderr, "gpumemctl: statistics of your tenant '%s' (the device's need admin rights)\n", tenant);
        }
        if (reset_peak || reset_accumulated) {
                r = gpumem_admin_reset_stats(c->admin, scope, tenant, reset_peak, reset_accumulated);
                return r < 0 ? ctl_failed(c, r) : 0;
        }
        gpumem_stats *st;
        r = tag ? gpumem_admin_stats_tag(c->admin, scope, tenant, pid, tag, &st)
                : gpumem_admin_stats(c->admin, scope, tenant, pid, &st);
        if (r < 0)
                return ctl_failed(c, r);
        if (scope == GPUMEM_SCOPE_PID && !tag && gpumem_stats_sessions(st) == 0) { /* with a tag: none named it */
                fprintf(stderr, "gpumemctl: --pid names no session on this daemon%s\n",
                        gpumem_admin_rights(c->admin) ? "" : " (that your tenant may see)");
                gpumem_stats_free(st);
                return EXIT_REFUSED;
        }
        if (json) {
                printf("{\"device\": %d, \"backend\": ", gpumem_stats_device(st));
                print_json_string(gpumem_admin_backend(c->admin));
                printf(", \"capacity_bytes\": %" PRIu64 ", \"sessions\": %" PRIu64 ", \"claimed_bytes\": %" PRIu64,
                       gpumem_stats_capacity(st), gpumem_stats_sessions(st), gpumem_stats_claimed(st));
                if (scope == GPUMEM_SCOPE_TENANT) {
                        printf(", \"tenant\": ");
                        print_json_string(tenant);
                }
                if (tag) {
                        printf(", \"tag\": ");
                        print_json_string(tag);
                }
                for (size_t i = 0; i < gpumem_stats_count(st); i++) {
                        printf(", ");
                        print_json_string(gpumem_stats_name(st, i));
                        printf(": %" PRId64, gpumem_stats_value(st, i));
                }
                printf("}\n");
        } else {
                char *text;
                r = gpumem_stats_summary(st, false, &text);
                if (r < 0) {
                        gpumem_stats_free(st);
                        return EXIT_REFUSED;
                }
                if (tag) /* which pool the summary is of, and over how many sessions */
                        printf("Tagged pool '%s' of %" PRIu64 " session(s)\n", tag[0] ? tag : "default",
                               gpumem_stats_sessions(st));
                fputs(text, stdout);
                gpumem_buffer_free(text);
        }
        gpumem_stats_free(st);
        return 0;
}

static int cmd_trim(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {{"tenant", required_argument, NULL, 't'}, {}};
        const char *tenant = "*";
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "t:", opts, NULL)) != -1) {
                if (o != 't') {
                        usage(stderr);
                        return EXIT_USAGE;
                }
                tenant = optarg;
        }
        if (no_more_args("trim", argc, argv, optind))
                return EXIT_USAGE;
        int r = ctl_connect(c);
        if (r)
                return r;
        uint64_t released;
        r = gpumem_admin_trim(c->admin, tenant, &released);
        if (r < 0)
                return ctl_failed(c, r);
        char buf[32];
        printf("released %s (%" PRIu64 " bytes)\n", gm_format_size(released, buf, sizeof(buf)), released);
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
        gpumem_snapshot_format format = GPUMEM_SNAPSHOT_PICKLE;
        gpumem_snapshot_category category = GPUMEM_SNAPSHOT_CATEGORY_NONE;
        uint32_t pid = 0;
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "o:f:p:c:", opts, NULL)) != -1) {
                switch (o) {
                case 'o':
                        output = optarg;
                        break;
                case 'f':
                        if (strcmp(optarg, "pickle") == 0)
                                format = GPUMEM_SNAPSHOT_PICKLE;
                        else if (strcmp(optarg, "json") == 0)
                                format = GPUMEM_SNAPSHOT_JSON;
                        else if (strcmp(optarg, "pickle-1.13") == 0)
                                format = GPUMEM_SNAPSHOT_PICKLE_1_13;
                        else {
                                fprintf(stderr, "gpumemctl: --format is pickle, json or pickle-1.13\n");
                                return EXIT_USAGE;
                        }
                        break;
                case 'c':
                        if (strcmp(optarg, "tenant") == 0)
                                category = GPUMEM_SNAPSHOT_CATEGORY_TENANT;
                        else if (strcmp(optarg, "pid") == 0)
                                category = GPUMEM_SNAPSHOT_CATEGORY_PID;
                        else if (strcmp(optarg, "tag") == 0)
                                category = GPUMEM_SNAPSHOT_CATEGORY_TAG;
                        else if (strcmp(optarg, "none") == 0)
                                category = GPUMEM_SNAPSHOT_CATEGORY_NONE;
                        else {
                                fprintf(stderr, "gpumemctl: --category is tenant, pid, tag or none\n");
                                return EXIT_USAGE;
                        }
                        break;
                case 'p':
                        pid = (uint32_t) strtoul(optarg, NULL, 10);
                        if (!pid) {
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
        int r = ctl_connect(c);
        if (r)
                return r;
        int fd;
        gpumem_snapshot_info info;
        r = gpumem_admin_snapshot(c->admin, format, category, pid, &fd, &info);
        if (r < 0)
                return ctl_failed(c, r);
        uint64_t size = info.size;
        if (info.local_unanswered)
                fprintf(stderr,
                        "gpumemctl: %u of %u local sessions did not answer in time: their blocks are unknown, "
                        "their segments are shown (marked gpumemd_blocks_unknown)\n",
                        info.local_unanswered, info.local_asked);
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
        const char *what = argc >= 2 ? argv[1] : "";
        if (strcmp(what, "on") != 0 && strcmp(what, "off") != 0 && strcmp(what, "status") != 0)
                return usage_error("history on [--max-entries N] | off | status");
        gpumem_history_op op = strcmp(what, "on") == 0       ? GPUMEM_HISTORY_ON
                               : strcmp(what, "status") == 0 ? GPUMEM_HISTORY_STATUS
                                                             : GPUMEM_HISTORY_OFF;
        uint64_t max_entries = 0;
        int i = 2;
        if (op == GPUMEM_HISTORY_ON && i < argc && strcmp(argv[i], "--max-entries") == 0) {
                if (i + 1 >= argc)
                        return usage_error("--max-entries needs a number");
                if (parse_number("--max-entries", argv[i + 1], 1, GPUMEM_HISTORY_MAX_ENTRIES, &max_entries))
                        return EXIT_USAGE;
                i += 2;
        }
        if (no_more_args(op == GPUMEM_HISTORY_ON       ? "history on"
                         : op == GPUMEM_HISTORY_STATUS ? "history status"
                                                       : "history off",
                         argc, argv, i))
                return EXIT_USAGE;
        int r = ctl_connect(c);
        if (r)
                return r;
        gpumem_history_state st;
        r = gpumem_admin_history(c->admin, op, max_entries, &st);
        if (r < 0)
                return ctl_failed(c, r);
        printf("history %s (max %" PRIu64 " entries, %" PRIu64 " recorded)\n", st.enabled ? "on" : "off",
               st.max_entries, st.entries);
        return 0;
}

static int cmd_alloc_conf(ctl_t *c, int argc, char **argv) {
        if (no_more_args("alloc-conf", argc, argv, 2))
                return EXIT_USAGE;
        int r = ctl_connect(c);
        if (r)
                return r;
        char *conf;
        r = gpumem_admin_alloc_conf(c->admin, argc == 2 ? argv[1] : NULL, &conf);
        if (r < 0)
                return ctl_failed(c, r);
        printf("%s\n", conf);
        gpumem_buffer_free(conf);
        return 0;
}

/* Compact sizes for tables that fit 80 columns: "512B", "20.0M", "7.5G". */
static const char *fmt_size(uint64_t v, char *buf, size_t len) {
        return gm_format_size_as(v, GM_SIZE_COMPACT, buf, len);
}

static void print_quota_json(const gpumem_tenant_usage *list, size_t n) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
                const gpumem_tenant_info *t = &list[i].info;
                printf("%s{\"tenant\": ", i ? ", " : "");
                print_json_string(t->tenant);
                printf(", \"quota_bytes\": %" PRIu64 ", \"quota_source\": ", t->quota);
                print_json_string(t->quota_source);
                printf(", \"reserved_bytes\": %" PRIu64 ", \"allocated_bytes\": %" PRIu64 ", \"cached_bytes\": %" PRIu64
                       ", \"sessions\": %u, \"release_unverified_bytes\": %" PRIu64 ", \"release_check\": ",
                       t->charged_bytes, t->allocated_bytes, t->cached_bytes, t->sessions,
                       list[i].release_unverified_bytes);
                print_json_string(list[i].release_check);
                printf(", \"audited_bytes\": %" PRIu64 ", \"claimed_bytes\": %" PRIu64 "}", list[i].audited_bytes,
                       list[i].claimed_bytes);
        }
        printf("]\n");
}

/* The tenant's quota as text in buf when a runtime one is in force, else "". */
static void runtime_quota_of(ctl_t *c, const char *tenant, char *buf, size_t len) {
        gpumem_tenant_usage *list;
        size_t n;
        buf[0] = '\0';
        if (gpumem_admin_quota(c->admin, GPUMEM_QUOTA_GET, tenant, 0, false, &list, &n) < 0)
                return; /* no such tenant yet */
        if (n == 1 && strcmp(list[0].info.quota_source, "runtime") == 0)
                fmt_size(list[0].info.quota, buf, len);
        gpumem_buffer_free(list);
}

static int cmd_quota(ctl_t *c, int argc, char **argv) {
        gpumem_quota_op op;
        const char *tenant = NULL;
        uint64_t bytes = 0;
        bool json = false, runtime = false;
        if (argc >= 2 && strcmp(argv[1], "list") == 0) {
                op = GPUMEM_QUOTA_LIST;
                json = argc >= 3 && strcmp(argv[2], "--json") == 0;
                if (no_more_args("quota list", argc, argv, json ? 3 : 2))
                        return EXIT_USAGE;
        } else if (argc >= 3 && strcmp(argv[1], "get") == 0) {
                op = GPUMEM_QUOTA_GET;
                tenant = argv[2];
                json = argc >= 4 && strcmp(argv[3], "--json") == 0;
                if (no_more_args("quota get", argc, argv, json ? 4 : 3))
                        return EXIT_USAGE;
        } else if ((argc == 4 || argc == 5) && strcmp(argv[1], "set") == 0) {
                op = GPUMEM_QUOTA_SET;
                tenant = argv[2];
                if (gm_parse_size(argv[3], &bytes) < 0) {
                        fprintf(stderr, "gpumemctl: invalid size '%s' (e.g. 8G, 512M, 0 to remove)\n", argv[3]);
                        return EXIT_USAGE;
                }
                if (argc == 5) {
                        if (strcmp(argv[4], "--runtime") != 0) {
                                usage(stderr);
                                return EXIT_USAGE;
                        }
                        runtime = true;
                }
        } else {
                usage(stderr);
                return EXIT_USAGE;
        }
        int r = ctl_connect(c);
        if (r)
                return r;
        /* A persistent quota replaces a runtime one (the daemon drops it): say so. */
        char replaced[32] = "";
        if (op == GPUMEM_QUOTA_SET && !runtime)
                runtime_quota_of(c, tenant, replaced, sizeof(replaced));
        gpumem_tenant_usage *list;
        size_t n;
        r = gpumem_admin_quota(c->admin, op, tenant, bytes, runtime, &list, &n);
        if (r < 0)
                return ctl_failed(c, r);
        if (!json && replaced[0] && n == 1 && strcmp(list[0].info.quota_source, "runtime") != 0)
                printf("The persistent quota replaces the runtime quota of %s that was in force.\n", replaced);
        if (json) {
                print_quota_json(list, n);
                gpumem_buffer_free(list);
                return 0;
        }
        printf("%-20s %8s %-10s %8s %9s %8s %4s %-6s\n", "TENANT", "QUOTA", "SOURCE", "RESERVED", "ALLOCATED", "CACHED",
               "SESS", "CHECK");
        for (size_t i = 0; i < n; i++) {
                const gpumem_tenant_info *t = &list[i].info;
                char q[32], ch[32], a[32], ca[32], au[32];
                printf("%-20.20s %8s %-10s %8s %9s %8s %4u %-6s", t->tenant,
                       t->quota ? fmt_size(t->quota, q, sizeof(q)) : "-", t->quota_source,
                       fmt_size(t->charged_bytes, ch, sizeof(ch)), fmt_size(t->allocated_bytes, a, sizeof(a)),
                       fmt_size(t->cached_bytes, ca, sizeof(ca)), t->sessions,
                       list[i].release_check[0] ? list[i].release_check : "-");
                if (list[i].audited_bytes) /* memory it gave back and maps again: beyond RESERVED */
                        printf(" +%s audited", fmt_size(list[i].audited_bytes, au, sizeof(au)));
                if (list[i].claimed_bytes) /* set aside for its sessions: beyond RESERVED */
                        printf(" +%s claimed", fmt_size(list[i].claimed_bytes, au, sizeof(au)));
                printf("\n");
        }
        gpumem_buffer_free(list);
        return 0;
}

static int cmd_clients(ctl_t *c, int argc, char **argv) {
        bool json = argc >= 2 && strcmp(argv[1], "--json") == 0;
        if (no_more_args("clients", argc, argv, json ? 2 : 1))
                return EXIT_USAGE;
        int r = ctl_connect(c);
        if (r)
                return r;
        gpumem_session_info *list;
        size_t n;
        r = gpumem_admin_list_clients(c->admin, &list, &n);
        if (r < 0)
                return ctl_failed(c, r);
        if (json)
                printf("[");
        else
                printf("%7s %-16s %-18s %8s %9s %8s %5s %-7s %s\n", "PID", "TENANT", "UNIT", "RESERVED", "ALLOCATED",
                       "CACHED", "SEGS", "HEAP", "COMMAND");
        for (size_t i = 0; i < n; i++) {
                const gpumem_session_info *si = &list[i];
                const gpumem_client_info *ci = &si->info;
                if (json) {
                        printf("%s{\"session_id\": %" PRIu64 ", \"pid\": %u, \"uid\": %u, \"tenant\": ", i ? ", " : "",
                               ci->session_id, ci->pid, ci->uid);
                        print_json_string(ci->tenant);
                        printf(", \"unit\": ");
                        print_json_string(ci->unit);
                        printf(", \"name\": ");
                        print_json_string(ci->name);
                        printf(", \"command\": ");
                        print_json_string(si->command);
                        printf(", \"reserved_bytes\": %" PRIu64 ", \"allocated_bytes\": %" PRIu64
                               ", \"cached_bytes\": %" PRIu64 ", \"segments\": %" PRIu64
                               ", \"releasing_bytes\": %" PRIu64
                               ", \"control\": %s, \"heap\": \"%s\", \"stats_page_invalid\": %s, \"requests\": %" PRIu64
                               ", \"unresponsive\": %s, \"unresponsive_ms\": %" PRIu64
                               ", \"release_unverified_bytes\": %" PRIu64 ", \"claimed_bytes\": %" PRIu64
                               ", \"asleep\": %s, \"sleeping_bytes\": %" PRIu64,
                               ci->reserved_bytes, ci->allocated_bytes, ci->cached_bytes, ci->segments,
                               ci->releasing_bytes, ci->control ? "true" : "false", ci->heap,
                               ci->stats_page_invalid ? "true" : "false", ci->requests,
                               si->unresponsive ? "true" : "false", si->unresponsive_ms, si->release_unverified_bytes,
                               si->claimed_bytes, ci->asleep ? "true" : "false", ci->sleeping_bytes);
                        printf(", \"tags\": {"); /* tagged pools' bytes: {"": default, "kv_cache": ...} */
                        for (size_t k = 0; k < si->n_tags; k++) {
                                printf("%s", k ? ", " : "");
                                print_json_string(si->tags[k].tag);
                                printf(": %" PRIu64, si->tags[k].bytes);
                        }
                        printf("}}");
                        continue;
                }
                char rs[32], a[32], ca[32], uv[48] = "", cl[48] = "", zz[48] = "";
                if (si->release_unverified_bytes)
                        snprintf(uv, sizeof(uv), " (%s released, unverified)",
                                 fmt_size(si->release_unverified_bytes, rs, sizeof(rs)));
                if (si->claimed_bytes)
                        snprintf(cl, sizeof(cl), " (+%s claimed)", fmt_size(si->claimed_bytes, rs, sizeof(rs)));
                if (ci->asleep)
                        snprintf(zz, sizeof(zz), " (asleep: needs %s to wake)",
                                 fmt_size(ci->sleeping_bytes, rs, sizeof(rs)));
                printf("%7u %-16.16s %-18.18s %8s %9s %8s %5" PRIu64 " %-7s %s%s%s%s%s%s\n", ci->pid, ci->tenant,
                       ci->unit[0] ? ci->unit : (ci->control ? "(control)" : "-"),
                       fmt_size(ci->reserved_bytes, rs, sizeof(rs)), fmt_size(ci->allocated_bytes, a, sizeof(a)),
                       fmt_size(ci->cached_bytes, ca, sizeof(ca)), ci->segments, ci->heap,
                       si->command[0] ? si->command : "-", ci->stats_page_invalid ? " (stats page invalid)" : "",
                       si->unresponsive ? " (unresponsive)" : "", uv, cl, zz);
        }
        if (json)
                printf("]\n");
        gpumem_buffer_free(list);
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
                        } else if (parse_number(a, v, 0, GPUMEM_MAX_DEVICE, &n)) {
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
        else if (strcmp(cmd, "shared") == 0)
                fn = cmd_shared;
        if (!fn)
                return usage_error("unknown command '%s'", cmd);
        ctl_t c = {.socket_path = socket_path, .device = device};
        int r = fn(&c, sub_argc, sub_argv);
        gpumem_admin_free(c.admin);
        return r;
}
