"""Compile ahead: run every provider of a share of the benchmark cases once, untimed, so that
Triton's and Inductor's on-disk caches hold their kernels before the timed run starts.

``python -m kernelab.bench.prewarm PART PARTS DTYPE [--grid NAME] OP [OP ...]``; the timed process
then finds its compiled kernels (torch.compile still traces, but skips code generation and
compilation). ``--grid``: the shapes' grid (``specs.GRIDS``, default pow2).
"""

from __future__ import annotations

import sys

import torch

from . import runner
from . import specs as S


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    part, parts, dtype, ops = int(argv[0]), int(argv[1]), getattr(torch, argv[2]), argv[3:]
    grid = "pow2"
    if ops[:1] == ["--grid"]:
        grid, ops = ops[1], ops[2:]
    device = torch.device("cuda")
    all_specs = S.specs()
    for case in runner.cases(ops, dtype, grid=grid)[part::parts]:
        spec = all_specs[case.op]
        inputs = spec.make(case.shape, case.dtype, device, torch.Generator(device).manual_seed(0))
        for name, fn in runner.provider_fns(spec, runner.PROVIDERS).items():
            args = runner.with_grad(inputs.args, inputs.grad_of, case.backward)
            try:
                res = fn(*args)
                if case.backward:
                    torch.autograd.grad(res, [args[i] for i in inputs.grad_of], torch.ones_like(res))
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - the timed run records failures
                print(f"prewarm {case.label} {name}: {type(e).__name__}", flush=True)
            del args
        del inputs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
