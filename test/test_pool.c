/* test_pool.c — the checkpointable pool allocator, on host memory.
 *
 * Chunks come from a test source backed by aligned_alloc that can be told to
 * run out of room (a byte budget) or to fail on its n-th call, and the pool's
 * own host allocations can be made to fail through pool__fail_host_alloc_after.
 * Every scenario ends with pool_check and with the source having got every
 * chunk back. The last test is a randomized property test that checks the
 * pool against a model of which byte ranges are owned.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pool.h"

/* ------------------------------------------------------- test source */

typedef struct source_chunk {
  char *base;
  size_t bytes;
} source_chunk;

/* With an arena, chunks are carved from one aligned_alloc'd block, from its
 * bottom or its top as a hash of the call number decides, instead of coming
 * from aligned_alloc one by one. Their addresses are then a function of the
 * call sequence alone, so a seed of the property test replays exactly, and
 * they come in no monotonic order, which exercises the pool's sorted chunks. */
typedef struct test_source {
  char *arena;
  size_t arena_lo, arena_hi; /* the free middle of the arena */
  size_t budget;       /* live bytes the source may hand out */
  size_t live_bytes;
  size_t calls;        /* alloc calls so far */
  size_t fail_on_call; /* 1-based call number that fails; 0: none */
  source_chunk *chunks; /* live chunks */
  size_t n_chunks, cap_chunks;
} test_source;

static cgt_status source_alloc(void *ctx, size_t bytes, void **ptr) {
  test_source *s = ctx;
  void *mem;
  s->calls++;
  if (s->fail_on_call && s->calls == s->fail_on_call) return CGT_ERR_OUT_OF_MEMORY;
  if (bytes > s->budget - s->live_bytes) return CGT_ERR_OUT_OF_MEMORY;
  if (s->n_chunks == s->cap_chunks) {
    size_t cap = s->cap_chunks ? 2 * s->cap_chunks : 16;
    source_chunk *grown = realloc(s->chunks, cap * sizeof *grown);
    if (!grown) return CGT_ERR_OUT_OF_MEMORY;
    s->chunks = grown;
    s->cap_chunks = cap;
  }
  if (s->arena) {
    if (bytes > s->arena_hi - s->arena_lo) return CGT_ERR_OUT_OF_MEMORY;
    if ((s->calls * 0x9e3779b97f4a7c15ull) >> 63) {
      mem = s->arena + s->arena_lo;
      s->arena_lo += bytes;
    } else {
      s->arena_hi -= bytes;
      mem = s->arena + s->arena_hi;
    }
  } else {
    mem = aligned_alloc(POOL_ALIGN, bytes);
    if (!mem) return CGT_ERR_OUT_OF_MEMORY;
  }
  s->chunks[s->n_chunks].base = mem;
  s->chunks[s->n_chunks].bytes = bytes;
  s->n_chunks++;
  s->live_bytes += bytes;
  *ptr = mem;
  return CGT_OK;
}

static void source_free(void *ctx, void *ptr, size_t freed_bytes) {
  test_source *s = ctx;
  size_t i;
  for (i = 0; i < s->n_chunks; i++) {
    if (s->chunks[i].base == ptr) {
      size_t bytes = s->chunks[i].bytes;
      if (freed_bytes != bytes)
        fail_msg("source_free of %p names %zu bytes; the source handed out %zu", ptr, freed_bytes, bytes);
      s->live_bytes -= bytes;
      s->chunks[i] = s->chunks[--s->n_chunks];
      if (!s->arena) {
        free(ptr);
      } else if ((char *)ptr + bytes == s->arena + s->arena_lo) {
        s->arena_lo -= bytes; /* the most recent from the bottom: take it back */
      } else if ((char *)ptr == s->arena + s->arena_hi) {
        s->arena_hi += bytes;
      }
      return;
    }
  }
  fail_msg("source_free of %p, which the source never handed out", ptr);
}

/* 1 if [base, base+bytes) lies inside one live chunk of the source. */
static int source_owns(const test_source *s, const void *base, size_t bytes) {
  size_t i;
  for (i = 0; i < s->n_chunks; i++) {
    uintptr_t lo = (uintptr_t)s->chunks[i].base, p = (uintptr_t)base;
    if (p >= lo && p - lo <= s->chunks[i].bytes && bytes <= s->chunks[i].bytes - (p - lo)) return 1;
  }
  return 0;
}

/* --------------------------------------------------------- fixture */

typedef struct fixture {
  test_source src;
  pool *p;
} fixture;

static pool *make_pool(fixture *f, size_t chunk_bytes) {
  pool_source ps;
  ps.alloc = source_alloc;
  ps.free = source_free;
  ps.ctx = &f->src;
  assert_int_equal(pool_create(&ps, chunk_bytes, &f->p), CGT_OK);
  return f->p;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  f->src.budget = (size_t)1 << 30;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  char why[256];
  int ok = 1;
  if (f->p && !pool_check(f->p, why, sizeof why)) {
    print_error("pool_check at teardown: %s\n", why);
    ok = 0;
  }
  pool_destroy(f->p);
  if (f->src.n_chunks != 0) {
    print_error("pool_destroy left %zu chunks with the source\n", f->src.n_chunks);
    ok = 0;
  }
  free(f->src.chunks);
  free(f);
  return ok ? 0 : -1;
}

#define CHECK(p)                                                  \
  do {                                                            \
    char check_why_[256];                                         \
    if (!pool_check((p), check_why_, sizeof check_why_))          \
      fail_msg("pool_check: %s", check_why_);                     \
  } while (0)

static pool_stats stats_of(const pool *p) {
  pool_stats s;
  pool_get_stats(p, &s);
  return s;
}

/* Everything but host_allocs, which counts attempts and so moves even when
 * a failed call leaves the pool as it was. */
#define ASSERT_SAME_LAYOUT_STATS(a, b)                      \
  do {                                                      \
    assert_int_equal((a).reserved_bytes, (b).reserved_bytes); \
    assert_int_equal((a).allocated_bytes, (b).allocated_bytes); \
    assert_int_equal((a).peak_bytes, (b).peak_bytes);       \
    assert_int_equal((a).chunks, (b).chunks);               \
    assert_int_equal((a).blocks, (b).blocks);               \
  } while (0)

static void *alloc_ok(pool *p, size_t bytes) {
  void *ptr = NULL;
  assert_int_equal(pool_alloc(p, bytes, &ptr), CGT_OK);
  assert_non_null(ptr);
  assert_int_equal((uintptr_t)ptr % POOL_ALIGN, 0);
  return ptr;
}

static pool_checkpoint *take(pool *p) {
  pool_checkpoint *c = NULL;
  assert_int_equal(pool_checkpoint_take(p, &c), CGT_OK);
  assert_non_null(c);
  return c;
}

/* ------------------------------------------------- allocation basics */

static void test_alloc_returns_256_byte_aligned_blocks_of_rounded_size(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 64 * 1024);
  static const size_t sizes[] = {1, 255, 256, 257, 511, 512, 1000, 4096, 4097};
  size_t i;
  for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char *ptr = alloc_ok(p, sizes[i]);
    size_t rounded = (sizes[i] + 255) / 256 * 256;
    void *base = NULL;
    size_t bytes = 0;
    assert_int_equal(pool_block_bytes(p, ptr), rounded);
    assert_true(source_owns(&f->src, ptr, rounded));
    assert_true(pool_find(p, ptr + rounded - 1, &base, &bytes));
    assert_ptr_equal(base, ptr);
    assert_int_equal(bytes, rounded);
    assert_int_equal(pool_block_bytes(p, ptr + 1), 0);
    CHECK(p);
  }
  assert_int_equal(stats_of(p).chunks, 1);
}

static void test_alloc_splits_a_free_block_and_leaves_the_rest_free(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a = alloc_ok(p, 256);
  char *b;
  pool_stats s = stats_of(p);
  assert_ptr_equal(a, f->src.chunks[0].base);
  assert_int_equal(s.blocks, 2);
  assert_int_equal(s.allocated_bytes, 256);
  b = alloc_ok(p, 300);
  assert_ptr_equal(b, a + 256);
  assert_int_equal(stats_of(p).blocks, 3);
  assert_false(pool_find(p, b + 512, NULL, NULL)); /* the free rest */
  CHECK(p);
}

