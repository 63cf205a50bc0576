/* cgtree.c — the `cgtree` command: demo, dot, info.
 *
 * The demo is the library's argument in one command. It runs the same
 * workloads three times on one backend: eagerly (every segment launched
 * kernel by kernel, the baseline), with separate graphs (one graph and one
 * private pool per node, what naive graph capture costs in memory), and as a
 * graph tree (the product). The three must compute the same thing, so the
 * output of every step is compared bit for bit against the eager run before a
 * single figure is printed; a disagreement is an error, because speed of a
 * wrong answer is worth nothing. Then it shows, per workload, what the tree
 * buys: time per step against eager on a GPU, memory against eager (the tree
 * should match it, separate graphs should not), and the counters that say
 * why (graphs recorded, replays, checkpoint restores, nodes that fell back
 * to eager), and draws the tree the run grew. With --defer a fourth run,
 * tree+defer, holds replays back and launches recurring spans of the path
 * as one fused graph (defer_launch); its table column and tree show them.
 *
 * Every step is first checked against eager (each ending in cgt_sync and a
 * read-back); then as many steps as there were after the warm-up ones run
 * back to back and are timed with one cgt_sync at the end, the way bench/
 * times them, so a figure is the cost of a step in a stream of steps. On the
 * simulator those times measure a CPU pretending to be a GPU; they are always
 * labelled "CPU simulation (not GPU time)" and no speedup is derived from
 * them, since a simulated graph replay says nothing about a real one.
 *
 * The command keeps to the library's public API (cgtree.h) and the shared
 * workloads (tools/common); the GPU description comes from cuda_info.c.
 * Exit status: 0 success, 1 a failure or a disagreement between modes, 2 a
 * command line it does not understand.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cgtree.h"
#include "cuda_info.h"
#include "kernels.h"
#include "workloads.h"

enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* The steps a demo runs unless --steps says otherwise: enough that replays
 * dominate the counters and the means. The whole default demo takes about
 * two seconds on the simulator, so both backends run the same count. */
enum { DEFAULT_STEPS = 200, MAX_STEPS = 10000000 };

/* The tree drawing stops after this many nodes; `cgtree dot` draws them all. */
enum { MAX_DRAWN_NODES = 48 };

static const uint64_t demo_seed = 20240601;

static const char usage_text[] =
    "usage: cgtree <command> [options]\n"
    "\n"
    "commands:\n"
    "  demo   run the workloads eagerly, as separate graphs and as a graph tree;\n"
    "         check that the outputs agree, then print the figures and the tree\n"
    "  dot    run the demo's tree mode and write its tree as Graphviz\n"
    "  info   print the version, the backends and the GPU\n"
    "  help   print this help\n"
    "\n"
    "cgtree demo [--backend auto|cuda|sim] [--workload branchy|chain|all]\n"
    "            [--steps N] [--dot FILE] [--json] [--defer]\n"
    "  --backend   auto (default): the GPU if there is one, else the simulator\n"
    "  --workload  which workload to run (default: all)\n"
    "  --steps     steps per mode (default: 200)\n"
    "  --dot       also write each tree-mode tree to FILE as Graphviz\n"
    "  --json      print one JSON document instead of the tables:\n"
    "              {\"cgtree\": version, \"workloads\": [one object per workload]}\n"
    "  --defer     also run the tree with defer_launch = 1 (tree+defer): replays\n"
    "              are held back and recurring spans launched as one fused graph\n"
    "\n"
    "cgtree dot [--backend B] [--workload W] [--steps N] [--defer] [FILE]\n"
    "  writes to FILE, or to standard output; default workload: branchy\n"
    "  (several workloads give several graphs, one after another)\n"
    "\n"
    "cgtree --version | --help\n"
    "\n"
    "Exit status: 0 success, 1 failure or outputs that disagree, 2 bad usage.\n";

static void usage(FILE *f) { fputs(usage_text, f); }

/* A command line we do not understand: say what in one line, then where
 * the help is (the whole help would bury the one line that matters). */
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("cgtree: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\nTry 'cgtree help' for usage.\n", stderr);
  va_end(ap);
  return EXIT_USAGE;
}

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("cgtree: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *fmt_bytes(size_t b, char *buf, size_t n) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, n, "%zu B", b);
  else
    snprintf(buf, n, "%.*f %s", v < 10.0 ? 2 : 1, v, unit[u]);
  return buf;
}

static const char *fmt_time(double seconds, char *buf, size_t n) {
  if (seconds < 1e-3)
    snprintf(buf, n, "%.1f us", seconds * 1e6);
  else if (seconds < 1.0)
    snprintf(buf, n, "%.2f ms", seconds * 1e3);
  else
    snprintf(buf, n, "%.2f s", seconds);
  return buf;
}

static const char *mode_name(cgt_mode m) {
  return m == CGT_MODE_EAGER ? "eager" : m == CGT_MODE_SEPARATE ? "separate" : "tree";
}

static const char *backend_name(cgt_backend b) {
  return b == CGT_BACKEND_CUDA ? "cuda" : b == CGT_BACKEND_SIM ? "sim" : "auto";
}

static const char *workload_name(wl_kind k) { return k == WL_CHAIN ? "chain" : "branchy"; }

