/* gpumemd: the per-GPU memory broker. Startup and shutdown are symmetric:
 * options → backend → loop → server → READY; teardown in reverse. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "localstats.h"
#include "log.h"
#include "sd.h"
#include "metrics.h"
#include "requests.h"
#include "clock.h"
#include "size.h"
#include "trust.h"

static void usage(FILE *f) {
        fprintf(f, "Usage: gpumemd [OPTIONS]\n"
                   "Per-GPU memory broker: hands out memory blocks to client processes.\n\n"
                   "  -c, --config FILE          configuration file (INI)\n"
                   "  -d, --device N             device index (default 0)\n"
                   "  -b, --backend KIND         auto, cuda or host (default auto)\n"
                   "  -C, --capacity BYTES       bytes to hand out (1G, 512M, 4096; default: host\n"
                   "                             min(8G, RAM/4), cuda the device's memory)\n"
                   "  -s, --socket PATH          control socket (default $RUNTIME_DIRECTORY/gpu<N>.sock\n"
                   "                             under systemd, /run/gpumem/gpu<N>.sock as root, else\n"
                   "                             $XDG_RUNTIME_DIR/gpumem/gpu<N>.sock); persistent quotas\n"
                   "                             live in state_dir, $STATE_DIRECTORY or its directory\n"
                   "  -m, --metrics-listen ADDR  Prometheus endpoint (default 127.0.0.1:9470+N)\n"
                   "  -a, --alloc-conf STR       PYTORCH_CUDA_ALLOC_CONF-style allocator settings\n"
                   "      --max-sessions N       concurrent sessions (default 1024)\n"
                   "      --max-sessions-per-uid N  sessions of one uid (default max-sessions/4)\n"
                   "      --max-blocks N         live blocks per session (default 1048576)\n"
                   "      --unresponsive-timeout MS  a client that answers no release request for\n"
                   "                             this long is not waited for (default 10000, 0 never)\n"
                   "  -v, --verbose              more logging (repeat for debug)\n"
                   "  -h, --help                 this text\n");
}

enum { OPT_MAX_SESSIONS = 256, OPT_MAX_BLOCKS, OPT_MAX_SESSIONS_PER_UID, OPT_UNRESPONSIVE_TIMEOUT };

/* A whole-number flag, in the range of the configuration key it mirrors. */
static int parse_limit(const char *flag, const char *key, const char *value, uint64_t *ret) {
        uint64_t min = 0, max = 0;
        if (gm_config_key_range(key, &min, &max) < 0)
                return -EINVAL;
        if (gm_parse_uint(value, min, max, ret) < 0) {
                log_error("Invalid --%s '%s': a whole number from %llu to %llu", flag, value, (unsigned long long) min,
                          (unsigned long long) max);
                return -EINVAL;
        }
        return 0;
}

/* A ReleaseRequest must fit one packet: ranges are sent in batches of this many. */
#define RANGES_PER_RELEASE 512

