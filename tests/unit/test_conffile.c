/* daemon/config.c: the configuration file (every key, every error with its
 * FILE:LINE message), tenant resolution, cgroup parsing and peer identities. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "ipc.h"

static char tmpdir[64];
static char conf_path[128];
static char err[512];

static void setup(void) {
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/gm-conffile-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
        snprintf(conf_path, sizeof(conf_path), "%s/gpumemd.conf", tmpdir);
        err[0] = '\0';
}

static void teardown(void) {
        unlink(conf_path);
        rmdir(tmpdir);
}

static void write_conf_len(const char *text, size_t len) {
        FILE *f = fopen(conf_path, "we");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(text, 1, len, f), len);
        ck_assert_int_eq(fclose(f), 0);
}

/* Loads `text` from a file; returns the result, *ret the config or NULL. */
static int load_len(const char *text, size_t len, gm_config_t **ret) {
        write_conf_len(text, len);
        *ret = NULL;
        err[0] = '\0';
        return gm_config_load(conf_path, ret, err, sizeof(err));
}

static gm_config_t *load_ok(const char *text) {
        gm_config_t *c;
        int r = load_len(text, strlen(text), &c);
        ck_assert_msg(r == 0, "load failed: %d %s", r, err);
        ck_assert_ptr_nonnull(c);
        return c;
}

/* Asserts that `text` is refused with exactly "<file>:<expect>". */
static void check_error_len(const char *text, size_t len, const char *expect) {
        gm_config_t *c;
        int r = load_len(text, len, &c);
        char want[600];
        snprintf(want, sizeof(want), "%s:%s", conf_path, expect);
        ck_assert_msg(r == -EINVAL, "r=%d for \"%s\" (err '%s')", r, text, err);
        ck_assert_ptr_null(c);
        ck_assert_str_eq(err, want);
}

static void check_error(const char *text, const char *expect) {
        check_error_len(text, strlen(text), expect);
}

static gid_t gid_of(const char *name) {
        struct group *g = getgrnam(name);
        ck_assert_msg(g != NULL, "group %s missing on this system", name);
        return g->gr_gid;
}

static uid_t uid_of(const char *name) {
        struct passwd *p = getpwnam(name);
        ck_assert_msg(p != NULL, "user %s missing on this system", name);
        return p->pw_uid;
}

/* ---- loading ---------------------------------------------------------------- */

