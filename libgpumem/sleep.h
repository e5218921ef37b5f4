/* libgpumem's floor 4.7, sleep and wake of a local session (sleep.c): over
 * the local heap's provider (local_session.h), the segment table and the
 * connection. Every call: caller holds heap_lock, in a local session. Not
 * installed. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "conn.h"

/* Pools one sleep may name (SleepState's bound). */
#define GM_SLEEP_MAX_TAGS 16
/* -EINVAL (with the message) unless `tags` is NULL or names 1 to
 * GM_SLEEP_MAX_TAGS pools ("" the default) and every keep tag is "*" or a
 * pool's name. */
int gm_sleep_check_tags(gpumem_client *c, const char *const *tags, const char *const *keep_tags);
/* gpumem_sleep(): cached memory released, the device synchronized, the kept
 * blocks copied to host memory, the daemon told, every mapped piece given
 * back (ranges kept). -EALREADY asleep, -EBUSY with pieces the driver would
 * not unmap, else 0 or the error with nothing given back but the cache. */
int gm_sleep_enter(gpumem_client *c, const char *const *tags, const char *const *keep_tags,
                   uint64_t *ret_released_bytes);
/* gpumem_wake(): the same pieces granted again at the same addresses
 * (waiting up to timeout_ms, 0: the daemon's park_timeout_ms), the kept data
 * copied back. On a refusal what came goes back and the session stays
 * asleep. 0 when awake already. */
int gm_sleep_wake(gpumem_client *c, uint32_t timeout_ms);
/* Bytes a wake needs (0 awake). */
uint64_t gm_sleep_bytes(const gpumem_client *c);
/* Of the kept data, the bytes in page-locked host memory (0 awake). */
uint64_t gm_sleep_pinned_bytes(const gpumem_client *c);
/* A sleeping block at `ptr` was freed: its kept data goes. */
void gm_sleep_drop_kept(gpumem_client *c, uint64_t ptr);
/* The session closes: the record goes (its pieces are the daemon's). */
void gm_sleep_forget(gpumem_client *c);
