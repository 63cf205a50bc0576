"""How far cgtree's trained weights lie from plain Inductor's, against how
far plain Inductor's lie from its own (python/tests/test_torch_train_models.py's
models, 10 AdamW steps each).

The embeddings' backward accumulates with atomics, so two plain Inductor
runs of one model from one seed round differently, and Adam and ReLU's
thresholds can carry a difference of rounding into a weight's whole step.
The test's tolerance (atol 2e-4) is Inductor's own spread measured once; this
prints both spreads side by side, per model, from one process:

    python3 bench/torch_train_spread.py [--models t5,bert] [--runs 2]

For each model: the largest weight difference and the number of weights
that differ by more than 2e-4, cgtree against the first Inductor run, and
each further Inductor run against the first. A cgtree that lost a step or
read a stale activation differs in many weights by about the learning rate
(1e-3); a spread like Inductor's own is rounding.
"""
import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))

import test_torch_train_models as T  # noqa: E402  (imports cgtree.torch before CUDA starts)

torch, ct = T.torch, T.ct


def trained(model, backend, make_batches, loss_fn, autocast, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-4, capturable=True)
    f = torch.compile(model, backend=backend)
    step = torch.compile(opt.step, backend=backend)
    torch.manual_seed(11)
    T.train(f, model, loss_fn, make_batches(steps), (opt, step), autocast)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="t5,bert", help="names from test_torch_train_models.MODELS")
    ap.add_argument("--runs", type=int, default=2, help="plain Inductor runs (the first is the reference)")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    print("| model | run | largest weight difference | weights > 2e-4 | of | where the largest is |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in a.models.split(","):
        make, autocast, _ = T.MODELS[name]
        torch._dynamo.reset()
        torch.manual_seed(0)
        model, loss_fn = make()
        model = model.to("cuda").train()
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(1, T.VOCAB, (4, 64), generator=g).to("cuda") for _ in range(4)]
        make_batches = lambda steps: [batches[i % 4] for i in range(steps)]  # noqa: E731
        ref = trained(copy.deepcopy(model), "inductor", make_batches, loss_fn, autocast, a.steps)
        others = [("cgtree", trained(copy.deepcopy(model), "cgtree", make_batches, loss_fn, autocast, a.steps))]
        others += [("inductor %d" % (i + 2), trained(copy.deepcopy(model), "inductor", make_batches, loss_fn, autocast,
                                                   a.steps)) for i in range(a.runs - 1)]
        for label, m in others:
            over, count, (worst, where) = T.weight_spread(m, ref, 2e-4)
            print("| %s | %s against inductor 1 | %.2e | %d | %d | %s |" % (name, label, worst, over, count, where))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