static void test_alloc_of_a_whole_free_block_does_not_split(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 1024);
  alloc_ok(p, 1024);
  assert_int_equal(stats_of(p).blocks, 1);
  assert_int_equal(stats_of(p).allocated_bytes, 1024);
  CHECK(p);
}

/* Four neighbours a b c d filling the front of a chunk, then the free tail. */
static void four_blocks(pool *p, char **a, char **b, char **c, char **d) {
  *a = alloc_ok(p, 256);
  *b = alloc_ok(p, 256);
  *c = alloc_ok(p, 256);
  *d = alloc_ok(p, 256);
  assert_ptr_equal(*b, *a + 256);
  assert_ptr_equal(*c, *b + 256);
  assert_ptr_equal(*d, *c + 256);
  assert_int_equal(stats_of(p).blocks, 5);
}

static void test_free_merges_with_a_free_left_neighbour(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a, *b, *c, *d;
  four_blocks(p, &a, &b, &c, &d);
  assert_int_equal(pool_free(p, b), CGT_OK);
  assert_int_equal(stats_of(p).blocks, 5);
  assert_int_equal(pool_free(p, c), CGT_OK);
  assert_int_equal(stats_of(p).blocks, 4); /* b+c is one hole */
  CHECK(p);
  assert_ptr_equal(alloc_ok(p, 512), b); /* the hole fits exactly */
  assert_int_equal(stats_of(p).blocks, 4);
  CHECK(p);
}

static void test_free_merges_with_a_free_right_neighbour(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a, *b, *c, *d;
  four_blocks(p, &a, &b, &c, &d);
  assert_int_equal(pool_free(p, c), CGT_OK);
  assert_int_equal(pool_free(p, b), CGT_OK);
  assert_int_equal(stats_of(p).blocks, 4);
  CHECK(p);
  assert_ptr_equal(alloc_ok(p, 512), b);
  /* d merges with the free tail on its right. */
  assert_int_equal(pool_free(p, d), CGT_OK);
  assert_int_equal(stats_of(p).blocks, 3);
  CHECK(p);
}

static void test_free_merges_with_both_free_neighbours(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a, *b, *c, *d;
  four_blocks(p, &a, &b, &c, &d);
  assert_int_equal(pool_free(p, a), CGT_OK);
  assert_int_equal(pool_free(p, c), CGT_OK);
  assert_int_equal(stats_of(p).blocks, 5);
  assert_int_equal(pool_free(p, b), CGT_OK); /* a+b+c */
  assert_int_equal(stats_of(p).blocks, 3);
  CHECK(p);
  assert_int_equal(pool_free(p, d), CGT_OK); /* a..d and the tail: the whole chunk */
  assert_int_equal(stats_of(p).blocks, 1);
  assert_int_equal(stats_of(p).allocated_bytes, 0);
  assert_ptr_equal(alloc_ok(p, 4096), a);
  CHECK(p);
}

static void test_best_fit_picks_the_smallest_fitting_hole(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 16 * 1024);
  /* Holes of 1024, 512, 768 and 512 bytes, in that address order, separated
   * by allocated fences, then the free tail. */
  char *h1 = alloc_ok(p, 1024), *f1 = alloc_ok(p, 256);
  char *h2 = alloc_ok(p, 512), *f2 = alloc_ok(p, 256);
  char *h3 = alloc_ok(p, 768), *f3 = alloc_ok(p, 256);
  char *h4 = alloc_ok(p, 512), *f4 = alloc_ok(p, 256);
  size_t reserved = stats_of(p).reserved_bytes;
  (void)f1, (void)f2, (void)f3, (void)f4;
  assert_int_equal(pool_free(p, h1), CGT_OK);
  assert_int_equal(pool_free(p, h2), CGT_OK);
  assert_int_equal(pool_free(p, h3), CGT_OK);
  assert_int_equal(pool_free(p, h4), CGT_OK);
  CHECK(p);
  assert_ptr_equal(alloc_ok(p, 600), h3);  /* 768 is the smallest hole >= 600 */
  assert_ptr_equal(alloc_ok(p, 300), h2);  /* two 512 holes: the lower address wins */
  assert_ptr_equal(alloc_ok(p, 512), h4);  /* the other 512 hole, exactly */
  assert_ptr_equal(alloc_ok(p, 256), h1);  /* 1024 beats the much larger tail */
  assert_ptr_equal(alloc_ok(p, 700), h1 + 256); /* the 768 left of h1, exactly */
  CHECK(p);
  assert_int_equal(stats_of(p).reserved_bytes, reserved);
}

static void test_fragmentation_then_reuse_fills_holes_without_growing(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 64 * 1024);
  char *blocks[64];
  size_t i, reserved;
  for (i = 0; i < 64; i++) blocks[i] = alloc_ok(p, 1024);
  reserved = stats_of(p).reserved_bytes;
  for (i = 0; i < 64; i += 2) assert_int_equal(pool_free(p, blocks[i]), CGT_OK);
  CHECK(p);
  assert_int_equal(stats_of(p).blocks, 64); /* the blocks filled the chunk; no two holes touch */
  for (i = 0; i < 64; i += 2) assert_ptr_equal(alloc_ok(p, 1000), blocks[i]);
  assert_int_equal(stats_of(p).reserved_bytes, reserved);
  assert_int_equal(stats_of(p).chunks, 1);
  CHECK(p);
}

static void test_pool_grows_by_a_chunk_only_when_no_free_block_fits(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a = alloc_ok(p, 3000), *b;
  assert_int_equal(stats_of(p).chunks, 1);
  assert_int_equal(f->src.calls, 1);
  alloc_ok(p, 1024); /* fits the 1024-byte rest exactly */
  assert_int_equal(f->src.calls, 1);
  b = alloc_ok(p, 3000);
  assert_int_equal(stats_of(p).chunks, 2);
  assert_int_equal(stats_of(p).reserved_bytes, 8192);
  assert_int_equal(f->src.calls, 2);
  assert_false(b >= a && b < a + 4096);
  CHECK(p);
}

static void test_oversize_request_gets_a_chunk_of_its_own(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *small = alloc_ok(p, 256), *big;
  big = alloc_ok(p, 10000);
  assert_int_equal(stats_of(p).chunks, 2);
  assert_int_equal(stats_of(p).reserved_bytes, 4096 + 10240);
  assert_int_equal(pool_block_bytes(p, big), 10240);
  assert_int_equal(stats_of(p).blocks, 3); /* small, the free rest, big (no split) */
  assert_true(source_owns(&f->src, big, 10240));
  assert_false(big >= small && big < small + 4096);
  assert_int_equal(pool_free(p, big), CGT_OK);
  /* The freed big chunk serves a later oversize request without the source. */
  assert_ptr_equal(alloc_ok(p, 9000), big);
  assert_int_equal(f->src.calls, 2);
  CHECK(p);
}

static void test_stats_track_reserved_allocated_peak_chunks_and_blocks(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 8192);
  pool_stats s = stats_of(p);
  char *a, *b;
  assert_int_equal(s.reserved_bytes, 0);
  assert_int_equal(s.allocated_bytes, 0);
  assert_int_equal(s.peak_bytes, 0);
  assert_int_equal(s.chunks, 0);
  assert_int_equal(s.blocks, 0);
  assert_true(s.host_allocs >= 1);
  a = alloc_ok(p, 1000);
  b = alloc_ok(p, 3000);
  s = stats_of(p);
  assert_int_equal(s.reserved_bytes, 8192);
  assert_int_equal(s.allocated_bytes, 1024 + 3072);
  assert_int_equal(s.peak_bytes, 4096);
  assert_int_equal(s.chunks, 1);
  assert_int_equal(s.blocks, 3);
  assert_int_equal(pool_free(p, a), CGT_OK);
  s = stats_of(p);
  assert_int_equal(s.allocated_bytes, 3072);
  assert_int_equal(s.peak_bytes, 4096);
  pool_reset_peak(p);
  assert_int_equal(stats_of(p).peak_bytes, 3072);
  assert_int_equal(pool_free(p, b), CGT_OK);
  s = stats_of(p);
  assert_int_equal(s.allocated_bytes, 0);
  assert_int_equal(s.peak_bytes, 3072);
  assert_int_equal(s.blocks, 1);
  CHECK(p);
}