START_TEST(test_every_key) {
        gm_config_t *c = load_ok("; every key once\n"
                                 "[daemon]\n"
                                 "socket = /run/gm/g1.sock\n"
                                 "socket_mode = 0640\n"
                                 "socket_group = 0\n"
                                 "metrics_listen = [::1]:9999\n"
                                 "backend = host\n"
                                 "device = 3\n"
                                 "capacity = 1.5G\n"
                                 "alloc_conf = max_split_size_mb:64\n"
                                 "admin_group = root\n"
                                 "state_dir = /srv/gm\n"
                                 "max_sessions = 7\n"
                                 "max_blocks_per_session = 4294967296\n"
                                 "max_packet = 4K\n"
                                 "max_fds = 253\n"
                                 "release_timeout_ms = 150\n"
                                 "park_timeout_ms = 3600000\n"
                                 "max_parked_per_session = 0\n"
                                 "[tenant ml]\n"
                                 "unit = trainer.service\n"
                                 "user = root\n"
                                 "group = 4242\n"
                                 "quota = 40G\n");
        ck_assert_str_eq(c->path, conf_path);
        ck_assert(c->has_socket);
        ck_assert_str_eq(c->socket, "/run/gm/g1.sock");
        ck_assert(c->has_socket_mode);
        ck_assert_uint_eq(c->socket_mode, 0640);
        ck_assert(c->has_socket_group);
        ck_assert_uint_eq(c->socket_group, 0);
        ck_assert(c->has_metrics_listen);
        ck_assert_str_eq(c->metrics_listen, "[::1]:9999");
        ck_assert(c->has_backend);
        ck_assert_str_eq(c->backend, "host");
        ck_assert(c->has_device);
        ck_assert_int_eq(c->device, 3);
        ck_assert_ptr_null(c->device_uuid);
        ck_assert(c->has_capacity);
        ck_assert_uint_eq(c->capacity, 3ull << 29);
        ck_assert(c->has_alloc_conf);
        ck_assert_str_eq(c->alloc_conf, "max_split_size_mb:64");
        ck_assert(c->has_admin_group);
        ck_assert_uint_eq(c->admin_group, 0);
        ck_assert(c->has_state_dir);
        ck_assert_str_eq(c->state_dir, "/srv/gm");
        ck_assert(c->has_max_sessions);
        ck_assert_uint_eq(c->max_sessions, 7);
        ck_assert(c->has_max_blocks_per_session);
        ck_assert_uint_eq(c->max_blocks_per_session, 1ull << 32);
        ck_assert(c->has_max_packet);
        ck_assert_uint_eq(c->max_packet, 4096);
        ck_assert(c->has_max_fds);
        ck_assert_uint_eq(c->max_fds, 253);
        ck_assert(c->has_release_timeout_ms);
        ck_assert_uint_eq(c->release_timeout_ms, 150);
        ck_assert(c->has_park_timeout_ms);
        ck_assert_uint_eq(c->park_timeout_ms, 3600000);
        ck_assert(c->has_max_parked_per_session);
        ck_assert_uint_eq(c->max_parked_per_session, 0);

        ck_assert_uint_eq(c->n_tenants, 1);
        ck_assert_str_eq(c->tenants[0].name, "ml");
        ck_assert_uint_eq(c->tenants[0].line, 20);
        ck_assert(c->tenants[0].has_quota);
        ck_assert_uint_eq(c->tenants[0].quota, 40ull << 30);
        ck_assert_uint_eq(c->n_rules, 3);
        ck_assert_int_eq(c->rules[0].kind, GM_RULE_UNIT);
        ck_assert_str_eq(c->rules[0].unit, "trainer.service");
        ck_assert_uint_eq(c->rules[0].line, 21);
        ck_assert_int_eq(c->rules[1].kind, GM_RULE_USER);
        ck_assert_uint_eq(c->rules[1].id, 0);
        ck_assert_int_eq(c->rules[2].kind, GM_RULE_GROUP);
        ck_assert_uint_eq(c->rules[2].id, 4242);
        for (size_t i = 0; i < c->n_rules; i++)
                ck_assert_uint_eq(c->rules[i].tenant, 0);
        ck_assert_ptr_null(gm_config_free(c));
}
END_TEST

/* The example with its settings ("#key = value", "#[section]") uncommented;
 * explanatory comments ("# text") stay. */
static char *example_uncommented(void) {
        FILE *f = fopen(GM_EXAMPLE_CONF, "re");
        ck_assert_ptr_nonnull(f);
        static char text[65536];
        char line[1024];
        size_t n = 0, settings = 0;
        while (fgets(line, sizeof(line), f)) {
                bool setting = line[0] == '#' && (line[1] == '[' || (line[1] >= 'a' && line[1] <= 'z'));
                settings += setting;
                n += (size_t) snprintf(text + n, sizeof(text) - n, "%s", line + setting);
                ck_assert_uint_lt(n, sizeof(text) - 1);
        }
        fclose(f);
        ck_assert_uint_ge(settings, 30);
        return text;
}

