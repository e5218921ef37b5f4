/* gpumemctl's connection to the daemon, shared by its command files
 * (gpumemctl.c, gpumemctl_top.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "gpumem.pb-c.h"

enum { EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

/* Commands parse all their arguments before they reach the daemon: the first
 * request connects (ctl_connect), so a usage error is one with no daemon too. */
typedef struct ctl {
        const char *socket_path; /* the daemon to reach: this socket, else */
        int device;              /* GPU's (-1: the default socket); after connecting, the daemon's own */
        int fd;                  /* -1 until connected */
        uint32_t max_packet;
        uint64_t next_id;
        char backend[16];
        char tenant[64];
        bool admin; /* the daemon grants this connection admin rights */
} ctl_t;

/* Connects and says hello, unless connected already; 0 or an exit code. */
int ctl_connect(ctl_t *c);
/* Sends a request (connecting first) and returns its reply (and, if ret_fd is not NULL, the first
 * fd it carried, or -1); an Error reply is printed and turned into
 * EXIT_REFUSED. Returns 0 or an exit code. */
int ctl_call_fd(ctl_t *c, Gpumem__Envelope *env, Gpumem__Envelope **ret_reply, int *ret_fd);
/* Sends a request whose reply must have body `want`; prints and maps refusals. */
int ctl_expect(ctl_t *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want, Gpumem__Envelope **ret_reply);

/* gpumemctl_top.c */
int cmd_diagnose(ctl_t *c, int argc, char **argv);
int cmd_top(ctl_t *c, int argc, char **argv);
int cmd_status(ctl_t *c, int argc, char **argv);