/* ------------------------------------------------------------ command line */

/* Workloads in the order the demo runs them. */
static const wl_kind all_workloads[] = {WL_BRANCHY, WL_CHAIN};
enum { N_WORKLOADS = sizeof all_workloads / sizeof all_workloads[0] };

typedef struct cli {
  cgt_backend backend; /* as asked: AUTO, CUDA or SIM */
  int want[N_WORKLOADS]; /* want[i]: run all_workloads[i] */
  int steps;           /* 0: DEFAULT_STEPS */
  const char *dot_path;
  int json;
  int defer; /* --defer: a tree+defer mode (demo), or the dot of that tree (dot) */
} cli;

/* Takes "--name value" or "--name=value" at argv[*i]. Returns 1 and sets
 * *value when argv[*i] is that option, 0 when it is another, -1 (after a
 * usage message) when the value is missing. */
static int take_option(int argc, char **argv, int *i, const char *name, const char **value) {
  size_t len = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, len) != 0)
    return 0;
  if (a[len] == '=') {
    *value = a + len + 1;
    return 1;
  }
  if (a[len] != '\0')
    return 0;
  if (*i + 1 >= argc) {
    usage_error("%s needs a value", name);
    return -1;
  }
  *value = argv[++*i];
  return 1;
}

/* Parses the options shared by demo and dot. `command` is "demo" or "dot";
 * dot takes one positional FILE, demo none. Returns 0, or EXIT_USAGE after
 * printing why. */
static int parse_cli(int argc, char **argv, const char *command, cli *c) {
  int is_dot = !strcmp(command, "dot");
  memset(c, 0, sizeof *c);
  c->backend = CGT_BACKEND_AUTO;
  const char *which = is_dot ? "branchy" : "all";
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    int r;
    if ((r = take_option(argc, argv, &i, "--backend", &v)) != 0) {
      if (r < 0)
        return EXIT_USAGE;
      if (!strcmp(v, "auto"))
        c->backend = CGT_BACKEND_AUTO;
      else if (!strcmp(v, "cuda"))
        c->backend = CGT_BACKEND_CUDA;
      else if (!strcmp(v, "sim"))
        c->backend = CGT_BACKEND_SIM;
      else
        return usage_error("unknown backend '%s' (auto, cuda or sim)", v);
    } else if ((r = take_option(argc, argv, &i, "--workload", &v)) != 0) {
      if (r < 0)
        return EXIT_USAGE;
      which = v;
    } else if ((r = take_option(argc, argv, &i, "--steps", &v)) != 0) {
      if (r < 0)
        return EXIT_USAGE;
      char *end = NULL;
      long n = strtol(v, &end, 10);
      if (!*v || *end || n < 1 || n > MAX_STEPS)
        return usage_error("--steps wants a whole number from 1 to %d, not '%s'", MAX_STEPS, v);
      c->steps = (int)n;
    } else if (!is_dot && (r = take_option(argc, argv, &i, "--dot", &v)) != 0) {
      if (r < 0)
        return EXIT_USAGE;
      if (!*v)
        return usage_error("--dot wants a file name");
      c->dot_path = v;
    } else if (!is_dot && !strcmp(argv[i], "--json")) {
      c->json = 1;
    } else if (!strcmp(argv[i], "--defer")) {
      c->defer = 1;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      exit(0);
    } else if (is_dot && argv[i][0] != '-' && !c->dot_path) {
      c->dot_path = argv[i];
    } else if (is_dot && !strcmp(argv[i], "-") && !c->dot_path) {
      c->dot_path = "-";
    } else {
      return usage_error("%s: unexpected argument '%s'", command, argv[i]);
    }
  }
  int any = 0;
  for (int k = 0; k < N_WORKLOADS; k++) {
    c->want[k] = !strcmp(which, "all") || !strcmp(which, workload_name(all_workloads[k]));
    any |= c->want[k];
  }
  if (!any)
    return usage_error("unknown workload '%s' (branchy, chain or all)", which);
  return 0;
}

/* ---------------------------------------------------------------- backend */

/* The backend a run will use, and the words that say why. */
typedef struct backend_choice {
  cgt_backend backend; /* CUDA or SIM, never AUTO */
  cuda_info cuda;
  char why[320];       /* "auto: no usable GPU (...)" or the GPU's name */
} backend_choice;

static int cuda_built(void) { return kernels_for(CGT_BACKEND_CUDA) != NULL; }

/* Resolves --backend. An unavailable CUDA backend is a one-line error. */
static int choose_backend(cgt_backend asked, backend_choice *b) {
  memset(b, 0, sizeof *b);
  cuda_info_query(&b->cuda);
  int have_gpu = cuda_built() && cgt_cuda_available();
  if (asked == CGT_BACKEND_CUDA && !have_gpu) {
    if (!cuda_built())
      fail("the CUDA backend is not available: this cgtree was built without CUDA");
    else
      fail("the CUDA backend is not available: no usable GPU or driver (%s)",
           b->cuda.error[0] ? b->cuda.error : "cgt_cuda_available() says no");
    return EXIT_FAIL;
  }
  b->backend = asked == CGT_BACKEND_AUTO ? (have_gpu ? CGT_BACKEND_CUDA : CGT_BACKEND_SIM) : asked;
  const char *how = asked == CGT_BACKEND_AUTO ? "auto: " : "";
  if (b->backend == CGT_BACKEND_CUDA) {
    const cuda_gpu *g = &b->cuda.gpus[0];
    snprintf(b->why, sizeof b->why, "%s%s, compute capability %d.%d", how, g->name, g->cc_major, g->cc_minor);
  } else if (asked == CGT_BACKEND_AUTO) {
    snprintf(b->why, sizeof b->why, "auto: no usable GPU: %s",
             b->cuda.error[0] ? b->cuda.error : "cgt_cuda_available() says no");
  } else {
    snprintf(b->why, sizeof b->why, "asked for");
  }
  return 0;
}