START_TEST(test_example_file) {
        /* As shipped, the example sets nothing. */
        gm_config_t *c = NULL;
        int r = gm_config_load(GM_EXAMPLE_CONF, &c, err, sizeof(err));
        ck_assert_msg(r == 0, "%s", err);
        ck_assert(!c->has_socket && !c->has_capacity && !c->has_max_sessions && !c->has_admin_group);
        ck_assert_uint_eq(c->n_tenants, 0);
        gm_config_free(c);

        c = load_ok(example_uncommented());
        /* The example documents every [daemon] key. */
        ck_assert(c->has_socket && c->has_socket_mode && c->has_socket_group && c->has_metrics_listen &&
                  c->has_backend && c->has_device && c->has_capacity && c->has_alloc_conf && c->has_admin_group &&
                  c->has_state_dir && c->has_max_sessions && c->has_max_blocks_per_session && c->has_max_packet &&
                  c->has_max_fds && c->has_release_timeout_ms && c->has_park_timeout_ms &&
                  c->has_unresponsive_timeout_ms && c->unresponsive_timeout_ms == 10000 &&
                  c->has_max_parked_per_session && c->has_max_sessions_per_uid && c->has_hello_timeout_ms &&
                  c->has_metrics_tenants && c->has_release_check && c->has_audit_interval_ms &&
                  c->has_max_audited_processes && c->max_audited_processes == 1024);
        ck_assert(c->metrics_tenants);
        ck_assert_int_eq(c->release_check, GM_RELEASE_CHECK_VERIFY);
        ck_assert_uint_eq(c->audit_interval_ms, 2000);
        ck_assert_uint_eq(c->socket_mode, 0660);
        ck_assert_uint_eq(c->socket_group, gid_of("video"));
        ck_assert_uint_eq(c->admin_group, gid_of("adm"));
        ck_assert_uint_eq(c->max_packet, 64 * 1024);
        ck_assert_str_eq(c->alloc_conf, "expandable_segments:True,max_split_size_mb:128");

        ck_assert_uint_eq(c->n_tenants, 4);
        ck_assert_str_eq(c->tenants[1].name, "inference");
        ck_assert_uint_eq(c->tenants[1].quota, 16ull << 30); /* an inline comment after the value */
        ck_assert(c->tenants[2].has_quota);
        ck_assert_uint_eq(c->tenants[2].quota, 0); /* none */
        ck_assert(c->tenants[2].has_release_check && !c->tenants[1].has_release_check);
        ck_assert_int_eq(c->tenants[2].release_check, GM_RELEASE_CHECK_TRUST);
        const gm_config_tenant_t *t = gm_config_tenant_find(c, "uid:1001");
        ck_assert_ptr_nonnull(t);
        ck_assert_uint_eq(t->quota, 4ull << 30);
        ck_assert_ptr_null(gm_config_tenant_find(c, "uid:1002"));

        /* unit, unit, user (training); unit, user (inference); group (batch). */
        ck_assert_uint_eq(c->n_rules, 6);
        ck_assert_str_eq(c->rules[1].unit, "trainer-worker@.service");
        ck_assert_uint_eq(c->rules[4].id, uid_of("www-data"));
        ck_assert_uint_eq(c->rules[5].id, gid_of("users"));
        ck_assert_uint_eq(c->rules[5].tenant, 2);
        gm_config_free(c);
}
END_TEST

START_TEST(test_defaults_and_layout) {
        /* Empty file: nothing set, defaults only. */
        gm_config_t *c = load_ok("");
        ck_assert(!c->has_socket && !c->has_capacity && !c->has_max_sessions && !c->has_state_dir);
        ck_assert_str_eq(c->state_dir, GM_CONFIG_DEFAULT_STATE_DIR);
        ck_assert_uint_eq(c->n_tenants, 0);
        gm_config_free(c);

        /* No [daemon] section, an empty tenant, a UTF-8 BOM, CRLF line ends,
         * indented keys, comments of both kinds, a GPU UUID. */
        c = load_ok("\xEF\xBB\xBF# comment\r\n"
                    "[tenant empty]\r\n"
                    "[ tenant   spaced ]\r\n"
                    "    quota = 1M   ; trailing comment\r\n"
                    "\t; another comment\n"
                    "[daemon]\n"
                    "  device = GPU-8f6c-aa\n");
        ck_assert_uint_eq(c->n_tenants, 2);
        ck_assert_str_eq(c->tenants[0].name, "empty");
        ck_assert(!c->tenants[0].has_quota);
        ck_assert_str_eq(c->tenants[1].name, "spaced");
        ck_assert_uint_eq(c->tenants[1].quota, 1u << 20);
        ck_assert(c->has_device);
        ck_assert_int_eq(c->device, -1);
        ck_assert_str_eq(c->device_uuid, "GPU-8f6c-aa");
        ck_assert(!c->has_socket);
        gm_config_free(c);

        /* A 63-character tenant name survives (inih itself cuts section names at 49). */
        char text[256];
        const char *name63 = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:";
        ck_assert_uint_eq(strlen(name63), 63);
        snprintf(text, sizeof(text), "[tenant %s]\nquota = 1G\n", name63);
        c = load_ok(text);
        ck_assert_str_eq(c->tenants[0].name, name63);
        ck_assert(c->tenants[0].has_quota);
        gm_config_free(c);
}
END_TEST

