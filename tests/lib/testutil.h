/* Test harness: real gpumemd processes on temporary sockets, raw protocol
 * connections for the tests that must speak (or break) the wire format. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>

#include "gpumem.pb-c.h"

typedef struct gm_test_daemon {
        pid_t pid;
        char dir[256];
        char socket_path[300];
        char log_path[300];
        char config_path[300];
        char extra_config[1024]; /* appended to the [daemon] section of its config file */
        bool keep_dir;           /* stop leaves the directory (for a restart) */
} gm_test_daemon_t;

/* The backend the integration suite runs on: $GPUMEM_TEST_BACKEND ("host" default, or "cuda"). */
const char *gm_test_backend(void);

/* Starts gpumemd with --capacity `capacity` plus extra args (NULL-terminated
 * list, may be NULL) and waits until its socket accepts connections. */
void gm_test_daemon_start(gm_test_daemon_t *d, const char *capacity, const char *const *extra_args);
/* The same with `config_text` appended to its configuration file's [daemon]
 * section (which may open further sections). */
void gm_test_daemon_start_config(gm_test_daemon_t *d, const char *capacity, const char *const *extra_args,
                                 const char *config_text);
/* Starts gpumemd again in d's existing directory (after a stop with keep_dir). */
void gm_test_daemon_launch(gm_test_daemon_t *d, const char *capacity, const char *const *extra_args);
/* SIGTERM, wait, and assert a clean exit (status 0). */
void gm_test_daemon_stop(gm_test_daemon_t *d);
/* Number of open fds of a process (/proc/PID/fd). */
int gm_test_count_fds(pid_t pid);

/* A raw protocol connection. */
int gm_test_raw_connect(const char *socket_path);
/* Sends Hello (admin or not) and asserts a HelloReply. */
void gm_test_raw_hello(int fd, bool admin);
/* The same with a client_name of the caller's choosing. */
void gm_test_raw_hello_named(int fd, bool admin, const char *client_name);
/* Sends Hello (resume_token may be NULL) and returns the reply, whatever it is. */
Gpumem__Envelope *gm_test_raw_hello_reply(int fd, bool admin, const char *client_name, const char *resume_token);
/* The same asking for a heap mode (a local one's statistics page fd is closed). */
Gpumem__Envelope *gm_test_raw_hello_mode(int fd, bool admin, const char *client_name, const char *resume_token,
                                         Gpumem__HeapMode heap_mode);
/* Sends env (request_id set by caller) and returns the next envelope with that
 * request id (skipping others), or NULL if the connection closed. */
Gpumem__Envelope *gm_test_raw_call(int fd, Gpumem__Envelope *env);
/* Receives one envelope; NULL when the connection is closed. fds received are closed. */
Gpumem__Envelope *gm_test_raw_recv(int fd);
/* The same, keeping the first fd the packet carries in *ret_fd (-1 if none;
 * the others are closed). */
Gpumem__Envelope *gm_test_raw_recv_fd(int fd, int *ret_fd);
/* Sends one request: `body` is the message of the oneof member `body_case` names. */
void gm_test_raw_send_body(int fd, uint64_t request_id, Gpumem__Envelope__BodyCase body_case, void *body);
/* The next envelope of kind `body_case` within 10 packets, each awaited at
 * most 5 s (fds it carries are closed). */
Gpumem__Envelope *gm_test_raw_await_body(int fd, Gpumem__Envelope__BodyCase body_case);
/* Frees block_id, trims, and acknowledges the release that follows without
 * unmapping anything. */
void gm_test_raw_acknowledge_mapped(int fd, uint64_t block_id);
/* The same, asserting that the daemon refuses the word (EBUSY, "still
 * mapped") and closes the connection. */
void gm_test_raw_lying_release(int fd, uint64_t block_id);
/* Awaits the daemon's refusal of a word that memory was unmapped (EBUSY,
 * "still mapped") and asserts the connection closed. */
void gm_test_raw_assert_caught(int fd);
/* Sends Hello for a local heap and asserts a local HelloReply. */
void gm_test_raw_hello_local(int fd);
/* A local session's Grant of one whole segment `size`: the reply (a
 * GrantReply or an Error), its fd in *ret_fd (-1 if none). */
