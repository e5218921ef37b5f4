/* The configuration file and peer identities (see config.h).
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "allocator.h" /* gm_alloc_config_parse */
#include "ipc.h"
#include "size.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5, asm-generic value */
#endif

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

static bool has_suffix(const char *s, size_t n, const char *suffix) {
        size_t k = strlen(suffix);
        return n > k && memcmp(s + n - k, suffix, k) == 0;
}

/* A systemd unit name of n bytes (not NUL-terminated) with the given suffix. */
static bool valid_unit_name(const char *s, size_t n, const char *suffix) {
        if (n == 0 || n > GM_UNIT_NAME_MAX || !has_suffix(s, n, suffix))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char) s[i]) && !strchr(":_.\\@-", s[i]))
                        return false;
        return true;
}

static bool valid_leaf_unit(const char *s, size_t n) {
        return valid_unit_name(s, n, ".service") || valid_unit_name(s, n, ".scope");
}

/* "user@<uid>.service": a per-user service manager, whose subtree the user owns. */
static bool is_user_manager(const char *s, size_t n) {
        static const char prefix[] = "user@", suffix[] = ".service";
        size_t p = sizeof(prefix) - 1, q = sizeof(suffix) - 1;
        if (n <= p + q || memcmp(s, prefix, p) != 0 || memcmp(s + n - q, suffix, q) != 0)
                return false;
        for (size_t i = p; i < n - q; i++)
                if (!isdigit((unsigned char) s[i]))
                        return false;
        return true;
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
        K_PATH,       /* absolute path */
        K_SOCKET,     /* absolute path that fits sun_path */
        K_STRING,
        K_BACKEND,
        K_DEVICE,
        K_MODE,
        K_GROUP,
        K_SIZE,       /* gm_parse_size, min..max */
        K_UINT,       /* decimal, min..max */
        K_ALLOC_CONF,
} key_type_t;

typedef struct daemon_key {
        const char *name;
        key_type_t type;
        size_t value; /* offsetof in gm_config_t */
        size_t has;   /* offsetof of its has_* flag */
        unsigned width; /* bytes of a K_SIZE/K_UINT value */
        uint64_t min, max;
} daemon_key_t;

#define KEY(n, t, mn, mx)                                                                                          \
        {                                                                                                          \
                #n, t, offsetof(gm_config_t, n), offsetof(gm_config_t, has_##n), sizeof(((gm_config_t *) 0)->n), mn, \
                        mx                                                                                         \
        }

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
        KEY(max_parked_per_session, K_UINT, 0, 65536),
        KEY(reattach_grace_ms, K_UINT, 0, 86400000),
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
        size_t tenant;  /* with SECTION_TENANT */
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
                return fail(st, -EINVAL, h->line,
                            "invalid tenant name '%.*s': 1 to %u of A-Z a-z 0-9 _ . : -", (int) n, name,
                            GM_TENANT_NAME_MAX);
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
                if (strcmp(value, "auto") != 0 && strcmp(value, "cuda") != 0 && strcmp(value, "host") != 0)
                        return fail(st, -EINVAL, line, "invalid backend '%s': auto, cuda or host", value);
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
                if (!valid_leaf_unit(value, strlen(value)))
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

/* ---- identity ---------------------------------------------------------------------------- */

/* The unit of one cgroup path ("/system.slice/foo.service/..."), n bytes. */
static bool path_unit(const char *p, size_t n, char ret_unit[GM_UNIT_NAME_MAX + 1], bool *ret_user_unit) {
        const char *end = p + n;
        const char *manager = NULL;
        size_t manager_len = 0;
        if (n == 0 || *p != '/')
                return false;
        while (p < end) {
                p++; /* the '/' */
                const char *slash = memchr(p, '/', (size_t) (end - p));
                size_t c = slash ? (size_t) (slash - p) : (size_t) (end - p);
                if (valid_unit_name(p, c, ".slice")) {
                        p += c;
                        continue;
                }
                if (!valid_leaf_unit(p, c))
                        break;
                if (!manager && is_user_manager(p, c)) {
                        manager = p, manager_len = c;
                        p += c;
                        continue;
                }
                memcpy(ret_unit, p, c);
                ret_unit[c] = '\0';
                *ret_user_unit = manager != NULL;
                return true;
        }
        if (!manager)
                return false;
        /* In user@UID.service itself or in a subgroup that names no unit. */
        memcpy(ret_unit, manager, manager_len);
        ret_unit[manager_len] = '\0';
        *ret_user_unit = false;
        return true;
}

