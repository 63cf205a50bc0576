# bench/autotune_reuse_probe.py — why a keyed backward (cgtree) and plain Inductor can
# pick different reduction configurations for one kernel source (bench/RESULTS.md,
# forty-third session; docs/torch.md). Written by helper-104; needs a GPU.
# helper-104: why does plain Inductor's B re-benchmark the backward reduction that cgtree's keyed A
# already tuned (bench/sigmoid_bias_probe.py cgtree), when two plain compiles share the choice?
# Run from the repo root:  PYTHONPATH=/tmp/cgtree_pkg:/tmp/deps/site python3 bench/autotune_reuse_probe.py [--all]
# Each experiment runs in a fresh child process with an empty TORCHINDUCTOR_CACHE_DIR (in-process state,
# the compile pool and PyCodeCache, is what is under test). The child instruments, in the parent process only:
# AsyncCompile.triton (which path: in-process vs worker future; pool ready?; the object returned is the
# very CachingAutotuner A ran, from PyCodeCache.modules_no_attr?), CachingAutotuner.precompile (launchers
# rebuilt from compile_results?), benchmark_all_configs, and triton_heuristics.check_autotune_cache.
import json, os, shutil, subprocess, sys, tempfile, time

KERNEL = "triton_per_"  # the backward's persistent reduction (triton_per_fused_sigmoid_backward_sum_0)
EXPERIMENTS = {  # name: (mode, extra env, action before B)
    "cgtree": ("cgtree", {}, None),
    "cgtree+wait_pool": ("cgtree", {}, "wait"),
    "plain-nocache": ("plain-nocache", {}, None),
    "plain-nocache+1thread": ("plain-nocache", {"TORCHINDUCTOR_COMPILE_THREADS": "1"}, None),
    "cgtree+clear_pycodecache": ("cgtree", {}, "clear"),
}
DEFAULT = ["cgtree", "cgtree+wait_pool", "plain-nocache", "plain-nocache+1thread"]


def child(name):
    mode, _, action = EXPERIMENTS[name]
    from sigmoid_bias_probe import first_phase, sigmoid_pair, t, torch  # bench/, beside this file
    from torch._inductor import async_compile as ac, codecache as cc
    from torch._inductor.runtime import triton_heuristics as th

    st = {"phase": "init"}

    def emit(**kw):
        kw["phase"] = st["phase"]
        print("@@" + json.dumps(kw, default=str), flush=True)

    def ready():
        rf = ac.AsyncCompile._ready_future
        return None if rf is None else rf.done()

    def name_of(k):
        return (getattr(k, "inductor_meta", None) or {}).get("kernel_name") or getattr(k.fn, "__name__", "?")

    def describe(k, prior):
        return dict(obj=hex(id(k)), reused=id(k) in prior, results=len(k.compile_results or []),
                    launchers=len(k.launchers), cache_state=(k.autotune_cache_info or {}).get("autotune_cache_state"))

    orig_triton = ac.AsyncCompile.triton

    def triton(self, kernel_name, source_code, device_str="cuda"):
        if not kernel_name.startswith(KERNEL):
            return orig_triton(self, kernel_name, source_code, device_str)
        prior = {id(getattr(m, kernel_name)) for m in list(cc.PyCodeCache.modules_no_attr.values())
                 if hasattr(m, kernel_name)}
        fut = ac.CompiledTritonKernels.get(source_code)
        rec = dict(ev="triton", k=kernel_name, future_hit=type(fut).__name__ if fut is not None else None,
                   pool_ready=ready(), module_cached_in_parent=bool(prior))
        ret = orig_triton(self, kernel_name, source_code, device_str)
        if isinstance(ret, th.CachingAutotuner):
            emit(path="in-process", **rec, **describe(ret, prior))
        else:
            emit(path="future:" + type(ret).__name__, **rec)
            if not getattr(ret, "_h104", False):
                orig_result = ret.result

                def result():
                    r = orig_result()
                    emit(ev="future_result", k=kernel_name, **describe(r, prior))
                    return r
                ret.result, ret._h104 = result, True
        return ret
    ac.AsyncCompile.triton = triton

    orig_pre = th.CachingAutotuner.precompile

    def precompile(self, *a, **kw):
        before, results = len(self.launchers), len(self.compile_results or [])
        r = orig_pre(self, *a, **kw)
        if name_of(self).startswith(KERNEL) and not kw.get("warm_cache_only"):
            emit(ev="precompile", k=name_of(self), obj=hex(id(self)), results_before=results,
                 launchers_before=before, launchers_after=len(self.launchers))
        return r
    th.CachingAutotuner.precompile = precompile

    orig_bench = th.CachingAutotuner.benchmark_all_configs

    def bench(self, *a, **kw):
        if name_of(self).startswith(KERNEL):
            emit(ev="bench", k=name_of(self), obj=hex(id(self)), launchers=len(self.launchers))
        return orig_bench(self, *a, **kw)
    th.CachingAutotuner.benchmark_all_configs = bench

    orig_check = th.check_autotune_cache

    def check(configs, filename, inductor_meta):
        out = orig_check(configs, filename, inductor_meta)
        if filename and KERNEL in str(inductor_meta.get("kernel_name", "")):
            emit(ev="check", file=os.path.basename(filename)[:10], n_in=len(configs), n_out=len(out[0]),
                 state=out[2].get("autotune_cache_state"))
        return out
    th.check_autotune_cache = check

    m, ref, cf, rf, xs = sigmoid_pair(mode)
    st["phase"] = "A"
    t0 = time.time()
    got = first_phase(mode, cf, m, xs)
    st["phase"] = "between"
    emit(ev="A_done", secs=round(time.time() - t0, 2), pool_ready=ready(),
         compile_threads=torch._inductor.config.compile_threads)
    if action == "wait":
        ac.AsyncCompile.wait_pool_ready(timeout=30)
        emit(ev="waited", pool_ready=ready())
    elif action == "clear":
        cc.PyCodeCache.cache_clear(purge=False)
        emit(ev="cleared")
    st["phase"] = "B"
    want = t.train(rf, ref, xs)
    emit(ev="result", bias_equal=torch.equal(m.lin.bias, ref.lin.bias), losses_equal=torch.equal(got, want))