static int parse_args(int argc, char **argv, gm_options_t *o) {
        static const struct option long_options[] = {
                {"config", required_argument, NULL, 'c'},
                {"device", required_argument, NULL, 'd'},
                {"backend", required_argument, NULL, 'b'},
                {"capacity", required_argument, NULL, 'C'},
                {"socket", required_argument, NULL, 's'},
                {"metrics-listen", required_argument, NULL, 'm'},
                {"alloc-conf", required_argument, NULL, 'a'},
                {"max-sessions", required_argument, NULL, OPT_MAX_SESSIONS},
                {"max-blocks", required_argument, NULL, OPT_MAX_BLOCKS},
                {"max-sessions-per-uid", required_argument, NULL, OPT_MAX_SESSIONS_PER_UID},
                {"unresponsive-timeout", required_argument, NULL, OPT_UNRESPONSIVE_TIMEOUT},
                {"verbose", no_argument, NULL, 'v'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        int c;
        while ((c = getopt_long(argc, argv, "c:d:b:C:s:m:a:vh", long_options, NULL)) != -1) {
                uint64_t v;
                switch (c) {
                case 'c':
                        o->config_path = optarg;
                        break;
                case 'd':
                        if (strncmp(optarg, "GPU-", 4) == 0) {
                                o->device_uuid = optarg;
                                break;
                        }
                        if (gm_parse_uint(optarg, 0, INT32_MAX, &v) < 0) {
                                log_error("Invalid --device '%s': an index or a GPU-... UUID", optarg);
                                return -EINVAL;
                        }
                        o->device = (int) v;
                        break;
                case 'b':
                        if (!gm_backend_kind_known(optarg)) {
                                log_error("Invalid --backend '%s': " GM_BACKEND_KINDS, optarg);
                                return -EINVAL;
                        }
                        o->backend = optarg;
                        break;
                case 'C':
                        if (gm_parse_size(optarg, &o->capacity) < 0 || o->capacity == 0) {
                                log_error("Invalid --capacity '%s': a size such as 8G, 512M or 4096", optarg);
                                return -EINVAL;
                        }
                        break;
                case 's':
                        if (optarg[0] != '/') {
                                log_error("Invalid --socket '%s': an absolute path", optarg);
                                return -EINVAL;
                        }
                        if (strlen(optarg) >= sizeof(o->socket_path)) {
                                log_error("Socket path '%s' is too long", optarg);
                                return -ENAMETOOLONG;
                        }
                        snprintf(o->socket_path, sizeof(o->socket_path), "%s", optarg);
                        break;
                case 'm':
                        o->metrics_listen = optarg;
                        break;
                case 'a':
                        o->alloc_conf = optarg;
                        break;
                case OPT_MAX_SESSIONS:
                        if (parse_limit("max-sessions", "max_sessions", optarg, &v) < 0)
                                return -EINVAL;
                        o->limits.max_sessions = (uint32_t) v;
                        break;
                case OPT_MAX_SESSIONS_PER_UID:
                        if (parse_limit("max-sessions-per-uid", "max_sessions_per_uid", optarg, &v) < 0)
                                return -EINVAL;
                        o->limits.max_sessions_per_uid = (uint32_t) v;
                        break;
                case OPT_UNRESPONSIVE_TIMEOUT:
                        if (parse_limit("unresponsive-timeout", "unresponsive_timeout_ms", optarg, &v) < 0)
                                return -EINVAL;
                        o->limits.unresponsive_timeout_ms = (uint32_t) v;
                        break;
                case OPT_MAX_BLOCKS:
                        if (parse_limit("max-blocks", "max_blocks_per_session", optarg, &v) < 0)
                                return -EINVAL;
                        o->limits.max_blocks_per_session = v;
                        break;
                case 'v':
                        o->verbosity++;
                        break;
                case 'h':
                        usage(stdout);
                        exit(EXIT_SUCCESS);
                default:
                        usage(stderr);
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                log_error("Unexpected argument '%s'", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

static void options_default(gm_options_t *o) {
        *o = (gm_options_t){
                .backend = "auto",
                .socket_mode = 0666,
                .metrics_tenants = true,
                .limits =
                        {
                                .max_sessions = 1024,
                                .hello_timeout_ms = 5000,
                                .max_blocks_per_session = 1u << 20,
                                .max_packet = GM_IPC_MAX_PACKET_DEFAULT,
                                .max_fds = GM_IPC_MAX_FDS_DEFAULT,
                                .max_parked_per_session = 64,
                                .max_shared_objects = GM_SHARED_DEFAULT_MAX_OBJECTS,
                                .park_timeout_ms = 2000,
                                .release_timeout_ms = 2000,
                                .unresponsive_timeout_ms = 10000,
                                .audit_interval_ms = 2000,
                                .max_audited_processes = 1024,
                                .reattach_grace_ms = 30000,
                                .max_reattach_items = 4u << 20,
                        },
        };
}

/* Settings from the configuration file; command-line flags, parsed after,
 * override them. Strings point into `c`, which lives as long as the daemon. */
static void options_from_config(gm_options_t *o, const gm_config_t *c) {
        if (c->has_socket)
                snprintf(o->socket_path, sizeof(o->socket_path), "%s", c->socket);
        if (c->has_socket_mode)
                o->socket_mode = c->socket_mode;
        o->has_socket_group = c->has_socket_group;
        o->socket_group = c->socket_group;
        o->has_admin_group = c->has_admin_group;
        o->admin_group = c->admin_group;
        if (c->has_metrics_listen)
                o->metrics_listen = c->metrics_listen;
        if (c->has_backend)
                o->backend = c->backend;
        if (c->has_device) {
                o->device = c->device >= 0 ? c->device : 0;
                o->device_uuid = c->device_uuid;
        }
        if (c->has_capacity)
                o->capacity = c->capacity;
        if (c->has_alloc_conf)
                o->alloc_conf = c->alloc_conf;
        if (c->has_max_sessions)
                o->limits.max_sessions = c->max_sessions;
        if (c->has_max_blocks_per_session)
                o->limits.max_blocks_per_session = c->max_blocks_per_session;
        if (c->has_max_packet)
                o->limits.max_packet = c->max_packet;
        if (c->has_max_fds)
                o->limits.max_fds = c->max_fds;
        if (c->has_release_timeout_ms)
                o->limits.release_timeout_ms = c->release_timeout_ms;
        if (c->has_park_timeout_ms)
                o->limits.park_timeout_ms = c->park_timeout_ms;
        if (c->has_unresponsive_timeout_ms)
                o->limits.unresponsive_timeout_ms = c->unresponsive_timeout_ms;
        if (c->has_audit_interval_ms)
                o->limits.audit_interval_ms = c->audit_interval_ms;
        if (c->has_max_audited_processes)
                o->limits.max_audited_processes = c->max_audited_processes;
        if (c->has_release_check)
                o->limits.release_check = c->release_check;
        if (c->has_max_parked_per_session)
                o->limits.max_parked_per_session = c->max_parked_per_session;
        if (c->has_max_shared_objects)
                o->limits.max_shared_objects = c->max_shared_objects;
        if (c->has_reattach_grace_ms)
                o->limits.reattach_grace_ms = c->reattach_grace_ms;
        if (c->has_max_sessions_per_uid)
                o->limits.max_sessions_per_uid = c->max_sessions_per_uid;
        if (c->has_hello_timeout_ms)
                o->limits.hello_timeout_ms = c->hello_timeout_ms;
        if (c->has_metrics_tenants)
                o->metrics_tenants = c->metrics_tenants;
}

/* The snapshot limits of the configuration file (defaults where unset). */
static void snapshot_limits_from_config(gm_snapshot_limits_t *l, const gm_config_t *c) {
        *l = GM_SNAPSHOT_DEFAULT_LIMITS;
        if (c->has_snapshot_max_bytes)
                l->user_max_bytes = c->snapshot_max_bytes;
        if (c->has_snapshot_max_entries)
                l->user_max_entries = c->snapshot_max_entries;
        if (c->has_snapshot_answer_timeout_ms)
                l->answer_timeout_ms = c->snapshot_answer_timeout_ms;
}

/* The first directory of a systemd directory variable ($RUNTIME_DIRECTORY,
 * $STATE_DIRECTORY: absolute paths separated by colons) in buf, or NULL. */
static const char *systemd_directory(const char *variable, char *buf, size_t buf_len) {
        const char *value = getenv(variable);
        if (!value || value[0] != '/')
                return NULL;
        size_t len = strcspn(value, ":");
        if (len >= buf_len)
                return NULL;
        memcpy(buf, value, len);
        buf[len] = '\0';
        return buf;
}

/* The control socket when neither a flag nor the configuration names one:
 * in the runtime directory systemd made for the service, else the default
 * socket of the daemon's user (gm_ipc_default_socket_path). */
static int default_socket_path(gm_options_t *o) {
        char dir[sizeof(o->socket_path)];
        if (o->socket_path[0])
                return 0;
        if (!systemd_directory("RUNTIME_DIRECTORY", dir, sizeof(dir)))
                return gm_ipc_default_socket_path(o->device, false, o->socket_path, sizeof(o->socket_path));
        int n = snprintf(o->socket_path, sizeof(o->socket_path), "%s/gpu%d.sock", dir, o->device);
        return n < 0 || (size_t) n >= sizeof(o->socket_path) ? -ENAMETOOLONG : 0;
}

/* Where persistent quotas are kept: the configuration's state_dir, else the
 * state directory systemd made for the service, else the directory of the
 * control socket, so that a daemon started by hand never writes the system's
 * state. Needs the final socket path; `c` must outlive the choice. */
static void choose_state_dir(gm_options_t *o, const gm_config_t *c) {
        if (c->has_state_dir) {
                o->state_dir = c->state_dir;
                return;
        }
        o->state_dir = systemd_directory("STATE_DIRECTORY", o->state_dir_buf, sizeof(o->state_dir_buf));
        if (o->state_dir)
                return;
        const char *slash = strrchr(o->socket_path, '/');
        size_t len = slash ? (size_t) (slash - o->socket_path) : 0;
        if (len == 0 || len >= sizeof(o->state_dir_buf))
                return; /* none kept */
        memcpy(o->state_dir_buf, o->socket_path, len);
        o->state_dir_buf[len] = '\0';
        o->state_dir = o->state_dir_buf;
}

/* The broker's limits from the daemon's. */
static gm_broker_limits_t broker_limits(const gm_daemon_t *d) {
        const gm_limits_t *l = &d->opts.limits;
        return (gm_broker_limits_t){
                .max_blocks_per_session = l->max_blocks_per_session,
                .max_parked_per_session = l->max_parked_per_session,
                .max_shared_objects = l->max_shared_objects,
                .park_timeout_ms = l->park_timeout_ms,
                .release_timeout_ms = l->release_timeout_ms,
                .unresponsive_timeout_ms = l->unresponsive_timeout_ms,
                .audit_interval_ms = l->audit_interval_ms,
                .max_audited_processes = l->max_audited_processes,
                .release_check = l->release_check,
                .reattach_grace_ms = l->reattach_grace_ms,
                .max_reattach_items = l->max_reattach_items,
                .max_ranges_per_release = RANGES_PER_RELEASE,
        };
}

/* Applies the config file's tenant quotas and release checks to every tenant. */
static void apply_config_quotas(gm_daemon_t *d) {
        for (size_t i = 0; i < d->config->n_tenants; i++) {
                const gm_config_tenant_t *ct = &d->config->tenants[i];
                gm_tenant_t *t = gm_tenant_get(d->broker, ct->name); /* listed even before a session comes */
                if (t) {
                        gm_tenant_set_quota(t, GM_QUOTA_CONFIG, ct->has_quota, ct->quota);
                        gm_tenant_set_release_check(t, ct->has_release_check, ct->release_check);
                        gm_tenant_set_tag_quotas(t, ct->tag_quotas, ct->has_tag_quota ? ct->n_tag_quotas : 0);
                }
        }
        for (gm_tenant_t *t = d->broker->tenants; t; t = t->next)
                if (!gm_config_tenant_find(d->config, t->name)) {
                        gm_tenant_set_quota(t, GM_QUOTA_CONFIG, false, 0);
                        gm_tenant_set_release_check(t, false, GM_RELEASE_CHECK_VERIFY);
                        gm_tenant_set_tag_quotas(t, NULL, 0);
                }
}

/* SIGHUP: a new configuration file takes effect for tenant rules, quotas,
 * limits, the admin group and alloc_conf; a bad file keeps the old one. */
static void reload_config(gm_daemon_t *d) {
        char err[512] = "";
        gm_sd_notify_reloading();
        gm_config_t *c = NULL;
        int r = gm_config_load(d->opts.config_path, &c, err, sizeof(err));
        if (r < 0) {
                log_error("Reloading the configuration failed, keeping the old one: %s", err[0] ? err : strerror(-r));
                return;
        }
        gm_alloc_config_t alloc;
        if (c->has_alloc_conf && gm_alloc_config_parse(c->alloc_conf, &alloc, err, sizeof(err)) == 0 &&
            strcmp(alloc.raw, d->broker->alloc_config.raw) != 0)
                gm_broker_set_alloc_config(d->broker, &alloc); /* max_split_size of the statistics too */
        gm_options_t o = d->opts;
        options_from_config(&o, c);
        if (strcmp(o.socket_path, d->opts.socket_path) != 0 || o.socket_mode != d->opts.socket_mode ||
            o.capacity != d->opts.capacity || o.limits.max_packet != d->opts.limits.max_packet ||
            o.limits.max_fds != d->opts.limits.max_fds ||
            (o.backend != d->opts.backend &&
             (!o.backend || !d->opts.backend || strcmp(o.backend, d->opts.backend) != 0)))
                log_warning("Configuration changes to the socket, backend, capacity or packet limits need a "
                            "restart, ignoring them");
        d->opts.limits.max_sessions = o.limits.max_sessions;
        d->opts.limits.max_sessions_per_uid = o.limits.max_sessions_per_uid;
        d->opts.limits.hello_timeout_ms = o.limits.hello_timeout_ms;
        d->opts.limits.max_blocks_per_session = o.limits.max_blocks_per_session;
        d->opts.limits.release_timeout_ms = o.limits.release_timeout_ms;
        d->opts.limits.park_timeout_ms = o.limits.park_timeout_ms;
        d->opts.limits.unresponsive_timeout_ms = o.limits.unresponsive_timeout_ms;
        d->opts.limits.audit_interval_ms = o.limits.audit_interval_ms;
        d->opts.limits.max_audited_processes = o.limits.max_audited_processes;
        d->opts.limits.release_check = o.limits.release_check;
        d->opts.limits.max_parked_per_session = o.limits.max_parked_per_session;
        d->opts.limits.max_shared_objects = o.limits.max_shared_objects;
        d->opts.has_admin_group = o.has_admin_group;
        d->opts.admin_group = o.admin_group;
        snapshot_limits_from_config(&d->snapjobs.limits, c);
        gm_broker_limits_t limits = broker_limits(d);
        gm_broker_set_limits(d->broker, &limits);
        choose_state_dir(&d->opts, c);
        gm_config_free(d->config);
        d->config = c;
        gm_server_sync_requests(d); /* the state directory may have moved */
        apply_config_quotas(d);
        log_notice("configuration reloaded from %s", c->path ? c->path : "(defaults)");
        gm_sd_notify_ready();
}

/* Every physical handle is an fd: allow as many as the hard limit lets us. */
static void raise_fd_limit(void) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                        log_warning_errno(-errno, "Failed to raise RLIMIT_NOFILE, ignoring");
        }
}

static void on_signal(uv_signal_t *handle, int signum) {
        gm_daemon_t *d = handle->data;
        if (signum == SIGHUP) {
                reload_config(d);
                return;
        }
        if (d->shutting_down) {
                if (signum == SIGINT) {
                        log_notice("second SIGINT: exiting now");
                        _exit(EXIT_FAILURE);
                }
                return;
        }
        log_notice("%s: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
        d->shutting_down = true;
        /* Under systemd the fd store keeps every segment for the next daemon,
         * whose clients re-attach; otherwise everything is released now. */
        d->broker->keep_stored = gm_sd_notify_available();
        d->broker->stopping = true; /* the sessions' clients may re-attach to the next daemon */
        gm_sd_notify_stopping();
        gm_server_stop(d);
        gm_orphan_expire(d->broker, gm_now_ms(), true);
        if (d->watchdog_running) {
                uv_timer_stop(&d->watchdog);
                uv_close((uv_handle_t *) &d->watchdog, NULL);
                d->watchdog_running = false;
        }
        d->metrics = gm_metrics_stop(d->metrics);
        uv_signal_stop(&d->sigterm);
        uv_signal_stop(&d->sighup);
        uv_close((uv_handle_t *) &d->sigterm, NULL);
        uv_close((uv_handle_t *) &d->sighup, NULL);
        /* SIGINT stays armed so that a second one exits at once. */
        uv_unref((uv_handle_t *) &d->sigint);
}

/* The loop is alive: ping systemd's watchdog and show live figures. */
static void on_watchdog(uv_timer_t *t) {
        gm_daemon_t *d = t->data;
        char used[32], cap[32];
        uint64_t usec;
        if (gm_sd_watchdog_interval_usec(&usec) > 0)
                gm_sd_watchdog_ping();
        gm_sd_notify_status("%u sessions, %s of %s in use", d->n_conns,
                            gm_format_size(gm_piece_reserved(d->broker), used, sizeof(used)),
                            gm_format_size(d->backend->capacity, cap, sizeof(cap)));
}

/* Copies of the option strings that point into the configuration, which a
 * reload frees: a reload compares against what the daemon started with. */
typedef struct startup_strings {
        char *backend, *metrics_listen, *alloc_conf, *device_uuid;
} startup_strings_t;

static void own_startup_strings(gm_options_t *o, startup_strings_t *own) {
        own->backend = o->backend ? strdup(o->backend) : NULL;
        own->metrics_listen = o->metrics_listen ? strdup(o->metrics_listen) : NULL;
        own->alloc_conf = o->alloc_conf ? strdup(o->alloc_conf) : NULL;
        own->device_uuid = o->device_uuid ? strdup(o->device_uuid) : NULL;
        o->backend = own->backend;
        o->metrics_listen = own->metrics_listen;
        o->alloc_conf = own->alloc_conf;
        o->device_uuid = own->device_uuid;
}

static void free_startup_strings(startup_strings_t *own) {
        free(own->backend);
        free(own->metrics_listen);
        free(own->alloc_conf);
        free(own->device_uuid);
        *own = (startup_strings_t){0};
}

static void walk_close(uv_handle_t *h, void *arg) {
        if (!uv_is_closing(h))
                uv_close(h, NULL);
}

int main(int argc, char **argv) {
        static gm_daemon_t daemon;
        static startup_strings_t startup;
        gm_daemon_t *d = &daemon;
        char err[512] = "";
        int r;

        options_default(&d->opts);
        d->listen_fd = -1;
        /* Flags override the configuration file: a first pass finds the file. */
        gm_options_t first = d->opts;
        if (parse_args(argc, argv, &first) < 0)
                return EXIT_FAILURE;
        gm_log_max_level = first.verbosity > 0 ? LOG_DEBUG : LOG_INFO;
        r = gm_config_load(first.config_path, &d->config, err, sizeof(err));
        if (r < 0) {
                log_error("Failed to load the configuration: %s", err[0] ? err : strerror(-r));
                return EXIT_FAILURE;
        }
        options_from_config(&d->opts, d->config);
        snapshot_limits_from_config(&d->snapjobs.limits, d->config);
        optind = 0;
        if (parse_args(argc, argv, &d->opts) < 0)
                return EXIT_FAILURE;
        own_startup_strings(&d->opts, &startup);
        gm_log_max_level = d->opts.verbosity > 0 ? LOG_DEBUG : LOG_INFO;
        r = default_socket_path(&d->opts);
        if (r < 0)
                return log_error_errno(r, "Failed to determine the socket path"), EXIT_FAILURE;
        choose_state_dir(&d->opts, d->config);
        r = gm_alloc_config_parse(d->opts.alloc_conf, &d->alloc_config, err, sizeof(err));
        if (r < 0) {
                log_error("Invalid --alloc-conf '%s': %s", d->opts.alloc_conf, err);
                return EXIT_FAILURE;
        }
        signal(SIGPIPE, SIG_IGN);
        raise_fd_limit();
        /* Before libcuda starts threads: this unsets LISTEN_* (not thread-safe). */
        gm_sd_fds_t sdfds;
        r = gm_sd_listen_fds(&sdfds);
        if (r < 0)
                return log_error_errno(r, "Failed to take the fds passed by systemd"), EXIT_FAILURE;
        if (sdfds.control_fd >= 0) {
                d->listen_fd = sdfds.control_fd;
                d->listen_fd_inherited = true;
                sdfds.control_fd = -1;
        }

        /* The socket's directory holds the ledger too: it exists, and nobody
         * but this daemon's user (or root) can write to it, before either
         * is opened. */
        if (!d->listen_fd_inherited && (r = gm_ipc_make_socket_dir(d->opts.socket_path)) < 0)
                return log_error_errno(r, "Failed to create the directory of '%s'", d->opts.socket_path), EXIT_FAILURE;
        gm_trust_t trust = {0};
        gm_trust_add(&trust, geteuid());
        r = gm_trust_check_dir(d->opts.socket_path, &trust, err, sizeof(err));
        if (r < 0)
                return log_error("Refusing to start: %s", r == -EPERM ? err : strerror(-r)), EXIT_FAILURE;

        gm_backend_options_t bopts = {
                .kind = d->opts.backend,
                .device = d->opts.device,
                .device_uuid = d->opts.device_uuid,
                .capacity = d->opts.capacity,
        };
        err[0] = '\0';
        r = gm_backend_open(&bopts, &d->backend, err, sizeof(err));
        if (r < 0) {
                log_error("Failed to open the %s backend: %s", d->opts.backend, err[0] ? err : strerror(-r));
                return EXIT_FAILURE;
        }
        if (err[0])
                log_notice("%s", err);
        gm_broker_params_t bparams = {
                .backend = d->backend,
                .alloc_config = &d->alloc_config,
                .limits = broker_limits(d),
                .ops = gm_server_broker_ops(d),
                .store_max = gm_sd_notify_available() ? GM_SD_FDSTORE_MAX : 0,
        };
        r = gm_broker_new(&bparams, &d->broker);
        if (r < 0) {
                log_error_errno(r, "Failed to set up the broker");
                d->backend = gm_backend_close(d->backend);
                return EXIT_FAILURE;
        }
        char ledger_path[sizeof(d->opts.socket_path) + sizeof(".ledger")];
        size_t socket_len = strnlen(d->opts.socket_path, sizeof(d->opts.socket_path) - 1);
        memcpy(ledger_path, d->opts.socket_path, socket_len);
        memcpy(ledger_path + socket_len, ".ledger", sizeof(".ledger"));
        r = gm_ledger_open(d->broker, ledger_path);
        if (r < 0)
                log_warning_errno(r, "No ledger journal at '%s': restarts will rely on clients alone", ledger_path);
        for (size_t i = 0; i < sdfds.n_segments; i++) {
                gm_orphan_adopt(d->broker, sdfds.segments[i].name, sdfds.segments[i].fd);
                sdfds.segments[i].fd = -1; /* consumed */
        }
        gm_orphan_adopt_done(d->broker, gm_now_ms());
        r = gm_tenant_quotas_load(d->broker, d->opts.state_dir);
        if (r < 0)
                log_warning_errno(r, "Failed to read persistent quotas from '%s', ignoring", d->opts.state_dir);
        apply_config_quotas(d);

        d->loop = uv_default_loop();
        /* Signals first: a client may connect (and a supervisor signal) as
         * soon as the socket listens. */
        uv_signal_init(d->loop, &d->sigterm);
        uv_signal_init(d->loop, &d->sigint);
        uv_signal_init(d->loop, &d->sighup);
        d->sigterm.data = d->sigint.data = d->sighup.data = d;
        uv_signal_start(&d->sigterm, on_signal, SIGTERM);
        uv_signal_start(&d->sigint, on_signal, SIGINT);
        uv_signal_start(&d->sighup, on_signal, SIGHUP);
        gm_server_sync_requests(d);
        r = gm_server_start(d);
        if (r < 0) {
                d->broker = gm_broker_free(d->broker);
                d->backend = gm_backend_close(d->backend);
                return EXIT_FAILURE;
        }
        err[0] = '\0';
        const char *const *op_names;
        /* The UUID label: the cuda backend's, else the configured one
         * (--device GPU-..., or device = GPU-... in the config). */
        gm_metrics_source_t msrc = {.loop = d->loop,
                                    .broker = d->broker,
                                    .hide_tenants = !d->opts.metrics_tenants,
                                    .device_uuid = d->opts.device_uuid,
                                    .refresh = gm_localstats_metrics_refresh,
                                    .tenant_extra = gm_localstats_metrics_tenant,
                                    .userdata = &d->requests,
                                    .snapshots = &d->snapjobs.counters};
        msrc.n_ops = gm_requests_op_names(&op_names);
        msrc.op_names = op_names;
        if (sdfds.metrics_fd >= 0) {
                r = gm_metrics_start_fd(&msrc, sdfds.metrics_fd, &d->metrics, err, sizeof(err));
                sdfds.metrics_fd = -1;
        } else
                r = gm_metrics_start(&msrc, d->opts.metrics_listen, &d->metrics, err, sizeof(err));
        gm_sd_fds_done(&sdfds);
        if (r < 0 && d->opts.metrics_listen) {
                log_error("Failed to start the metrics endpoint: %s", err);
                gm_server_stop(d);
                uv_walk(d->loop, walk_close, NULL);
                uv_run(d->loop, UV_RUN_DEFAULT);
                d->broker = gm_broker_free(d->broker);
                d->backend = gm_backend_close(d->backend);
                return EXIT_FAILURE;
        }
        if (r < 0) /* the default address is best effort: another daemon may hold it */
                log_warning("No metrics endpoint: %s; choose one with --metrics-listen", err);

        char cap[32];
        log_notice("gpumemd %s: device %d, %s backend, capacity %s, listening on %s", GPUMEMD_VERSION,
                   d->backend->device, d->backend->ops->name, gm_format_size(d->backend->capacity, cap, sizeof(cap)),
                   d->opts.socket_path);
        if (d->backend->detail[0])
                log_info("%s backend: %s", d->backend->ops->name, d->backend->detail);
        /* Under systemd: watchdog pings at half of WatchdogSec=, and STATUS=
         * lines at least every 10 s. */
        uint64_t watchdog_usec = 0;
        if (gm_sd_notify_available()) {
                uint64_t period_ms = 10000;
                if (gm_sd_watchdog_interval_usec(&watchdog_usec) > 0 && watchdog_usec / 2000 < period_ms)
                        period_ms = watchdog_usec / 2000 ? watchdog_usec / 2000 : 1;
                uv_timer_init(d->loop, &d->watchdog);
                d->watchdog.data = d;
                uv_timer_start(&d->watchdog, on_watchdog, 0, period_ms);
                d->watchdog_running = true;
        }
        gm_sd_notify_ready();
        uv_run(d->loop, UV_RUN_DEFAULT);

        uv_walk(d->loop, walk_close, NULL);
        uv_run(d->loop, UV_RUN_DEFAULT);
        /* Every integration test is a leak test: what is still held here is a bug. */
        int status = EXIT_SUCCESS;
        r = uv_loop_close(d->loop);
        if (r < 0) {
                log_error("BUG: event loop not empty at exit: %s", uv_strerror(r));
                status = EXIT_FAILURE;
        }
        char why[256];
        if (gm_broker_check(d->broker, why, sizeof(why)) != 0) {
                log_error("BUG: broker inconsistent at exit: %s", why);
                status = EXIT_FAILURE;
        }
        d->broker = gm_broker_free(d->broker);
        if (d->backend->in_use != 0) {
                log_error("BUG: %llu bytes still in use at exit", (unsigned long long) d->backend->in_use);
                status = EXIT_FAILURE;
        }
        d->backend = gm_backend_close(d->backend);
        d->config = gm_config_free(d->config);
        free_startup_strings(&startup);
        log_notice("stopped");
        return status;
}
