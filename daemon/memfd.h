/* Read-only memfds for replies too large for a packet (snapshots, samples). */
#pragma once

#include <stddef.h>

/* Writes exactly `len` bytes at `dst`. */
typedef void gm_memfd_fill_fn(void *dst, size_t len, const void *ctx);

/* A memfd named `name` of `len` bytes that `fill` wrote (through a mapping),
 * sealed against every change (size, writes, further seals), so the client it
 * is sent to reads what the daemon wrote and nothing else. CLOEXEC. */
int gm_memfd_sealed(const char *name, size_t len, gm_memfd_fill_fn *fill, const void *ctx, int *ret_fd);
