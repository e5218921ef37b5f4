/* Shared by the libFuzzer harnesses: the entry point's prototype and a
 * NUL-terminated copy of the input for parsers that take C strings. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A fresh NUL-terminated copy of data (free it); embedded NULs end the string
 * early, as they would for any C caller. */
static inline char *fuzz_cstring(const uint8_t *data, size_t size) {
        char *s = malloc(size + 1);
        if (!s)
                abort();
        memcpy(s, data, size);
        s[size] = '\0';
        return s;
}

/* A property the parser promised did not hold: report and crash, so libFuzzer
 * keeps the input. */
#define FUZZ_ASSERT(cond)                                                                           \
        do {                                                                                        \
                if (!(cond)) {                                                                      \
                        fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
                        abort();                                                                    \
                }                                                                                   \
        } while (0)
