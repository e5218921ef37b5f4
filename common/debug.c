#include "debug.h"

#include <stdio.h>
#include <stdlib.h>

void gm_assert_fail(const char *expr, const char *file, int line, const char *func) {
        fprintf(stderr, "<2>gpumem: assertion '%s' failed at %s:%d (%s)\n", expr, file, line, func);
        abort();
}