void gm_cgroup_parse_unit(const char *text, char ret_unit[GM_UNIT_NAME_MAX + 1], bool *ret_user_unit) {
        const char *v2 = NULL, *v1 = NULL;
        size_t v2_len = 0, v1_len = 0;
        for (const char *s = text; *s;) {
                const char *nl = strchr(s, '\n');
                size_t n = nl ? (size_t) (nl - s) : strlen(s);
                /* "ID:CONTROLLERS:PATH"; the path may itself hold ':'. */
                const char *c1 = memchr(s, ':', n);
                const char *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t) (c1 + 1 - s)) : NULL;
                if (c2) {
                        const char *path = c2 + 1;
                        size_t path_len = n - (size_t) (path - s);
                        if (c1 - s == 1 && s[0] == '0' && c2 == c1 + 1)
                                v2 = path, v2_len = path_len;
                        else if (c2 - c1 - 1 == 12 && memcmp(c1 + 1, "name=systemd", 12) == 0)
                                v1 = path, v1_len = path_len;
                }
                s += n + (nl ? 1 : 0);
        }
        bool user = false;
        if ((v2 && path_unit(v2, v2_len, ret_unit, &user)) || (v1 && path_unit(v1, v1_len, ret_unit, &user))) {
                *ret_user_unit = user;
                return;
        }
        ret_unit[0] = '\0';
        *ret_user_unit = false;
}

/* Reads a small /proc file whole (NUL-terminated) into buf. */
static int read_proc(const char *path, char *buf, size_t size) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        size_t len = 0;
        for (;;) {
                ssize_t k = read(fd, buf + len, size - 1 - len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0 || (len += (size_t) k) == size - 1)
                        break;
        }
        close(fd);
        buf[len] = '\0';
        return 0;
}

static bool pidfd_alive(int pidfd) {
        return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0 || errno == EPERM;
}

/* The effective uid on the "Uid:" line of /proc/PID/status. */
static bool proc_euid_is(pid_t pid, uid_t uid, char *buf, size_t size) {
        char path[64];
        unsigned real, effective;
        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        if (read_proc(path, buf, size) < 0)
                return false;
        const char *u = strstr(buf, "\nUid:");
        return u && sscanf(u + 5, "%u %u", &real, &effective) == 2 && effective == (unsigned) uid;
}

/* Sets id->unit only when the kernel vouches that cred->pid still names the
 * peer: SO_PEERPIDFD pins the peer process itself (Linux >= 6.5); older
 * kernels get a pidfd by pid plus a uid check, which a pid reused by another
 * user cannot pass. The pidfd must still be alive after /proc was read. */
static void peer_unit(int sock, const gm_peer_cred_t *cred, gm_identity_t *id) {
        int pidfd = -1;
        socklen_t l = sizeof(pidfd);
        bool by_pid = false;
        if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &l) < 0) {
                if (errno != ENOPROTOOPT)
                        return; /* the peer is gone */
                pidfd = (int) syscall(SYS_pidfd_open, cred->pid, 0); /* always CLOEXEC */
                by_pid = true;
        }
        if (pidfd < 0)
                return;
        size_t size = 64 * 1024;
        char *text = malloc(size), path[64];
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) cred->pid);
        if (text && read_proc(path, text, size) == 0) {
                char *status = by_pid ? malloc(8192) : NULL;
                if ((!by_pid || (status && proc_euid_is(cred->pid, cred->uid, status, 8192))) && pidfd_alive(pidfd))
                        gm_cgroup_parse_unit(text, id->unit, &id->user_unit);
                free(status);
        }
        free(text);
        close(pidfd);
}

int gm_identity_read(int sock, pid_t pid, gm_identity_t *ret) {
        gm_peer_cred_t cred;
        int r = gm_ipc_peer_cred(sock, &cred);
        if (r < 0)
                return r;
        if (pid != 0 && pid != cred.pid)
                return -ESRCH;
        gm_identity_t id = {.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
        r = gm_ipc_peer_groups(sock, id.groups, GM_IDENTITY_MAX_GROUPS, &id.n_groups);
        if (r < 0)
                return r;
        if (cred.pid > 0)
                peer_unit(sock, &cred, &id);
        *ret = id;
        return 0;
}
