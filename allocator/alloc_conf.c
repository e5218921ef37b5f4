/* PYTORCH_CUDA_ALLOC_CONF parsing, following PyTorch's AllocatorConfig:
 * the string is cut into tokens at ',' ':' '[' ']' (each of which is a token
 * itself) with whitespace dropped, then read as "key : value" pairs separated
 * by ','. Every parse starts from the defaults. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_conf.h"

#define MIB (UINT64_C(1) << 20)
#define MIN_SPLIT_MB 20 /* kLargeBuffer */
#define MAX_REGISTER_THREADS 128
#define MAX_TOKENS sizeof(((gm_alloc_config_t *) NULL)->raw) /* conf is shorter than raw */

typedef enum option_kind {
        OPT_SIZE_MB,   /* uint64_t bytes, given in MB, >= 20 */
        OPT_BOOL,      /* bool, True|False */
        OPT_GC,        /* double in (0, 1) */
        OPT_FRACTION,  /* double in [0, 1] */
        OPT_THREADS,   /* uint32_t, power of 2 <= 128 */
        OPT_DIVISIONS, /* roundup_power2_divisions */
        OPT_BACKEND,   /* native only */
} option_kind_t;

#define NO_FIELD SIZE_MAX /* accepted and validated, but has no effect here */

static const struct option {
        const char *name;
        option_kind_t kind;
        size_t offset; /* in gm_alloc_config_t, or NO_FIELD */
} options[] = {
        {"backend", OPT_BACKEND, NO_FIELD},
        {"max_split_size_mb", OPT_SIZE_MB, offsetof(gm_alloc_config_t, max_split_size)},
        {"max_non_split_rounding_mb", OPT_SIZE_MB, offsetof(gm_alloc_config_t, max_non_split_rounding)},
        {"roundup_power2_divisions", OPT_DIVISIONS, offsetof(gm_alloc_config_t, roundup_power2_divisions)},
        {"garbage_collection_threshold", OPT_GC, offsetof(gm_alloc_config_t, garbage_collection_threshold)},
        {"per_process_memory_fraction", OPT_FRACTION, offsetof(gm_alloc_config_t, per_process_memory_fraction)},
        {"expandable_segments", OPT_BOOL, offsetof(gm_alloc_config_t, expandable_segments)},
        {"release_lock_on_cudamalloc", OPT_BOOL, offsetof(gm_alloc_config_t, release_lock_on_cudamalloc)},
        {"release_lock_on_hipmalloc", OPT_BOOL, offsetof(gm_alloc_config_t, release_lock_on_cudamalloc)},
        {"pinned_use_cuda_host_register", OPT_BOOL, offsetof(gm_alloc_config_t, pinned_use_cuda_host_register)},
        {"pinned_use_hip_host_register", OPT_BOOL, offsetof(gm_alloc_config_t, pinned_use_cuda_host_register)},
        {"pinned_num_register_threads", OPT_THREADS, offsetof(gm_alloc_config_t, pinned_num_register_threads)},
        {"pinned_use_background_threads", OPT_BOOL, NO_FIELD},
        /* gpumemd extensions (PyTorch has no such keys) */
        {"gpumemd_page_reuse", OPT_BOOL, offsetof(gm_alloc_config_t, page_reuse)},
};

typedef struct parser {
        const char *tok[MAX_TOKENS]; /* NUL-terminated tokens in `store` */
        size_t n_tok;
        char store[2 * MAX_TOKENS];
        gm_alloc_config_t *config;
        char *reterr;
        size_t reterr_len;
} parser_t;

