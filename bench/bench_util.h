/* bench_util.h — what the benchmarks share: a monotonic clock, medians, the
 * CPU's name, the chain link of the simulator benchmarks, and the few device calls that have no place in the library's
 * API (the device's name, a bare capture of a workload segment). Those live
 * in bench_cuda.c when CUDA is built and in bench_cuda_none.c otherwise.
 */
#ifndef CGT_BENCH_UTIL_H
#define CGT_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cgtree_sim.h"
#include "workloads.h"

static inline double bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of n values (sorts them in place); 0 for n == 0. */
static inline double bench_median(double *v, size_t n) {
  if (n == 0)
    return 0.0;
  qsort(v, n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The CPU's model name from /proc/cpuinfo, or "unknown". */
static inline void bench_cpu_name(char *buf, size_t n) {
  snprintf(buf, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    const char *c = strchr(line, ':');
    if (!c)
      break;
    c++;
    while (*c == ' ' || *c == '\t')
      c++;
    snprintf(buf, n, "%s", c);
    size_t len = strlen(buf);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
      buf[--len] = '\0';
    break;
  }
  fclose(f);
}

/* Writes s as a JSON string body (no quotes) into buf. */
static inline const char *bench_json_escape(const char *s, char *buf, size_t n) {
  size_t j = 0;
  for (; *s && j + 7 < n; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      buf[j++] = '\\';
      buf[j++] = (char)c;
    } else if (c < 0x20) {
      j += (size_t)snprintf(buf + j, n - j, "\\u%04x", c);
    } else {
      buf[j++] = (char)c;
    }
  }
  buf[j] = '\0';
  return buf;
}

/* ------------------------------------- device extras (bench_cuda*.c) */

/* "NVIDIA H100 80GB HBM3 (driver 13000, runtime 13000)" for CUDA; "CPU
 * simulator" otherwise. */
void bench_device_name(cgt_backend backend, char *buf, size_t n);

/* A bare capture of segment `segment_index` of w with the device's own calls
 * (no tree): on a fresh stream, begin capture, wl_raw_enqueue, end capture
 * (capture_us), instantiate + upload (instantiate_us), then launch and wait
 * (total_us covers all of it, like a tree's recording, which also launches
 * once). Medians of `reps` repetitions after one eager warm run. Returns 0
 * when it cannot be measured here (the simulator has no public capture
 * calls), 1 on success, -1 on failure. */
int bench_raw_record(workload *w, int segment_index, int reps, double *capture_us, double *instantiate_us,
                     double *total_us);

/* The link of the simulator chains (path_length, held_replay): a segment of
 * one input that allocates BENCH_LINK_BYTES of pool memory, enqueues one
 * empty simulator kernel and names the allocation as its output, so that
 * what a benchmark times is the runtime's own work. */
enum { BENCH_LINK_BYTES = 256 };

static inline void bench_empty_kernel(void *args) { (void)args; }

static inline cgt_status bench_link_launch(cgt_launch *l, void *user) {
  (void)user;
  void *out;
  cgt_status st = cgt_launch_alloc(l, BENCH_LINK_BYTES, &out);
  if (st == CGT_OK)
    st = cgt_sim_launch(cgt_launch_stream(l), bench_empty_kernel, NULL, 0);
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 0, out, BENCH_LINK_BYTES);
  return st;
}

/* 1 if st is CGT_OK; else prints "prog: what: STATUS: the tree's last error"
 * (without the last part when t is NULL) and returns 0. */
static inline int bench_check(const char *prog, cgt_status st, const char *what, cgt_tree *t) {
  if (st == CGT_OK)
    return 1;
  fprintf(stderr, "%s: %s: %s%s%s\n", prog, what, cgt_status_name(st), t ? ": " : "", t ? cgt_tree_last_error(t) : "");
  return 0;
}

#endif /* CGT_BENCH_UTIL_H */
