/* The JSON reader (json_read.h): recursive descent over the text, one node
 * per value. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "json_read.h"

typedef struct parser {
        const char *s;
        size_t len, pos;
        int error; /* 0, -EINVAL or -ENOMEM */
} parser_t;

static void skip_space(parser_t *p) {
        while (p->pos < p->len && strchr(" \t\r\n", p->s[p->pos]) && p->s[p->pos])
                p->pos++;
}

static bool take(parser_t *p, char c) {
        skip_space(p);
        if (p->pos < p->len && p->s[p->pos] == c) {
                p->pos++;
                return true;
        }
        return false;
}

static bool take_word(parser_t *p, const char *w) {
        size_t n = strlen(w);
        if (p->len - p->pos >= n && memcmp(p->s + p->pos, w, n) == 0) {
                p->pos += n;
                return true;
        }
        return false;
}

static gm_json_t *fail(parser_t *p, int err) {
        if (!p->error)
                p->error = err;
        return NULL;
}

static gm_json_t *node(parser_t *p, gm_json_type_t type) {
        gm_json_t *v = calloc(1, sizeof(*v));
        if (!v)
                return fail(p, -ENOMEM);
        v->type = type;
        return v;
}

static int hex4(parser_t *p, unsigned *ret) {
        if (p->len - p->pos < 4)
                return -EINVAL;
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
                char c = p->s[p->pos++];
                unsigned d = c >= '0' && c <= '9'   ? (unsigned) (c - '0')
                             : c >= 'a' && c <= 'f' ? (unsigned) (c - 'a' + 10)
                             : c >= 'A' && c <= 'F' ? (unsigned) (c - 'A' + 10)
                                                    : 16u;
                if (d == 16)
                        return -EINVAL;
                v = v * 16 + d;
        }
        *ret = v;
        return 0;
}

static size_t put_utf8(char *out, unsigned cp) {
        if (cp < 0x80)
                return out[0] = (char) cp, 1;
        if (cp < 0x800)
                return out[0] = (char) (0xc0 | cp >> 6), out[1] = (char) (0x80 | (cp & 0x3f)), 2;
        if (cp < 0x10000)
                return out[0] = (char) (0xe0 | cp >> 12), out[1] = (char) (0x80 | ((cp >> 6) & 0x3f)),
                       out[2] = (char) (0x80 | (cp & 0x3f)), 3;
        return out[0] = (char) (0xf0 | cp >> 18), out[1] = (char) (0x80 | ((cp >> 12) & 0x3f)),
               out[2] = (char) (0x80 | ((cp >> 6) & 0x3f)), out[3] = (char) (0x80 | (cp & 0x3f)), 4;
}

/* A string after its opening quote; malloc'd, or NULL with p->error set. */
static char *string_body(parser_t *p) {
        size_t start = p->pos, cap = 1;
        while (p->pos < p->len && p->s[p->pos] != '"') { /* an upper bound of the decoded size */
                cap += 1;
                p->pos += p->s[p->pos] == '\\' ? 2 : 1;
        }
        if (p->pos >= p->len)
                return fail(p, -EINVAL), NULL;
        p->pos = start;
        char *out = malloc(cap * 2 + 4);
        if (!out)
                return fail(p, -ENOMEM), NULL;
        size_t n = 0;
        while (p->s[p->pos] != '"') {
                unsigned char c = (unsigned char) p->s[p->pos++];
                if (c < 0x20)
                        return free(out), fail(p, -EINVAL), NULL;
                if (c != '\\') {
                        out[n++] = (char) c;
                        continue;
                }
                char e = p->s[p->pos++];
                const char *simple = strchr("\"\\/bfnrt", e);
                if (simple && e) {
                        static const char map[] = "\"\\/\b\f\n\r\t";
                        out[n++] = map[simple - "\"\\/bfnrt"];
                        continue;
                }
                unsigned cp, lo;
                if (e != 'u' || hex4(p, &cp) < 0)
                        return free(out), fail(p, -EINVAL), NULL;
                if (cp >= 0xd800 && cp < 0xdc00 && p->len - p->pos >= 6 && p->s[p->pos] == '\\' &&
                    p->s[p->pos + 1] == 'u') {
                        p->pos += 2;
                        if (hex4(p, &lo) < 0)
                                return free(out), fail(p, -EINVAL), NULL;
                        cp = lo >= 0xdc00 && lo < 0xe000 ? 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00) : 0xfffd;
                } else if (cp >= 0xd800 && cp < 0xe000) {
                        cp = 0xfffd;
                }
                n += put_utf8(out + n, cp);
        }
        p->pos++;
        out[n] = '\0';
        return out;
}

static gm_json_t *value(parser_t *p, unsigned depth);

/* Appends to an array or object (key NULL for arrays). */
static bool append(parser_t *p, gm_json_t *v, char *key, gm_json_t *item) {
        gm_json_t **items = realloc(v->items, (v->n + 1) * sizeof(*items));
        if (items)
                v->items = items;
        char **keys = v->type == GM_JSON_OBJECT ? realloc(v->keys, (v->n + 1) * sizeof(*keys)) : NULL;
        if (keys)
                v->keys = keys;
        if (!items || (v->type == GM_JSON_OBJECT && !keys)) {
                free(key);
                gm_json_free(item);
                return fail(p, -ENOMEM), false;
        }
        v->items[v->n] = item;
        if (keys)
                v->keys[v->n] = key;
        v->n++;
        return true;
}

