/* Pickle/JSON writer: see pickle.h. Pickle layout: PROTO 2, then each dict is
 * EMPTY_DICT MARK key value ... SETITEMS and each list EMPTY_LIST MARK ...
 * APPENDS (the MARK is dropped again when the container stays empty), then
 * STOP. Ints take Python's own choice of BININT1/BININT2/BININT/LONG1. */
#include "pickle.h"
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
        KIND_DICT,
        KIND_LIST,
};

/* Pickle opcodes (Lib/pickletools.py names). */
enum {
        OP_MARK = '(',
        OP_STOP = '.',
        OP_BINFLOAT = 'G',
        OP_BININT = 'J',
        OP_BININT1 = 'K',
        OP_BININT2 = 'M',
        OP_NONE = 'N',
        OP_BINUNICODE = 'X',
        OP_EMPTY_LIST = ']',
        OP_APPENDS = 'e',
        OP_TUPLE = 't',
        OP_SETITEMS = 'u',
        OP_EMPTY_DICT = '}',
        OP_EMPTY_TUPLE = ')',
        OP_PROTO = 0x80,
        OP_TUPLE1 = 0x85,
        OP_NEWTRUE = 0x88,
        OP_NEWFALSE = 0x89,
        OP_LONG1 = 0x8a,
};

static const char replacement_char[] = "\xef\xbf\xbd"; /* U+FFFD */

static void fail(gm_pickler_t *w, int error) {
        if (w->error == 0)
                w->error = error;
}

/* Makes room for n more bytes. */
static bool reserve(gm_pickler_t *w, size_t n) {
        if (w->error != 0)
                return false;
        if (n <= w->cap - w->len)
                return true;
        if (n > SIZE_MAX / 2 - w->len) {
                fail(w, -ENOMEM);
                return false;
        }
        size_t cap = w->cap > 0 ? w->cap : 4096;
        while (cap - w->len < n)
                cap *= 2;
        char *buf = realloc(w->buf, cap);
        if (!buf) {
                fail(w, -ENOMEM);
                return false;
        }
        w->buf = buf;
        w->cap = cap;
        return true;
}

static void put(gm_pickler_t *w, const void *data, size_t n) {
        if (!reserve(w, n))
                return;
        memcpy(w->buf + w->len, data, n);
        w->len += n;
}

static void put_byte(gm_pickler_t *w, uint8_t c) {
        put(w, &c, 1);
}

static void put_le(gm_pickler_t *w, uint64_t v, size_t n) {
        uint8_t b[8];
        for (size_t i = 0; i < n; i++)
                b[i] = (uint8_t) (v >> (8 * i));
        put(w, b, n);
}