/* --------------------------------------------------------------- progress */

/* A progress line, shown from the first step whenever stderr is a terminal
 * (a demo of 200 steps in three modes takes seconds on the simulator and
 * should never look hung). It goes to stderr and is erased before anything
 * else is printed, so no file or pipe ever holds it, and a terminal shows
 * it even while stdout goes to a file. */
typedef struct progress {
  int enabled, shown;
  double start, last;
  long done, total;
} progress;

static void progress_init(progress *p, long total) {
  memset(p, 0, sizeof *p);
  p->enabled = isatty(STDERR_FILENO);
  p->start = p->last = now_s();
  p->total = total > 0 ? total : 1;
}

static void progress_step(progress *p, const char *what, cgt_mode mode, int step, int steps) {
  p->done++;
  if (!p->enabled)
    return;
  double t = now_s();
  if (p->shown && t - p->last < 0.1 && p->done < p->total)
    return;
  p->last = t;
  fprintf(stderr, "\r\033[K  running %s, %s mode: step %d/%d  (%ld%% done)", what, mode_name(mode), step + 1,
          steps, p->done * 100 / p->total);
  fflush(stderr);
  p->shown = 1;
}

static void progress_clear(progress *p) {
  if (p->shown) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->shown = 0;
  }
}

/* ---------------------------------------------------------------- running */

/* The fourth, with --defer, is the tree again with defer_launch = 1. */
static const cgt_mode demo_modes[] = {CGT_MODE_EAGER, CGT_MODE_SEPARATE, CGT_MODE_TREE, CGT_MODE_TREE};
enum { N_MODES = 4, MODE_TREE_INDEX = 2, MODE_DEFER_INDEX = 3 };

typedef struct mode_result {
  cgt_mode mode;
  int defer;           /* the tree+defer mode */
  double step_s;       /* mean host time of a timed step */
  cgt_stats stats;
  size_t memory_peak;  /* graph pool peak plus the eager nodes' side pool peak */
  uint32_t eager_nodes;
  /* Agreement with the eager run (always agrees for eager itself). */
  int bit_equal;
  double max_abs_diff;
  int first_diff_step;
  size_t first_diff_index;
} mode_result;

static const char *result_name(const mode_result *m) { return m->defer ? "tree+defer" : mode_name(m->mode); }

typedef struct workload_result {
  wl_kind kind;
  wl_params params;
  char description[256];
  int steps, warmup_steps, segments_per_step;
  size_t output_floats;
  int n_modes; /* 3, or 4 with --defer */
  mode_result modes[N_MODES];
  /* The tree-mode run is kept until it has been printed: the node list's
   * names belong to the tree. */
  cgt_tree *tree;
  workload *wl;
  cgt_node_info *nodes;
  size_t n_nodes;
} workload_result;

typedef struct demo_run {
  backend_choice backend;
  int n_modes; /* 3, or 4 with --defer */
  int steps, warmup_steps;
  progress progress;
} demo_run;

/* Warm-up steps are excluded from the timing: they record graphs and grow
 * the pools, which the steady state the figures describe does not do. */
static int warmup_steps_for(int steps) {
  if (steps < 2)
    return 0;
  int w = steps / 10;
  return w < 1 ? 1 : w > 20 ? 20 : w;
}

static void report_failure(const char *what, const workload_result *r, cgt_mode mode, int step, cgt_status st,
                           const cgt_tree *t) {
  /* The tree knows about device failures, the workload about its own. */
  const char *detail = t ? cgt_tree_last_error(t) : "";
  if (!*detail)
    detail = wl_last_error();
  if (step >= 0)
    fail("%s, %s mode, step %d: %s failed: %s%s%s", workload_name(r->kind), mode_name(mode), step, what,
         cgt_status_name(st), *detail ? ": " : "", detail);
  else
    fail("%s, %s mode: %s failed: %s%s%s", workload_name(r->kind), mode_name(mode), what, cgt_status_name(st),
         *detail ? ": " : "", detail);
}

static void compare_step(mode_result *m, const float *ref, const float *got, size_t n, int step) {
  if (!memcmp(ref, got, n * sizeof *ref))
    return;
  for (size_t i = 0; i < n; i++) {
    if (!memcmp(&ref[i], &got[i], sizeof *ref))
      continue;
    double d = fabs((double)ref[i] - (double)got[i]);
    if (isnan(d))
      d = INFINITY;
    if (m->bit_equal) {
      m->bit_equal = 0;
      m->first_diff_step = step;
      m->first_diff_index = i;
    }
    if (d > m->max_abs_diff)
      m->max_abs_diff = d;
  }
}

