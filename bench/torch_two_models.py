#!/usr/bin/env python3
"""Two compiled models in one training step, side by side with PyTorch:
programs where one model's output is read after the other's call.

    python3 bench/torch_two_models.py [--modes eager,inductor,reduce-overhead,cgtree]
                                      [--programs gan,gan-checkpoint,gan-reentrant,distill]
                                      [--rounds 3] [--steps 100] [--out results.jsonl]

gan: a GAN's step. The discriminator D trains on the generator's output
detached, its backward runs, then D(fake) trains the generator G, whose
output must still hold what G wrote. gan-checkpoint and gan-reentrant call
G under torch.utils.checkpoint (use_reentrant False and True): G keeps no
saved activation, so nothing of G's holds a step across D's backward but
its output itself. distill: under no_grad a frozen teacher's output t,
then the student's call, then a loss that reads t.

The models are 3-layer MLPs (256 wide, batch 64, fp32), each compiled on
its own; SGD with momentum in eager. Each mode and program runs in a fresh
process (cgtree's allocator must be installed before CUDA starts),
--rounds processes for reduce-overhead and cgtree, interleaved; the table
gives the median round's ms per step (wall time of --steps steps over
their count, synchronised at both ends, after 10 warm-up steps), whether
the loop raised (and the first line of what), and whether every loss and
the final weights equal Inductor's bit for bit (reduce-overhead and cgtree
replay Inductor's kernels, so any difference is data read after it was
overwritten). Weights and data are made on the CPU from fixed seeds, so
every process starts from the same bits. A program takes about 7
minutes at --rounds 3 with every mode on an H100 (a process compiles
anew): one program per device call.
"""
import argparse
import hashlib
import time

from mode_rounds import append_rounds, child_result, interleaved_rounds, median_round, run_child

WIDTH, BATCH, NOISE, WARMUP, BATCHES = 256, 64, 64, 10, 8


def mlp(torch, n_in, n_out, act):
    return torch.nn.Sequential(torch.nn.Linear(n_in, WIDTH), act(), torch.nn.Linear(WIDTH, WIDTH), act(),
                               torch.nn.Linear(WIDTH, n_out))


def child(mode, program, steps):
    if mode == "cgtree":
        import cgtree.torch as ct  # before CUDA starts: its allocator
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    relu, leaky = torch.nn.ReLU, lambda: torch.nn.LeakyReLU(0.2)
    gan = program.startswith("gan")
    # gan: G (noise -> sample) and D (sample -> score); distill: a frozen teacher and a student
    gm = mlp(torch, NOISE if gan else WIDTH, WIDTH, relu).cuda()
    dm = mlp(torch, WIDTH, 1 if gan else WIDTH, leaky if gan else relu).cuda()
    if not gan:
        gm.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    zs = [torch.randn(BATCH, NOISE if gan else WIDTH, generator=g).cuda().requires_grad_(program == "gan-reentrant")
          for _ in range(BATCHES)]
    reals = [torch.randn(BATCH, WIDTH, generator=g).cuda() for _ in range(BATCHES)]
    compile_ = {"eager": lambda m: m, "inductor": torch.compile,
                "reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead"),
                "cgtree": lambda m: torch.compile(m, backend="cgtree")}[mode]
    fg, fd = compile_(gm), compile_(dm)
    og = torch.optim.SGD(gm.parameters(), lr=0.02, momentum=0.5) if gan else None
    od = torch.optim.SGD(dm.parameters(), lr=0.02, momentum=0.5)
    softplus = torch.nn.functional.softplus
    losses = []

    def gan_step(z, real):
        if program == "gan":
            fake = fg(z)
        else:
            fake = torch.utils.checkpoint.checkpoint(fg, z, use_reentrant=program == "gan-reentrant")
        d_loss = softplus(-fd(real)).mean() + softplus(fd(fake.detach())).mean()
        od.zero_grad(set_to_none=True)
        d_loss.backward()
        od.step()
        g_loss = softplus(-fd(fake)).mean()
        og.zero_grad(set_to_none=True)
        g_loss.backward()
        og.step()
        losses.append(torch.stack([d_loss.detach(), g_loss.detach()]))

    def distill_step(x, _):
        with torch.no_grad():
            t = fg(x)
        loss = (fd(x) - t).square().mean()  # t read after the student's call
        od.zero_grad(set_to_none=True)
        loss.backward()
        od.step()
        losses.append(loss.detach())

    def step(i):
        (gan_step if gan else distill_step)(zs[i % BATCHES], reals[i % BATCHES])

    out = {"mode": mode, "program": program, "device": torch.cuda.get_device_name()}
    try:
        for i in range(WARMUP):
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(WARMUP, WARMUP + steps):
            step(i)
        torch.cuda.synchronize()
        out["ms_per_step"] = (time.perf_counter() - t0) / steps * 1e3
        out["losses"] = torch.cat([v.flatten() for v in losses]).cpu().tolist()
        flat = torch.cat([p.detach().flatten() for p in list(gm.parameters()) + list(dm.parameters())])
        out["weights_sha256"] = hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()
    except Exception as e:  # what the mode does with the step is the finding
        out["raised"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if mode == "cgtree":
        s = ct.stats()
        for k in ("recordings", "replays", "stale_refused", "graphs_plain", "arguments_moved",
                  "steps_held_for_inference_outputs"):
            out[k] = s[k]
    child_result(out)


def run(mode, program, steps):
    return run_child(__file__, ["--child", mode, "--program", program, "--steps", steps],
                     {"mode": mode, "program": program})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="eager,inductor,reduce-overhead,cgtree")
    ap.add_argument("--programs", default="gan,gan-checkpoint,gan-reentrant,distill")
    ap.add_argument("--program")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.program, a.steps)

    modes = a.modes.split(",")
    print(f"Two compiled 3-layer MLPs ({WIDTH} wide, batch {BATCH}) in a training step, {a.steps} timed steps a round")
    print("| program | mode | ms/step (median round) | rounds | raised | losses and weights bit-equal to "
          "Inductor | recordings | replays | refused as stale | steps held for inference outputs |")
    print("| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for program in a.programs.split(","):
        rounds = interleaved_rounds(modes, a.rounds, lambda m: run(m, program, a.steps))
        ref = rounds.get("inductor", [{}])[0]
        for m in modes:
            rs, med = median_round(rounds[m], "ms_per_step")
            equal = ""
            if "losses" in ref and m != "inductor":
                same = [r["losses"] == ref["losses"] and r["weights_sha256"] == ref["weights_sha256"] for r in rs]
                equal = f"{sum(same)} of {len(rs)} rounds" if rs else ""
            each = " ".join("%.3f" % r["ms_per_step"] for r in rs)
            raised = "; ".join(sorted({r["raised"] for r in rounds[m] if "raised" in r})) or "no"
            print(f"| {program} | {m} | {med.get('ms_per_step', float('nan')):.3f} | {each} | {raised} | "
                  f"{equal} | {med.get('recordings', '')} | {med.get('replays', '')} | "
                  f"{med.get('stale_refused', '')} | {med.get('steps_held_for_inference_outputs', '')} |")
            append_rounds(a.out, rounds[m], ("losses",), bench="torch_two_models", steps=a.steps)


if __name__ == "__main__":
    main()
