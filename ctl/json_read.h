/* A small JSON reader for what gpumemctl reads back from the daemon (the
 * JSON snapshot): the whole text into a tree. Strict RFC 8259 syntax, nesting
 * at most GM_JSON_MAX_DEPTH deep, \u escapes written as UTF-8 (a lone
 * surrogate as U+FFFD). Pure: no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_JSON_MAX_DEPTH 64

typedef enum gm_json_type {
        GM_JSON_NULL,
        GM_JSON_BOOL,
        GM_JSON_NUMBER,
        GM_JSON_STRING,
        GM_JSON_ARRAY,
        GM_JSON_OBJECT,
} gm_json_type_t;

typedef struct gm_json gm_json_t;
struct gm_json {
        gm_json_type_t type;
        bool boolean;
        double number;
        bool is_uint;      /* a number written as digits only: `uint` holds it exactly */
        uint64_t uint;     /* (saturated at UINT64_MAX) */
        char *string;      /* NUL-terminated (strings with NUL inside end there) */
        gm_json_t **items; /* array values, or object values */
        char **keys;       /* object keys, parallel to items */
        size_t n;
};

/* Parses `len` bytes; -EINVAL (with the offset in *ret_error_at when not
 * NULL) for anything that is not one JSON value, -ENOMEM. */
int gm_json_parse(const char *text, size_t len, gm_json_t **ret_value, size_t *ret_error_at);
/* Accepts NULL; returns NULL. */
gm_json_t *gm_json_free(gm_json_t *v);
/* The first member `key` of an object, or NULL (also when v is not an object). */
const gm_json_t *gm_json_get(const gm_json_t *v, const char *key);
/* The member's string or number, with a default when absent or of another type. */
const char *gm_json_get_string(const gm_json_t *v, const char *key, const char *dflt);
uint64_t gm_json_get_uint(const gm_json_t *v, const char *key, uint64_t dflt);
