/* The free set's AVL tree on its own (allocator/freeset.c): random inserts
 * and removes, nodes with two children included, checked after every step
 * against gm_tree_check() (order, heights, balance, subtree maxima, which the
 * early-stopping retrace must keep exact) and lookups against a brute force. */
#include <check.h>
#include <stdlib.h>

#include "heap-internal.h"

#define N_NODES 600

static gm_tnode_t nodes[N_NODES];
static bool in_tree[N_NODES];

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static int key_cmp3(const uint64_t a[3], const uint64_t b[3]) {
        for (int i = 0; i < 3; i++)
                if (a[i] != b[i])
                        return a[i] < b[i] ? -1 : 1;
        return 0;
}

/* The brute-force lower bound and the largest key[1] of the nodes in the tree. */
static gm_tnode_t *brute_lower_bound(const uint64_t k[3], uint64_t *ret_max) {
        gm_tnode_t *best = NULL;
        uint64_t max = 0;

        for (int i = 0; i < N_NODES; i++) {
                if (!in_tree[i])
                        continue;
                if (nodes[i].key[1] > max)
                        max = nodes[i].key[1];
                if (key_cmp3(nodes[i].key, k) >= 0 && (!best || key_cmp3(nodes[i].key, best->key) < 0))
                        best = &nodes[i];
        }
        *ret_max = max;
        return best;
}

START_TEST(test_random_inserts_and_removes) {
        gm_tnode_t *root = NULL;
        uint64_t count, live = 0, max;

        for (int i = 0; i < N_NODES; i++) {
                /* few streams; half the sizes from a few values (equal key[1] common), half
                 * from many (a removed node often holds its subtree's only maximum) */
                nodes[i].key[0] = rnd() % 3;
                nodes[i].key[1] = 512 * (1 + rnd() % (i % 2 ? 16 : 4096));
                nodes[i].key[2] = 4096 * (uint64_t) i;
        }
        for (int step = 0; step < 20000; step++) {
                int i = (int) (rnd() % N_NODES);
                uint64_t k[3] = {rnd() % 3, 512 * (rnd() % (step % 2 ? 18 : 4098)), 0};
                gm_tnode_t *want;

                if (in_tree[i]) {
                        gm_tree_remove(&root, &nodes[i]);
                        live--;
                } else {
                        gm_tree_insert(&root, &nodes[i]);
                        live++;
                }
                in_tree[i] = !in_tree[i];
                ck_assert_int_eq(gm_tree_check(root, &count), 0);
                ck_assert_uint_eq(count, live);
                want = brute_lower_bound(k, &max);
                ck_assert_ptr_eq(gm_tree_lower_bound(root, k), want);
                ck_assert_uint_eq(root ? root->max_key1 : 0, max);
        }
}
END_TEST

int main(void) {
        Suite *s = suite_create("freeset");
        TCase *tc = tcase_create("core");
        SRunner *sr;
        int failed;

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_random_inserts_and_removes);
        suite_add_tcase(s, tc);
        sr = srunner_create(s);
        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
