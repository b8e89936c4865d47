#!/usr/bin/env python
"""The compiler's plan (groups, ops left to ATen and why) of small programs on this machine's GPU:
the graphs a GPU traces can differ from the CPU's (attention paths, decompositions chosen by
device), and a plan seen here is what ``KERNELAB_DEBUG=2`` prints there.

    python benchmarks/plan_on_gpu.py [NAME ...]      # default: every program below
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernelab.compiler as klc  # noqa: E402


def _interpolate(mode, dtype, backward=False):
    def program(device):
        x = torch.randn(4, 32, 56, 56, device=device, dtype=dtype, requires_grad=backward)
        kwargs = {} if mode == "nearest" else {"align_corners": False}

        def fn(x):
            y = F.interpolate(x, scale_factor=2, mode=mode, **kwargs)
            return y.sum().backward() if backward else y
        return fn, (x,)
    return program


PROGRAMS = {
    f"{mode}_{str(dtype)[6:]}{'_fwd_bwd' if bwd else ''}": _interpolate(mode, dtype, bwd)
    for mode in ("bilinear", "bicubic", "nearest") for dtype in (torch.float32, torch.bfloat16) for bwd in (False, True)
}


def main(names: list[str]) -> None:
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        sys.exit(f"plan_on_gpu.py: unknown program(s) {', '.join(unknown)}; known: {', '.join(sorted(PROGRAMS))}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in names or sorted(PROGRAMS):
        torch._dynamo.reset()
        fn, args = PROGRAMS[name](device)
        plan = klc.explain(fn, *args)
        print(f"=== {name} on {device}: {sum(len(gp.groups) for gp in plan.graphs)} generated kernel(s)")
        for gp in plan.graphs:
            print("\n".join(line for line in gp.decisions().splitlines() if "refused" not in line))


if __name__ == "__main__":
    main(sys.argv[1:])
