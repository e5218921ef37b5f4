/* Intrusive AVL tree ordered by a three-word key: the free-block and unmapped
 * sets of the caching allocator. Every operation is O(log n); recursion depth
 * is bounded by the tree height (< 1.45 log2 n). Each node also keeps the
 * largest key[1] of its subtree so the largest free block is O(1). */
#include <stddef.h>

#include "debug.h"
#include "heap-internal.h"

static int key_cmp(const uint64_t a[3], const uint64_t b[3]) {
        for (int i = 0; i < 3; i++)
                if (a[i] != b[i])
                        return a[i] < b[i] ? -1 : 1;
        return 0;
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

static gm_tnode_t *insert_at(gm_tnode_t *root, gm_tnode_t *n) {
        int c;

        if (!root)
                return n;
        c = key_cmp(n->key, root->key);
        gm_dassert(c != 0); /* keys are unique */
        if (c < 0)
                root->left = insert_at(root->left, n);
        else
                root->right = insert_at(root->right, n);
        return rebalance(root);
}

void gm_tree_insert(gm_tnode_t **root, gm_tnode_t *n) {
        n->left = n->right = NULL;
        n->height = 1;
        n->max_key1 = n->key[1];
        *root = insert_at(*root, n);
}

/* Detaches the minimum of `root` into *ret_min; returns the new subtree. */
static gm_tnode_t *remove_min(gm_tnode_t *root, gm_tnode_t **ret_min) {
        if (!root->left) {
                *ret_min = root;
                return root->right;
        }
        root->left = remove_min(root->left, ret_min);
        return rebalance(root);
}

static gm_tnode_t *remove_at(gm_tnode_t *root, const gm_tnode_t *n) {
        gm_tnode_t *succ;
        int c;

        c = key_cmp(n->key, root->key);
        if (c < 0)
                root->left = remove_at(root->left, n);
        else if (c > 0)
                root->right = remove_at(root->right, n);
        else {
                gm_dassert(root == n); /* the node under n's key is n itself */
                if (!root->left)
                        return root->right;
                if (!root->right)
                        return root->left;
                root->right = remove_min(root->right, &succ);
                succ->left = root->left;
                succ->right = root->right;
                return rebalance(succ);
        }
        return rebalance(root);
}

void gm_tree_remove(gm_tnode_t **root, gm_tnode_t *n) {
        *root = remove_at(*root, n);
        n->left = n->right = NULL;
}

gm_tnode_t *gm_tree_lower_bound(gm_tnode_t *root, const uint64_t k[3]) {
        gm_tnode_t *best = NULL;

        while (root) {
                if (key_cmp(root->key, k) >= 0) {
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
                if (key_cmp(root->key, k) > 0) {
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
                if (key_cmp(root->key, k) < 0) {
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