static void test_host_allocs_stop_growing_in_a_steady_state(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 64 * 1024);
  char *keep = alloc_ok(p, 256); /* keeps the lookup table alive */
  uint64_t before;
  int round;
  (void)keep;
  for (round = 0; round < 2; round++) {
    void *x = alloc_ok(p, 1000), *y = alloc_ok(p, 5000);
    assert_int_equal(pool_free(p, x), CGT_OK);
    assert_int_equal(pool_free(p, y), CGT_OK);
  }
  before = stats_of(p).host_allocs;
  for (round = 0; round < 100; round++) {
    void *x = alloc_ok(p, 1000), *y = alloc_ok(p, 5000);
    assert_int_equal(pool_free(p, x), CGT_OK);
    assert_int_equal(pool_free(p, y), CGT_OK);
  }
  assert_int_equal(stats_of(p).host_allocs, before);
  CHECK(p);
}

static void test_reserve_makes_room_so_later_allocations_need_no_chunk(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  assert_int_equal(pool_reserve(p, 0), CGT_OK);
  assert_int_equal(stats_of(p).chunks, 0);
  assert_int_equal(pool_reserve(p, 10000), CGT_OK);
  assert_int_equal(stats_of(p).chunks, 1);
  assert_int_equal(stats_of(p).reserved_bytes, 10240);
  assert_int_equal(stats_of(p).allocated_bytes, 0);
  assert_int_equal(stats_of(p).blocks, 1);
  CHECK(p);
  /* Room already there: nothing to do. */
  assert_int_equal(pool_reserve(p, 10240), CGT_OK);
  assert_int_equal(f->src.calls, 1);
  alloc_ok(p, 6000);
  alloc_ok(p, 4000);
  assert_int_equal(f->src.calls, 1);
  /* A small reservation still gets at least chunk_bytes. */
  assert_int_equal(pool_reserve(p, 100), CGT_OK);
  assert_int_equal(stats_of(p).chunks, 2);
  assert_int_equal(stats_of(p).reserved_bytes, 10240 + 4096);
  assert_int_equal(pool_reserve(p, SIZE_MAX), CGT_ERR_INVALID_ARGUMENT);
  CHECK(p);
}

/* ------------------------------------------------------- checkpoints */

typedef struct block_list {
  char *base[256];
  size_t bytes[256];
  size_t n;
} block_list;

static void collect(void *user, void *base, size_t bytes) {
  block_list *l = user;
  assert_true(l->n < 256);
  l->base[l->n] = base;
  l->bytes[l->n] = bytes;
  l->n++;
}

static int keep_none(void *user, void *base) {
  (void)user, (void)base;
  return 0;
}

/* Keeps the blocks listed in user (a NULL-terminated array). */
static int keep_listed(void *user, void *base) {
  char **list = user;
  for (; *list; list++)
    if (*list == base) return 1;
  return 0;
}

static void test_restore_rebuilds_the_checkpointed_layout(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a = alloc_ok(p, 256), *b = alloc_ok(p, 1000), *c = alloc_ok(p, 512);
  pool_checkpoint *cp;
  pool_stats at_cp;
  char *probe[8];
  int found[8];
  void *fbase[8];
  size_t fbytes[8], i;
  assert_int_equal(pool_free(p, b), CGT_OK);
  cp = take(p);
  at_cp = stats_of(p);
  assert_true(pool_matches(p, cp));
  assert_int_equal(pool_checkpoint_allocated_bytes(cp), 256 + 512);
  probe[0] = a;
  probe[1] = a + 255;
  probe[2] = b;
  probe[3] = b + 700;
  probe[4] = c + 1;
  probe[5] = c + 511;
  probe[6] = c + 512;
  probe[7] = a + 4000;
  for (i = 0; i < 8; i++) found[i] = pool_find(p, probe[i], &fbase[i], &fbytes[i]);

  /* Move far away: frees, allocations, two more chunks. */
  assert_int_equal(pool_free(p, a), CGT_OK);
  alloc_ok(p, 3000);
  alloc_ok(p, 3000);
  alloc_ok(p, 256);
  assert_int_equal(pool_free(p, c), CGT_OK);
  assert_false(pool_matches(p, cp));
  CHECK(p);

  assert_int_equal(pool_restore(p, cp, NULL, NULL), CGT_OK);
  CHECK(p);
  assert_true(pool_matches(p, cp));
  assert_int_equal(stats_of(p).allocated_bytes, at_cp.allocated_bytes);
  assert_int_equal(stats_of(p).chunks, 3); /* the two made since stay */
  assert_int_equal(pool_block_bytes(p, a), 256);
  assert_int_equal(pool_block_bytes(p, c), 512);
  assert_int_equal(pool_block_bytes(p, b), 0);
  for (i = 0; i < 8; i++) {
    void *base = NULL;
    size_t bytes = 0;
    assert_int_equal(pool_find(p, probe[i], &base, &bytes), found[i]);
    if (found[i]) {
      assert_ptr_equal(base, fbase[i]);
      assert_int_equal(bytes, fbytes[i]);
    }
  }
  pool_checkpoint_free(cp);
}

static void test_restore_frees_every_block_keep_rejects(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 8192);
  char *x[6];
  char *kept[3];
  pool_checkpoint *cp;
  size_t i;
  for (i = 0; i < 6; i++) x[i] = alloc_ok(p, 512);
  cp = take(p);
  for (i = 0; i < 6; i++) assert_int_equal(pool_free(p, x[i]), CGT_OK);
  alloc_ok(p, 5000);
  kept[0] = x[1];
  kept[1] = x[4];
  kept[2] = NULL;
  assert_int_equal(pool_restore(p, cp, keep_listed, kept), CGT_OK);
  CHECK(p);
  for (i = 0; i < 6; i++) assert_int_equal(pool_block_bytes(p, x[i]), (i == 1 || i == 4) ? 512 : 0);
  assert_int_equal(stats_of(p).allocated_bytes, 1024);
  /* [x0 free][x1][x2+x3 free][x4][x5 and tail free]: freed blocks merged. */
  assert_int_equal(stats_of(p).blocks, 5);
  assert_false(pool_matches(p, cp));
  /* Keeping none is the empty layout. */
  assert_int_equal(pool_restore(p, cp, keep_none, NULL), CGT_OK);
  CHECK(p);
  assert_int_equal(stats_of(p).allocated_bytes, 0);
  assert_int_equal(stats_of(p).blocks, 1);
  pool_checkpoint_free(cp);
}

static void test_chunks_made_after_a_checkpoint_stay_and_are_free_after_restore(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  pool_checkpoint *cp;
  char *late1, *late2;
  size_t calls;
  alloc_ok(p, 2048);
  cp = take(p);
  late1 = alloc_ok(p, 4000);
  late2 = alloc_ok(p, 20000);
  assert_int_equal(stats_of(p).chunks, 3);
  assert_int_equal(pool_restore(p, cp, NULL, NULL), CGT_OK);
  CHECK(p);
  assert_true(pool_matches(p, cp));
  assert_int_equal(stats_of(p).chunks, 3);
  assert_int_equal(stats_of(p).reserved_bytes, 4096 + 4096 + 20224);
  assert_int_equal(stats_of(p).blocks, 4); /* 2048 + free rest, and two whole free chunks */
  assert_false(pool_find(p, late1, NULL, NULL));
  assert_false(pool_find(p, late2 + 100, NULL, NULL));
  assert_int_equal(f->src.n_chunks, 3);
  calls = f->src.calls;
  assert_ptr_equal(alloc_ok(p, 20000), late2);
  assert_ptr_equal(alloc_ok(p, 4000), late1);
  assert_int_equal(f->src.calls, calls);
  CHECK(p);
  pool_checkpoint_free(cp);
}

static void test_same_allocations_after_restore_return_the_same_addresses(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 8192);
  static const size_t sizes[] = {700, 256, 5000, 300, 9000, 1, 2048, 4000};
  void *first[8], *again[8];
  pool_checkpoint *cp;
  size_t i;
  void *x = alloc_ok(p, 1000), *y = alloc_ok(p, 3000);
  alloc_ok(p, 512);
  assert_int_equal(pool_free(p, x), CGT_OK);
  cp = take(p);
  for (i = 0; i < 8; i++) {
    first[i] = alloc_ok(p, sizes[i]);
    if (i == 3) assert_int_equal(pool_free(p, first[1]), CGT_OK);
  }
  (void)y;
  assert_int_equal(pool_restore(p, cp, NULL, NULL), CGT_OK);
  /* Different history, same layout: free blocks in another order. */
  for (i = 0; i < 8; i++) {
    again[i] = alloc_ok(p, sizes[i]);
    if (i == 3) assert_int_equal(pool_free(p, again[1]), CGT_OK);
    assert_ptr_equal(again[i], first[i]);
  }
  CHECK(p);
  pool_checkpoint_free(cp);
}

