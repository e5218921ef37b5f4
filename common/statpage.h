/* A statistics page: a small sealed memfd that one writer (a client's local
 * heap) keeps up to date and readers (the daemon) copy out whole, under a
 * sequence lock, without any message.
 *
 * The daemon creates the page (gm_statpage_create) and hands its fd to the
 * client, which maps it writable; the daemon maps it read-only. The size is
 * sealed, so the mapping can never be truncated under the reader. What the
 * writer puts there is untrusted: readers copy a bounded number of bytes a
 * bounded number of times and validate the copy themselves. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Room for a heap's statistics and each of its tagged pools' (docs/tags.md). */
#define GM_STATPAGE_SIZE 20480u
#define GM_STATPAGE_MAGIC UINT64_C(0x3174617473706d67) /* "gmpstat1" little-endian */
/* The payload starts at this offset of the page. */
#define GM_STATPAGE_PAYLOAD_OFFSET 64u
#define GM_STATPAGE_PAYLOAD_MAX (GM_STATPAGE_SIZE - GM_STATPAGE_PAYLOAD_OFFSET)

typedef struct gm_statpage {
        uint64_t magic;        /* GM_STATPAGE_MAGIC, written by the creator */
        uint32_t payload_size; /* bytes of payload the creator expects */
        uint32_t reserved0;
        uint64_t seq; /* even: stable; odd: the writer is updating */
} gm_statpage_t;

/* Creates a page of GM_STATPAGE_SIZE bytes whose header announces
 * `payload_size`, sealed against growing and shrinking. *ret_fd is CLOEXEC. */
int gm_statpage_create(size_t payload_size, int *ret_fd);

/* Maps the page behind `fd` (the fd stays the caller's). The writer checks
 * the size, the seals and the header; the reader only the size. */
int gm_statpage_map(int fd, bool writable, gm_statpage_t **ret_page);
/* Accepts NULL. */
void gm_statpage_unmap(gm_statpage_t *page);

static inline void *gm_statpage_payload(gm_statpage_t *page) {
        return (uint8_t *) page + GM_STATPAGE_PAYLOAD_OFFSET;
}

/* The writer brackets every change of the payload (no other writer):
 * inline, as a local heap does it around every allocation and free. */
static inline void gm_statpage_write_begin(gm_statpage_t *page) {
        _Atomic uint64_t *seq = (_Atomic uint64_t *) &page->seq;
        atomic_store_explicit(seq, atomic_load_explicit(seq, memory_order_relaxed) + 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_release);
}

static inline void gm_statpage_write_end(gm_statpage_t *page) {
        _Atomic uint64_t *seq = (_Atomic uint64_t *) &page->seq;
        atomic_store_explicit(seq, atomic_load_explicit(seq, memory_order_relaxed) + 1, memory_order_release);
}

/* Copies `len` (<= GM_STATPAGE_PAYLOAD_MAX) payload bytes into dst once they
 * were stable for the whole copy, trying at most `max_tries` times. 0, -EAGAIN
 * when the writer was busy every time (dst then holds a torn copy), -EBADMSG
 * when the header was overwritten, -EINVAL for a bad len. */
int gm_statpage_read(const gm_statpage_t *page, void *dst, size_t len, unsigned max_tries);
/* The same for the `len` bytes at `offset` of the payload (offset + len <=
 * GM_STATPAGE_PAYLOAD_MAX, else -EINVAL). */
int gm_statpage_read_at(const gm_statpage_t *page, size_t offset, void *dst, size_t len, unsigned max_tries);
