/* A streaming writer of one value tree, as a Python pickle or as JSON.
 *
 * The same calls (begin/end dict and list, key, str, ints, double, bool,
 * none, tuple of ints) produce either format, so a snapshot is described once.
 * Pickle output is protocol 2 using only opcodes that PyTorch's MemoryViz.js
 * unpickler reads (no memo, no bytes, no LONG4); JSON output is compact UTF-8.
 * Strings are written as UTF-8; each byte that is not part of a valid sequence
 * becomes U+FFFD, so both formats always load.
 *
 * Errors are sticky: the first failure (-ENOMEM on growth, -EINVAL on a call
 * that does not fit the tree being built, e.g. a key outside a dict or a value
 * where a key is due) is remembered, later calls do nothing, and
 * gm_pickler_finish() reports it. Pure C, no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_PICKLER_MAX_DEPTH 32

typedef enum gm_pickle_format {
        GM_PICKLE_FORMAT_PICKLE, /* Python pickle, protocol 2 */
        GM_PICKLE_FORMAT_JSON,
        _GM_PICKLE_FORMAT_MAX,
} gm_pickle_format_t;

/* Callers treat the fields as private; the struct is public only so a writer
 * can live on the stack. */
typedef struct gm_pickler {
        gm_pickle_format_t format;
        char *buf;
        size_t len, cap;
        int error;                            /* first failure, 0 = none */
        unsigned depth;                       /* open containers */
        bool root_written;                    /* the single top-level value is done */
        bool key_pending;                     /* in a dict: a key was written, its value is due */
        uint8_t kind[GM_PICKLER_MAX_DEPTH];   /* per open container: dict or list */
        uint32_t items[GM_PICKLER_MAX_DEPTH]; /* per open container: values written so far */
} gm_pickler_t;

/* Starts an empty writer (nothing allocated yet). -EINVAL for an unknown format. */
int gm_pickler_init(gm_pickler_t *w, gm_pickle_format_t format);
/* Frees the buffer of a writer that will not be finished. Accepts NULL. */
void gm_pickler_done(gm_pickler_t *w);
/* Ends the stream (STOP for pickle, newline for JSON) and hands the buffer to
 * the caller, who frees it with free(). Returns the sticky error, or -EINVAL
 * when the tree is incomplete; on any failure the buffer is freed and the
 * out-parameters are untouched. The writer is empty afterwards either way. */
int gm_pickler_finish(gm_pickler_t *w, char **ret_buf, size_t *ret_len);

void gm_pickler_begin_dict(gm_pickler_t *w);
void gm_pickler_end_dict(gm_pickler_t *w);
void gm_pickler_begin_list(gm_pickler_t *w);
void gm_pickler_end_list(gm_pickler_t *w);
/* A dict key; exactly one value call must follow. */
void gm_pickler_key(gm_pickler_t *w, const char *key);

void gm_pickler_str(gm_pickler_t *w, const char *s);
void gm_pickler_int(gm_pickler_t *w, int64_t v);
void gm_pickler_uint(gm_pickler_t *w, uint64_t v);
/* Non-finite values are written as JSON null (pickle keeps them). */
void gm_pickler_double(gm_pickler_t *w, double v);
void gm_pickler_bool(gm_pickler_t *w, bool v);
void gm_pickler_none(gm_pickler_t *w);
/* A tuple of n ints (a JSON array). */
void gm_pickler_tuple_ints(gm_pickler_t *w, const int64_t *v, size_t n);
