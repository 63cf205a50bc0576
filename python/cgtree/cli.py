"""The `cgtree` command of the Python package: `pip install .` installs it,
and `python -m cgtree` is the same program.

It has the C tool's verbs and options (tools/cgtree.c): `demo` runs the
demo workloads through a tree and checks every output, `dot` writes the
trees they grow as Graphviz, `info` says whether CUDA is built in and, if no
GPU is usable, why; `--json` prints one JSON document, `--version` the
version. The workloads themselves are cgtree/demo.py's, written with numpy
(simulator) and PyTorch (GPU) kernels, so the figures are the Python
package's, not the C tool's.

Bad input (an unknown verb or option, a missing or malformed value) is one
line on stderr naming what is wrong, a hint, and exit status 2; a backend
that is not there is one line and exit status 1. No input makes a traceback.
argparse does the parsing; only its error reporting is replaced.
"""
import argparse
import json
import sys

EXIT_FAIL, EXIT_USAGE = 1, 2
MAX_STEPS = 10_000_000


class _Usage(Exception):
    """A bad command line, reported in one line (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Usage(message)


def _steps(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"wants a whole number from 1 to {MAX_STEPS}, not '{text}'")
    return n


def _parser():
    p = _Parser(prog="cgtree", description="cgtree: CUDA graph trees with checkpointed memory pools "
                "(the Python package's command).",
                epilog="Exit status: 0 success, 1 failure or wrong outputs, 2 bad usage.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    verbs = p.add_subparsers(dest="verb", metavar="{demo,dot,info,help}", parser_class=_Parser)

    def run_options(sp):
        sp.add_argument("--backend", choices=["auto", "cuda", "sim"], default="auto",
                        help="auto (default): the GPU if there is one, else the simulator")
        sp.add_argument("--workload", choices=["branchy", "chain", "all"], default="all",
                        help="which workload to run (default: all)")
        sp.add_argument("--steps", type=_steps, default=200, help="steps per workload (default: 200)")
        sp.add_argument("--defer", action="store_true", help="run the tree with defer_launch = 1")

    demo = verbs.add_parser("demo", help="run the demo workloads (GPU if present, else the simulator)")
    run_options(demo)
    demo.add_argument("--dot", metavar="FILE", help="also write each tree to FILE as Graphviz")
    demo.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    dot = verbs.add_parser("dot", help="run the workloads and write their trees as Graphviz")
    run_options(dot)
    dot.add_argument("file", nargs="?", default="-", help="where to write (default: - for stdout)")
    verbs.add_parser("info", help="the version, whether CUDA is built in, and the GPU or why there is none")
    verbs.add_parser("help", help="this help")
    return p


def _open_dot(path):
    """Opened before anything runs, so a path that cannot be written fails at once."""
    if path in (None, "-"):
        return sys.stdout if path == "-" else None
    try:
        return open(path, "w")
    except OSError as e:
        raise _Failure(f"cannot write {path}: {e.strerror}") from None


def _write_dot(f, results):
    f.write("".join(r["dot"] for r in results))
    if f is not sys.stdout:
        f.close()


class _Failure(Exception):
    """A run that could not be done (exit 1), reported in one line."""


def _results(a):
    import cgtree
    from . import demo

    names = list(demo.WORKLOADS) if a.workload == "all" else [a.workload]
    if a.backend == "cuda" and not cgtree.cuda_available():
        raise _Failure(f"the CUDA backend is not available: {_no_cuda_reason()}")
    try:
        return [demo.run_workload(n, a.backend, a.steps, a.defer) for n in names]
    except ImportError as e:
        raise _Failure(f"the CUDA backend needs PyTorch for the demo's kernels: {e}") from None


def _demo(a):
    import cgtree
    from . import demo

    dot = _open_dot(a.dot)
    results = _results(a)
    if a.json:
        for r in results:
            r.pop("dot")
        print(json.dumps({"cgtree": cgtree.__version__, "workloads": results}))
    else:
        print(f"cgtree {cgtree.__version__} Python demo on {results[0]['where']}")
        for r in results:
            print()
            demo.print_result(r)
    if dot is not None:
        _write_dot(dot, results)
        if not a.json:
            print(f"\nGraphviz: wrote {len(results)} tree{'s' if len(results) != 1 else ''} to {a.dot}")
    return 0 if all(r["outputs_equal"] for r in results) else EXIT_FAIL


def _dot(a):
    out = _open_dot(a.file)
    results = _results(a)
    _write_dot(out, results)
    return 0 if all(r["outputs_equal"] for r in results) else EXIT_FAIL


def _no_cuda_reason():
    import cgtree
    from ._gpu import no_gpu_reason

    if not cgtree._cgtree.CUDA_BUILT:
        return "this cgtree was built without CUDA (nvcc or the CUDA runtime was not found at pip install)"
    return no_gpu_reason() or "cgtree.cuda_available() says no"


def _info():
    import cgtree

    available = cgtree.cuda_available()
    built = bool(cgtree._cgtree.CUDA_BUILT)
    state = "available" if available else "built, no usable GPU" if built else "not built"
    print(f"cgtree {cgtree.__version__} (Python package at {cgtree.__file__})")
    print(f"backends: sim, cuda ({state})")
    if not available:
        print(f"cuda: {_no_cuda_reason()}")
    print(f"Tree() picks: {'cuda' if available else 'sim'}")
    return 0


def main(argv=None):
    """Runs the command line argv (sys.argv[1:] by default); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    p = _parser()
    try:
        a = p.parse_args(argv)
        if a.version and a.verb is None:
            import cgtree
            print(f"cgtree {cgtree.__version__}")
            return 0
        if a.version:
            raise _Usage("--version takes no command")
        if a.verb is None:
            raise _Usage("no command given")
        if a.verb == "help":
            p.print_help()
            return 0
        if a.verb == "info":
            return _info()
        return _demo(a) if a.verb == "demo" else _dot(a)
    except _Usage as e:
        print(f"cgtree: {e}\nTry 'cgtree help' for usage.", file=sys.stderr)
        return EXIT_USAGE
    except _Failure as e:
        print(f"cgtree: {e}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`cgtree demo | head`): stop quietly, and keep
        # Python from failing again when it flushes stdout at exit.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL
