#!/usr/bin/env python
"""How far a channels-last training batch norm's statistics and output are from float64, under
kernelab's generated norm and under eager float32, for channels whose data make a variance hard.

    TRITON_INTERPRET=1 KERNELAB_BN_FORWARD=generated python3 benchmarks/bn_statistics_precision.py [--shape N C H W]

Cases (every channel alike): all zero but the first value x[0, c, 0, 0]; sparse spikes, the first
value one of them (a dead ReLU channel's pattern); 1000 + N(0, 1); N(0, 1). For each: the running
variance's largest relative error and the output's largest absolute error against float64. On the
CPU set ``KERNELAB_BN_FORWARD=generated`` (its default there is ATen's norm) and run the kernels
in Triton's interpreter; on a GPU the generated norm is the default. Stop 39's table
(``benchmarks/NOTES_compiler.md``) came from this script at 8 4 56 56.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def channels(case: str, shape, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(*shape, generator=g)
    if case == "first value only":
        x.zero_()
        x[0, :, 0, 0] = 1.0
    elif case == "sparse spikes incl. the first":
        x = x * (torch.rand(*shape, generator=g) < 0.001)
        x[0, :, 0, 0] = 3.0
    elif case == "1000 + N(0, 1)":
        x = x + 1000
    return x.contiguous(memory_format=torch.channels_last)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=4, default=[8, 4, 56, 56], metavar=("N", "C", "H", "W"))
    args = ap.parse_args(argv)
    if min(args.shape) < 1 or args.shape[0] * args.shape[2] * args.shape[3] < 2:
        ap.error("--shape needs positive sizes and at least two values a channel")
    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"

    device = "cuda" if torch.cuda.is_available() else "cpu"
    n_c = args.shape[1]
    print(f"{'case':32s} {'variance rel. err: kernelab':>28s} {'eager':>9s} {'output abs. err: kernelab':>26s} {'eager':>9s}")
    for case in ("first value only", "sparse spikes incl. the first", "1000 + N(0, 1)", "N(0, 1)"):
        x = channels(case, args.shape, torch.Generator().manual_seed(0)).to(device)
        exact = x.double().var((0, 2, 3), unbiased=False)
        torch._dynamo.reset()
        generated, eager = torch.nn.BatchNorm2d(n_c, momentum=1.0).to(device), torch.nn.BatchNorm2d(n_c, momentum=1.0).to(device)
        y = torch.compile(generated, backend="kernelab")(x)
        y_eager = eager(x)
        y64 = torch.nn.functional.batch_norm(x.double(), None, None, training=True, eps=1e-5)
        m = x.numel() // n_c
        errors = []
        for norm, out in ((generated, y), (eager, y_eager)):
            var = norm.running_var.double() * (m - 1) / m  # the unbiased running variance, back to the batch's
            errors.append((((var - exact).abs() / exact).max().item(), (out.double() - y64).abs().max().item()))
        (kv, ko), (ev, eo) = errors
        print(f"{case:32s} {kv:28.1e} {ev:9.1e} {ko:26.1e} {eo:9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