def analyse(name, evs):
    def sel(phase, ev):
        return [e for e in evs if e.get("phase") == phase and e.get("ev") == ev]
    a_objs = {e["obj"] for e in sel("A", "bench")}
    b_bench = sel("B", "bench")
    b_tri = [e for e in sel("B", "triton") if not e.get("future_hit")]
    b_hit = [e for e in sel("B", "triton") if e.get("future_hit")]
    b_fut = sel("B", "future_result")
    b_pre = [e for e in sel("B", "precompile")]
    b_chk = sel("B", "check")
    res = (sel("B", "result") or [{}])[0]
    first = b_tri[0] if b_tri else (b_hit[0] if b_hit else {})
    kobj = [e for e in b_tri if e["path"] == "in-process"] + b_fut
    desc = ("B's kernel: path=%s pool_ready=%s module_cached_in_parent=%s future_hit=%s; object %s; "
            "B precompile %s; B checks %s; B benchmarked=%s (on A's object: %s); bias_equal=%s"
            % (first.get("path"), first.get("pool_ready"), first.get("module_cached_in_parent"),
               first.get("future_hit"),
               ["reused A's=%s results=%s launchers=%s cache=%s" % (e["reused"], e["results"], e["launchers"],
                                                                   e["cache_state"]) for e in kobj],
               ["%s->%s of %s" % (e["launchers_before"], e["launchers_after"], e["results_before"]) for e in b_pre],
               ["%s %d->%d %s" % (e["file"], e["n_in"], e["n_out"], e["state"]) for e in b_chk],
               bool(b_bench), any(e["obj"] in a_objs for e in b_bench), res.get("bias_equal")))
    return dict(bench=bool(b_bench), reused=any(e.get("reused") for e in kobj),
                inproc=any(e["path"] == "in-process" for e in b_tri), worker=bool(b_fut),
                worker_miss=any(e.get("cache_state") == "miss" for e in b_fut),
                future_hit_first=bool(b_hit) and not b_tri,
                rebuilt=any(e["launchers_before"] < e["launchers_after"] and e["launchers_before"] > 0 for e in b_pre),
                desc=desc)


def main():
    names = list(EXPERIMENTS) if "--all" in sys.argv else DEFAULT
    names = [a for a in sys.argv[1:] if a in EXPERIMENTS] or names
    out = {}
    for name in names:
        env = dict(os.environ, **EXPERIMENTS[name][1])
        d = tempfile.mkdtemp(prefix="h104ic")
        env["TORCHINDUCTOR_CACHE_DIR"] = d
        env.pop("TRITON_CACHE_DIR", None)
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name], env=env,
                               capture_output=True, text=True, timeout=45)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
        shutil.rmtree(d, ignore_errors=True)
        evs = [json.loads(l[2:]) for l in text.splitlines() if l.startswith("@@")]
        out[name] = a = analyse(name, evs)
        a["rc"], a["secs"] = rc, round(time.time() - t0, 1)
        print("[%s] rc=%s %.1fs %s" % (name, rc, a["secs"], a["desc"]), flush=True)
        if rc != 0:
            print("   tail: " + " | ".join(text.strip().splitlines()[-6:])[:1500], flush=True)
        with open(os.path.join(os.environ.get("OUT", "/tmp"), "h104_%s.events.json" % name), "w") as f:
            json.dump(evs, f, indent=0)

    def verdict(ok):
        return "CONFIRMED" if ok else "REFUTED"
    c = out.get("cgtree")
    if c:
        print("H1 (B compiles the kernel in-process; PyCodeCache.load hands back the CachingAutotuner A already "
              "autotuned; precompile()->_make_launchers rebuilds a launcher per compile_result, so B benchmarks "
              "again without reading .best_config): %s" % verdict(c["bench"] and c["inproc"] and c["reused"]
                                                                   and c["rebuilt"]))
        print("H2 (B's kernel built in a compile worker whose .best_config lookup missed/was rejected): %s"
              % verdict(c["bench"] and c["worker_miss"]))
        print("H3 (B took a stale future from CompiledTritonKernels / a StaticAutotunerFuture): %s"
              % verdict(c["bench"] and c["future_hit_first"]))
    w = out.get("cgtree+wait_pool")
    if w:
        print("H4 (it is the compile pool not yet being ready at B's backward compile: waiting for it before B "
              "makes B's kernel come from a worker that reads A's .best_config, no re-benchmark): %s"
              % verdict(not w["bench"] and not w["inproc"]))
    p = out.get("plain-nocache")
    if p:
        print("H4b (plain B shares A's choice because its kernels come from a ready worker pool): %s"
              % verdict(not p["bench"] and not p["inproc"]))
    q = out.get("plain-nocache+1thread")
    if q:
        print("H5 (plain Inductor alone re-benchmarks too once B compiles in-process: TORCHINDUCTOR_COMPILE_THREADS=1): "
              "%s" % verdict(q["bench"] and q["reused"]))
    r = out.get("cgtree+clear_pycodecache")
    if r:
        print("H6 (dropping PyCodeCache's in-memory modules between A and B stops the re-benchmark): %s"
              % verdict(not r["bench"]))


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1])
    else:
        main()
