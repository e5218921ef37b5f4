/* Intrusive AVL tree ordered by a three-word key: the free-block and unmapped
 * sets of the caching allocator. Every operation is O(log n) (the tree height
 * is < 1.45 log2 n). Each node also keeps the
 * largest key[1] of its subtree so the largest free block is O(1). Insert and
 * remove walk down iteratively and retrace only as far up as a subtree's
 * height or maximum changed. */
#include <stdbool.h>
#include <stddef.h>

#include "debug.h"
#include "heap-internal.h"

static int key_cmp(const uint64_t a[3], const uint64_t b[3]) {
        for (int i = 0; i < 3; i++)
                if (a[i] != b[i])
                        return a[i] < b[i] ? -1 : 1;
        return 0;
}

/* a < b; the hot paths' comparison (keys of distinct nodes always differ). */
static bool key_less(const uint64_t a[3], const uint64_t b[3]) {
        if (a[0] != b[0])
                return a[0] < b[0];
        if (a[1] != b[1])
                return a[1] < b[1];
        return a[2] < b[2];
}

static int height(const gm_tnode_t *n) {
        return n ? n->height : 0;
}

static uint64_t max_key1(const gm_tnode_t *n) {
        return n ? n->max_key1 : 0;
}

static void update(gm_tnode_t *n) {
        int hl = height(n->left), hr = height(n->right);
        uint64_t m = n->key[1];

        n->height = 1 + (hl > hr ? hl : hr);
        if (max_key1(n->left) > m)
                m = max_key1(n->left);
        if (max_key1(n->right) > m)
                m = max_key1(n->right);
        n->max_key1 = m;
}

static gm_tnode_t *rotate_right(gm_tnode_t *n) {
        gm_tnode_t *l = n->left;

        n->left = l->right;
        l->right = n;
        update(n);
        update(l);
        return l;
}

static gm_tnode_t *rotate_left(gm_tnode_t *n) {
        gm_tnode_t *r = n->right;

        n->right = r->left;
        r->left = n;
        update(n);
        update(r);
        return r;
}

/* Restores the AVL balance at `n` after one of its subtrees changed by one. */
static gm_tnode_t *rebalance(gm_tnode_t *n) {
        int bal;

        update(n);
        bal = height(n->left) - height(n->right);
        if (bal > 1) {
                if (height(n->left->left) < height(n->left->right))
                        n->left = rotate_left(n->left);
                return rotate_right(n);
        }
        if (bal < -1) {
                if (height(n->right->right) < height(n->right->left))
                        n->right = rotate_right(n->right);
                return rotate_left(n);
        }
        return n;
}

/* The links (the root or a child pointer) from the root down to a change;
 * an AVL tree of 2^64 nodes is less than 93 high. */
#define MAX_DEPTH 96

/* Rebalances and refreshes the nodes under links[depth-1] up to links[0], and
 * stops at the first one whose subtree kept its height and maximum (nothing
 * above it can change then). The node at index `floor` is the exception: its
 * stored figures are not those of its subtree before the change (a removed
 * node's successor took them over), so an unchanged subtree below it skips
 * on to it, and only one at or above it stops the walk. */
static void retrace(gm_tnode_t **links[], int depth, int floor) {
        for (int i = depth - 1; i >= 0; i--) {
                gm_tnode_t *n = *links[i], *sub;
                int old_height = n->height;
                uint64_t old_max = n->max_key1;

                sub = rebalance(n);
                *links[i] = sub;
                if (sub->height != old_height || sub->max_key1 != old_max)
                        continue;
                if (i <= floor)
                        return;
                i = floor + 1; /* on at `floor`, whose figures are stale */
        }
}

void gm_tree_insert(gm_tnode_t **root, gm_tnode_t *n) {
        gm_tnode_t **links[MAX_DEPTH], **link = root;
        int depth = 0;

        n->left = n->right = NULL;
        n->height = 1;
        n->max_key1 = n->key[1];
        while (*link) {
                gm_dassert(depth < MAX_DEPTH); /* keys are unique: gm_tree_check() */
                links[depth++] = link;
                link = key_less(n->key, (*link)->key) ? &(*link)->left : &(*link)->right;
        }
        *link = n;
        retrace(links, depth, depth);
}

void gm_tree_remove(gm_tnode_t **root, gm_tnode_t *n) {
        gm_tnode_t **links[MAX_DEPTH], **link = root;
        int depth = 0, floor;

        while (*link != n) {
                gm_dassert(*link && depth < MAX_DEPTH); /* n is in the tree */
                links[depth++] = link;
                link = key_less(n->key, (*link)->key) ? &(*link)->left : &(*link)->right;
        }
        floor = depth;
        if (!n->left || !n->right)
                *link = n->left ? n->left : n->right;
        else {
                /* the successor, the minimum of the right subtree, takes n's place */
                gm_tnode_t **to_succ = &n->right, *succ;

                links[depth++] = link;
                while ((*to_succ)->left) {
                        gm_dassert(depth < MAX_DEPTH);
                        links[depth++] = to_succ;
                        to_succ = &(*to_succ)->left;
                }
                succ = *to_succ;
                *to_succ = succ->right;
                succ->left = n->left;
                succ->right = n->right;
                succ->height = n->height;
                succ->max_key1 = n->max_key1;
                *link = succ;
                if (depth > floor + 1)
                        links[floor + 1] = &succ->right; /* was n's own field */
        }
        retrace(links, depth, floor);
        n->left = n->right = NULL;
}

gm_tnode_t *gm_tree_lower_bound(gm_tnode_t *root, const uint64_t k[3]) {
        gm_tnode_t *best = NULL;

        while (root) {
                if (!key_less(root->key, k)) {
                        best = root;
                        root = root->left;
                } else
                        root = root->right;
        }
        return best;
}

gm_tnode_t *gm_tree_next(gm_tnode_t *root, const uint64_t k[3]) {
        gm_tnode_t *best = NULL;

        while (root) {
                if (key_less(k, root->key)) {
                        best = root;
                        root = root->left;
                } else
                        root = root->right;
        }
        return best;
}

gm_tnode_t *gm_tree_prev(gm_tnode_t *root, const uint64_t k[3]) {
        gm_tnode_t *best = NULL;

        while (root) {
                if (key_less(root->key, k)) {
                        best = root;
                        root = root->right;
                } else
                        root = root->left;
        }
        return best;
}

/* Checks the subtree against the open key interval (lo, hi) (NULL = unbounded). */
static int check_at(const gm_tnode_t *n, const uint64_t *lo, const uint64_t *hi, uint64_t *count) {
        int bad = 0, hl, hr;
        uint64_t m;

        if (!n)
                return 0;
        (*count)++;
        if ((lo && key_cmp(n->key, lo) <= 0) || (hi && key_cmp(n->key, hi) >= 0))
                bad++;
        bad += check_at(n->left, lo, n->key, count);
        bad += check_at(n->right, n->key, hi, count);
        hl = height(n->left);
        hr = height(n->right);
        if (n->height != 1 + (hl > hr ? hl : hr) || hl - hr > 1 || hr - hl > 1)
                bad++;
        m = n->key[1];
        if (max_key1(n->left) > m)
                m = max_key1(n->left);
        if (max_key1(n->right) > m)
                m = max_key1(n->right);
        if (n->max_key1 != m)
                bad++;
        return bad;
}

int gm_tree_check(const gm_tnode_t *root, uint64_t *ret_count) {
        uint64_t count = 0;
        int bad = check_at(root, NULL, NULL, &count);

        *ret_count = count;
        return bad;
}