/* Runs one workload in one mode for every step. The eager run fills *ref
 * with each step's output (allocating it); the later modes are compared
 * against it when there is one. The tree-mode tree and workload are handed
 * back through r instead of destroyed. */
static int run_mode(demo_run *d, workload_result *r, int mode_index, float **ref) {
  mode_result *m = &r->modes[mode_index];
  cgt_mode mode = demo_modes[mode_index];
  memset(m, 0, sizeof *m);
  m->mode = mode;
  m->defer = mode_index == MODE_DEFER_INDEX;
  m->bit_equal = 1;
  m->first_diff_step = -1;

  cgt_options o;
  cgt_options_init(&o);
  o.backend = d->backend.backend;
  o.mode = mode;
  o.defer_launch = (uint32_t)m->defer;
  cgt_tree *t = NULL;
  cgt_status st = cgt_tree_create(&o, &t);
  if (st != CGT_OK) {
    report_failure("cgt_tree_create", r, mode, -1, st, NULL);
    return EXIT_FAIL;
  }
  workload *w = NULL;
  st = wl_create(t, &r->params, demo_seed, &w);
  if (st != CGT_OK) {
    report_failure("wl_create", r, mode, -1, st, t);
    cgt_tree_destroy(t);
    return EXIT_FAIL;
  }
  int rc = EXIT_FAIL;
  float *out = NULL;
  cgt_node_info *nodes = NULL;
  size_t n = wl_output_floats(w);
  if (mode == CGT_MODE_EAGER || !*ref) {
    r->output_floats = n;
    r->segments_per_step = wl_segments_per_step(w);
  } else if (n != r->output_floats) {
    fail("%s, %s mode: %zu output floats, the eager run had %zu", workload_name(r->kind), mode_name(mode), n,
         r->output_floats);
    goto done;
  }
  if (mode == CGT_MODE_EAGER) {
    free(*ref);
    *ref = malloc((size_t)d->steps * (n ? n : 1) * sizeof **ref);
    out = *ref;
  } else {
    out = malloc((n ? n : 1) * sizeof *out);
  }
  if (!out) {
    fail("out of host memory for %d steps of %zu output floats", d->steps, n);
    goto done;
  }

  /* First every step is checked: run, sync, read the output back, compare
   * with eager. Then the same number of steps after the warm-up ones runs
   * back to back and is timed as bench/ times it: one sync at the end, so a
   * figure is the cost of a step in a stream of steps. */
  for (int step = 0; step < d->steps; step++) {
    st = wl_step(w, step);
    if (st == CGT_OK)
      st = cgt_sync(t);
    if (st != CGT_OK) {
      progress_clear(&d->progress);
      report_failure("wl_step", r, mode, step, st, t);
      goto done;
    }
    float *step_out = mode == CGT_MODE_EAGER ? out + (size_t)step * n : out;
    st = wl_output(w, step_out, n);
    if (st != CGT_OK) {
      progress_clear(&d->progress);
      report_failure("wl_output", r, mode, step, st, t);
      goto done;
    }
    if (mode != CGT_MODE_EAGER && *ref)
      compare_step(m, *ref + (size_t)step * n, out, n, step);
    progress_step(&d->progress, workload_name(r->kind), mode, step, d->steps);
  }
  int timed_steps = d->steps - d->warmup_steps;
  double t0 = now_s();
  for (int i = 0; i < timed_steps && st == CGT_OK; i++)
    st = wl_step(w, d->steps + i);
  if (st == CGT_OK)
    st = cgt_sync(t);
  double t1 = now_s();
  if (st != CGT_OK) {
    progress_clear(&d->progress);
    report_failure("wl_step", r, mode, d->steps, st, t);
    goto done;
  }
  m->step_s = timed_steps > 0 ? (t1 - t0) / timed_steps : 0.0;

  cgt_tree_stats(t, &m->stats);
  m->memory_peak = m->stats.pool_peak_bytes + m->stats.side_pool_peak_bytes;
  size_t count = 0;
  cgt_tree_nodes(t, NULL, 0, &count);
  nodes = calloc(count ? count : 1, sizeof *nodes);
  if (!nodes) {
    fail("out of host memory");
    goto done;
  }
  cgt_tree_nodes(t, nodes, count, &count);
  for (size_t i = 0; i < count; i++)
    m->eager_nodes += nodes[i].state == CGT_NODE_EAGER;
  if (mode == CGT_MODE_TREE) {
    /* The last tree-mode run is the one drawn (tree+defer, with --defer). */
    free(r->nodes);
    if (r->wl)
      wl_destroy(r->wl);
    cgt_tree_destroy(r->tree);
    r->tree = t;
    r->wl = w;
    r->nodes = nodes;
    r->n_nodes = count;
    t = NULL;
    w = NULL;
    nodes = NULL;
  }
  rc = 0;
done:
  if (mode != CGT_MODE_EAGER)
    free(out);
  free(nodes);
  if (w)
    wl_destroy(w);
  cgt_tree_destroy(t);
  return rc;
}

