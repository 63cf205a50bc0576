/* tree_hooks.h — test hooks of the tree, for the library's own tests.
 *
 * Not installed and not part of the contract. Tests link the static library
 * and include this header to reach failures that a CPU-only machine cannot
 * produce on demand, such as the host running out of memory in the middle of
 * a run.
 */
#ifndef CGT_TREE_HOOKS_H
#define CGT_TREE_HOOKS_H

#include "cgtree.h"

/* Host allocation failure injection for the whole tree: the tree's own
 * allocations, those uthash makes for it, and those of every pool it has or
 * makes later all count. The next n host allocations succeed and the one
 * after fails; with once = 1 the hook then turns itself off (so a failing
 * run's own clean-up still gets memory), with once = 0 every later one fails
 * too. n < 0 turns the hook off. NULL t is a no-op. */
void cgt__fail_host_alloc_after(cgt_tree *t, long long n, int once);

/* Host allocations the hook has failed since cgt__fail_host_alloc_after
 * armed it (0 after a run that needed no more than n allocations). */
long long cgt__host_alloc_failures(const cgt_tree *t);

/* "cgt_tree_destroy frees every graph, node, value and pool chunk": on the
 * simulator, whose device knows what it still holds, destroy writes into
 * out (cap bytes) what the device had to free itself when the tree closed
 * (allocations, graphs, executables, an open capture), or "" when the tree
 * had given everything back first. On another backend out is left as it
 * was. NULL t is a no-op; cap 0 turns the hook off. */
void cgt__leftovers_to(cgt_tree *t, char *out, size_t cap);

#endif /* CGT_TREE_HOOKS_H */