static void test_checkpoint_lists_allocated_blocks_in_address_order(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  pool_checkpoint *cp;
  block_list l;
  size_t i, sum = 0, n_alloc = 0;
  void *ptrs[12];
  for (i = 0; i < 12; i++) ptrs[i] = alloc_ok(p, 700 + 500 * i); /* several chunks */
  for (i = 0; i < 12; i += 3) assert_int_equal(pool_free(p, ptrs[i]), CGT_OK);
  cp = take(p);
  memset(&l, 0, sizeof l);
  pool_checkpoint_foreach_allocated(cp, collect, &l);
  for (i = 0; i < 12; i++) n_alloc += (i % 3) != 0;
  assert_int_equal(l.n, n_alloc);
  for (i = 0; i < l.n; i++) {
    sum += l.bytes[i];
    assert_int_equal(pool_block_bytes(p, l.base[i]), l.bytes[i]);
    if (i > 0) assert_true((uintptr_t)l.base[i - 1] + l.bytes[i - 1] <= (uintptr_t)l.base[i]);
  }
  assert_int_equal(sum, pool_checkpoint_allocated_bytes(cp));
  assert_int_equal(sum, stats_of(p).allocated_bytes);
  pool_checkpoint_free(cp);
}

static void test_checkpoint_of_an_empty_pool_restores_to_all_free(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  pool_checkpoint *empty = take(p);
  assert_int_equal(pool_checkpoint_allocated_bytes(empty), 0);
  alloc_ok(p, 100);
  alloc_ok(p, 9000);
  assert_int_equal(pool_restore(p, empty, NULL, NULL), CGT_OK);
  CHECK(p);
  assert_true(pool_matches(p, empty));
  assert_int_equal(stats_of(p).allocated_bytes, 0);
  assert_int_equal(stats_of(p).blocks, 2);
  pool_checkpoint_free(empty);
}

