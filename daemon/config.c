/* The configuration file (see config.h).
 *
 * libinih splits the file into sections and key = value pairs. Its section
 * buffer truncates names at 49 characters and it never reports empty
 * sections, so section headers are found by a pre-scan of our own that
 * mirrors inih's rules (comments, inline ';' comments, a UTF-8 BOM); the
 * handler then takes the section of a key from that table by line number.
 * The pre-scan also stops the parse before the first line that is too long or
 * holds a NUL byte, which inih would otherwise split or cut silently. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#define INI_HANDLER_LINENO 1 /* the handler gets line numbers (Debian builds libinih so) */
#include <ini.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "allocator.h" /* gm_alloc_config_parse */
#include "backend.h"   /* gm_backend_kind_known */
#include "ipc.h"
#include "size.h"

/* ---- values ---------------------------------------------------------------- */

static bool parse_decimal(const char *s, uint64_t *ret) {
        if (!isdigit((unsigned char) *s))
                return false;
        uint64_t v = 0;
        for (; *s; s++) {
                if (!isdigit((unsigned char) *s) || v > (UINT64_MAX - 9) / 10)
                        return false;
                v = v * 10 + (uint64_t) (*s - '0');
        }
        *ret = v;
        return true;
}

bool gm_tenant_name_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > GM_TENANT_NAME_MAX)
                return false;
        return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-") == n;
}

/* Resolves a user or group name, or a decimal id, to an id. Returns 0,
 * -ENOENT for an unknown name, -EINVAL for a bad id, or another -errno. */
static int resolve_id(const char *s, bool group, uint32_t *ret_id) {
        uint64_t v;
        if (parse_decimal(s, &v)) {
                if (v >= UINT32_MAX) /* (uid_t) -1 means "no id" */
                        return -EINVAL;
                *ret_id = (uint32_t) v;
                return 0;
        }
        if (!*s)
                return -EINVAL;
        size_t len = 1024;
        for (;;) {
                char *buf = malloc(len);
                if (!buf)
                        return -ENOMEM;
                int r;
                uint32_t id = 0;
                bool found;
                if (group) {
                        struct group gr, *res = NULL;
                        r = getgrnam_r(s, &gr, buf, len, &res);
                        found = res != NULL;
                        if (found)
                                id = gr.gr_gid;
                } else {
                        struct passwd pw, *res = NULL;
                        r = getpwnam_r(s, &pw, buf, len, &res);
                        found = res != NULL;
                        if (found)
                                id = pw.pw_uid;
                }
                free(buf);
                if (r == ERANGE && len < (1u << 24)) {
                        len *= 4;
                        continue;
                }
                if (found) {
                        *ret_id = id;
                        return 0;
                }
                /* Not found is 0 or one of the errnos NSS uses for it. */
                return r == 0 || r == ENOENT || r == ESRCH || r == EBADF || r == EPERM ? -ENOENT : -r;
        }
}

/* ---- parse state --------------------------------------------------------------- */

typedef enum {
        SECTION_NONE,
        SECTION_DAEMON,
        SECTION_TENANT,
} section_kind_t;

typedef struct header {
        unsigned line;
        const char *text; /* inside the brackets, trimmed; not NUL-terminated */
        size_t len;
} header_t;

typedef enum {
        K_PATH,   /* absolute path */
        K_SOCKET, /* absolute path that fits sun_path */
        K_STRING,
        K_BACKEND,
        K_DEVICE,
        K_MODE,
        K_GROUP,
        K_SIZE, /* gm_parse_size, min..max */
        K_UINT, /* decimal, min..max */
        K_ALLOC_CONF,
        K_BOOL,          /* true/false, yes/no, 1/0 */
        K_RELEASE_CHECK, /* verify or trust */
} key_type_t;

typedef struct daemon_key {
        const char *name;
        key_type_t type;
        size_t value;   /* offsetof in gm_config_t */
        size_t has;     /* offsetof of its has_* flag */
        unsigned width; /* bytes of a K_SIZE/K_UINT value */
        uint64_t min, max;
} daemon_key_t;