__attribute__((format(printf, 2, 3))) static int fail(parser_t *p, const char *fmt, ...) {
        va_list ap;

        if (p->reterr && p->reterr_len > 0) {
                va_start(ap, fmt);
                vsnprintf(p->reterr, p->reterr_len, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

static bool is_separator(char c) {
        return c == ',' || c == ':' || c == '[' || c == ']';
}

/* Splits conf (shorter than MAX_TOKENS) into tokens. */
static void tokenize(parser_t *p, const char *conf) {
        char *w = p->store;
        bool in_word = false;

        for (const char *c = conf; *c; c++) {
                if (isspace((unsigned char) *c))
                        continue;
                if (is_separator(*c) || !in_word) {
                        if (in_word)
                                *w++ = '\0';
                        p->tok[p->n_tok++] = w;
                }
                *w++ = *c;
                in_word = !is_separator(*c);
                if (!in_word)
                        *w++ = '\0';
        }
        if (in_word)
                *w = '\0';
}

static bool token_is(const parser_t *p, size_t i, const char *s) {
        return i < p->n_tok && strcmp(p->tok[i], s) == 0;
}

static int expect(parser_t *p, size_t i, const char *sep) {
        if (!token_is(p, i, sep))
                return fail(p, "Error parsing CachingAllocator settings, expected %s", sep);
        return 0;
}

/* The value token of `key` at index i (must exist). */
static int value_token(parser_t *p, size_t i, const char *key, const char **ret) {
        if (i >= p->n_tok || is_separator(p->tok[i][0]))
                return fail(p, "Error, expecting %s value", key);
        *ret = p->tok[i];
        return 0;
}

static int parse_uint(parser_t *p, const char *s, uint64_t max, const char *key, uint64_t *ret) {
        unsigned long long v;
        char *end;

        errno = 0;
        v = strtoull(s, &end, 10);
        if (!isdigit((unsigned char) s[0]) || *end || errno != 0 || v > max)
                return fail(p, "Expected a non-negative integer for %s, got '%s'", key, s);
        *ret = v;
        return 0;
}

static int parse_double(parser_t *p, const char *s, const char *key, double *ret) {
        char *end;
        double v;

        errno = 0;
        v = strtod(s, &end);
        if (end == s || *end || errno != 0 || !isfinite(v))
                return fail(p, "Expected a number for %s, got '%s'", key, s);
        *ret = v;
        return 0;
}

static bool is_pow2(uint64_t v) {
        return v != 0 && (v & (v - 1)) == 0;
}

static unsigned log2_floor(uint64_t v) {
        return 63u - (unsigned) __builtin_clzll(v);
}

static int parse_division(parser_t *p, const char *s, uint32_t *ret) {
        uint64_t v = 0;
        int r = parse_uint(p, s, UINT32_MAX, "roundup_power2_divisions", &v);

        if (r < 0)
                return r;
        if (v != 0 && !is_pow2(v))
                return fail(p, "For roundups, the divisions has to be power of 2 or 0 to disable roundup");
        *ret = (uint32_t) v;
        return 0;
}

/* "roundup_power2_divisions:<p2>" or ":[<MB p2>:<div>,...,>:<div>]"; i is the
 * value's index, *ret_i the index of its last token. In a list, key K sets
 * slot log2(K) (clamped to 0..15), the first key also fills every lower slot,
 * and '>' fills every slot after the last explicit key. */
static int parse_divisions(parser_t *p, size_t i, uint32_t *slots, size_t *ret_i) {
        const char *key = "roundup_power2_divisions";
        bool first = true;
        size_t last = 0;
        const char *v = NULL; /* set before use; initialised for gcc -O3 -Wmaybe-uninitialized */
        uint64_t u = 0;
        uint32_t divs = 0;
        int r;

        if (!token_is(p, i, "[")) {
                if ((r = value_token(p, i, key, &v)) < 0 || (r = parse_uint(p, v, UINT32_MAX, key, &u)) < 0)
                        return r;
                if (!is_pow2(u))
                        return fail(p, "For roundups, the divisions has to be power of 2");
                for (size_t s = 0; s < GM_ROUNDUP_SLOTS; s++)
                        slots[s] = (uint32_t) u;
                *ret_i = i;
                return 0;
        }
        while (++i < p->n_tok && !token_is(p, i, "]")) {
                const char *interval = p->tok[i];

                if ((r = expect(p, ++i, ":")) < 0 || (r = value_token(p, ++i, key, &v)) < 0 ||
                    (r = parse_division(p, v, &divs)) < 0)
                        return r;
                if (strcmp(interval, ">") == 0) {
                        for (size_t s = last + 1; s < GM_ROUNDUP_SLOTS; s++)
                                slots[s] = divs;
                } else {
                        size_t slot;

                        if ((r = parse_uint(p, interval, UINT64_MAX, key, &u)) < 0)
                                return r;
                        if (!is_pow2(u))
                                return fail(p, "For roundups, the intervals have to be power of 2");
                        slot = log2_floor(u);
                        if (slot >= GM_ROUNDUP_SLOTS)
                                slot = GM_ROUNDUP_SLOTS - 1;
                        for (size_t s = 0; first && s < slot; s++)
                                slots[s] = divs;
                        first = false;
                        slots[slot] = divs;
                        last = slot;
                }
                if (!token_is(p, i + 1, "]") && (r = expect(p, ++i, ",")) < 0)
                        return r;
        }
        if (i >= p->n_tok)
                return fail(p, "Expected closing bracket ']' in %s", key);
        *ret_i = i;
        return 0;
}

/* Parses the value of option `o` starting at token i; *ret_i = its last token. */
static int parse_value(parser_t *p, const struct option *o, size_t i, size_t *ret_i) {
        char *field = o->offset == NO_FIELD ? NULL : (char *) p->config + o->offset;
        const char *v = NULL;
        uint64_t u = 0;
        double d = 0;
        int r;

        if (o->kind != OPT_DIVISIONS && (r = value_token(p, i, o->name, &v)) < 0)
                return r;
        *ret_i = i;
        switch (o->kind) {
        case OPT_DIVISIONS:
                return parse_divisions(p, i, (uint32_t *) field, ret_i);
        case OPT_SIZE_MB:
                if ((r = parse_uint(p, v, UINT64_MAX, o->name, &u)) < 0)
                        return r;
                if (u < MIN_SPLIT_MB)
                        return fail(p, "CachingAllocator option %s too small, must be >= %d", o->name, MIN_SPLIT_MB);
                if (u > UINT64_MAX / MIB)
                        u = UINT64_MAX / MIB;
                u *= MIB;
                memcpy(field, &u, sizeof(u));
                return 0;
        case OPT_BOOL:
                if (strcmp(v, "True") != 0 && strcmp(v, "False") != 0)
                        return fail(p, "Expected a single True/False argument for %s", o->name);
                if (field)
                        *(bool *) field = strcmp(v, "True") == 0;
                return 0;
        case OPT_GC:
                if ((r = parse_double(p, v, o->name, &d)) < 0)
                        return r;
                if (!(d > 0.0 && d < 1.0))
                        return fail(p, "garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
                memcpy(field, &d, sizeof(d));
                return 0;
        case OPT_FRACTION:
                if ((r = parse_double(p, v, o->name, &d)) < 0)
                        return r;
                if (!(d >= 0.0 && d <= 1.0))
                        return fail(p, "Invalid fraction value: %s. Allowed range: 0~1", v);
                memcpy(field, &d, sizeof(d));
                return 0;
        case OPT_THREADS:
                if ((r = parse_uint(p, v, UINT64_MAX, o->name, &u)) < 0)
                        return r;
                if (!is_pow2(u))
                        return fail(p, "Number of register threads has to be power of 2, got %s", v);
                if (u > MAX_REGISTER_THREADS)
                        return fail(p, "Number of register threads should be less than or equal to %d, got %s",
                                    MAX_REGISTER_THREADS, v);
                *(uint32_t *) field = (uint32_t) u;
                return 0;
        case OPT_BACKEND:
                if (strcmp(v, "cudaMallocAsync") == 0 || strcmp(v, "hipMallocAsync") == 0)
                        return fail(p, "backend:%s is not supported: gpumemd is the allocator, use backend:native", v);
                if (strcmp(v, "native") != 0)
                        return fail(p, "Unknown allocator backend, options are native and cudaMallocAsync");
                return 0;
        }
        __builtin_unreachable();
}

void gm_alloc_config_default(gm_alloc_config_t *ret_config) {
        *ret_config = (gm_alloc_config_t){
                .max_split_size = UINT64_MAX,
                .max_non_split_rounding = MIN_SPLIT_MB * MIB,
                .pinned_num_register_threads = 1,
        };
}

int gm_alloc_config_parse(const char *conf, gm_alloc_config_t *ret_config, char *reterr, size_t reterr_len) {
        gm_alloc_config_t config;
        parser_t p = {.config = &config, .reterr = reterr, .reterr_len = reterr_len};
        int r;

        gm_alloc_config_default(&config);
        if (!conf)
                conf = "";
        if (strlen(conf) >= sizeof(config.raw))
                return fail(&p, "allocator settings longer than %zu characters", sizeof(config.raw) - 1);
        strcpy(config.raw, conf);
        tokenize(&p, conf);

        for (size_t i = 0; i < p.n_tok; i++) {
                const struct option *o = NULL;

                for (size_t k = 0; k < sizeof(options) / sizeof(options[0]); k++)
                        if (strcmp(p.tok[i], options[k].name) == 0)
                                o = &options[k];
                if (!o)
                        return fail(&p, "Unrecognized key '%s' in CUDA allocator config", p.tok[i]);
                if ((r = expect(&p, ++i, ":")) < 0 || (r = parse_value(&p, o, i + 1, &i)) < 0)
                        return r;
                if (i + 1 < p.n_tok && (r = expect(&p, ++i, ",")) < 0)
                        return r;
        }
        if (config.page_reuse && !config.expandable_segments)
                return fail(&p, "gpumemd_page_reuse:True needs expandable_segments:True");
        *ret_config = config;
        return 0;
}