static void workload_result_free(workload_result *r) {
  free(r->nodes);
  if (r->wl)
    wl_destroy(r->wl);
  cgt_tree_destroy(r->tree);
  r->nodes = NULL;
  r->wl = NULL;
  r->tree = NULL;
}

/* Runs the modes from first_mode on: 0 for all three (the demo),
 * MODE_TREE_INDEX for the tree alone (`cgtree dot`). */
static int run_workload(demo_run *d, wl_kind kind, int first_mode, workload_result *r) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  wl_params_default(&r->params, kind);
  wl_describe(&r->params, r->description, sizeof r->description);
  r->steps = d->steps;
  r->warmup_steps = d->warmup_steps;
  r->n_modes = d->n_modes;
  float *ref = NULL;
  int rc = 0;
  for (int i = first_mode; i < d->n_modes && rc == 0; i++)
    rc = run_mode(d, r, i, &ref);
  free(ref);
  if (rc)
    workload_result_free(r);
  return rc;
}

/* --------------------------------------------------------------- printing */

/* The tree like tree(1): the roots hang under a title line, each child is
 * drawn under its parent in id order (the order the run created them). */
typedef struct drawing {
  const cgt_node_info *nodes; /* nodes[id - 1] */
  uint32_t *first_child;      /* by id; index 0 is the roots */
  uint32_t *next_sibling;     /* by id */
  char *prefix;
  size_t drawn, limit;
} drawing;

static void draw_node(drawing *g, const cgt_node_info *n, int last, size_t prefix_len) {
  if (g->drawn == g->limit)
    return;
  g->drawn++;
  printf("  %s%s #%" PRIu32 " %s", g->prefix, last ? "\u2514\u2500\u2500" : "\u251c\u2500\u2500", n->id,
         n->segment_name ? n->segment_name : "?");
  if (n->variant)
    printf(" (variant %" PRIu64 ")", n->variant);
  printf(" [%s] replays=%" PRIu64, cgt_node_state_name(n->state), n->replays);
  if (n->fused_runs)
    printf(" fused=%" PRIu64, n->fused_runs);
  if (n->state == CGT_NODE_EAGER && n->reason)
    printf(" (%s)", n->reason);
  putchar('\n');
  /* Children continue the parent's vertical line unless it was the last. */
  const char *bar = last ? "    " : "\u2502   ";
  strcpy(g->prefix + prefix_len, bar);
  size_t child_len = prefix_len + strlen(bar);
  for (uint32_t c = g->first_child[n->id]; c; c = g->next_sibling[c])
    draw_node(g, &g->nodes[c - 1], g->next_sibling[c] == 0, child_len);
  g->prefix[prefix_len] = '\0';
}

static void draw_tree(const workload_result *r) {
  size_t n = r->n_nodes;
  printf("  tree mode grew %zu node%s:\n", n, n == 1 ? "" : "s");
  if (!n)
    return;
  drawing g = {.nodes = r->nodes, .limit = MAX_DRAWN_NODES};
  uint32_t max_depth = 0;
  for (size_t i = 0; i < n; i++)
    if (r->nodes[i].depth > max_depth)
      max_depth = r->nodes[i].depth;
  g.first_child = calloc(n + 1, sizeof *g.first_child);
  g.next_sibling = calloc(n + 1, sizeof *g.next_sibling);
  g.prefix = calloc((size_t)max_depth + 2, sizeof "\u2502   ");
  if (!g.first_child || !g.next_sibling || !g.prefix) {
    printf("  (out of host memory for the drawing)\n");
  } else {
    /* Ids are 1..n in creation order; prepending from the back leaves every
     * sibling list in id order. */
    for (size_t i = n; i-- > 0;) {
      const cgt_node_info *c = &r->nodes[i];
      if (c->id != i + 1 || c->parent >= c->id)
        continue; /* not the numbering cgt_tree_nodes promises; skip rather than loop */
      g.next_sibling[c->id] = g.first_child[c->parent];
      g.first_child[c->parent] = c->id;
    }
    for (uint32_t c = g.first_child[0]; c; c = g.next_sibling[c])
      draw_node(&g, &r->nodes[c - 1], g.next_sibling[c] == 0, 0);
    if (g.drawn < n)
      printf("  ... and %zu more node%s (cgtree dot draws them all)\n", n - g.drawn, n - g.drawn == 1 ? "" : "s");
  }
  free(g.first_child);
  free(g.next_sibling);
  free(g.prefix);
}

static int outputs_agree(const workload_result *r) {
  for (int i = 0; i < r->n_modes; i++)
    if (!r->modes[i].bit_equal)
      return 0;
  return 1;
}

static void print_agreement(const workload_result *r) {
  if (outputs_agree(r)) {
    printf("  outputs: bit-equal in every mode at every step (%d step%s x %zu floats)\n", r->steps,
           r->steps == 1 ? "" : "s", r->output_floats);
    return;
  }
  for (int i = 1; i < r->n_modes; i++) {
    const mode_result *m = &r->modes[i];
    if (!m->bit_equal)
      printf("  outputs: %s DIFFERS from eager: max abs diff %.9g%s (first at step %d, float %zu)\n",
             result_name(m), m->max_abs_diff, isinf(m->max_abs_diff) ? " (a NaN or inf on one side)" : "",
             m->first_diff_step, m->first_diff_index);
  }
}

