/* cgt_assert.h — the library's one vocabulary of assertions.
 * (Not "assert.h": lib/ is on the include path, and <assert.h> must stay the C library's.)
 *
 * Three tiers, as in mimalloc, chosen by CGT_DEBUG (0 with NDEBUG, else 1 by
 * default; a build may define 2 or 3):
 *
 *   cgt_assert(x)            cheap preconditions; CGT_DEBUG >= 1
 *   cgt_assert_internal(x)   checks inside the algorithms; CGT_DEBUG >= 2
 *   cgt_assert_expensive(x)  whole-structure walks; CGT_DEBUG >= 3
 *
 * and, as in SQLite, defensive conditions for what cannot happen unless a
 * contract is broken: `if (NEVER(x)) return error;` and
 * `if (ALWAYS(x)) ...`. In debug builds (buildtype=debug, CGT_DEBUG_CHECKS)
 * a broken one stops the program on the spot; in every other build
 * (debugoptimized, the default, and release) they are the plain condition, so
 * the library refuses the operation with an error instead of corrupting the
 * tree or aborting the host program.
 *
 * The invariant checkers (tree__check, pool_check) are separate: tests call
 * them, and buildtype=debug (CGT_DEBUG_CHECKS) calls them after every state
 * change.
 */
#ifndef CGT_ASSERT_H
#define CGT_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#ifndef CGT_DEBUG
#ifdef NDEBUG
#define CGT_DEBUG 0
#else
#define CGT_DEBUG 1
#endif
#endif

#if defined(__GNUC__)
__attribute__((noreturn, cold))
#endif
static inline void
cgt_assert_fail(const char *what, const char *file, int line) {
  fprintf(stderr, "cgtree: assertion failed: %s (%s:%d)\n", what, file, line);
  abort();
}

#if CGT_DEBUG >= 1
#define cgt_assert(x) ((x) ? (void)0 : cgt_assert_fail(#x, __FILE__, __LINE__))
#else
#define cgt_assert(x) ((void)sizeof(!(x))) /* compiled, never run: what it names stays used */
#endif
#ifdef CGT_DEBUG_CHECKS
#define NEVER(x) ((x) ? (cgt_assert_fail("NEVER(" #x ")", __FILE__, __LINE__), 1) : 0)
#define ALWAYS(x) ((x) ? 1 : (cgt_assert_fail("ALWAYS(" #x ")", __FILE__, __LINE__), 0))
#else
#define NEVER(x) (__builtin_expect(!!(x), 0))
#define ALWAYS(x) (__builtin_expect(!!(x), 1))
#endif
#if CGT_DEBUG >= 2
#define cgt_assert_internal(x) cgt_assert(x)
#else
#define cgt_assert_internal(x) ((void)0)
#endif
#if CGT_DEBUG >= 3
#define cgt_assert_expensive(x) cgt_assert(x)
#else
#define cgt_assert_expensive(x) ((void)0)
#endif

#endif /* CGT_ASSERT_H */