START_TEST(test_tenant_limit) {
        size_t cap = 40 * 1100;
        char *text = malloc(cap);
        size_t n = 0;
        for (int i = 0; i < 1024; i++)
                n += (size_t) snprintf(text + n, cap - n, "[tenant t%d]\n", i);
        gm_config_t *c = load_ok(text);
        ck_assert_uint_eq(c->n_tenants, 1024);
        ck_assert_str_eq(c->tenants[1023].name, "t1023");
        gm_config_free(c);
        snprintf(text + n, cap - n, "[tenant one-too-many]\n");
        check_error(text, "1025: too many tenants (at most 1024)");
        free(text);

        cap = 20 * (GM_CONFIG_MAX_RULES + 2);
        text = malloc(cap);
        n = (size_t) snprintf(text, cap, "[tenant many]\n");
        for (unsigned i = 0; i < GM_CONFIG_MAX_RULES; i++)
                n += (size_t) snprintf(text + n, cap - n, "user = %u\n", 100000 + i);
        c = load_ok(text);
        ck_assert_uint_eq(c->n_rules, GM_CONFIG_MAX_RULES);
        ck_assert_uint_eq(c->rules[GM_CONFIG_MAX_RULES - 1].id, 100000 + GM_CONFIG_MAX_RULES - 1);
        gm_config_free(c);
        snprintf(text + n, cap - n, "group = 1\n");
        check_error(text, "16386: too many unit, user and group rules (at most 16384)");
        free(text);
}
END_TEST

START_TEST(test_errors_structure) {
        check_error("[tenant ml]\nuser = 0\nquotaa = 1G\n", "3: unknown key 'quotaa' in [tenant ml]");
        check_error("[daemon]\n\ncapacityy = 1G\n", "3: unknown key 'capacityy' in [daemon]");
        check_error("[deamon]\ncapacity = 1G\n", "1: unknown section [deamon]: [daemon] or [tenant NAME]");
        check_error("[daemon]\n[bogus]\n", "2: unknown section [bogus]: [daemon] or [tenant NAME]");
        check_error("[tenants ml]\n", "1: unknown section [tenants ml]: [daemon] or [tenant NAME]");
        check_error("capacity = 1G\n[daemon]\n",
                    "1: key 'capacity' outside of any section: start with [daemon] or [tenant NAME]");
        check_error("[daemon]\ncapacity = 1G\n[tenant a]\n[daemon]\nbackend = host\n",
                    "4: section [daemon] repeated (first on line 1)");
        check_error("[tenant a]\nuser = 0\n[tenant b]\n[tenant a]\n", "4: tenant 'a' already defined on line 1");
        check_error("[tenant]\n", "1: section [tenant] needs a name: [tenant NAME]");
        check_error("[tenant a/b]\n", "1: invalid tenant name 'a/b': 1 to 63 of A-Z a-z 0-9 _ . : -");
        check_error("[tenant abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:x]\n",
                    "1: invalid tenant name 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:x': 1 to "
                    "63 of A-Z a-z 0-9 _ . : -");
        check_error("[daemon]\nbackend = host\nsocket = /a\nbackend = cuda\n", "4: 'backend' already set on line 2");
        check_error("[tenant a]\nquota = 1G\nquota = none\n", "3: 'quota' already set on line 2");
        check_error("[daemon]\nnovalue\n", "2: syntax error: expected 'key = value' or '[section]'");
        check_error("[daemon\nbackend = host\n", "1: syntax error: expected 'key = value' or '[section]'");
        /* Errors come in line order: a bad section before a syntax error. */
        check_error("[nope]\n\nnovalue\n", "1: unknown section [nope]: [daemon] or [tenant NAME]");
}
END_TEST

START_TEST(test_errors_lines) {
        size_t cap = 6000;
        char *text = malloc(cap);
        int n = snprintf(text, cap, "[daemon]\nalloc_conf = ");
        memset(text + n, 'x', 4100);
        snprintf(text + n + 4100, cap - (size_t) n - 4100, "\n[bogus]\n");
        check_error(text, "2: line too long (at most 4096 bytes)");
        /* An earlier error wins over the long line. */
        memcpy(text, "[daemox]", 8);
        check_error(text, "1: unknown section [daemox]: [daemon] or [tenant NAME]");
        free(text);
        static const char with_nul[] = "[daemon]\nbackend = host\nsocket = /a\0b\n";
        check_error_len(with_nul, sizeof(with_nul) - 1, "3: NUL byte in line");
}
END_TEST

