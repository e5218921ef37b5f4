/* A memory kind's capabilities: one record per kind (host, cuda), shared by
 * both halves of the kind (backend.h for the daemon, mapper.h for clients)
 * and sent to every client in HelloReply.caps. Code outside backend/ asks
 * these, never the kind's name. */
#pragma once
#include <stdbool.h>

typedef struct gm_kind_caps {
        /* Work on the memory is queued on device streams and finishes later:
         * a free is done only once its stream passes it (stream fences), and
         * memory is unmapped only after a sync. False: a free is done when
         * the client sends it. */
        bool device_streams;
        /* A mapped pointer is ordinary CPU memory the process may touch. */
        bool cpu_accessible;
} gm_kind_caps_t;

extern const gm_kind_caps_t gm_kind_host_caps;
extern const gm_kind_caps_t gm_kind_cuda_caps;