static void test_clear_frees_every_block_and_keeps_the_chunks(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  void *a = alloc_ok(p, 100);
  alloc_ok(p, 300);
  alloc_ok(p, 9000);
  pool_clear(p);
  CHECK(p);
  assert_int_equal(stats_of(p).allocated_bytes, 0);
  assert_int_equal(stats_of(p).chunks, 2);
  assert_int_equal(stats_of(p).blocks, 2);
  assert_int_equal(pool_block_bytes(p, a), 0);
  assert_int_equal(pool_free(p, a), CGT_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(alloc_ok(p, 4096), a);
  CHECK(p);
}

static void test_restore_refuses_a_checkpoint_of_another_pool(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096), *q = NULL;
  pool_source ps;
  pool_checkpoint *cq = NULL;
  pool_stats before;
  ps.alloc = source_alloc;
  ps.free = source_free;
  ps.ctx = &f->src;
  assert_int_equal(pool_create(&ps, 4096, &q), CGT_OK);
  alloc_ok(q, 100);
  alloc_ok(p, 100);
  assert_int_equal(pool_checkpoint_take(q, &cq), CGT_OK);
  before = stats_of(p);
  assert_int_equal(pool_restore(p, cq, NULL, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_false(pool_matches(p, cq));
  ASSERT_SAME_LAYOUT_STATS(before, stats_of(p));
  CHECK(p);
  pool_checkpoint_free(cq);
  pool_destroy(q);
}

/* ------------------------------------------------------------ failures */

static void test_source_out_of_budget_leaves_the_pool_unchanged(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  char *a = alloc_ok(p, 1000), *b = alloc_ok(p, 2000);
  pool_checkpoint *before_cp = take(p);
  pool_stats before = stats_of(p);
  void *ptr = (void *)&ptr;
  f->src.budget = 8192; /* one more small chunk fits, nothing larger */
  assert_int_equal(pool_alloc(p, 5000, &ptr), CGT_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(ptr, (void *)&ptr); /* untouched */
  assert_int_equal(pool_reserve(p, 5000), CGT_ERR_OUT_OF_MEMORY);
  {
    pool_stats after = stats_of(p);
    assert_memory_equal(&before, &after, sizeof before); /* host_allocs too: the source was asked first */
  }
  assert_true(pool_matches(p, before_cp));
  assert_int_equal(pool_block_bytes(p, a), 1024);
  assert_int_equal(pool_block_bytes(p, b), 2048);
  CHECK(p);
  /* The pool still works within the budget. */
  alloc_ok(p, 4000);
  assert_int_equal(stats_of(p).chunks, 2);
  pool_checkpoint_free(before_cp);
}

static void test_source_failing_on_the_nth_call_leaves_the_pool_unchanged(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  pool_checkpoint *cp;
  pool_stats before;
  void *ptr;
  alloc_ok(p, 4096); /* call 1 */
  alloc_ok(p, 4096); /* call 2 */
  cp = take(p);
  before = stats_of(p);
  f->src.fail_on_call = 3;
  assert_int_equal(pool_alloc(p, 100, &ptr), CGT_ERR_OUT_OF_MEMORY);
  {
    pool_stats after = stats_of(p);
    assert_memory_equal(&before, &after, sizeof before);
  }
  assert_true(pool_matches(p, cp));
  CHECK(p);
  alloc_ok(p, 100); /* call 4 succeeds */
  assert_int_equal(stats_of(p).chunks, 3);
  CHECK(p);
  pool_checkpoint_free(cp);
}

static void test_invalid_arguments_change_nothing(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096), *q = NULL;
  char *a = alloc_ok(p, 1000), *b = alloc_ok(p, 256);
  char local;
  pool_checkpoint *cp = take(p);
  pool_stats before = stats_of(p);
  void *ptr = NULL;
  pool_source bad = {0};
  assert_int_equal(pool_alloc(p, 0, &ptr), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_alloc(p, SIZE_MAX, &ptr), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_alloc(p, SIZE_MAX - 254, &ptr), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_alloc(p, 100, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_alloc(NULL, 100, &ptr), CGT_ERR_INVALID_ARGUMENT);
  assert_null(ptr);
  assert_int_equal(pool_free(p, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_free(p, &local), CGT_ERR_INVALID_ARGUMENT);   /* unknown */
  assert_int_equal(pool_free(p, a + 256), CGT_ERR_INVALID_ARGUMENT);  /* interior */
  assert_int_equal(pool_free(p, b + 256), CGT_ERR_INVALID_ARGUMENT);  /* the free rest */
  assert_int_equal(pool_free(NULL, a), CGT_ERR_INVALID_ARGUMENT);
  {
    pool_stats after = stats_of(p);
    assert_memory_equal(&before, &after, sizeof before);
  }
  assert_true(pool_matches(p, cp));
  assert_int_equal(pool_free(p, b), CGT_OK);
  before = stats_of(p);
  assert_int_equal(pool_free(p, b), CGT_ERR_INVALID_ARGUMENT); /* double free */
  {
    pool_stats after = stats_of(p);
    assert_memory_equal(&before, &after, sizeof before);
  }
  assert_int_equal(pool_block_bytes(p, a), 1024);
  CHECK(p);
  assert_int_equal(pool_create(&bad, 4096, &q), CGT_ERR_INVALID_ARGUMENT);
  assert_null(q);
  assert_int_equal(pool_create(NULL, 4096, &q), CGT_ERR_INVALID_ARGUMENT);
  {
    pool_source ps = {source_alloc, source_free, &f->src};
    assert_int_equal(pool_create(&ps, 0, &q), CGT_ERR_INVALID_ARGUMENT);
    assert_int_equal(pool_create(&ps, SIZE_MAX, &q), CGT_ERR_INVALID_ARGUMENT);
    assert_null(q);
  }
  assert_int_equal(pool_restore(p, NULL, NULL, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_checkpoint_take(p, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_false(pool_find(p, &local, NULL, NULL));
  assert_false(pool_find(p, NULL, NULL, NULL));
  assert_int_equal(pool_block_bytes(p, NULL), 0);
  pool_destroy(NULL);
  pool_checkpoint_free(NULL);
  pool_checkpoint_free(cp);
}

/* Runs op with the n-th host allocation failing, for n = 0, 1, 2, ... until
 * op succeeds. Each failure must be CGT_ERR_OUT_OF_MEMORY with the layout and
 * stats (but host_allocs) as before. Returns how many failures it saw. */
typedef cgt_status (*pool_op)(pool *p, void *user);

static int sweep_host_failures(pool *p, pool_op op, void *user) {
  pool_checkpoint *before_cp = take(p);
  pool_stats before = stats_of(p);
  int failures = 0;
  long long n;
  for (n = 0;; n++) {
    cgt_status st;
    pool__fail_host_alloc_after(p, n);
    st = op(p, user);
    pool__fail_host_alloc_after(p, -1);
    if (st == CGT_OK) break;
    assert_int_equal(st, CGT_ERR_OUT_OF_MEMORY);
    failures++;
    CHECK(p);
    ASSERT_SAME_LAYOUT_STATS(before, stats_of(p));
    assert_true(pool_matches(p, before_cp));
    assert_true(n < 100000);
  }
  CHECK(p);
  pool_checkpoint_free(before_cp);
  return failures;
}

static cgt_status op_alloc(pool *p, void *user) {
  void *ptr;
  return pool_alloc(p, *(size_t *)user, &ptr);
}

static cgt_status op_reserve(pool *p, void *user) { return pool_reserve(p, *(size_t *)user); }

static cgt_status op_take(pool *p, void *user) {
  pool_checkpoint *c = NULL;
  cgt_status st = pool_checkpoint_take(p, &c);
  if (st == CGT_OK) {
    assert_true(pool_matches(p, c));
    pool_checkpoint_free(c);
  } else {
    assert_null(c);
  }
  (void)user;
  return st;
}

typedef struct restore_args {
  pool_checkpoint *cp;
  char **kept;
} restore_args;

static cgt_status op_restore(pool *p, void *user) {
  restore_args *r = user;
  return pool_restore(p, r->cp, r->kept ? keep_listed : NULL, r->kept);
}

static void test_host_allocation_failure_leaves_the_pool_unchanged(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 16 * 1024);
  char *first[200], *kept[4];
  pool_checkpoint *cp;
  restore_args r;
  size_t i, bytes;
  int failures;

  /* The first allocation needs a chunk, a chunk array, descriptors and the
   * lookup table. */
  bytes = 1000;
  assert_true(sweep_host_failures(p, op_alloc, &bytes) >= 3);
  /* An oversize chunk, then a reservation. */
  bytes = 40000;
  sweep_host_failures(p, op_alloc, &bytes);
  bytes = 30000;
  sweep_host_failures(p, op_reserve, &bytes);
  assert_int_equal(stats_of(p).chunks, 3);

  /* Enough blocks that the lookup table has to grow its buckets. */
  for (i = 0; i < 200; i++) {
    bytes = 256;
    sweep_host_failures(p, op_alloc, &bytes);
  }
  assert_true(sweep_host_failures(p, op_take, NULL) >= 1);

  /* A checkpoint with 200 small blocks, then a different layout that uses up
   * the spare descriptors, so the restore must allocate many. */
  pool_clear(p);
  for (i = 0; i < 200; i++) first[i] = alloc_ok(p, 256);
  cp = take(p);
  pool_clear(p);
  for (i = 0; i < 200; i++) alloc_ok(p, 512);
  r.cp = cp;
  r.kept = NULL;
  failures = sweep_host_failures(p, op_restore, &r);
  assert_true(failures >= 3);
  assert_true(pool_matches(p, cp));

  pool_clear(p);
  for (i = 0; i < 300; i++) alloc_ok(p, 256);
  kept[0] = first[3];
  kept[1] = first[100];
  kept[2] = first[199];
  kept[3] = NULL;
  r.kept = kept;
  assert_true(sweep_host_failures(p, op_restore, &r) >= 1);
  assert_int_equal(stats_of(p).allocated_bytes, 3 * 256);
  assert_int_equal(pool_block_bytes(p, first[100]), 256);
  CHECK(p);
  pool_checkpoint_free(cp);
}

/* ------------------------------------------------ delta checkpoints */

#define CHECK_CKPT(c)                                                     \
  do {                                                                    \
    char check_why_[256];                                                 \
    if (!pool_checkpoint_check((c), check_why_, sizeof check_why_))       \
      fail_msg("pool_checkpoint_check: %s", check_why_);                  \
  } while (0)

enum { CHAIN = 1000 };

/* The shape of a recorded path with every value live: one more block per
 * checkpoint, each checkpoint a delta on the one before. */
static void test_a_chain_of_deltas_holds_memory_linear_in_its_length(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, (size_t)1 << 20);
  static pool_checkpoint *chain[CHAIN];
  pool_checkpoint *full = NULL;
  void *blocks[CHAIN];
  size_t i, delta_bytes = 0;
  for (i = 0; i < CHAIN; i++) {
    blocks[i] = alloc_ok(p, 256);
    assert_int_equal(pool_checkpoint_take_delta(p, i ? chain[i - 1] : NULL, &chain[i]), CGT_OK);
    assert_int_equal(pool_checkpoint_allocated_bytes(chain[i]), (i + 1) * 256);
    if (i == 1) delta_bytes = pool_checkpoint_host_bytes(chain[i]);
    /* Every delta is as small as the first: one block and the free rest. */
    if (i >= 1) assert_int_equal(pool_checkpoint_host_bytes(chain[i]), delta_bytes);
  }
  assert_int_equal(pool_checkpoint_take(p, &full), CGT_OK);
  assert_true(pool_checkpoint_host_bytes(full) > 100 * delta_bytes);
  CHECK_CKPT(chain[CHAIN - 1]);
  assert_true(pool_matches(p, chain[CHAIN - 1]));
  /* Back to the middle of the chain: the second half is free again. */
  assert_int_equal(pool_restore(p, chain[CHAIN / 2 - 1], NULL, NULL), CGT_OK);
  assert_int_equal(stats_of(p).allocated_bytes, CHAIN / 2 * 256);
  assert_int_equal(pool_block_bytes(p, blocks[CHAIN / 2 - 1]), 256);
  assert_int_equal(pool_block_bytes(p, blocks[CHAIN / 2]), 0);
  assert_false(pool_matches(p, chain[CHAIN - 1]));
  CHECK(p);
  /* And to the end again, which a full checkpoint of the same layout agrees with. */
  assert_int_equal(pool_restore(p, chain[CHAIN - 1], NULL, NULL), CGT_OK);
  assert_true(pool_matches(p, full));
  CHECK(p);
  for (i = 0; i < CHAIN; i++) pool_checkpoint_free(chain[i]);
  pool_checkpoint_free(full);
}

static void test_a_delta_keeps_its_freed_base_alive(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  pool_checkpoint *a = NULL, *b = NULL, *c = NULL;
  void *x = alloc_ok(p, 100), *y;
  assert_int_equal(pool_checkpoint_take(p, &a), CGT_OK);
  y = alloc_ok(p, 300);
  assert_int_equal(pool_checkpoint_take_delta(p, a, &b), CGT_OK);
  assert_int_equal(pool_free(p, x), CGT_OK);
  assert_int_equal(pool_checkpoint_take_delta(p, b, &c), CGT_OK);
  /* Freed before the deltas that are based on them (ASan would see a use
   * after free below if the memory went with the holder's reference). */
  pool_checkpoint_free(a);
  pool_checkpoint_free(b);
  CHECK_CKPT(c);
  pool_clear(p);
  assert_int_equal(pool_restore(p, c, NULL, NULL), CGT_OK);
  assert_int_equal(pool_block_bytes(p, x), 0);
  assert_int_equal(pool_block_bytes(p, y), 512);
  assert_int_equal(stats_of(p).allocated_bytes, 512);
  CHECK(p);
  pool_checkpoint_free(c);
}

/* The pool knows what changed only since the checkpoint it last took or
 * restored, so a delta on any other base is stored whole. */
static void test_a_delta_on_a_base_other_than_the_last_checkpoint_is_full(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, (size_t)1 << 20);
  pool_checkpoint *a = NULL, *b = NULL, *full = NULL, *c = NULL, *d = NULL;
  size_t i;
  for (i = 0; i < 50; i++) alloc_ok(p, 256);
  assert_int_equal(pool_checkpoint_take(p, &a), CGT_OK);
  alloc_ok(p, 256);
  assert_int_equal(pool_checkpoint_take(p, &b), CGT_OK);
  alloc_ok(p, 256);
  assert_int_equal(pool_checkpoint_take(p, &full), CGT_OK);
  assert_int_equal(pool_checkpoint_take_delta(p, a, &c), CGT_OK); /* a is not the last */
  assert_int_equal(pool_checkpoint_host_bytes(c), pool_checkpoint_host_bytes(full));
  assert_int_equal(pool_checkpoint_take_delta(p, c, &d), CGT_OK); /* c is */
  assert_true(pool_checkpoint_host_bytes(d) < pool_checkpoint_host_bytes(full) / 10);
  /* After pool_clear no checkpoint has the layout: full again. */
  pool_checkpoint_free(d);
  pool_clear(p);
  assert_int_equal(pool_checkpoint_take_delta(p, c, &d), CGT_OK);
  pool_checkpoint_free(full);
  assert_int_equal(pool_checkpoint_take(p, &full), CGT_OK); /* the same layout, whole */
  assert_int_equal(pool_checkpoint_host_bytes(d), pool_checkpoint_host_bytes(full));
  CHECK_CKPT(c);
  CHECK_CKPT(d);
  pool_checkpoint_free(a);
  pool_checkpoint_free(b);
  pool_checkpoint_free(c);
  pool_checkpoint_free(d);
  pool_checkpoint_free(full);
}

static void test_a_delta_on_a_checkpoint_of_another_pool_is_refused(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096), *q = NULL;
  pool_source ps;
  pool_checkpoint *cq = NULL, *out = (pool_checkpoint *)&ps;
  ps.alloc = source_alloc;
  ps.free = source_free;
  ps.ctx = &f->src;
  assert_int_equal(pool_create(&ps, 4096, &q), CGT_OK);
  alloc_ok(q, 100);
  assert_int_equal(pool_checkpoint_take(q, &cq), CGT_OK);
  assert_int_equal(pool_checkpoint_take_delta(p, cq, &out), CGT_ERR_INVALID_ARGUMENT);
  assert_null(out);
  assert_int_equal(pool_checkpoint_take_delta(NULL, NULL, &out), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(pool_checkpoint_take_delta(p, NULL, NULL), CGT_ERR_INVALID_ARGUMENT);
  pool_checkpoint_free(cq);
  pool_destroy(q);
}

/* A restore to a delta expands it first: that host allocation may fail too,
 * and then nothing changes. */
static void test_host_allocation_failure_restoring_a_delta_leaves_the_pool_unchanged(void **state) {
  fixture *f = *state;
  pool *p = make_pool(f, 4096);
  pool_checkpoint *a = NULL, *b = NULL, *now = NULL;
  pool_stats before;
  alloc_ok(p, 100);
  assert_int_equal(pool_checkpoint_take(p, &a), CGT_OK);
  alloc_ok(p, 100);
  assert_int_equal(pool_checkpoint_take_delta(p, a, &b), CGT_OK);
  pool_clear(p);
  alloc_ok(p, 1000);
  assert_int_equal(pool_checkpoint_take(p, &now), CGT_OK);
  before = stats_of(p);
  pool__fail_host_alloc_after(p, 0);
  assert_int_equal(pool_restore(p, b, NULL, NULL), CGT_ERR_OUT_OF_MEMORY);
  pool__fail_host_alloc_after(p, -1);
  ASSERT_SAME_LAYOUT_STATS(before, stats_of(p));
  assert_true(pool_matches(p, now));
  CHECK(p);
  assert_int_equal(pool_restore(p, b, NULL, NULL), CGT_OK);
  assert_int_equal(stats_of(p).allocated_bytes, 512);
  pool_checkpoint_free(a);
  pool_checkpoint_free(b);
  pool_checkpoint_free(now);
}

/* ----------------------------------------------------- property test */

typedef struct model_block {
  char *base;
  size_t bytes; /* rounded */
} model_block;

typedef struct model {
  model_block *b;
  size_t n, cap;
} model;

typedef struct saved_checkpoint {
  pool_checkpoint *cp;
  model m;
} saved_checkpoint;

#define PROP_SAVED 6
#define PROP_CHUNK ((size_t)64 * 1024)

typedef struct prop {
  uint64_t seed, rng;
  long op;
  fixture *f;
  pool *p;
  model live;
  saved_checkpoint saved[PROP_SAVED];
  uint64_t keep_salt;
  unsigned keep_percent;
  size_t peak; /* the model's highest allocated bytes since the last reset */
  int last;    /* the slot whose checkpoint the pool last took or restored; -1: none */
  long restores, injected_failures, grown, max_blocks, deltas;
} prop;

#define PROP_ASSERT(pr, cond)                                                                      \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      fail_msg("seed %llu op %ld: %s", (unsigned long long)(pr)->seed, (pr)->op, #cond);           \
  } while (0)

static uint64_t prop_next(prop *pr) {
  /* splitmix64: tiny and good enough to drive a test. */
  uint64_t z = (pr->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static size_t prop_below(prop *pr, size_t n) { return (size_t)(prop_next(pr) % n); }

static void model_push(model *m, char *base, size_t bytes) {
  if (m->n == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    model_block *grown = realloc(m->b, cap * sizeof *grown);
    assert_non_null(grown);
    m->b = grown;
    m->cap = cap;
  }
  m->b[m->n].base = base;
  m->b[m->n].bytes = bytes;
  m->n++;
}

static void model_copy(model *dst, const model *src) {
  size_t i;
  dst->n = 0;
  for (i = 0; i < src->n; i++) model_push(dst, src->b[i].base, src->b[i].bytes);
}

static size_t model_bytes(const model *m) {
  size_t i, sum = 0;
  for (i = 0; i < m->n; i++) sum += m->b[i].bytes;
  return sum;
}

static int model_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const model_block *)a)->base, y = (uintptr_t)((const model_block *)b)->base;
  return (x > y) - (x < y);
}

/* By address. An empty model may have no array at all, which qsort may not see. */
static void model_sort(model *m) {
  if (m->n) qsort(m->b, m->n, sizeof *m->b, model_cmp);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

/* Decided by the offset in the arena, not the address, so that runs repeat. */
static int prop_keeps(const prop *pr, const void *base) {
  uint64_t offset = (uint64_t)((const char *)base - pr->f->src.arena);
  return mix(offset ^ pr->keep_salt) % 100 < pr->keep_percent;
}

static int prop_keep(void *user, void *base) { return prop_keeps(user, base); }

static void model_collect(void *user, void *base, size_t bytes) { model_push(user, base, bytes); }

/* The pool's allocated blocks are exactly the model's: each model block is
 * one, and they add up to all the pool has. (No checkpoint is taken here:
 * that would move the pool's mark, which delta checkpoints depend on.) */
static void prop_assert_same_blocks(prop *pr) {
  size_t i;
  for (i = 0; i < pr->live.n; i++) PROP_ASSERT(pr, pool_block_bytes(pr->p, pr->live.b[i].base) == pr->live.b[i].bytes);
  PROP_ASSERT(pr, stats_of(pr->p).allocated_bytes == model_bytes(&pr->live));
}

/* c lists exactly the blocks of m, and its chain passes pool_checkpoint_check. */
static void prop_assert_checkpoint_is(prop *pr, const pool_checkpoint *c, const model *m) {
  model got = {0}, want = {0};
  char why[256];
  size_t i;
  if (!pool_checkpoint_check(c, why, sizeof why))
    fail_msg("seed %llu op %ld: pool_checkpoint_check: %s", (unsigned long long)pr->seed, pr->op, why);
  pool_checkpoint_foreach_allocated(c, model_collect, &got);
  model_copy(&want, m);
  model_sort(&want);
  PROP_ASSERT(pr, got.n == want.n);
  for (i = 0; i < got.n; i++) {
    PROP_ASSERT(pr, got.b[i].base == want.b[i].base);
    PROP_ASSERT(pr, got.b[i].bytes == want.b[i].bytes);
  }
  PROP_ASSERT(pr, pool_checkpoint_allocated_bytes(c) == model_bytes(m));
  free(got.b);
  free(want.b);
}

static void prop_after_op(prop *pr) {
  char why[256];
  pool_stats s = stats_of(pr->p);
  if (!pool_check(pr->p, why, sizeof why)) fail_msg("seed %llu op %ld: pool_check: %s", (unsigned long long)pr->seed, pr->op, why);
  PROP_ASSERT(pr, s.allocated_bytes == model_bytes(&pr->live));
  PROP_ASSERT(pr, s.reserved_bytes == pr->f->src.live_bytes);
  PROP_ASSERT(pr, s.chunks == pr->f->src.n_chunks);
  if (model_bytes(&pr->live) > pr->peak) pr->peak = model_bytes(&pr->live);
  PROP_ASSERT(pr, s.peak_bytes == pr->peak);
  if ((long)s.blocks > pr->max_blocks) pr->max_blocks = (long)s.blocks;
  if (pr->live.n) {
    /* Any address inside a live block finds that block. */
    const model_block *m = &pr->live.b[prop_below(pr, pr->live.n)];
    void *base = NULL;
    size_t bytes = 0;
    PROP_ASSERT(pr, pool_find(pr->p, m->base + prop_below(pr, m->bytes), &base, &bytes));
    PROP_ASSERT(pr, base == m->base && bytes == m->bytes);
    PROP_ASSERT(pr, pool_block_bytes(pr->p, m->base) == m->bytes);
  }
}

static size_t prop_size(prop *pr) {
  size_t r = prop_below(pr, 100);
  if (r < 3) return 64 * 1024 + prop_below(pr, 192 * 1024); /* oversize: a chunk of its own */
  if (r < 10) return 256 * (1 + prop_below(pr, 16));       /* exact multiples */
  return 1 + prop_below(pr, (size_t)1 << (4 + prop_below(pr, 10)));
}

static int chunk_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const source_chunk *)a)->base, y = (uintptr_t)((const source_chunk *)b)->base;
  return (x > y) - (x < y);
}