START_TEST(test_errors_values) {
        static const struct {
                const char *text, *expect;
        } cases[] = {
                {"[daemon]\nsocket = run/x.sock\n", "2: invalid socket 'run/x.sock': an absolute path"},
                {"[daemon]\nsocket = "
                 "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                 "aaaaaaaaaaaaaaaaaaaaaaa\n",
                 "2: invalid socket "
                 "'/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                 "aaaaaaaaaaaaaaaaaaaaaaaa': longer than 107 bytes"},
                {"[daemon]\nsocket_mode = 0999\n",
                 "2: invalid socket_mode '0999': an octal mode from 0 to 0777, such as 0660"},
                {"[daemon]\nsocket_mode = 01777\n",
                 "2: invalid socket_mode '01777': an octal mode from 0 to 0777, such as 0660"},
                {"[daemon]\nsocket_group = no-such-group-gm\n", "2: unknown group 'no-such-group-gm' in socket_group"},
                {"[daemon]\nadmin_group = 4294967295\n", "2: invalid admin_group '4294967295': a group name or gid"},
                {"[daemon]\nbackend = rocm\n", "2: invalid backend 'rocm': auto, cuda or host"},
                {"[daemon]\ndevice = -1\n", "2: invalid device '-1': an index or a GPU-... UUID"},
                {"[daemon]\ncapacity = 0\n",
                 "2: invalid capacity '0': a size such as 8G, 512M or 4096, at least 1 bytes"},
                {"[daemon]\ncapacity = 1X\n",
                 "2: invalid capacity '1X': a size such as 8G, 512M or 4096, at least 1 bytes"},
                {"[daemon]\nmax_packet = 1K\n", "2: invalid max_packet '1K': a size from 4.00 KiB to 1.00 MiB"},
                {"[daemon]\nmax_packet = 2M\n", "2: invalid max_packet '2M': a size from 4.00 KiB to 1.00 MiB"},
                {"[daemon]\nmax_fds = 254\n", "2: invalid max_fds '254': a whole number from 1 to 253"},
                {"[daemon]\nmax_fds = 0\n", "2: invalid max_fds '0': a whole number from 1 to 253"},
                {"[daemon]\nmax_sessions = -1\n", "2: invalid max_sessions '-1': a whole number from 1 to 1048576"},
                {"[daemon]\nrelease_timeout_ms = 2s\n",
                 "2: invalid release_timeout_ms '2s': a whole number from 1 to 3600000"},
                {"[daemon]\npark_timeout_ms =\n", "2: invalid park_timeout_ms '': a whole number from 1 to 3600000"},
                {"[daemon]\nunresponsive_timeout_ms = 86400001\n",
                 "2: invalid unresponsive_timeout_ms '86400001': a whole number from 0 to 86400000"},
                {"[daemon]\nmax_parked_per_session = 65537\n",
                 "2: invalid max_parked_per_session '65537': a whole number from 0 to 65536"},
                {"[daemon]\nmax_blocks_per_session = 99999999999999999999999\n",
                 "2: invalid max_blocks_per_session '99999999999999999999999': a whole number from 1 to 4294967296"},
                {"[daemon]\nstate_dir = var/lib\n", "2: invalid state_dir 'var/lib': an absolute path"},
                {"[daemon]\nalloc_conf = bogus_key:1\n", NULL}, /* reason from gm_alloc_config_parse */
                {"[tenant a]\nunit = trainer\n",
                 "2: invalid unit 'trainer': a systemd .service or .scope name such as trainer.service (or "
                 "foo@.service for every instance)"},
                {"[tenant a]\nunit = my app.service\n",
                 "2: invalid unit 'my app.service': a systemd .service or .scope name such as trainer.service (or "
                 "foo@.service for every instance)"},
                {"[tenant a]\nuser = no-such-user-gm\n", "2: unknown user 'no-such-user-gm'"},
                {"[tenant a]\ngroup = no-such-group-gm\n", "2: unknown group 'no-such-group-gm'"},
                {"[tenant a]\nuser =\n", "2: invalid user '': a name or a numeric id"},
                {"[tenant a]\nquota = 0\n", "2: invalid quota '0': a positive size such as 40G, or 'none'"},
                {"[tenant a]\nrelease_check = maybe\n", "2: invalid release_check 'maybe': 'verify' or 'trust'"},
                {"[tenant a]\nrelease_check = trust\nrelease_check = trust\n",
                 "3: 'release_check' already set in [tenant a]"},
                {"[daemon]\nrelease_check = yes\n", "2: invalid release_check 'yes': 'verify' or 'trust'"},
                {"[daemon]\naudit_interval_ms = 3600001\n",
                 "2: invalid audit_interval_ms '3600001': a whole number from 0 to 3600000"},
                {"[tenant a]\nquota = lots\n", "2: invalid quota 'lots': a positive size such as 40G, or 'none'"},
                /* the same rule twice, by name and by number */
                {"[tenant a]\nuser = 0\n[tenant b]\nuser = root\n",
                 "4: user 'root' already belongs to tenant 'a' (line 2)"},
                {"[tenant a]\nunit = x.service\nunit = x.service\n",
                 "3: unit 'x.service' already belongs to tenant 'a' (line 2)"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                if (cases[i].expect) {
                        check_error(cases[i].text, cases[i].expect);
                        continue;
                }
                gm_config_t *c;
                ck_assert_int_eq(load_len(cases[i].text, strlen(cases[i].text), &c), -EINVAL);
                char prefix[300];
                snprintf(prefix, sizeof(prefix), "%s:2: invalid alloc_conf 'bogus_key:1': ", conf_path);
                ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0 && strlen(err) > strlen(prefix), "%s", err);
        }
}
END_TEST

START_TEST(test_io_errors) {
        gm_config_t *c = NULL;
        char missing[200], want[300];
        snprintf(missing, sizeof(missing), "%s/absent.conf", tmpdir);
        ck_assert_int_eq(gm_config_load(missing, &c, err, sizeof(err)), -ENOENT);
        ck_assert_ptr_null(c);
        snprintf(want, sizeof(want), "%s: %s", missing, strerror(ENOENT));
        ck_assert_str_eq(err, want);

        ck_assert_int_eq(gm_config_load(tmpdir, &c, err, sizeof(err)), -EISDIR);
        ck_assert_ptr_null(c);

        size_t big = GM_CONFIG_MAX_FILE + 1;
        char *text = malloc(big);
        memset(text, '\n', big);
        write_conf_len(text, big);
        free(text);
        ck_assert_int_eq(gm_config_load(conf_path, &c, err, sizeof(err)), -EFBIG);
        snprintf(want, sizeof(want), "%s: larger than 1 MiB", conf_path);
        ck_assert_str_eq(err, want);

        /* NULL path: the default file, whose absence is no error. */
        if (access(GM_CONFIG_DEFAULT_PATH, F_OK) < 0 && errno == ENOENT) {
                ck_assert_int_eq(gm_config_load(NULL, &c, err, sizeof(err)), 0);
                ck_assert_ptr_null(c->path);
                ck_assert(!c->has_socket && c->n_tenants == 0);
                ck_assert_str_eq(c->state_dir, GM_CONFIG_DEFAULT_STATE_DIR);
                gm_config_free(c);
        }
        ck_assert_ptr_null(gm_config_free(NULL));
}
END_TEST

/* ---- tenants --------------------------------------------------------------------------- */

static gm_identity_t ident(uid_t uid, gid_t gid, const char *unit, bool user_unit) {
        gm_identity_t id = {.pid = 1234, .uid = uid, .gid = gid, .user_unit = user_unit};
        snprintf(id.unit, sizeof(id.unit), "%s", unit);
        return id;
}

START_TEST(test_tenant_for) {
        /* Rules listed group first, user next, unit last: the kind decides, not the order. */
        gm_config_t *c = load_ok("[tenant by-group]\n"
                                 "group = 500\n"
                                 "[tenant by-group2]\n"
                                 "group = 501\n"
                                 "[tenant by-user]\n"
                                 "user = 1000\n"
                                 "[tenant by-unit]\n"
                                 "unit = trainer.service\n"
                                 "unit = worker@.service\n"
                                 "unit = session-1.scope\n"
                                 "[tenant uid:77]\n"
                                 "quota = 1G\n");
        char buf[32];
        gm_identity_t id = ident(1000, 500, "trainer.service", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-unit");
        id = ident(1000, 500, "other.service", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-user");
        id = ident(1001, 500, "", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-group");
        /* A supplementary group; the first group rule in file order wins. */
        id = ident(1001, 100, "", false);
        id.groups[0] = 7, id.groups[1] = 501, id.groups[2] = 500, id.n_groups = 3;
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-group");
        id.groups[2] = 8;
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-group2");
        /* Nothing matches: uid:N, the name a [tenant uid:N] section configures. */
        id = ident(77, 100, "", false);
        const char *name = gm_config_tenant_for(c, &id, buf, sizeof(buf));
        ck_assert_ptr_eq(name, buf);
        ck_assert_str_eq(name, "uid:77");
        ck_assert_uint_eq(gm_config_tenant_find(c, name)->quota, 1u << 30);
        /* Templates match instances only. */
        id = ident(5, 5, "worker@3.service", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-unit");
        id = ident(5, 5, "worker@.service", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "uid:5");
        id = ident(5, 5, "worker.service", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "uid:5");
        id = ident(5, 5, "session-1.scope", false);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-unit");
        /* A user's own unit of the same name never matches a unit rule. */
        id = ident(5, 5, "trainer.service", true);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "uid:5");
        id = ident(1000, 5, "trainer.service", true);
        ck_assert_str_eq(gm_config_tenant_for(c, &id, buf, sizeof(buf)), "by-user");
        gm_config_free(c);

        /* No configuration at all. */
        id = ident(4294967294u, 0, "trainer.service", false);
        ck_assert_str_eq(gm_config_tenant_for(NULL, &id, buf, sizeof(buf)), "uid:4294967294");
}
END_TEST

/* ---- cgroups and identities ------------------------------------------------------------- */

static void check_cgroup(const char *text, const char *unit, bool user_unit) {
        char got[GM_UNIT_NAME_MAX + 1];
        bool user = !user_unit;
        memset(got, 'z', sizeof(got));
        gm_cgroup_parse_unit(text, got, &user);
        ck_assert_msg(strcmp(got, unit) == 0, "'%s' gave '%s', want '%s'", text, got, unit);
        ck_assert_msg(user == user_unit, "'%s': user_unit %d", text, user);
}

START_TEST(test_cgroup_parse) {
        check_cgroup("0::/system.slice/foo.service\n", "foo.service", false);
        check_cgroup("0::/system.slice/foo.service", "foo.service", false);
        check_cgroup("0::/user.slice/user-1000.slice/user@1000.service/app.slice/bar.service\n", "bar.service", true);
        check_cgroup("0::/user.slice/user-1000.slice/user@1000.service/init.scope\n", "init.scope", true);
        check_cgroup("0::/user.slice/user-1000.slice/user@1000.service\n", "user@1000.service", false);
        check_cgroup("0::/user.slice/user-1000.slice/user@1000.service/app.slice/x y\n", "user@1000.service", false);
        check_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n", "session-3.scope", false);
        check_cgroup("0::/system.slice/system-getty.slice/getty@tty1.service\n", "getty@tty1.service", false);
        check_cgroup("0::/system.slice/docker.service/payload/deeper\n", "docker.service", false);
        check_cgroup("0::/machine.slice/libpod-0a1b.scope/container\n", "libpod-0a1b.scope", false);
        check_cgroup("0::/system.slice/odd:name.service\n", "odd:name.service", false);
        check_cgroup("0::/init.scope\n", "init.scope", false);
        /* cgroup v1 and hybrid: the name=systemd hierarchy, v2 first when it names a unit. */
        check_cgroup("12:pids:/system.slice/a.service\n1:name=systemd:/system.slice/foo.service\n0::/\n", "foo.service",
                     false);
        check_cgroup("1:name=systemd:/\n0::/system.slice/v2.service\n", "v2.service", false);
        check_cgroup("5:cpu,cpuacct:/system.slice/a.service\n", "", false);
        /* Nothing systemd vouches for. */
        check_cgroup("0::/\n", "", false);
        check_cgroup("0::/docker/0a1b2c\n", "", false);
        check_cgroup("0::/system.slice/foo.service (deleted)\n", "", false);
        check_cgroup("0::/system.slice/\n", "", false);
        check_cgroup("0::system.slice/foo.service\n", "", false);
        check_cgroup("0:/system.slice/foo.service\n", "", false);
        check_cgroup("10::/system.slice/foo.service\n", "", false);
        check_cgroup("garbage\n", "", false);
        check_cgroup("", "", false);
        char longer[400];
        memset(longer, 'a', sizeof(longer));
        snprintf(longer, sizeof(longer), "0::/system.slice/%0300d.service\n", 1);
        check_cgroup(longer, "", false);
}
END_TEST

static void read_self_cgroup_unit(char unit[GM_UNIT_NAME_MAX + 1], bool *user_unit) {
        static char text[65536];
        FILE *f = fopen("/proc/self/cgroup", "re");
        ck_assert_ptr_nonnull(f);
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        fclose(f);
        text[n] = '\0';
        gm_cgroup_parse_unit(text, unit, user_unit);
}

START_TEST(test_identity_read) {
        char sock_path[200];
        int lfd, fd, r;
        snprintf(sock_path, sizeof(sock_path), "%s/id.sock", tmpdir);
        ck_assert_int_eq(gm_ipc_listen(sock_path, 0600, 4, &lfd), 0);
        int go[2];
        ck_assert_int_eq(pipe2(go, O_CLOEXEC), 0);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                int cfd;
                char b;
                close(go[1]);
                if (gm_ipc_connect(sock_path, &cfd) < 0)
                        _exit(2);
                /* Stay alive, connected, until the parent is done. */
                _exit(read(go[0], &b, 1) < 0 ? 3 : 0);
        }
        close(go[0]);
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        ck_assert_int_eq(poll(&p, 1, 30000), 1);
        ck_assert_int_eq(gm_ipc_accept(lfd, &fd), 0);

        gm_identity_t id;
        memset(&id, 0xa5, sizeof(id));
        r = gm_identity_read(fd, 0, &id);
        ck_assert_msg(r == 0, "%s", strerror(-r));
        ck_assert_int_eq(id.pid, child);
        ck_assert_uint_eq(id.uid, geteuid());
        ck_assert_uint_eq(id.gid, getegid());
        gid_t groups[GM_IDENTITY_MAX_GROUPS];
        int ng = getgroups(0, NULL);
        ck_assert_int_ge(ng, 0);
        if (ng <= (int) GM_IDENTITY_MAX_GROUPS) {
                ck_assert_int_eq(getgroups(ng, groups), ng);
                ck_assert_uint_eq(id.n_groups, (size_t) ng);
                for (int i = 0; i < ng; i++)
                        ck_assert_uint_eq(id.groups[i], groups[i]);
        } else {
                ck_assert_uint_eq(id.n_groups, GM_IDENTITY_MAX_GROUPS);
        }
        /* The child shares our cgroup. */
        char unit[GM_UNIT_NAME_MAX + 1];
        bool user_unit;
        read_self_cgroup_unit(unit, &user_unit);
        ck_assert_str_eq(id.unit, unit);
        ck_assert(id.user_unit == user_unit);

        /* A caller that already holds the pid: it must be the peer's. */
        gm_identity_t again;
        ck_assert_int_eq(gm_identity_read(fd, child, &again), 0);
        ck_assert_int_eq(again.pid, child);
        ck_assert_int_eq(gm_identity_read(fd, getpid(), &again), -ESRCH);
        ck_assert_int_eq(gm_identity_read(go[1], 0, &again), -ENOTSOCK);

        close(go[1]);
        int status;
        ck_assert_int_eq(waitpid(child, &status, 0), child);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(fd);
        close(lfd);
        unlink(sock_path);
}
END_TEST

static Suite *conffile_suite(void) {
        Suite *s = suite_create("conffile");
        TCase *tc = tcase_create("load");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_every_key);
        tcase_add_test(tc, test_example_file);
        tcase_add_test(tc, test_defaults_and_layout);
        tcase_add_test(tc, test_tenant_limit);
        tcase_add_test(tc, test_errors_structure);
        tcase_add_test(tc, test_errors_lines);
        tcase_add_test(tc, test_errors_values);
        tcase_add_test(tc, test_io_errors);
        suite_add_tcase(s, tc);

        tc = tcase_create("identity");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_tenant_for);
        tcase_add_test(tc, test_cgroup_parse);
        tcase_add_test(tc, test_identity_read);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(conffile_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