static void print_table(const demo_run *d, const workload_result *r) {
  int gpu = d->backend.backend == CGT_BACKEND_CUDA;
  int timed = r->steps > r->warmup_steps;
  printf("%s: %s\n", workload_name(r->kind), r->description);
  printf("  %d checked step%s per mode, then %d timed back to back; %d segment run%s per step\n\n", r->steps,
         r->steps == 1 ? "" : "s", r->steps - r->warmup_steps, r->segments_per_step,
         r->segments_per_step == 1 ? "" : "s");
  /* On the simulator there is no speedup column: see the essay. */
  printf("  %-10s %12s", "mode", gpu ? "time/step" : "CPU sim/step");
  if (gpu)
    printf(" %8s", "speedup");
  printf(" %11s %9s %7s %8s %9s %12s", "pool peak", "vs eager", "graphs", "replays", "restores", "eager nodes");
  /* Two spaces at least between column names, so no two read as one. */
  if (r->n_modes > MODE_DEFER_INDEX)
    printf("  %14s", "fused launches");
  putchar('\n');
  const mode_result *eager = &r->modes[0];
  for (int i = 0; i < r->n_modes; i++) {
    const mode_result *m = &r->modes[i];
    char t[32], b[32], speedup[16] = "-", mem[16] = "-";
    if (timed && m->step_s > 0)
      snprintf(speedup, sizeof speedup, "%.2fx", eager->step_s / m->step_s);
    if (eager->memory_peak)
      snprintf(mem, sizeof mem, "%.2fx", (double)m->memory_peak / (double)eager->memory_peak);
    printf("  %-10s %12s", result_name(m), timed ? fmt_time(m->step_s, t, sizeof t) : "-");
    if (gpu)
      printf(" %8s", speedup);
    printf(" %11s %9s %7" PRIu64 " %8" PRIu64 " %9" PRIu64 " %12" PRIu32, fmt_bytes(m->memory_peak, b, sizeof b),
           mem, m->stats.recordings, m->stats.replays, m->stats.checkpoint_restores, m->eager_nodes);
    if (r->n_modes > MODE_DEFER_INDEX)
      printf("  %14" PRIu64, m->stats.fused_launches);
    putchar('\n');
  }
  putchar('\n');
  print_agreement(r);
  putchar('\n');
  draw_tree(r);
}

/* JSON: the demo prints one document, {"cgtree": version, "workloads": [...]},
 * with each workload's object on a line of its own. Strings come from the
 * library and the workloads, so they are escaped in full. */
static void json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", stdout);
    else if (*p < 0x20)
      printf("\\u%04x", *p);
    else
      putchar(*p);
  }
  putchar('"');
}

static void json_number(double v) {
  if (isfinite(v))
    printf("%.9g", v);
  else
    fputs("null", stdout);
}

