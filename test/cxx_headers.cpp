/* cxx_headers.cpp — "both headers compile as C11 and as C++": cgtree.h and
 * cgtree_sim.h included by a C++11 program built with -Wall -Wextra
 * -pedantic -Werror (test/meson.build), which calls each inline helper and
 * runs one simulated segment through a kernel, so that the extern "C"
 * guards are exercised by the linker too (a missing guard would leave
 * C++-mangled names the library does not export). Exit 0, or 1 with the
 * failing step on stderr.
 */
#include <cstdio>
#include <cstring>

#include "cgtree.h"
#include "cgtree_sim.h"

namespace {

const int n = 16;

struct doubling {
  const float *in;
  float *out;
};

void double_it(void *args) {
  doubling d;
  std::memcpy(&d, args, sizeof d);
  for (int i = 0; i < n; i++)
    d.out[i] = 2 * d.in[i];
}

cgt_status launch_double(cgt_launch *l, void *) {
  void *out = nullptr;
  cgt_status st = cgt_launch_alloc(l, n * sizeof(float), &out);
  if (st != CGT_OK)
    return st;
  doubling d = {static_cast<const float *>(cgt_launch_input(l, 0)), static_cast<float *>(out)};
  st = cgt_sim_launch(cgt_launch_stream(l), double_it, &d, sizeof d);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, n * sizeof(float)) : st;
}

int failed(const char *what, cgt_status st) {
  std::fprintf(stderr, "cxx_headers: %s: %s\n", what, cgt_status_name(st));
  return 1;
}

}  // namespace

int main() {
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_tree *t = nullptr;
  cgt_status st = cgt_tree_create(&o, &t);
  if (st != CGT_OK)
    return failed("cgt_tree_create", st);
  void *x = nullptr;
  st = cgt_sim_malloc(cgt_tree_stream(t), n * sizeof(float), &x);
  if (st != CGT_OK)
    return failed("cgt_sim_malloc", st);
  float host[n];
  for (int i = 0; i < n; i++)
    host[i] = static_cast<float>(i);
  if ((st = cgt_sim_memcpy_async(cgt_tree_stream(t), x, host, sizeof host)) != CGT_OK ||
      (st = cgt_sim_sync(cgt_tree_stream(t))) != CGT_OK)
    return failed("the input's upload", st);
  cgt_segment_desc d = {"double", launch_double, nullptr, 1, 1, 0};
  cgt_segment s = 0;
  if ((st = cgt_segment_register(t, &d, &s)) != CGT_OK)
    return failed("cgt_segment_register", st);
  cgt_value v = {0};
  cgt_arg a = cgt_arg_static(x, n * sizeof(float));
  if (a.kind != CGT_ARG_STATIC || cgt_arg_dynamic(x, 4).kind != CGT_ARG_DYNAMIC)
    return failed("cgt_arg_static and cgt_arg_dynamic", CGT_ERR_STATE);
  for (int step = 0; step < 3; step++) { /* warmup, recording, replay */
    if ((st = cgt_step_begin(t)) != CGT_OK || (st = cgt_run(t, s, 0, &a, 1, &v, 1)) != CGT_OK)
      return failed("a step", st);
  }
  cgt_arg chained = cgt_arg_value(v);
  if (chained.kind != CGT_ARG_VALUE)
    return failed("cgt_arg_value", CGT_ERR_STATE);
  float got[n];
  if ((st = cgt_value_copy_out(t, v, got, sizeof got)) != CGT_OK || (st = cgt_sync(t)) != CGT_OK)
    return failed("cgt_value_copy_out", st);
  for (int i = 0; i < n; i++)
    if (got[i] != 2 * host[i])
      return failed("the segment's result", CGT_ERR_STATE);
  cgt_sim_free(cgt_tree_stream(t), x);
  cgt_tree_destroy(t);
  std::printf("cxx_headers: both headers compile as C++ and link: ok\n");
  return 0;
}
