/* Claims, the client's side: gpumem_claim() and the query that
 * gpumem_mem_get_info() counts the caller's own claim with. */
#pragma once

#include <stdint.h>

#include "gpumem/gpumem.h"

/* *ret_claimed: this session's unconsumed claim, as the daemon has it now;
 * *ret_available: what the session could be given now, its claim included. */
int gm_claim_query(gpumem_client *c, uint64_t *ret_claimed, uint64_t *ret_available);
