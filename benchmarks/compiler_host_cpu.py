#!/usr/bin/env python
"""The host time kernelab's compiled runners add to a step, on the CPU, launches stubbed.

    TRITON_INTERPRET=1 python benchmarks/compiler_host_cpu.py [--models vit,bert,gpt2:infer] [--steps 20]
                                                              [--repeats 5] [--profile MODEL] [--out FILE]

A zoo model's training step (``NAME`` or ``NAME:train``; ``NAME:infer``: its forward under
``no_grad``, the inference graph) at its tiny size, compiled with ``backend="kernelab"`` on CPU tensors:
the first two steps run for real (Triton's interpreter), then every launch takes the path a GPU's
cached call takes (``group_runner._DirectLaunch.launch``: its specialization key, launch hooks,
stream) with a no-op in place of the driver's launch, so that the kernels' outputs are left as
allocated. What is timed is everything else a compiled step does on the host: dynamo's guards,
aot_autograd's wrappers, the generated runners, allocations, views, the ATen ops left to ATen (on
tiny CPU tensors). The step runs on the calling thread (a CPU backward has no autograd thread of
its own), so ``time.thread_time`` and cProfile see all of it, forward and backward: what the
GPU's cProfile (``zoo_profile.py --cprofile``) misses of the backward.

Figures per step (medians of ``--repeats`` rounds of ``--steps`` steps): the whole step, and the
part spent in kernelab's own modules (cProfile's own times of functions under ``kernelab/`` and the
generated runners, summed; cProfile inflates Python time, so compare these only with each other).
``--profile MODEL`` prints that model's kernelab functions by own time. For comparisons of one
code change on one machine: the CPU's ATen dispatch is not the GPU host's. Kernels launched
outside the groups' bound calls (the embedding backward's ``kl_scatter_add_rows``) still run under
the interpreter, and their Python counts in kernelab's share (T5: 3.7 of 6.6 ms in stop 33): read
the ``--profile`` table, not the share alone, for such models.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kernelab import launch  # noqa: E402


class NoLaunch:
    """Stands in for ``launch.StaticLauncher``: the driver's launch, minus the launch. As torch's
    launcher, it takes only the binary's runtime arguments (Triton makes every integer argument of
    1 a constant: ``keep`` is set from the first launch's arguments) plus one scratch placeholder,
    through :meth:`entry` (what the specialized runner calls, with ``runtime_tail``) or
    :meth:`launch` (which filters per call). Integer tensors among the arguments are zeroed: an
    index a stubbed kernel would have computed is otherwise whatever the allocation held, and an
    ATen op reading it stops (T5's position buckets into its bias embedding: "index out of
    range"). Zeroing is the stub's own time, outside kernelab's share."""

    runtime_tail = launch.StaticLauncher.runtime_tail
    launch = launch.StaticLauncher.launch
    function, num_warps, shared, arg_types, extra = 0, 4, 0, "", (None,)

    def __init__(self, args):
        self.keep = tuple(i for i, a in enumerate(args) if not (type(a) is int and a == 1)) or (0,)
        self.entry = self._entry

    @staticmethod
    def _entry(function, gx, gy, gz, warps, shared, arg_types, args, stream) -> None:
        for a in args:
            if isinstance(a, torch.Tensor) and not a.is_floating_point():
                a.zero_()
        return None


class Filtering(NoLaunch):
    """:class:`NoLaunch` without ``runtime_tail``: the specialized runner calls :meth:`launch`,
    which filters the arguments per call (the runner before stop 39)."""

    runtime_tail = None


def stub_launches(filtering: bool = False) -> None:
    """Every group's call launched once for real (the interpreter), then bound to a no-op
    launcher (``group_runner.bound_launch``), as a GPU binds the compiled binary."""
    from kernelab.compiler import group_runner as gr

    stub = Filtering if filtering else NoLaunch

    def first_launch(self, call, args, varying):
        call.kernel[call.grid](*args, **call.meta)
        return gr.bound_launch(call, varying, stub(args))

    gr.GroupRunner.first_launch = first_launch


def _step_of(spec: str):
    """A zoo model's step at its tiny size: ``name`` or ``name:train`` a training step,
    ``name:infer`` its forward in eval mode under ``torch.no_grad`` (the inference graph)."""
    from kernelab.zoo import ZOO

    name, _, kind = spec.partition(":")
    zm = ZOO[name]
    model, inputs = zm.build("tiny")
    compiled = torch.compile(model, backend="kernelab")
    if kind == "infer":
        model.eval()

        def infer():
            with torch.no_grad():
                zm.forward(compiled, inputs)
        return infer

    def step():
        model.zero_grad(set_to_none=True)
        zm.loss(compiled, inputs).backward()
    return step


def _kernelab_share(prof: cProfile.Profile) -> float:
    """Seconds of own time in kernelab's modules and its generated runners."""
    total = 0.0
    for (filename, _, _), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():
        if "/kernelab/" in filename or filename.startswith("<kernelab"):
            total += tottime
    return total


def measure(name: str, steps: int, repeats: int, profile: bool = False) -> dict:
    step = _step_of(name)
    for _ in range(3):  # compile, the interpreter's first launches, then the stubbed path once
        step()
    rounds = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(steps):
            step()
        rounds.append((time.thread_time() - t0) / steps * 1e3)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    row = {"model": name, "step_ms": statistics.median(rounds), "kernelab_ms_cprofile": _kernelab_share(prof) / steps * 1e3}
    if profile:
        stats = pstats.Stats(prof)
        own = sorted(((v[2], v[0], f"{Path(k[0]).name}:{k[1]}({k[2]})") for k, v in stats.stats.items()
                      if "/kernelab/" in k[0] or k[0].startswith("<kernelab")), reverse=True)
        row["profile"] = [f"{t / steps * 1e3:8.3f} ms {n // steps:6d} calls  {where}" for t, n, where in own[:25]]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit,bert,resnet")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", default="", help="print this model's kernelab functions by own time")
    ap.add_argument("--out", type=Path, help="append the table (and profile) to this file")
    ap.add_argument("--filtering", action="store_true",
                    help="specialized lines call the launcher's launch(), which filters arguments per call "
                         "(the runner before stop 39) instead of its entry with the runtime arguments")
    args = ap.parse_args(argv)
    from kernelab.zoo import ZOO

    def known(spec: str) -> bool:
        name, _, kind = spec.partition(":")
        return name in ZOO and kind in ("", "train", "infer")

    unknown = sorted(m for m in args.models.split(",") if m and not known(m))
    if unknown or (args.profile and not known(args.profile)):
        ap.error(f"unknown model: {', '.join(unknown or [args.profile])} (the zoo has {', '.join(sorted(ZOO))})")
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be at least 1")
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("compiler_host_cpu.py: run with TRITON_INTERPRET=1 (the first launches run in Triton's interpreter)",
              file=sys.stderr)
        return 2
    stub_launches(args.filtering)
    lines = [f"# compiler_host_cpu.py --models {args.models} --steps {args.steps} --repeats {args.repeats}"
             f"{' --filtering' if args.filtering else ''}, "
             f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs",
             f"{'model':10s} {'step ms':>9s} {'kernelab own ms (cProfile)':>28s}"]
    for name in [m for m in args.models.split(",") if m]:
        row = measure(name, args.steps, args.repeats, profile=name == args.profile)
        lines.append(f"{name:10s} {row['step_ms']:9.2f} {row['kernelab_ms_cprofile']:28.2f}")
        lines += row.get("profile", [])
        print(lines[-1 - len(row.get("profile", []))], flush=True)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
