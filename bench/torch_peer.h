/* The PyTorch-style comparison peer of the allocator core (torch_peer.cpp):
 * a C interface so that bench/alloc_core.c drives both through one loop. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct torch_peer torch_peer_t;

torch_peer_t *torch_peer_new(bool expandable);
/* Returns the block's address (never fails: segments are synthetic). */
uint64_t torch_peer_alloc(torch_peer_t *p, uint64_t size, uint64_t stream);
void torch_peer_free(torch_peer_t *p, uint64_t ptr);
void torch_peer_destroy(torch_peer_t *p);

#ifdef __cplusplus
}
#endif