Gpumem__Envelope *gm_test_raw_grant(int fd, uint64_t request_id, uint64_t segment_id, uint64_t size, int *ret_fd);
/* Returns that whole segment (ReturnPieces; no reply unless refused). */
void gm_test_raw_return(int fd, uint64_t request_id, uint64_t segment_id, uint64_t size);
/* The same, the last of a give-back a ReturnIntent began when `closes_intent`. */
void gm_test_raw_return_closing(int fd, uint64_t request_id, uint64_t segment_id, uint64_t size, bool closes_intent);
/* Sends a ReturnIntent and returns its reply (Ok, or an Error). */
Gpumem__Envelope *gm_test_raw_return_intent(int fd, uint64_t request_id);

/* A tenant's charged bytes (gpumemctl quota get), via an admin connection. */
uint64_t gm_test_tenant_charged(const char *socket_path, const char *tenant);
/* How many sessions `tenant` has, as the daemon counts them. */
uint32_t gm_test_tenant_sessions(const char *socket_path, const char *tenant);
/* One device-wide statistic via an admin connection. */
int64_t gm_test_device_stat(const char *socket_path, const char *name);
/* Polls gm_test_device_stat until it equals `want` or ~10 s pass; returns the last value. */
int64_t gm_test_wait_device_stat(const char *socket_path, const char *name, int64_t want);

/* Runs every test of `s`; the process's exit status (EXIT_FAILURE when one failed). */
int gm_test_run_suite(Suite *s);
/* Runs a shell command whose exit status does not matter (log dumps, cleanup). */
void gm_test_shell(const char *cmd);
/* Runs a command, captures stdout into buf; returns its exit status. */
int gm_test_run(char *buf, size_t buf_len, const char *const *argv);

/* A child process with a pipe to its stdin and one from its stdout. */
typedef struct gm_test_proc {
        pid_t pid;
        int stdin_fd;
        int stdout_fd;
} gm_test_proc_t;

/* Starts argv (argv[0] a path); as `uid` through setpriv unless uid is 0. */
void gm_test_spawn(const char *const *argv, uid_t uid, gm_test_proc_t *ret);
/* Reads one line of the child's stdout (without the newline); false at EOF. */
bool gm_test_proc_read_line(gm_test_proc_t *p, char *buf, size_t len);
/* Closes its stdin, waits, returns the exit status (128+signal if killed). */
int gm_test_proc_finish(gm_test_proc_t *p);
/* gm_test_run as another user. */
int gm_test_run_as(char *buf, size_t buf_len, uid_t uid, const char *const *argv);

/* SIGSTOP, then waits until every thread of pid is stopped: kill() returns
 * before the group stop reaches the threads, and until it does libgpumem's
 * service thread still answers the daemon (it would give the cache back). */
void gm_test_stop_process(pid_t pid);

/* Runs one test case in this process (no fork: an attacker child's own
 * checks), `timeout_s` its limit; EXIT_SUCCESS when it passed. */
int gm_test_run_in_process(const TTest *test, int timeout_s);

/* How often `what` occurs in `text` (not overlapping). */
size_t gm_test_count(const char *text, const char *what);
/* This process's statistics page (its writable mapping of the daemon's
 * memfd, found in /proc/self/maps), NULL without a local session. */
void *gm_test_own_stats_page(void);
/* The bytes `gpumemctl clients --json` (gpumemctl: its path) books in pool
 * `tag` ("" the default) for process `pid`'s session; -1: no such process. */
int64_t gm_test_client_tag_bytes(const char *gpumemctl, const char *socket_path, pid_t pid, const char *tag);

/* Fills / verifies a pattern derived from seed. */
void gm_test_fill(void *p, size_t n, uint64_t seed);
bool gm_test_verify(const void *p, size_t n, uint64_t seed);
/* The offset of the first byte of [p, +n) that is not 0, or n when all are
 * (fresh memory); on the emulator's device memory only whether one is not,
 * by an emulated kernel: then 0 for "some byte", n for "none". */
size_t gm_test_first_nonzero(const void *p, size_t n);