static void json_stats(const cgt_stats *s) {
  const char *sep = "";
  putchar('{');
#define JSON_U64(f)                                  \
  printf("%s\"" #f "\":%" PRIu64, sep, (uint64_t)s->f); \
  sep = ",";
#define JSON_SIZE(f)                       \
  printf("%s\"" #f "\":%zu", sep, s->f); \
  sep = ",";
  CGT_STATS_FIELDS(JSON_U64, JSON_SIZE)
#undef JSON_U64
#undef JSON_SIZE
  putchar('}');
}

static void print_json(const demo_run *d, const workload_result *r) {
  int gpu = d->backend.backend == CGT_BACKEND_CUDA;
  printf("{\"workload\":");
  json_string(workload_name(r->kind));
  printf(",\"description\":");
  json_string(r->description);
  printf(",\"backend\":\"%s\",\"backend_detail\":", backend_name(d->backend.backend));
  json_string(d->backend.why);
  printf(",\"timing\":\"%s\",\"steps\":%d,\"warmup_steps\":%d,\"segments_per_step\":%d,\"output_floats\":%zu",
         gpu ? "gpu" : "cpu_simulation", r->steps, r->warmup_steps, r->segments_per_step, r->output_floats);
  double max_diff = 0;
  for (int i = 0; i < r->n_modes; i++)
    if (r->modes[i].max_abs_diff > max_diff)
      max_diff = r->modes[i].max_abs_diff;
  printf(",\"outputs_bit_equal\":%s,\"max_abs_diff\":", outputs_agree(r) ? "true" : "false");
  json_number(max_diff);
  printf(",\"modes\":[");
  const mode_result *eager = &r->modes[0];
  for (int i = 0; i < r->n_modes; i++) {
    const mode_result *m = &r->modes[i];
    printf("%s{\"mode\":\"%s\",\"step_us\":", i ? "," : "", result_name(m));
    json_number(r->steps > r->warmup_steps ? m->step_s * 1e6 : NAN);
    printf(",\"speedup_vs_eager\":");
    json_number(gpu && m->step_s > 0 ? eager->step_s / m->step_s : NAN);
    printf(",\"memory_peak_bytes\":%zu,\"memory_vs_eager\":", m->memory_peak);
    json_number(eager->memory_peak ? (double)m->memory_peak / (double)eager->memory_peak : NAN);
    printf(",\"eager_nodes\":%" PRIu32 ",\"outputs_bit_equal\":%s,\"max_abs_diff\":", m->eager_nodes,
           m->bit_equal ? "true" : "false");
    json_number(m->max_abs_diff);
    printf(",\"stats\":");
    json_stats(&m->stats);
    putchar('}');
  }
  printf("],\"nodes\":[");
  for (size_t i = 0; i < r->n_nodes; i++) {
    const cgt_node_info *n = &r->nodes[i];
    printf("%s{\"id\":%" PRIu32 ",\"parent\":%" PRIu32 ",\"depth\":%" PRIu32 ",\"segment\":%" PRIu32
           ",\"segment_name\":",
           i ? "," : "", n->id, n->parent, n->depth, n->segment);
    json_string(n->segment_name);
    printf(",\"variant\":%" PRIu64 ",\"state\":\"%s\",\"replays\":%" PRIu64 ",\"eager_runs\":%" PRIu64
           ",\"pool_bytes_live\":%zu,\"fused_runs\":%" PRIu64 ",\"reason\":",
           n->variant, cgt_node_state_name(n->state), n->replays, n->eager_runs, n->pool_bytes_live, n->fused_runs);
    if (n->reason)
      json_string(n->reason);
    else
      fputs("null", stdout);
    putchar('}');
  }
  printf("]}");
}

/* The Graphviz destination is opened before the run, so a path that cannot
 * be written fails at once instead of after the whole demo. */
static FILE *open_dot(const char *path) {
  if (!path || !strcmp(path, "-"))
    return stdout;
  FILE *f = fopen(path, "w");
  if (!f)
    fail("cannot write %s: %s", path, strerror(errno));
  return f;
}

/* Writes every tree-mode tree to f, one graph after another, and closes f
 * unless it is stdout. */
static int write_dot(workload_result *results, int n, FILE *f, const char *path) {
  const char *name = f == stdout ? "the dot output" : path;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    cgt_status st = cgt_tree_write_dot(results[i].tree, f);
    if (st != CGT_OK) {
      fail("writing %s: %s", name, cgt_status_name(st));
      rc = EXIT_FAIL;
    }
  }
  if ((f == stdout ? fflush(f) : fclose(f)) != 0 && rc == 0) {
    fail("writing %s: %s", name, strerror(errno));
    rc = EXIT_FAIL;
  }
  return rc;
}

/* --------------------------------------------------------------- commands */

/* The demo's modes are the point; a CGT_MODE kill switch in the environment
 * would turn all three into one, so the demo sets it aside and says so. */
static void set_aside_cgt_mode(int quiet) {
  const char *e = getenv("CGT_MODE");
  if (!e || !*e)
    return;
  if (!quiet)
    fprintf(stderr, "cgtree: note: ignoring CGT_MODE=%s; the demo chooses the mode of each run\n", e);
  unsetenv("CGT_MODE");
}

/* Runs the wanted workloads (all modes, or the tree alone) into results[];
 * returns how many through *n. */
static int run_all(demo_run *d, const cli *c, int tree_only, workload_result *results, int *n) {
  *n = 0;
  long total = 0;
  for (int k = 0; k < N_WORKLOADS; k++)
    total += c->want[k] ? (long)d->steps * (tree_only ? 1 : d->n_modes) : 0;
  progress_init(&d->progress, total);
  for (int k = 0; k < N_WORKLOADS; k++) {
    if (!c->want[k])
      continue;
    int first = !tree_only ? 0 : d->n_modes > MODE_DEFER_INDEX ? MODE_DEFER_INDEX : MODE_TREE_INDEX;
    int rc = run_workload(d, all_workloads[k], first, &results[*n]);
    progress_clear(&d->progress);
    if (rc)
      return rc;
    ++*n;
  }
  return 0;
}

static int setup_run(const cli *c, demo_run *d) {
  memset(d, 0, sizeof *d);
  int rc = choose_backend(c->backend, &d->backend);
  if (rc)
    return rc;
  d->steps = c->steps ? c->steps : DEFAULT_STEPS;
  d->warmup_steps = warmup_steps_for(d->steps);
  d->n_modes = c->defer ? N_MODES : N_MODES - 1;
  return 0;
}

static int cmd_demo(int argc, char **argv) {
  cli c;
  int rc = parse_cli(argc, argv, "demo", &c);
  if (rc)
    return rc;
  set_aside_cgt_mode(c.json);
  demo_run d;
  if ((rc = setup_run(&c, &d)) != 0)
    return rc;
  /* The Graphviz file is opened before anything runs or prints: a path
   * that cannot be written is the whole answer. */
  FILE *dot = NULL;
  if (c.dot_path && !(dot = open_dot(c.dot_path)))
    return EXIT_FAIL;
  if (!c.json) {
    printf("cgtree %s demo on %s (%s)\n", CGT_VERSION_STRING,
           d.backend.backend == CGT_BACKEND_CUDA ? "the GPU" : "the simulator", d.backend.why);
    if (d.backend.backend == CGT_BACKEND_SIM)
      printf("Times are CPU simulation (not GPU time); no speedup is derived from them.\n");
    else
      printf("Times are host-clock means per step over back-to-back steps, synced once at the end (as bench/ times).\n");
    printf("Columns: pool peak = peak bytes of the graph pool(s) plus the eager side pool; graphs = recordings; "
           "replays = graph replays; restores = pool checkpoint restores; eager nodes = nodes that run eagerly for good.\n\n");
    fflush(stdout);
  }
  workload_result results[N_WORKLOADS];
  int n = 0;
  rc = run_all(&d, &c, 0, results, &n);
  int disagree = 0;
  if (c.json)
    printf("{\"cgtree\":\"%s\",\"workloads\":[\n", CGT_VERSION_STRING);
  for (int i = 0; i < n; i++) {
    if (c.json) {
      print_json(&d, &results[i]);
      printf(i + 1 < n ? ",\n" : "\n");
    } else {
      if (i)
        printf("\n");
      print_table(&d, &results[i]);
    }
    disagree |= !outputs_agree(&results[i]);
  }
  if (c.json)
    printf("]}\n");
  if (dot) {
    /* After a failed run the file keeps the trees that were finished. */
    int dot_rc = write_dot(results, n, dot, c.dot_path);
    if (dot_rc == 0 && rc == 0 && !c.json)
      printf("\nGraphviz: wrote %d tree%s to %s\n", n, n == 1 ? "" : "s", c.dot_path);
    rc = rc ? rc : dot_rc;
  }
  for (int i = 0; i < n; i++)
    workload_result_free(&results[i]);
  fflush(stdout);
  if (rc)
    return rc;
  if (disagree) {
    fail("the modes computed different outputs (see above): this is a bug");
    return EXIT_FAIL;
  }
  return 0;
}

static int cmd_dot(int argc, char **argv) {
  cli c;
  int rc = parse_cli(argc, argv, "dot", &c);
  if (rc)
    return rc;
  set_aside_cgt_mode(1);
  demo_run d;
  if ((rc = setup_run(&c, &d)) != 0)
    return rc;
  FILE *dot = open_dot(c.dot_path);
  if (!dot)
    return EXIT_FAIL;
  workload_result results[N_WORKLOADS];
  int n = 0;
  rc = run_all(&d, &c, 1, results, &n);
  int dot_rc = write_dot(results, n, dot, c.dot_path);
  rc = rc ? rc : dot_rc;
  for (int i = 0; i < n; i++)
    workload_result_free(&results[i]);
  return rc;
}

static void print_cuda_version(const char *what, int v) {
  if (v > 0)
    printf("%s: CUDA %d.%d\n", what, v / 1000, v % 1000 / 10);
  else
    printf("%s: none found\n", what);
}

static int cmd_info(int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    }
    return usage_error("info: unexpected argument '%s'", argv[i]);
  }
  cuda_info ci;
  cuda_info_query(&ci);
  const char *cuda_state = !cuda_built()             ? "not built"
                           : cgt_cuda_available() ? "available"
                                                  : "built, no usable GPU";
  printf("cgtree %s\n", CGT_VERSION_STRING);
  printf("backends: sim, cuda (%s)\n", cuda_state);
  if (!cuda_built())
    return 0;
  if (!cgt_cuda_available() && ci.error[0])
    printf("cuda: %s\n", ci.error);
  for (int i = 0; i < ci.n_gpus && i < CUDA_INFO_MAX_GPUS; i++) {
    const cuda_gpu *g = &ci.gpus[i];
    char mem[32];
    printf("GPU %d: %s, compute capability %d.%d, %s\n", i, g->name, g->cc_major, g->cc_minor,
           fmt_bytes(g->memory_bytes, mem, sizeof mem));
  }
  if (ci.n_gpus > CUDA_INFO_MAX_GPUS)
    printf("(and %d more GPUs)\n", ci.n_gpus - CUDA_INFO_MAX_GPUS);
  print_cuda_version("driver", ci.driver_version);
  print_cuda_version("runtime", ci.runtime_version);
  return 0;
}

/* The library warns about an unknown CGT_LOG at every cgt_tree_create; the
 * demo creates a tree per mode and workload, so it says it once here and
 * sets the variable aside (the library then uses its default level). */
static void check_cgt_log(void) {
  const char *e = getenv("CGT_LOG");
  if (!e || !*e)
    return;
  static const char *const levels[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcasecmp(e, levels[i]))
      return;
  fprintf(stderr, "cgtree: warning: CGT_LOG=%s is not error, warn, info or debug; ignored\n", e);
  unsetenv("CGT_LOG");
}

int main(int argc, char **argv) {
  check_cgt_log();
  if (argc < 2)
    return usage_error("no command given");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "demo"))
    return cmd_demo(argc - 2, argv + 2);
  if (!strcmp(cmd, "dot"))
    return cmd_dot(argc - 2, argv + 2);
  if (!strcmp(cmd, "info"))
    return cmd_info(argc - 2, argv + 2);
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    if (argc > 2)
      return usage_error("%s takes no arguments", cmd);
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    if (argc > 2)
      return usage_error("%s takes no arguments", cmd);
    printf("cgtree %s\n", CGT_VERSION_STRING);
    return 0;
  }
  return usage_error("unknown command '%s'", cmd);
}
