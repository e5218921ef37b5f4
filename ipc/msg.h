/* Protocol messages over gm_ipc: one packed gpumem.Envelope a packet. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpumem.pb-c.h"

#define GM_PROTOCOL_VERSION 1u
/* The most memory-history entries a HistoryControl may ask the daemon to keep. */
#define GM_HISTORY_MAX_ENTRIES 100000000u
/* The most frees one Alloc (freed_block_ids) or one Free (block_id and more_block_ids) carries. */
#define GM_CARRIED_FREES_MAX 64u

/* Envelopes up to this size fit the buffer callers of gm_msg_pack() keep on the stack. */
#define GM_MSG_STACK_PACK_MAX 4096u

/* Packs `env` (its body walked once for its size, once to write it) into buf
 * (cap bytes) or, when it is larger, into a malloc()ed buffer. *ret_data is
 * buf or that buffer (the caller frees it when it is not buf), *ret_len the
 * packed size. -EMSGSIZE past max_packet bytes, -EINVAL for a body this build
 * does not know. */
int gm_msg_pack(const Gpumem__Envelope *env, size_t max_packet, uint8_t *buf, size_t cap, uint8_t **ret_data,
                size_t *ret_len);

/* Packs `env` into a packet of at most max_packet bytes and sends it with the
 * given fds (still owned by the caller). -EMSGSIZE when it does not fit. */
int gm_msg_send(int sock, const Gpumem__Envelope *env, const int *fds, size_t n_fds, size_t max_packet);

/* Unpacks one envelope from buf: a protobuf Envelope or a fixed-layout
 * packet (hotmsg.h, told apart by its first byte). -EBADMSG for bytes that
 * are not a valid envelope (or carry no body). Free the result with
 * gm_msg_free(). */
int gm_msg_unpack(const void *buf, size_t len, Gpumem__Envelope **ret_env);

/* Accepts NULL; returns NULL. */
Gpumem__Envelope *gm_msg_free(Gpumem__Envelope *env);