/* Where best fit must put a block of `rounded` bytes, from the model alone:
 * the free holes are the gaps between live blocks inside the source's chunks
 * (the pool merges every free run into one block), and the answer is the
 * smallest hole that fits, the lowest address among equals. NULL: no hole
 * fits, so the pool must take a new chunk. */
static char *prop_expected_fit(prop *pr, size_t rounded) {
  model live = {0};
  source_chunk *chunks;
  size_t n_chunks = pr->f->src.n_chunks, i, k = 0, best_size = SIZE_MAX;
  char *best = NULL;
  chunks = malloc((n_chunks ? n_chunks : 1) * sizeof *chunks);
  assert_non_null(chunks);
  if (n_chunks) {
    memcpy(chunks, pr->f->src.chunks, n_chunks * sizeof *chunks);
    qsort(chunks, n_chunks, sizeof *chunks, chunk_cmp);
  }
  model_copy(&live, &pr->live);
  model_sort(&live);
  for (i = 0; i < n_chunks; i++) {
    char *cursor = chunks[i].base, *end = chunks[i].base + chunks[i].bytes;
    for (;; k++) {
      char *next = (k < live.n && live.b[k].base < end) ? live.b[k].base : end;
      size_t gap = (size_t)(next - cursor);
      if (gap >= rounded && gap < best_size) {
        best = cursor;
        best_size = gap;
      }
      if (next == end) break;
      cursor = live.b[k].base + live.b[k].bytes;
    }
  }
  free(live.b);
  free(chunks);
  return best;
}

