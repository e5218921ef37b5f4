/* Issue #25, "nobody in where they don't belong, part two": each attack a
 * hostile local user tried, run as a separate process of another uid (this
 * binary again, through setpriv, with the attack's name as its first
 * argument), and what the daemon must do about it. Needs root (to act as
 * other uids); reports and skips otherwise. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "msg.h"
#include "testutil.h"

#define ATTACKER 65534

static void sleep_ms(unsigned ms) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
}

/* ---- the attacks (run as ATTACKER; exit 0 when carried out) ---- */

/* A local session stops reading, then names a piece it was never granted:
 * the refusal's send fails and closes the connection inside the handler. */
static int attack_move_unknown_piece(const char *socket_path) {
        int fd = gm_test_raw_connect(socket_path);
        gm_test_raw_hello_local(fd);
        if (shutdown(fd, SHUT_RD) < 0)
                return 2;
        Gpumem__PageMove move = GPUMEM__PAGE_MOVE__INIT;
        move.from_segment_id = 77;
        move.to_segment_id = 78;
        move.to_segment_va_size = 2 << 20;
        move.length = 2 << 20;
        Gpumem__PageMove *moves[] = {&move};
        Gpumem__MovePieces mp = GPUMEM__MOVE_PIECES__INIT;
        mp.n_moves = 1;
        mp.moves = moves;
        gm_test_raw_send_body(fd, 2, GPUMEM__ENVELOPE__BODY_MOVE_PIECES, &mp);
        sleep_ms(300); /* the daemon handles it while this end is still open */
        close(fd);
        return 0;
}

static const char *attack_name, *attack_socket;

/* The testutil helpers assert with check: an attack runs as a test of its own. */
START_TEST(test_attack) {
        int r = 64;
        if (strcmp(attack_name, "move-unknown-piece") == 0)
                r = attack_move_unknown_piece(attack_socket);
        ck_assert_msg(r == 0, "attack %s: %d", attack_name, r);
}
END_TEST

static int attack_main(int argc, char **argv) {
        if (argc < 3)
                return 64;
        attack_name = argv[1];
        attack_socket = argv[2];
        Suite *s = suite_create("attack");
        TCase *tc = tcase_create("attack");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_attack);
        suite_add_tcase(s, tc);
        SRunner *sr = srunner_create(s);
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Runs attack `name` against d as ATTACKER; asserts it was carried out. */
static void run_attack(const gm_test_daemon_t *d, const char *name) {
        char out[4096];
        const char *argv[] = {SECURITY_BIN, name, d->socket_path, NULL};
        int status = gm_test_run_as(out, sizeof(out), ATTACKER, argv);
        ck_assert_msg(status == 0, "attack %s exited %d: %s", name, status, out);
}

/* The daemon is still running and serves a new session. */
static void assert_daemon_serves(const gm_test_daemon_t *d) {
        int status;
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid) {
                char cmd[400];
                snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", d->log_path);
                gm_test_shell(cmd);
        }
        ck_assert_msg(r == 0, "gpumemd died (status %d)", status);
        int fd = gm_test_raw_connect(d->socket_path);
        gm_test_raw_hello(fd, false);
        close(fd);
}

/* ---- 1: a handler never sees its connection's state freed ---- */

START_TEST(test_refusal_to_hung_up_local_session) {
        gm_test_daemon_t d;
        gm_test_daemon_start(&d, "64M", NULL);
        for (int i = 0; i < 3; i++) {
                run_attack(&d, "move-unknown-piece");
                assert_daemon_serves(&d);
        }
        gm_test_daemon_stop(&d);
}
END_TEST

static Suite *security_suite(void) {
        Suite *s = suite_create("security");
        TCase *conn = tcase_create("connections");
        tcase_set_timeout(conn, 60);
        tcase_add_test(conn, test_refusal_to_hung_up_local_session);
        suite_add_tcase(s, conn);
        return s;
}

int main(int argc, char **argv) {
        if (argc > 1)
                return attack_main(argc, argv);
        if (geteuid() != 0) {
                fprintf(stderr, "test_security: needs root to act as other users\n");
                return getenv("CI") ? EXIT_FAILURE : 77;
        }
        return gm_test_run_suite(security_suite());
}
