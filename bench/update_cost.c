/* update_cost.c — what a reload of parameters costs a recorded segment:
 * capture + update in place against capture + a fresh instantiate (issue 23).
 *
 * One segment the size of a GPT-2 forward in graph nodes: --kernels K
 * (default 200) element-wise kernels in a chain, kernel i adding slice i of
 * one STATIC weight buffer of K x --floats F floats (default 8 x 768, a
 * batch of 8 at GPT-2's width) to the running value; the input is DYNAMIC.
 * A reload moves the weights to a new buffer (new address, new values), so
 * every kernel node's parameters change and nothing else.
 *
 * Three trees run the same steps: `update` (the default: the recording is
 * captured again and its executable updated in place, cudaGraphExecUpdate
 * on CUDA), `instantiate` (no_update_in_place = 1: the capture becomes a new
 * node with a fresh instantiate, as before issue 23) and `eager` (the
 * launch function enqueued without capture: roughly what the capture itself
 * costs the host, since capturing a kernel costs about what enqueuing it
 * does). Each reload is followed by 5 steps of replays, so update in place
 * is allowed again (UPDATE_QUIET_STEPS). For every reload the cgt_run that
 * meets the new weights is timed alone (host time until it returns) and
 * with the cgt_sync after it (until its work is done); the reload steps'
 * outputs must be the same bytes in the update and instantiate trees.
 * Prints the medians over --reloads R (default 20) and the ratio
 * update / instantiate, in total and beyond the eager enqueue.
 *
 *   build/bench/update_cost [--backend sim|cuda|auto] [--kernels K] [--floats F] [--reloads R] [--json FILE]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static const char *prog = "update_cost";
static const kernels *kern;
static int n_kernels = 200;
static size_t n_floats = 8 * 768;

static int check(cgt_status st, const char *what, cgt_tree *t) { return bench_check(prog, st, what, t); }

static cgt_status launch_chain(cgt_launch *l, void *user) {
  (void)user;
  size_t bytes = n_floats * sizeof(float);
  void *acc;
  cgt_status st = cgt_launch_alloc(l, bytes, &acc);
  const float *x = cgt_launch_input(l, 0), *w = cgt_launch_input(l, 1);
  void *s = cgt_launch_stream(l);
  for (int i = 0; i < n_kernels && st == CGT_OK; i++)
    st = kern->add(s, i ? acc : x, w + (size_t)i * n_floats, acc, n_floats);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, acc, bytes);
}

enum { TREE_UPDATE, TREE_INSTANTIATE, TREE_EAGER, N_TREES };
static const char *const tree_names[N_TREES] = {"update", "instantiate", "eager"};

int main(int argc, char **argv) {
  cgt_backend backend = CGT_BACKEND_AUTO;
  int reloads = 20;
  const char *json_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
      const char *b = argv[++i];
      backend = !strcmp(b, "sim") ? CGT_BACKEND_SIM : !strcmp(b, "cuda") ? CGT_BACKEND_CUDA : CGT_BACKEND_AUTO;
    } else if (!strcmp(argv[i], "--kernels") && i + 1 < argc) {
      n_kernels = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--floats") && i + 1 < argc) {
      n_floats = (size_t)atol(argv[++i]);
    } else if (!strcmp(argv[i], "--reloads") && i + 1 < argc) {
      reloads = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      fprintf(stderr, "usage: update_cost [--backend sim|cuda|auto] [--kernels K] [--floats F] [--reloads R] "
                      "[--json FILE]\n");
      return 2;
    }
  }
  if (n_kernels < 1 || n_kernels > 100000 || n_floats < 1 || reloads < 1 || reloads > 1000) {
    fprintf(stderr, "%s: kernels 1..100000, floats and reloads positive (reloads at most 1000)\n", prog);
    return 2;
  }
  if (backend == CGT_BACKEND_AUTO)
    backend = cgt_cuda_available() ? CGT_BACKEND_CUDA : CGT_BACKEND_SIM;
  kern = kernels_for(backend);
  if (!kern) {
    fprintf(stderr, "%s: no kernels for that backend in this build\n", prog);
    return 2;
  }
  char device[256];
  bench_device_name(backend, device, sizeof device);
  size_t w_bytes = (size_t)n_kernels * n_floats * sizeof(float), x_bytes = n_floats * sizeof(float);
  printf("%s: %s; one segment of %d kernels on %zu floats, weights %.1f MiB, %d reloads\n", prog, device, n_kernels,
         n_floats, (double)w_bytes / (1 << 20), reloads);

  /* reloads + 1 weight buffers, all alive, so every reload is a new address. */
  float *host = malloc(w_bytes > x_bytes ? w_bytes : x_bytes);
  void **w = calloc((size_t)reloads + 1, sizeof *w);
  void *x = NULL;
  int ok = host && w;
  for (size_t i = 0; ok && i < n_floats; i++)
    host[i] = (float)(i % 11) * 0.125f;
  ok = ok && kern->dev_alloc(x_bytes, &x) == CGT_OK && kern->upload(x, host, x_bytes) == CGT_OK;
  for (int r = 0; ok && r <= reloads; r++) {
    for (size_t i = 0; i < (size_t)n_kernels * n_floats; i++)
      host[i] = (float)((i + (size_t)r) % 7) * 0.001f * (float)(r + 1);
    ok = kern->dev_alloc(w_bytes, &w[r]) == CGT_OK && kern->upload(w[r], host, w_bytes) == CGT_OK;
  }
  if (!ok) {
    fprintf(stderr, "%s: no memory for the weights\n", prog);
    return 1;
  }

  cgt_tree *t[N_TREES] = {NULL, NULL, NULL};
  cgt_segment seg[N_TREES];
  for (int k = 0; k < N_TREES && ok; k++) {
    cgt_options o;
    cgt_options_init(&o);
    o.backend = backend;
    o.mode = k == TREE_EAGER ? CGT_MODE_EAGER : CGT_MODE_TREE;
    o.no_update_in_place = k == TREE_INSTANTIATE;
    o.rerecord_limit = (uint32_t)reloads + 2; /* the instantiate tree keeps a node per reload */
    cgt_segment_desc d = {"gpt2_sized", launch_chain, NULL, 2, 1, 0};
    ok = check(cgt_tree_create(&o, &t[k]), "cgt_tree_create", NULL) &&
         check(cgt_segment_register(t[k], &d, &seg[k]), "cgt_segment_register", t[k]);
  }
  double *run_us[N_TREES], *done_us[N_TREES];
  for (int k = 0; k < N_TREES; k++) {
    run_us[k] = calloc((size_t)reloads, sizeof(double));
    done_us[k] = calloc((size_t)reloads, sizeof(double));
    ok = ok && run_us[k] && done_us[k];
  }
  float out[2][64];
  size_t cmp = n_floats < 64 ? n_floats : 64;
  /* Steps 0..5 with the first weights (warmup, recording, replays), then
   * for each reload one timed step and five replays. */
  for (int r = 0; r <= reloads && ok; r++) {
    for (int rep = 0; rep < 6 && ok; rep++) {
      /* The trees take turns going first: the first to read new weights
       * finds them out of the caches. */
      for (int j = 0; j < N_TREES && ok; j++) {
        int k = (r + j) % N_TREES;
        cgt_arg a[2] = {cgt_arg_dynamic(x, x_bytes), cgt_arg_static(w[r], w_bytes)};
        cgt_value v;
        ok = check(cgt_sync(t[k]), "cgt_sync", t[k]) && check(cgt_step_begin(t[k]), "cgt_step_begin", t[k]);
        double t0 = bench_now_ns();
        ok = ok && check(cgt_run(t[k], seg[k], 0, a, 2, &v, 1), "cgt_run", t[k]);
        double t1 = bench_now_ns();
        ok = ok && check(cgt_sync(t[k]), "cgt_sync", t[k]);
        double t2 = bench_now_ns();
        if (ok && r > 0 && rep == 0) {
          run_us[k][r - 1] = (t1 - t0) * 1e-3;
          done_us[k][r - 1] = (t2 - t0) * 1e-3;
          if (k < TREE_EAGER)
            ok = check(cgt_value_copy_out(t[k], v, out[k], cmp * sizeof(float)), "copy out", t[k]) &&
                 check(cgt_sync(t[k]), "cgt_sync", t[k]);
        }
      }
      if (ok && r > 0 && rep == 0 && memcmp(out[0], out[1], cmp * sizeof(float))) {
        fprintf(stderr, "%s: reload %d: the updated recording's output differs from the new instantiate's\n", prog, r);
        ok = 0;
      }
    }
  }
  if (!ok)
    return 1;
  cgt_stats s[N_TREES];
  for (int k = 0; k < N_TREES; k++)
    cgt_tree_stats(t[k], &s[k]);
  if (s[TREE_UPDATE].updates != (uint64_t)reloads || s[TREE_UPDATE].nodes != 1) {
    fprintf(stderr, "%s: expected %d updates in place and 1 node, got %llu and %llu\n", prog, reloads,
            (unsigned long long)s[TREE_UPDATE].updates, (unsigned long long)s[TREE_UPDATE].nodes);
    return 1;
  }
  double run_med[N_TREES], done_med[N_TREES];
  for (int k = 0; k < N_TREES; k++) {
    run_med[k] = bench_median(run_us[k], (size_t)reloads);
    done_med[k] = bench_median(done_us[k], (size_t)reloads);
    printf("%s: %-11s the run that meets new weights: %9.1f us to return, %9.1f us until done (median of %d); "
           "%llu nodes, %llu recordings, %llu updates in place (%llu instantiated afresh)\n",
           prog, tree_names[k], run_med[k], done_med[k], reloads, (unsigned long long)s[k].nodes,
           (unsigned long long)s[k].recordings, (unsigned long long)s[k].updates,
           (unsigned long long)s[k].update_fallbacks);
  }
  double ratio = run_med[TREE_UPDATE] / run_med[TREE_INSTANTIATE];
  double beyond_u = run_med[TREE_UPDATE] - run_med[TREE_EAGER], beyond_i = run_med[TREE_INSTANTIATE] - run_med[TREE_EAGER];
  double ratio_beyond = beyond_i > 0 ? beyond_u / beyond_i : 0;
  printf("%s: capture + update costs %.3fx capture + instantiate (%.3fx beyond the eager enqueue); target for "
         "update vs re-instantiate: below 0.5x\n",
         prog, ratio, ratio_beyond);
  if (json_path) {
    FILE *f = fopen(json_path, "a");
    if (f) {
      char esc[256];
      fprintf(f,
              "{\"bench\": \"update_cost\", \"device\": \"%s\", \"kernels\": %d, \"floats\": %zu, \"reloads\": %d, "
              "\"update_us\": %.2f, \"instantiate_us\": %.2f, \"eager_us\": %.2f, \"update_done_us\": %.2f, "
              "\"instantiate_done_us\": %.2f, \"ratio\": %.4f, \"ratio_beyond_enqueue\": %.4f, "
              "\"update_fallbacks\": %llu}\n",
              bench_json_escape(device, esc, sizeof esc), n_kernels, n_floats, reloads, run_med[TREE_UPDATE],
              run_med[TREE_INSTANTIATE], run_med[TREE_EAGER], done_med[TREE_UPDATE], done_med[TREE_INSTANTIATE],
              ratio, ratio_beyond, (unsigned long long)s[TREE_UPDATE].update_fallbacks);
      fclose(f);
    }
  }
  for (int k = 0; k < N_TREES; k++) {
    cgt_tree_destroy(t[k]);
    free(run_us[k]);
    free(done_us[k]);
  }
  for (int r = 0; r <= reloads; r++)
    kern->dev_free(w[r]);
  kern->dev_free(x);
  free(w);
  free(host);
  return 0;
}