static void prop_alloc(prop *pr) {
  size_t bytes = prop_size(pr), rounded = (bytes + 255) / 256 * 256, i;
  char *ptr = NULL;
  char *expected = prop_expected_fit(pr, rounded);
  /* Growth is rare and its failure path is the most involved, so failures
   * are injected there far more often. */
  int inject = prop_below(pr, expected ? 50 : 3) == 0;
  cgt_status st;
  pool_stats before = stats_of(pr->p);
  size_t calls = pr->f->src.calls;
  int source_fails = !expected && !inject && prop_below(pr, 4) == 0;
  if (inject) pool__fail_host_alloc_after(pr->p, (long long)prop_below(pr, 4));
  if (source_fails) pr->f->src.fail_on_call = calls + 1;
  st = pool_alloc(pr->p, bytes, (void **)&ptr);
  pool__fail_host_alloc_after(pr->p, -1);
  pr->f->src.fail_on_call = 0;
  if (source_fails) {
    pool_stats after = stats_of(pr->p);
    pr->injected_failures++;
    PROP_ASSERT(pr, st == CGT_ERR_OUT_OF_MEMORY && ptr == NULL);
    PROP_ASSERT(pr, memcmp(&before, &after, sizeof before) == 0);
    return;
  }
  if (inject && st == CGT_ERR_OUT_OF_MEMORY) {
    pool_stats after = stats_of(pr->p);
    pr->injected_failures++;
    PROP_ASSERT(pr, ptr == NULL);
    PROP_ASSERT(pr, after.allocated_bytes == before.allocated_bytes && after.blocks == before.blocks &&
                        after.chunks == before.chunks && after.reserved_bytes == before.reserved_bytes);
    return;
  }
  PROP_ASSERT(pr, st == CGT_OK);
  PROP_ASSERT(pr, (uintptr_t)ptr % POOL_ALIGN == 0);
  PROP_ASSERT(pr, pool_block_bytes(pr->p, ptr) == rounded);
  PROP_ASSERT(pr, source_owns(&pr->f->src, ptr, rounded));
  for (i = 0; i < pr->live.n; i++) {
    const model_block *m = &pr->live.b[i];
    PROP_ASSERT(pr, (uintptr_t)ptr + rounded <= (uintptr_t)m->base || (uintptr_t)m->base + m->bytes <= (uintptr_t)ptr);
  }
  if (expected) {
    PROP_ASSERT(pr, ptr == expected);
    PROP_ASSERT(pr, pr->f->src.calls == calls);
  } else {
    /* A new chunk, sized max(chunk_bytes, rounded), and the block at its base. */
    const source_chunk *newest = &pr->f->src.chunks[pr->f->src.n_chunks - 1];
    PROP_ASSERT(pr, pr->f->src.calls == calls + 1);
    PROP_ASSERT(pr, ptr == newest->base);
    PROP_ASSERT(pr, newest->bytes == (rounded > PROP_CHUNK ? rounded : PROP_CHUNK));
    pr->grown++;
  }
  model_push(&pr->live, ptr, rounded);
}

static void prop_free(prop *pr) {
  size_t i = prop_below(pr, pr->live.n);
  model_block m = pr->live.b[i];
  pool_stats before = stats_of(pr->p);
  /* Interior pointers are refused and change nothing. */
  if (m.bytes > 256) {
    pool_stats after;
    PROP_ASSERT(pr, pool_free(pr->p, m.base + 256) == CGT_ERR_INVALID_ARGUMENT);
    after = stats_of(pr->p);
    PROP_ASSERT(pr, memcmp(&before, &after, sizeof before) == 0);
  }
  PROP_ASSERT(pr, pool_free(pr->p, m.base) == CGT_OK);
  pr->live.b[i] = pr->live.b[--pr->live.n];
  /* A double free is refused. */
  PROP_ASSERT(pr, pool_free(pr->p, m.base) == CGT_ERR_INVALID_ARGUMENT);
}

/* After a reservation, an allocation of that size needs no new chunk. */
static void prop_reserve(prop *pr) {
  size_t bytes = 1 + prop_below(pr, 128 * 1024), calls;
  char *ptr = NULL;
  PROP_ASSERT(pr, pool_reserve(pr->p, bytes) == CGT_OK);
  calls = pr->f->src.calls;
  PROP_ASSERT(pr, pool_alloc(pr->p, bytes, (void **)&ptr) == CGT_OK);
  PROP_ASSERT(pr, pr->f->src.calls == calls);
  model_push(&pr->live, ptr, (bytes + 255) / 256 * 256);
}

/* A full checkpoint, or a delta on the last one (the one case where a delta
 * is stored as one), or a delta on any saved one (which must quietly be
 * full). The slot's old checkpoint is freed first, though deltas may still
 * be based on it. */