#define KEY(n, t, mn, mx) \
        { #n, t, offsetof(gm_config_t, n), offsetof(gm_config_t, has_##n), sizeof(((gm_config_t *) 0)->n), mn, mx }

static const daemon_key_t daemon_keys[] = {
        KEY(socket, K_SOCKET, 0, 0),
        KEY(socket_mode, K_MODE, 0, 0777),
        KEY(socket_group, K_GROUP, 0, 0),
        KEY(metrics_listen, K_STRING, 0, 0),
        KEY(backend, K_BACKEND, 0, 0),
        KEY(device, K_DEVICE, 0, 0),
        KEY(capacity, K_SIZE, 1, UINT64_MAX),
        KEY(alloc_conf, K_ALLOC_CONF, 0, 0),
        KEY(admin_group, K_GROUP, 0, 0),
        KEY(state_dir, K_PATH, 0, 0),
        KEY(max_sessions, K_UINT, 1, 1u << 20),
        KEY(max_blocks_per_session, K_UINT, 1, 1ull << 32),
        KEY(max_packet, K_SIZE, 4096, 1u << 20),
        KEY(max_fds, K_UINT, 1, GM_IPC_MAX_FDS_LIMIT),
        KEY(release_timeout_ms, K_UINT, 1, 3600000),
        KEY(park_timeout_ms, K_UINT, 1, 3600000),
        KEY(unresponsive_timeout_ms, K_UINT, 0, 86400000),
        KEY(max_parked_per_session, K_UINT, 0, 65536),
        KEY(max_shared_objects, K_UINT, 1, 65536),
        KEY(reattach_grace_ms, K_UINT, 0, 86400000),
        KEY(max_sessions_per_uid, K_UINT, 1, 1u << 20),
        KEY(hello_timeout_ms, K_UINT, 1, 3600000),
        KEY(metrics_tenants, K_BOOL, 0, 1),
        KEY(snapshot_max_bytes, K_SIZE, 0, UINT64_MAX),
        KEY(snapshot_max_entries, K_UINT, 0, 1ull << 32),
        KEY(snapshot_answer_timeout_ms, K_UINT, 1, 600000),
        KEY(audit_interval_ms, K_UINT, 0, 3600000),
        KEY(max_audited_processes, K_UINT, 0, 65536),
        KEY(release_check, K_RELEASE_CHECK, 0, 0),
};
#define N_DAEMON_KEYS (sizeof(daemon_keys) / sizeof(daemon_keys[0]))

typedef struct parse_state {
        gm_config_t *c;
        const char *path;
        char *err;
        size_t err_len;
        int r; /* 0, or the first failure */
        header_t *headers;
        size_t n_headers, next_header;
        section_kind_t section;
        size_t tenant; /* with SECTION_TENANT */
        unsigned daemon_line;
        unsigned key_line[N_DAEMON_KEYS];
        unsigned *quota_line; /* per tenant */
        size_t tenants_cap, rules_cap, headers_cap;
} parse_state_t;

/* Makes room for one more element after n in array (capacity *cap) by
 * doubling; returns the array, maybe moved, or NULL with array untouched. */
static void *grow(void *array, size_t *cap, size_t n, size_t size) {
        if (n < *cap)
                return array;
        size_t new_cap = *cap ? *cap * 2 : 16;
        void *p = reallocarray(array, new_cap, size);
        if (p)
                *cap = new_cap;
        return p;
}

/* Records the first failure as "FILE:LINE: reason"; returns 0, inih's "stop". */
static int fail(parse_state_t *st, int r, unsigned line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(parse_state_t *st, int r, unsigned line, const char *fmt, ...) {
        if (st->r < 0)
                return 0;
        st->r = r;
        if (st->err && st->err_len > 0) {
                int n = snprintf(st->err, st->err_len, "%s:%u: ", st->path, line);
                if (n >= 0 && (size_t) n < st->err_len) {
                        va_list ap;
                        va_start(ap, fmt);
                        vsnprintf(st->err + n, st->err_len - (size_t) n, fmt, ap);
                        va_end(ap);
                }
        }
        return 0;
}

/* ---- sections -------------------------------------------------------------------- */

static int open_section(parse_state_t *st, const header_t *h) {
        gm_config_t *c = st->c;
        if (h->len == 6 && memcmp(h->text, "daemon", 6) == 0) {
                if (st->daemon_line)
                        return fail(st, -EINVAL, h->line, "section [daemon] repeated (first on line %u)",
                                    st->daemon_line);
                st->daemon_line = h->line;
                st->section = SECTION_DAEMON;
                return 1;
        }
        if (h->len < 6 || memcmp(h->text, "tenant", 6) != 0 || (h->len > 6 && !isspace((unsigned char) h->text[6])))
                return fail(st, -EINVAL, h->line, "unknown section [%.*s]: [daemon] or [tenant NAME]", (int) h->len,
                            h->text);
        const char *name = h->text + 6;
        size_t n = h->len - 6;
        while (n > 0 && isspace((unsigned char) *name))
                name++, n--;
        if (n == 0)
                return fail(st, -EINVAL, h->line, "section [tenant] needs a name: [tenant NAME]");
        char buf[GM_TENANT_NAME_MAX + 1];
        snprintf(buf, sizeof(buf), "%.*s", (int) n, name);
        if (n > GM_TENANT_NAME_MAX || !gm_tenant_name_valid(buf))
                return fail(st, -EINVAL, h->line, "invalid tenant name '%.*s': 1 to %u of A-Z a-z 0-9 _ . : -", (int) n,
                            name, GM_TENANT_NAME_MAX);
        const gm_config_tenant_t *old = gm_config_tenant_find(c, buf);
        if (old)
                return fail(st, -EINVAL, h->line, "tenant '%s' already defined on line %u", buf, old->line);
        if (c->n_tenants >= GM_CONFIG_MAX_TENANTS)
                return fail(st, -EINVAL, h->line, "too many tenants (at most %u)", GM_CONFIG_MAX_TENANTS);
        gm_config_tenant_t *t = grow(c->tenants, &st->tenants_cap, c->n_tenants, sizeof(*t));
        if (!t)
                return fail(st, -ENOMEM, h->line, "out of memory");
        c->tenants = t;
        t += c->n_tenants;
        *t = (gm_config_tenant_t){.line = h->line};
        memcpy(t->name, buf, sizeof(buf));
        st->tenant = c->n_tenants++;
        st->section = SECTION_TENANT;
        return 1;
}

/* Opens every section whose header comes before `line`. */
static int advance_to(parse_state_t *st, unsigned line) {
        while (st->next_header < st->n_headers && st->headers[st->next_header].line < line)
                if (!open_section(st, &st->headers[st->next_header++]))
                        return 0;
        return 1;
}

/* ---- [daemon] --------------------------------------------------------------------- */

static void *field(gm_config_t *c, size_t offset) {
        return (char *) c + offset;
}

static int set_string(parse_state_t *st, const daemon_key_t *k, const char *value, unsigned line) {
        char *s = strdup(value);
        if (!s)
                return fail(st, -ENOMEM, line, "out of memory");
        char **p = field(st->c, k->value);
        free(*p);
        *p = s;
        return 1;
}

static int set_daemon_key(parse_state_t *st, const daemon_key_t *k, const char *value, unsigned line) {
        gm_config_t *c = st->c;
        uint64_t v = 0;
        uint32_t id;
        int r;
        char lo[32], hi[32], err[256];

        switch (k->type) {
        case K_SOCKET:
                if (strlen(value) >= sizeof(((struct sockaddr_un *) 0)->sun_path))
                        return fail(st, -EINVAL, line, "invalid %s '%s': longer than %zu bytes", k->name, value,
                                    sizeof(((struct sockaddr_un *) 0)->sun_path) - 1);
                /* fall through */
        case K_PATH:
                if (value[0] != '/')
                        return fail(st, -EINVAL, line, "invalid %s '%s': an absolute path", k->name, value);
                return set_string(st, k, value, line);
        case K_STRING:
                return set_string(st, k, value, line);
        case K_BACKEND:
                if (!gm_backend_kind_known(value))
                        return fail(st, -EINVAL, line, "invalid backend '%s': " GM_BACKEND_KINDS, value);
                return set_string(st, k, value, line);
        case K_DEVICE:
                if (strncmp(value, "GPU-", 4) == 0 && value[4]) {
                        c->device = -1;
                        c->device_uuid = strdup(value);
                        return c->device_uuid ? 1 : fail(st, -ENOMEM, line, "out of memory");
                }
                if (!parse_decimal(value, &v) || v > INT32_MAX)
                        return fail(st, -EINVAL, line, "invalid device '%s': an index or a GPU-... UUID", value);
                c->device = (int) v;
                return 1;
        case K_MODE: {
                char *end;
                errno = 0;
                unsigned long m = strtoul(value, &end, 8);
                if (!isdigit((unsigned char) value[0]) || *end || errno || m > k->max)
                        return fail(st, -EINVAL, line, "invalid %s '%s': an octal mode from 0 to 0777, such as 0660",
                                    k->name, value);
                *(mode_t *) field(c, k->value) = (mode_t) m;
                return 1;
        }
        case K_GROUP:
                r = resolve_id(value, true, &id);
                if (r == -ENOENT)
                        return fail(st, -EINVAL, line, "unknown group '%s' in %s", value, k->name);
                if (r < 0)
                        return fail(st, r == -ENOMEM ? r : -EINVAL, line, "invalid %s '%s': %s", k->name, value,
                                    r == -EINVAL ? "a group name or gid" : strerror(-r));
                *(gid_t *) field(c, k->value) = id;
                return 1;
        case K_SIZE:
                if (gm_parse_size(value, &v) < 0 || v < k->min || v > k->max) {
                        if (k->max == UINT64_MAX)
                                return fail(st, -EINVAL, line,
                                            "invalid %s '%s': a size such as 8G, 512M or 4096, at least %s", k->name,
                                            value, gm_format_size(k->min, lo, sizeof(lo)));
                        return fail(st, -EINVAL, line, "invalid %s '%s': a size from %s to %s", k->name, value,
                                    gm_format_size(k->min, lo, sizeof(lo)), gm_format_size(k->max, hi, sizeof(hi)));
                }
                break;
        case K_UINT:
                if (!parse_decimal(value, &v) || v < k->min || v > k->max)
                        return fail(st, -EINVAL, line, "invalid %s '%s': a whole number from %llu to %llu", k->name,
                                    value, (unsigned long long) k->min, (unsigned long long) k->max);
                break;
        case K_BOOL:
                if (strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 || strcmp(value, "1") == 0)
                        *(bool *) field(c, k->value) = true;
                else if (strcmp(value, "false") == 0 || strcmp(value, "no") == 0 || strcmp(value, "0") == 0)
                        *(bool *) field(c, k->value) = false;
                else
                        return fail(st, -EINVAL, line, "invalid %s '%s': true or false", k->name, value);
                return 1;
        case K_RELEASE_CHECK:
                if (gm_release_check_parse(value, (gm_release_check_t *) field(c, k->value)) < 0)
                        return fail(st, -EINVAL, line, "invalid %s '%s': 'verify' or 'trust'", k->name, value);
                return 1;
        case K_ALLOC_CONF: {
                gm_alloc_config_t ac;
                err[0] = '\0';
                if (gm_alloc_config_parse(value, &ac, err, sizeof(err)) < 0)
                        return fail(st, -EINVAL, line, "invalid alloc_conf '%s': %s", value, err);
                return set_string(st, k, value, line);
        }
        }
        if (k->width == sizeof(uint32_t))
                *(uint32_t *) field(c, k->value) = (uint32_t) v;
        else
                *(uint64_t *) field(c, k->value) = v;
        return 1;
}

static int daemon_key(parse_state_t *st, const char *name, const char *value, unsigned line) {
        for (size_t i = 0; i < N_DAEMON_KEYS; i++) {
                const daemon_key_t *k = &daemon_keys[i];
                if (strcmp(k->name, name) != 0)
                        continue;
                if (st->key_line[i])
                        return fail(st, -EINVAL, line, "'%s' already set on line %u", name, st->key_line[i]);
                if (!set_daemon_key(st, k, value, line))
                        return 0;
                st->key_line[i] = line;
                *(bool *) field(st->c, k->has) = true;
                return 1;
        }
        return fail(st, -EINVAL, line, "unknown key '%s' in [daemon]", name);
}

int gm_config_key_range(const char *key, uint64_t *ret_min, uint64_t *ret_max) {
        for (size_t i = 0; i < N_DAEMON_KEYS; i++)
                if (daemon_keys[i].type == K_UINT && strcmp(daemon_keys[i].name, key) == 0) {
                        *ret_min = daemon_keys[i].min;
                        *ret_max = daemon_keys[i].max;
                        return 0;
                }
        return -ENOENT;
}

/* ---- [tenant NAME] ------------------------------------------------------------------ */

static const char *const rule_key[_GM_RULE_KIND_MAX] = {
        [GM_RULE_UNIT] = "unit",
        [GM_RULE_USER] = "user",
        [GM_RULE_GROUP] = "group",
};

static bool same_rule(const gm_config_rule_t *a, const gm_config_rule_t *b) {
        if (a->kind != b->kind)
                return false;
        return a->kind == GM_RULE_UNIT ? strcmp(a->unit, b->unit) == 0 : a->id == b->id;
}

static int add_rule(parse_state_t *st, gm_rule_kind_t kind, const char *value, unsigned line) {
        gm_config_t *c = st->c;
        gm_config_rule_t rule = {.kind = kind, .tenant = st->tenant, .line = line};
        if (kind == GM_RULE_UNIT) {
                if (!gm_unit_name_valid_leaf(value, strlen(value)))
                        return fail(st, -EINVAL, line,
                                    "invalid unit '%s': a systemd .service or .scope name such as trainer.service "
                                    "(or foo@.service for every instance)",
                                    value);
                strcpy(rule.unit, value);
        } else {
                int r = resolve_id(value, kind == GM_RULE_GROUP, &rule.id);
                if (r == -ENOENT)
                        return fail(st, -EINVAL, line, "unknown %s '%s'", rule_key[kind], value);
                if (r < 0)
                        return fail(st, r == -ENOMEM ? r : -EINVAL, line, "invalid %s '%s': %s", rule_key[kind], value,
                                    r == -EINVAL ? "a name or a numeric id" : strerror(-r));
        }
        if (c->n_rules >= GM_CONFIG_MAX_RULES)
                return fail(st, -EINVAL, line, "too many unit, user and group rules (at most %u)", GM_CONFIG_MAX_RULES);
        for (size_t i = 0; i < c->n_rules; i++)
                if (same_rule(&c->rules[i], &rule))
                        return fail(st, -EINVAL, line, "%s '%s' already belongs to tenant '%s' (line %u)",
                                    rule_key[kind], value, c->tenants[c->rules[i].tenant].name, c->rules[i].line);
        gm_config_rule_t *rules = grow(c->rules, &st->rules_cap, c->n_rules, sizeof(*rules));
        if (!rules)
                return fail(st, -ENOMEM, line, "out of memory");
        c->rules = rules;
        rules[c->n_rules++] = rule;
        return 1;
}

static int tenant_key(parse_state_t *st, const char *name, const char *value, unsigned line) {
        gm_config_tenant_t *t = &st->c->tenants[st->tenant];
        for (gm_rule_kind_t k = 0; k < _GM_RULE_KIND_MAX; k++)
                if (strcmp(name, rule_key[k]) == 0)
                        return add_rule(st, k, value, line);
        if (strcmp(name, "heap") == 0) {
                if (t->has_heap)
                        return fail(st, -EINVAL, line, "'heap' already set in [tenant %s]", t->name);
                if (strcmp(value, "central") != 0 && strcmp(value, "any") != 0)
                        return fail(st, -EINVAL, line, "invalid heap '%s': 'central' or 'any'", value);
                t->has_heap = true;
                t->heap_central = strcmp(value, "central") == 0;
                return 1;
        }
        if (strcmp(name, "release_check") == 0) {
                if (t->has_release_check)
                        return fail(st, -EINVAL, line, "'release_check' already set in [tenant %s]", t->name);
                if (gm_release_check_parse(value, &t->release_check) < 0)
                        return fail(st, -EINVAL, line, "invalid release_check '%s': 'verify' or 'trust'", value);
                t->has_release_check = true;
                return 1;
        }
        if (strcmp(name, "tag_quota") == 0) {
                if (t->has_tag_quota)
                        return fail(st, -EINVAL, line, "'tag_quota' already set in [tenant %s]", t->name);
                int r = gm_tag_quotas_parse(value, t->tag_quotas, &t->n_tag_quotas);
                if (r < 0)
                        return fail(st, -EINVAL, line,
                                    "invalid tag_quota '%s': TAG:SIZE[,TAG:SIZE...] with at most %d distinct tags "
                                    "([A-Za-z0-9_.-]{1,31}) and positive sizes such as 40G",
                                    value, GM_TENANT_MAX_TAG_QUOTAS);
                t->has_tag_quota = true;
                return 1;
        }
        if (strcmp(name, "quota") != 0)
                return fail(st, -EINVAL, line, "unknown key '%s' in [tenant %s]", name, t->name);
        if (st->quota_line[st->tenant])
                return fail(st, -EINVAL, line, "'quota' already set on line %u", st->quota_line[st->tenant]);
        uint64_t v = 0;
        if (strcmp(value, "none") != 0 && (gm_parse_size(value, &v) < 0 || v == 0))
                return fail(st, -EINVAL, line, "invalid quota '%s': a positive size such as 40G, or 'none'", value);
        t->quota = v;
        t->has_quota = true;
        st->quota_line[st->tenant] = line;
        return 1;
}

static int on_key(void *user, const char *section, const char *name, const char *value, int lineno) {
        parse_state_t *st = user;
        unsigned line = (unsigned) lineno;
        if (st->r < 0 || !advance_to(st, line))
                return 0;
        switch (st->section) {
        case SECTION_DAEMON:
                return daemon_key(st, name, value, line);
        case SECTION_TENANT:
                return tenant_key(st, name, value, line);
        case SECTION_NONE:
                break;
        }
        return fail(st, -EINVAL, line, "key '%s' outside of any section: start with [daemon] or [tenant NAME]", name);
}

/* ---- the file --------------------------------------------------------------------- */

/* Finds section headers as inih does and cuts `text` (len bytes, NUL at
 * text[len]) before the first line that is too long or holds a NUL byte;
 * *ret_bad_line is that line (0 if none), *ret_too_long why. */
static int prescan(parse_state_t *st, char *text, size_t len, unsigned *ret_bad_line, bool *ret_too_long) {
        unsigned line = 0;
        *ret_bad_line = 0;
        for (size_t pos = 0; pos < len;) {
                char *s = text + pos;
                char *nl = memchr(s, '\n', len - pos);
                size_t n = nl ? (size_t) (nl - s) : len - pos;
                line++;
                if (n > GM_CONFIG_MAX_LINE || memchr(s, '\0', n)) {
                        *ret_bad_line = line;
                        *ret_too_long = n > GM_CONFIG_MAX_LINE;
                        *s = '\0';
                        return 0;
                }
                pos += n + 1;
                if (line == 1 && n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
                        s += 3, n -= 3;
                while (n > 0 && isspace((unsigned char) *s))
                        s++, n--;
                if (n == 0 || *s != '[')
                        continue;
                /* inih: the name ends at ']', and an inline comment before it is an error. */
                size_t e = 1;
                while (e < n && s[e] != ']' && !(s[e] == ';' && isspace((unsigned char) s[e - 1])))
                        e++;
                if (e == n || s[e] != ']')
                        continue; /* inih reports the syntax error */
                const char *h = s + 1;
                size_t hl = e - 1;
                while (hl > 0 && isspace((unsigned char) *h))
                        h++, hl--;
                while (hl > 0 && isspace((unsigned char) h[hl - 1]))
                        hl--;
                header_t *hs = grow(st->headers, &st->headers_cap, st->n_headers, sizeof(*hs));
                if (!hs)
                        return -ENOMEM;
                st->headers = hs;
                hs[st->n_headers++] = (header_t){.line = line, .text = h, .len = hl};
        }
        return 0;
}

static int read_file(const char *path, char **ret_text, size_t *ret_len) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        struct stat sb;
        int r = fstat(fd, &sb) < 0 ? -errno : S_ISDIR(sb.st_mode) ? -EISDIR : 0;
        if (r < 0) {
                close(fd);
                return r;
        }
        size_t cap = GM_CONFIG_MAX_FILE + 1, len = 0;
        char *text = malloc(cap + 1);
        if (!text) {
                close(fd);
                return -ENOMEM;
        }
        for (;;) {
                ssize_t k = read(fd, text + len, cap - len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        r = -errno;
                        free(text);
                        close(fd);
                        return r;
                }
                if (k == 0 || (len += (size_t) k) == cap)
                        break;
        }
        close(fd);
        if (len > GM_CONFIG_MAX_FILE) {
                free(text);
                return -EFBIG;
        }
        text[len] = '\0';
        *ret_text = text;
        *ret_len = len;
        return 0;
}

gm_config_t *gm_config_free(gm_config_t *c) {
        if (!c)
                return NULL;
        free(c->path);
        free(c->socket);
        free(c->metrics_listen);
        free(c->backend);
        free(c->device_uuid);
        free(c->alloc_conf);
        free(c->state_dir);
        free(c->tenants);
        free(c->rules);
        free(c);
        return NULL;
}

static void set_error(char *reterr, size_t reterr_len, const char *path, const char *why) {
        if (reterr && reterr_len > 0)
                snprintf(reterr, reterr_len, "%s: %s", path, why);
}

int gm_config_load(const char *path, gm_config_t **ret, char *reterr, size_t reterr_len) {
        bool allow_missing = !path;
        if (!path)
                path = GM_CONFIG_DEFAULT_PATH;
        gm_config_t *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->state_dir = strdup(GM_CONFIG_DEFAULT_STATE_DIR);
        if (!c->state_dir)
                return gm_config_free(c), -ENOMEM;

        char *text = NULL;
        size_t len = 0;
        int r = read_file(path, &text, &len);
        if (r == -ENOENT && allow_missing) {
                *ret = c;
                return 0;
        }
        if (r < 0) {
                set_error(reterr, reterr_len, path, r == -EFBIG ? "larger than 1 MiB" : strerror(-r));
                gm_config_free(c);
                return r;
        }
        c->path = strdup(path);
        parse_state_t st = {
                .c = c,
                .path = path,
                .err = reterr,
                .err_len = reterr_len,
                .quota_line = calloc(GM_CONFIG_MAX_TENANTS, sizeof(unsigned)),
        };
        unsigned bad_line;
        bool too_long = false;
        if (!c->path || !st.quota_line || prescan(&st, text, len, &bad_line, &too_long) < 0) {
                r = -ENOMEM;
                set_error(reterr, reterr_len, path, strerror(ENOMEM));
                goto finish;
        }

        /* Debian's libinih takes its settings at run time. Indented lines are
         * ordinary lines (no continuation values), and the first error stops. */
        ini_allow_multiline = false;
        ini_stop_on_first_error = true;
        ini_max_line = (int) GM_CONFIG_MAX_LINE + 3;
        int line = ini_parse_string(text, on_key, &st);
        if (line < 0) {
                r = -ENOMEM; /* inih's only failure on a string */
                set_error(reterr, reterr_len, path, strerror(ENOMEM));
                goto finish;
        }
        if (line > 0 && st.r == 0 && advance_to(&st, (unsigned) line))
                fail(&st, -EINVAL, (unsigned) line, "syntax error: expected 'key = value' or '[section]'");
        else if (line == 0 && advance_to(&st, bad_line ? bad_line : UINT32_MAX) && bad_line)
                fail(&st, -EINVAL, bad_line, too_long ? "line too long (at most %u bytes)" : "NUL byte in line",
                     GM_CONFIG_MAX_LINE);
        r = st.r;

finish:
        free(st.quota_line);
        free(st.headers);
        free(text);
        if (r < 0) {
                gm_config_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

/* ---- tenants ------------------------------------------------------------------------- */

const gm_config_tenant_t *gm_config_tenant_find(const gm_config_t *c, const char *name) {
        for (size_t i = 0; c && i < c->n_tenants; i++)
                if (strcmp(c->tenants[i].name, name) == 0)
                        return &c->tenants[i];
        return NULL;
}

/* "foo@.service" matches every "foo@X.service"; other rules match exactly. */
static bool unit_matches(const char *rule, const char *unit) {
        const char *at = strstr(rule, "@.");
        if (!at)
                return strcmp(rule, unit) == 0;
        size_t p = (size_t) (at - rule) + 1, n = strlen(unit);
        const char *suffix = at + 1;
        size_t q = strlen(suffix);
        return n > p + q && strncmp(unit, rule, p) == 0 && strcmp(unit + n - q, suffix) == 0;
}

static bool rule_matches(const gm_config_rule_t *r, const gm_identity_t *id) {
        switch (r->kind) {
        case GM_RULE_UNIT:
                return id->unit[0] && !id->user_unit && unit_matches(r->unit, id->unit);
        case GM_RULE_USER:
                return id->uid == r->id;
        case GM_RULE_GROUP:
                if (id->gid == r->id)
                        return true;
                for (size_t i = 0; i < id->n_groups && i < GM_IDENTITY_MAX_GROUPS; i++)
                        if (id->groups[i] == r->id)
                                return true;
                return false;
        case _GM_RULE_KIND_MAX:
                break;
        }
        return false;
}

const char *gm_config_tenant_for(const gm_config_t *c, const gm_identity_t *id, char *buf, size_t len) {
        for (gm_rule_kind_t k = 0; c && k < _GM_RULE_KIND_MAX; k++)
                for (size_t i = 0; i < c->n_rules; i++)
                        if (c->rules[i].kind == k && rule_matches(&c->rules[i], id))
                                return c->tenants[c->rules[i].tenant].name;
        snprintf(buf, len, "uid:%u", (unsigned) id->uid);
        return buf;
}