static void put_cstr(gm_pickler_t *w, const char *s) {
        put(w, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at s (1-4), or 0 if the bytes there are
 * not one (overlong forms, surrogates and code points above U+10FFFF count as
 * invalid). s is NUL-terminated, so reading on stops at the terminator. */
static size_t utf8_seq_len(const uint8_t *s) {
        uint8_t lo = 0x80, hi = 0xbf;
        size_t n;

        if (s[0] < 0x80)
                return 1;
        if (s[0] >= 0xc2 && s[0] <= 0xdf)
                n = 2;
        else if (s[0] >= 0xe0 && s[0] <= 0xef) {
                n = 3;
                if (s[0] == 0xe0)
                        lo = 0xa0;
                else if (s[0] == 0xed)
                        hi = 0x9f;
        } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
                n = 4;
                if (s[0] == 0xf0)
                        lo = 0x90;
                else if (s[0] == 0xf4)
                        hi = 0x8f;
        } else
                return 0;
        if (s[1] < lo || s[1] > hi)
                return 0;
        for (size_t i = 2; i < n; i++)
                if (s[i] < 0x80 || s[i] > 0xbf)
                        return 0;
        return n;
}

/* Appends s as UTF-8, invalid bytes replaced by U+FFFD; with json=true,
 * quotes, backslashes and control characters are escaped as well. */
static void put_text(gm_pickler_t *w, const char *str, bool json) {
        const uint8_t *s = (const uint8_t *) str;

        while (*s != 0 && w->error == 0) {
                size_t n = utf8_seq_len(s);
                if (n == 0) {
                        put_cstr(w, replacement_char);
                        s++;
                        continue;
                }
                char buf[8];
                const char *esc = json && n == 1 ? gm_json_escape_byte(*s, buf) : NULL;
                if (esc)
                        put_cstr(w, esc);
                else
                        put(w, s, n);
                s += n;
        }
}

static void put_string(gm_pickler_t *w, const char *s) {
        if (w->format == GM_PICKLE_FORMAT_JSON) {
                put_byte(w, '"');
                put_text(w, s, true);
                put_byte(w, '"');
                return;
        }
        /* BINUNICODE: 4-byte little-endian length, patched once the text is in. */
        put_byte(w, OP_BINUNICODE);
        size_t at = w->len;
        put_le(w, 0, 4);
        put_text(w, s, false);
        if (w->error != 0)
                return;
        size_t n = w->len - at - 4;
        if (n > UINT32_MAX) {
                fail(w, -EINVAL);
                return;
        }
        for (size_t i = 0; i < 4; i++)
                w->buf[at + i] = (char) (uint8_t) (n >> (8 * i));
}

static void put_pickle_int(gm_pickler_t *w, int64_t v) {
        if (v >= 0 && v <= 0xff) {
                put_byte(w, OP_BININT1);
                put_le(w, (uint64_t) v, 1);
        } else if (v >= 0 && v <= 0xffff) {
                put_byte(w, OP_BININT2);
                put_le(w, (uint64_t) v, 2);
        } else if (v >= INT32_MIN && v <= INT32_MAX) {
                put_byte(w, OP_BININT);
                put_le(w, (uint64_t) v, 4);
        } else {
                /* LONG1: shortest little-endian two's complement. */
                uint8_t b[8];
                size_t n = 8;
                for (size_t i = 0; i < 8; i++)
                        b[i] = (uint8_t) ((uint64_t) v >> (8 * i));
                while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
                        n--;
                put_byte(w, OP_LONG1);
                put_byte(w, (uint8_t) n);
                put(w, b, n);
        }
}

static bool is_open(const gm_pickler_t *w, uint8_t kind) {
        return w->depth > 0 && w->kind[w->depth - 1] == kind;
}

/* Checks that a value may come now and writes what precedes it (the pickle
 * header for the root, a JSON comma between list items). */
static bool value_begin(gm_pickler_t *w) {
        if (w->error != 0)
                return false;
        if (w->depth == 0) {
                if (w->root_written) {
                        fail(w, -EINVAL);
                        return false;
                }
                w->root_written = true;
                if (w->format == GM_PICKLE_FORMAT_PICKLE) {
                        put_byte(w, OP_PROTO);
                        put_byte(w, 2);
                }
        } else if (w->kind[w->depth - 1] == KIND_DICT) {
                if (!w->key_pending) {
                        fail(w, -EINVAL);
                        return false;
                }
                w->key_pending = false;
        } else {
                if (w->format == GM_PICKLE_FORMAT_JSON && w->items[w->depth - 1] > 0)
                        put_byte(w, ',');
                w->items[w->depth - 1]++;
        }
        return w->error == 0;
}

static void begin_container(gm_pickler_t *w, uint8_t kind) {
        if (!value_begin(w))
                return;
        if (w->depth == GM_PICKLER_MAX_DEPTH) {
                fail(w, -EINVAL);
                return;
        }
        w->kind[w->depth] = kind;
        w->items[w->depth] = 0;
        w->depth++;
        if (w->format == GM_PICKLE_FORMAT_JSON)
                put_byte(w, kind == KIND_DICT ? '{' : '[');
        else {
                put_byte(w, kind == KIND_DICT ? OP_EMPTY_DICT : OP_EMPTY_LIST);
                put_byte(w, OP_MARK);
        }
}

static void end_container(gm_pickler_t *w, uint8_t kind) {
        if (w->error != 0)
                return;
        if (!is_open(w, kind) || w->key_pending) {
                fail(w, -EINVAL);
                return;
        }
        w->depth--;
        if (w->format == GM_PICKLE_FORMAT_JSON)
                put_byte(w, kind == KIND_DICT ? '}' : ']');
        else if (w->items[w->depth] == 0)
                w->len--; /* nothing since the MARK: the empty container stands alone */
        else
                put_byte(w, kind == KIND_DICT ? OP_SETITEMS : OP_APPENDS);
}

int gm_pickler_init(gm_pickler_t *w, gm_pickle_format_t format) {
        if ((unsigned) format >= _GM_PICKLE_FORMAT_MAX)
                return -EINVAL;
        *w = (gm_pickler_t){.format = format};
        return 0;
}

void gm_pickler_done(gm_pickler_t *w) {
        if (!w)
                return;
        free(w->buf);
        *w = (gm_pickler_t){.format = w->format};
}

int gm_pickler_finish(gm_pickler_t *w, char **ret_buf, size_t *ret_len) {
        if (w->depth != 0 || !w->root_written)
                fail(w, -EINVAL);
        put_byte(w, w->format == GM_PICKLE_FORMAT_JSON ? '\n' : OP_STOP);
        int r = w->error;
        if (r != 0) {
                gm_pickler_done(w);
                return r;
        }
        *ret_buf = w->buf;
        *ret_len = w->len;
        *w = (gm_pickler_t){.format = w->format};
        return 0;
}

void gm_pickler_begin_dict(gm_pickler_t *w) {
        begin_container(w, KIND_DICT);
}

void gm_pickler_end_dict(gm_pickler_t *w) {
        end_container(w, KIND_DICT);
}

void gm_pickler_begin_list(gm_pickler_t *w) {
        begin_container(w, KIND_LIST);
}

void gm_pickler_end_list(gm_pickler_t *w) {
        end_container(w, KIND_LIST);
}

void gm_pickler_key(gm_pickler_t *w, const char *key) {
        if (w->error != 0)
                return;
        if (!is_open(w, KIND_DICT) || w->key_pending) {
                fail(w, -EINVAL);
                return;
        }
        if (w->format == GM_PICKLE_FORMAT_JSON && w->items[w->depth - 1] > 0)
                put_byte(w, ',');
        put_string(w, key);
        if (w->format == GM_PICKLE_FORMAT_JSON)
                put_byte(w, ':');
        w->items[w->depth - 1]++;
        w->key_pending = true;
}

void gm_pickler_str(gm_pickler_t *w, const char *s) {
        if (value_begin(w))
                put_string(w, s);
}

void gm_pickler_int(gm_pickler_t *w, int64_t v) {
        if (!value_begin(w))
                return;
        if (w->format == GM_PICKLE_FORMAT_JSON) {
                char num[24];
                snprintf(num, sizeof(num), "%" PRId64, v);
                put_cstr(w, num);
        } else
                put_pickle_int(w, v);
}

void gm_pickler_uint(gm_pickler_t *w, uint64_t v) {
        if (v <= INT64_MAX) {
                gm_pickler_int(w, (int64_t) v);
                return;
        }
        if (!value_begin(w))
                return;
        if (w->format == GM_PICKLE_FORMAT_JSON) {
                char num[24];
                snprintf(num, sizeof(num), "%" PRIu64, v);
                put_cstr(w, num);
        } else {
                /* The top bit is set: a ninth, zero byte keeps it positive. */
                put_byte(w, OP_LONG1);
                put_byte(w, 9);
                put_le(w, v, 8);
                put_byte(w, 0);
        }
}

void gm_pickler_double(gm_pickler_t *w, double v) {
        if (!value_begin(w))
                return;
        if (w->format == GM_PICKLE_FORMAT_PICKLE) {
                uint64_t bits;
                memcpy(&bits, &v, sizeof(bits));
                put_byte(w, OP_BINFLOAT);
                for (int i = 7; i >= 0; i--)
                        put_byte(w, (uint8_t) (bits >> (8 * i)));
                return;
        }
        if (!isfinite(v)) {
                put_cstr(w, "null");
                return;
        }
        /* The shortest of %.15g..%.17g that reads back exactly, kept a float
         * for JSON readers ("1" would load as an int). */
        char num[40];
        for (int prec = 15; prec <= 17; prec++) {
                snprintf(num, sizeof(num), "%.*g", prec, v);
                if (strtod(num, NULL) == v)
                        break;
        }
        if (!strpbrk(num, ".e"))
                strcat(num, ".0");
        put_cstr(w, num);
}

void gm_pickler_bool(gm_pickler_t *w, bool v) {
        if (!value_begin(w))
                return;
        if (w->format == GM_PICKLE_FORMAT_JSON)
                put_cstr(w, v ? "true" : "false");
        else
                put_byte(w, v ? OP_NEWTRUE : OP_NEWFALSE);
}

void gm_pickler_none(gm_pickler_t *w) {
        if (!value_begin(w))
                return;
        if (w->format == GM_PICKLE_FORMAT_JSON)
                put_cstr(w, "null");
        else
                put_byte(w, OP_NONE);
}

void gm_pickler_tuple_ints(gm_pickler_t *w, const int64_t *v, size_t n) {
        if (w->format == GM_PICKLE_FORMAT_JSON) {
                gm_pickler_begin_list(w);
                for (size_t i = 0; i < n; i++)
                        gm_pickler_int(w, v[i]);
                gm_pickler_end_list(w);
                return;
        }
        if (!value_begin(w))
                return;
        if (n == 0) {
                put_byte(w, OP_EMPTY_TUPLE);
                return;
        }
        if (n > 3)
                put_byte(w, OP_MARK);
        for (size_t i = 0; i < n; i++)
                put_pickle_int(w, v[i]);
        put_byte(w, n > 3 ? OP_TUPLE : (uint8_t) (OP_TUPLE1 + n - 1));
}