static void prop_checkpoint(prop *pr) {
  size_t slot = prop_below(pr, PROP_SAVED), kind = prop_below(pr, 4);
  saved_checkpoint *s = &pr->saved[slot];
  pool_checkpoint *base = NULL, *cp = NULL;
  pool_stats before = stats_of(pr->p);
  cgt_status st;
  if (kind >= 1 && pr->last >= 0) base = pr->saved[pr->last].cp;
  if (kind == 3) base = pr->saved[prop_below(pr, PROP_SAVED)].cp;
  if (prop_below(pr, 10) == 0) {
    /* Out of host memory: nothing changes, the mark included. */
    pool__fail_host_alloc_after(pr->p, 0);
    st = pool_checkpoint_take_delta(pr->p, base, &cp);
    pool__fail_host_alloc_after(pr->p, -1);
    PROP_ASSERT(pr, st == CGT_ERR_OUT_OF_MEMORY && cp == NULL);
    PROP_ASSERT(pr, stats_of(pr->p).blocks == before.blocks);
    pr->injected_failures++;
  }
  if (base && base == (pr->last >= 0 ? pr->saved[pr->last].cp : NULL)) pr->deltas++;
  PROP_ASSERT(pr, pool_checkpoint_take_delta(pr->p, base, &cp) == CGT_OK);
  pool_checkpoint_free(s->cp);
  s->cp = cp;
  model_copy(&s->m, &pr->live);
  pr->last = (int)slot;
  PROP_ASSERT(pr, pool_matches(pr->p, s->cp));
  prop_assert_checkpoint_is(pr, s->cp, &s->m);
}

static void prop_restore(prop *pr) {
  saved_checkpoint *s = &pr->saved[prop_below(pr, PROP_SAVED)];
  static const unsigned percents[] = {0, 30, 70, 100, 100};
  int inject = prop_below(pr, 20) == 0;
  pool_checkpoint *before = NULL;
  cgt_status st;
  size_t i;
  if (!s->cp) return;
  prop_assert_checkpoint_is(pr, s->cp, &s->m);
  if (inject) {
    PROP_ASSERT(pr, pool_checkpoint_take(pr->p, &before) == CGT_OK);
    pr->last = -1; /* the pool is marked with `before` now */
  }
  pr->keep_salt = prop_next(pr);
  pr->keep_percent = percents[prop_below(pr, 5)];
  if (inject) pool__fail_host_alloc_after(pr->p, (long long)prop_below(pr, 8));
  st = pool_restore(pr->p, s->cp, pr->keep_percent == 100 && prop_below(pr, 2) ? NULL : prop_keep, pr);
  pool__fail_host_alloc_after(pr->p, -1);
  if (inject && st == CGT_ERR_OUT_OF_MEMORY) {
    pr->injected_failures++;
    PROP_ASSERT(pr, pool_matches(pr->p, before)); /* the live layout is untouched */
    prop_assert_same_blocks(pr);
    pool_checkpoint_free(before);
    return;
  }
  pool_checkpoint_free(before);
  PROP_ASSERT(pr, st == CGT_OK);
  pr->restores++;
  pr->last = (int)(s - pr->saved);
  pr->live.n = 0;
  for (i = 0; i < s->m.n; i++)
    if (prop_keeps(pr, s->m.b[i].base)) model_push(&pr->live, s->m.b[i].base, s->m.b[i].bytes);
  /* Dropping even one block changes the layout: a free block where an
   * allocated one was. */
  PROP_ASSERT(pr, pool_matches(pr->p, s->cp) == (pr->live.n == s->m.n));
  prop_assert_same_blocks(pr);
}

static void run_property(fixture *f, uint64_t seed, long ops) {
  prop pr;
  size_t i;
  memset(&pr, 0, sizeof pr);
  pr.seed = pr.rng = seed;
  pr.f = f;
  pr.p = make_pool(f, PROP_CHUNK);
  pr.last = -1;
  for (pr.op = 0; pr.op < ops; pr.op++) {
    size_t r = prop_below(&pr, 1000);
    size_t alloc_permille = pr.live.n < 16 ? 650 : pr.live.n > 48 ? 350 : 480;
    if (r < 20) {
      prop_checkpoint(&pr);
    } else if (r < 32) {
      prop_restore(&pr);
    } else if (r < 33) {
      pool_clear(pr.p);
      pr.live.n = 0;
      pr.last = -1;
      if (prop_below(&pr, 2)) {
        pool_reset_peak(pr.p);
        pr.peak = 0;
      }
    } else if (r < 34) {
      prop_reserve(&pr);
    } else if (pr.live.n == 0 || r < 34 + alloc_permille) {
      prop_alloc(&pr);
    } else {
      prop_free(&pr);
    }
    prop_after_op(&pr);
  }
  print_message("seed %llu: %ld ops, %ld restores, %ld deltas, %ld grew the pool, %ld injected failures, "
                "%zu chunks, at most %ld blocks\n",
                (unsigned long long)seed, ops, pr.restores, pr.deltas, pr.grown, pr.injected_failures,
                stats_of(pr.p).chunks, pr.max_blocks);
  PROP_ASSERT(&pr, pr.deltas > 0);
  for (i = 0; i < PROP_SAVED; i++) {
    pool_checkpoint_free(pr.saved[i].cp);
    free(pr.saved[i].m.b);
  }
  free(pr.live.b);
}

static void test_random_operations_agree_with_a_model_of_owned_bytes(void **state) {
  fixture *f = *state;
  static const uint64_t seeds[] = {1, 0xc0ffee, 20240601, 0xdeadbeefcafef00dull};
  size_t i;
  for (i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    fixture one;
    memset(&one, 0, sizeof one);
    one.src.budget = (size_t)1 << 30;
    one.src.arena_hi = (size_t)64 << 20;
    one.src.arena = aligned_alloc(POOL_ALIGN, one.src.arena_hi);
    assert_non_null(one.src.arena);
    run_property(&one, seeds[i], 30000);
    pool_destroy(one.p);
    assert_int_equal(one.src.n_chunks, 0);
    free(one.src.chunks);
    free(one.src.arena);
  }
  (void)f;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_alloc_returns_256_byte_aligned_blocks_of_rounded_size, setup, teardown),
      cmocka_unit_test_setup_teardown(test_alloc_splits_a_free_block_and_leaves_the_rest_free, setup, teardown),
      cmocka_unit_test_setup_teardown(test_alloc_of_a_whole_free_block_does_not_split, setup, teardown),
      cmocka_unit_test_setup_teardown(test_free_merges_with_a_free_left_neighbour, setup, teardown),
      cmocka_unit_test_setup_teardown(test_free_merges_with_a_free_right_neighbour, setup, teardown),
      cmocka_unit_test_setup_teardown(test_free_merges_with_both_free_neighbours, setup, teardown),
      cmocka_unit_test_setup_teardown(test_best_fit_picks_the_smallest_fitting_hole, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fragmentation_then_reuse_fills_holes_without_growing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pool_grows_by_a_chunk_only_when_no_free_block_fits, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversize_request_gets_a_chunk_of_its_own, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stats_track_reserved_allocated_peak_chunks_and_blocks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_allocs_stop_growing_in_a_steady_state, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reserve_makes_room_so_later_allocations_need_no_chunk, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restore_rebuilds_the_checkpointed_layout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restore_frees_every_block_keep_rejects, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chunks_made_after_a_checkpoint_stay_and_are_free_after_restore, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_same_allocations_after_restore_return_the_same_addresses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_lists_allocated_blocks_in_address_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_of_an_empty_pool_restores_to_all_free, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clear_frees_every_block_and_keeps_the_chunks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_restore_refuses_a_checkpoint_of_another_pool, setup, teardown),
      cmocka_unit_test_setup_teardown(test_source_out_of_budget_leaves_the_pool_unchanged, setup, teardown),
      cmocka_unit_test_setup_teardown(test_source_failing_on_the_nth_call_leaves_the_pool_unchanged, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_arguments_change_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_allocation_failure_leaves_the_pool_unchanged, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_chain_of_deltas_holds_memory_linear_in_its_length, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_delta_keeps_its_freed_base_alive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_delta_on_a_base_other_than_the_last_checkpoint_is_full, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_delta_on_a_checkpoint_of_another_pool_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_allocation_failure_restoring_a_delta_leaves_the_pool_unchanged, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_random_operations_agree_with_a_model_of_owned_bytes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
