/* gpumemctl's connection to the daemon, shared by its command files
 * (gpumemctl.c, gpumemctl_top.c, gpumemctl_shared.c) over ctl.c: one libgpumem control connection
 * (gpumem/admin.h), whose failures become gpumemctl's messages and exit codes. */
#pragma once

#include <gpumem/admin.h>

enum { EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

/* Commands parse all their arguments before they reach the daemon: the first
 * request connects (ctl_connect), so a usage error is one with no daemon too. */
typedef struct ctl {
        const char *socket_path; /* the daemon to reach: this socket, else */
        int device;              /* GPU's (-1: the default socket) */
        gpumem_admin *admin;     /* NULL until connected */
} ctl_t;

/* Connects and says hello, unless connected already; 0 or an exit code (the
 * reason printed). */
int ctl_connect(ctl_t *c);
/* Prints why a call on c->admin failed (r: its return) and returns the exit
 * code: EXIT_UNREACHABLE for a daemon not reached or lost, else EXIT_REFUSED. */
int ctl_failed(const ctl_t *c, int r);
/* Milliseconds as "12s", "5m", "3h" (whole units, rounded down); returns buf. */
const char *ctl_fmt_age(uint64_t ms, char *buf, size_t len);

/* gpumemctl_top.c */
int cmd_diagnose(ctl_t *c, int argc, char **argv);
int cmd_top(ctl_t *c, int argc, char **argv);
int cmd_status(ctl_t *c, int argc, char **argv);

/* gpumemctl_shared.c */
int cmd_shared(ctl_t *c, int argc, char **argv);