static gm_json_t *container(parser_t *p, unsigned depth, bool object) {
        gm_json_t *v = node(p, object ? GM_JSON_OBJECT : GM_JSON_ARRAY);
        if (!v)
                return NULL;
        char close = object ? '}' : ']';
        if (take(p, close))
                return v;
        do {
                char *key = NULL;
                if (object) {
                        if (!take(p, '"') || !(key = string_body(p)) || !take(p, ':')) {
                                free(key);
                                gm_json_free(v);
                                return fail(p, -EINVAL);
                        }
                }
                gm_json_t *item = value(p, depth + 1);
                if (!item || !append(p, v, key, item)) {
                        if (!item)
                                free(key);
                        gm_json_free(v);
                        return fail(p, -EINVAL);
                }
        } while (take(p, ','));
        if (!take(p, close)) {
                gm_json_free(v);
                return fail(p, -EINVAL);
        }
        return v;
}

static gm_json_t *number(parser_t *p) {
        size_t start = p->pos;
        if (p->pos < p->len && p->s[p->pos] == '-')
                p->pos++;
        size_t digits = p->pos;
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
                p->pos++;
        if (p->pos == digits || (p->s[digits] == '0' && p->pos - digits > 1))
                return fail(p, -EINVAL);
        bool plain = start == digits;
        if (p->pos < p->len && p->s[p->pos] == '.') {
                plain = false;
                size_t f = ++p->pos;
                while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
                        p->pos++;
                if (p->pos == f)
                        return fail(p, -EINVAL);
        }
        if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
                plain = false;
                p->pos++;
                if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
                        p->pos++;
                size_t e = p->pos;
                while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
                        p->pos++;
                if (p->pos == e)
                        return fail(p, -EINVAL);
        }
        gm_json_t *v = node(p, GM_JSON_NUMBER);
        if (!v)
                return NULL;
        char buf[64];
        size_t n = p->pos - start < sizeof(buf) - 1 ? p->pos - start : sizeof(buf) - 1;
        memcpy(buf, p->s + start, n);
        buf[n] = '\0';
        v->number = strtod(buf, NULL);
        if (plain) {
                v->is_uint = true;
                for (size_t i = start; i < p->pos; i++) {
                        uint64_t d = (uint64_t) (p->s[i] - '0');
                        v->uint = v->uint > (UINT64_MAX - d) / 10 ? UINT64_MAX : v->uint * 10 + d;
                }
        }
        return v;
}

static gm_json_t *value(parser_t *p, unsigned depth) {
        if (depth > GM_JSON_MAX_DEPTH)
                return fail(p, -EINVAL);
        skip_space(p);
        if (p->pos >= p->len)
                return fail(p, -EINVAL);
        char c = p->s[p->pos];
        if (c == '{' || c == '[') {
                p->pos++;
                return container(p, depth, c == '{');
        }
        if (c == '"') {
                p->pos++;
                gm_json_t *v = node(p, GM_JSON_STRING);
                if (v && !(v->string = string_body(p)))
                        v = gm_json_free(v);
                return v;
        }
        if (c == '-' || (c >= '0' && c <= '9'))
                return number(p);
        gm_json_t *v = NULL;
        if (take_word(p, "true") || take_word(p, "false")) {
                if ((v = node(p, GM_JSON_BOOL)))
                        v->boolean = p->s[p->pos - 1] == 'e' && p->s[p->pos - 2] == 'u';
        } else if (take_word(p, "null")) {
                v = node(p, GM_JSON_NULL);
        } else {
                return fail(p, -EINVAL);
        }
        return v;
}

int gm_json_parse(const char *text, size_t len, gm_json_t **ret_value, size_t *ret_error_at) {
        parser_t p = {.s = text, .len = len};
        gm_json_t *v = value(&p, 0);
        skip_space(&p);
        if (v && p.pos != len) {
                v = gm_json_free(v);
                p.error = -EINVAL;
        }
        if (!v) {
                if (ret_error_at)
                        *ret_error_at = p.pos;
                return p.error ? p.error : -EINVAL;
        }
        *ret_value = v;
        return 0;
}

gm_json_t *gm_json_free(gm_json_t *v) {
        if (!v)
                return NULL;
        for (size_t i = 0; i < v->n; i++) {
                gm_json_free(v->items[i]);
                if (v->keys)
                        free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
        free(v->string);
        free(v);
        return NULL;
}

const gm_json_t *gm_json_get(const gm_json_t *v, const char *key) {
        if (!v || v->type != GM_JSON_OBJECT)
                return NULL;
        for (size_t i = 0; i < v->n; i++)
                if (strcmp(v->keys[i], key) == 0)
                        return v->items[i];
        return NULL;
}

const char *gm_json_get_string(const gm_json_t *v, const char *key, const char *dflt) {
        const gm_json_t *m = gm_json_get(v, key);
        return m && m->type == GM_JSON_STRING ? m->string : dflt;
}

uint64_t gm_json_get_uint(const gm_json_t *v, const char *key, uint64_t dflt) {
        const gm_json_t *m = gm_json_get(v, key);
        return m && m->type == GM_JSON_NUMBER && m->is_uint ? m->uint : dflt;
}
