#!/usr/bin/env python
"""Host time of a layer_norm / rms_norm call, measured on the CPU with the GPU launches stubbed:
``benchmarks/ops_host.py`` for the norms, with ``--settings`` adding every launch setting of
``norm_tune.py`` (``norms.configured``) as a provider.

    python3 benchmarks/norm_host.py [--steps 300] [--repeats 15] [--settings] [--profile layer_norm]

See ops_host.py for what is measured and what it is compared with.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import ops_host  # noqa: E402 - after the path

NORMS = ("layer_norm", "rms_norm")


def settings_providers(op: str) -> dict:
    """``kernelab~<setting>`` -> the op launched with that NormConfig (norm_tune.py's settings)."""
    from norm_tune import settings

    from kernelab.ops import norms

    out = {}
    for label, config in settings(backward=True).items():
        if config is None:
            continue
        fn = getattr(norms.configured(config), op)
        out[f"kernelab~{label}"] = ((lambda f: lambda x, w, b: f(x, (64,), w, b, 1e-5)) if op == "layer_norm"
                                    else (lambda f: lambda x, w: f(x, (64,), w, 1e-6)))(fn)
    return out


def main() -> int:
    p = ops_host.parser(NORMS)
    p.add_argument("--settings", action="store_true", help="also every launch setting of norm_tune.py")
    args = p.parse_args()
    if args.profile or not args.settings:
        return ops_host.main(args)
    import torch

    torch.set_num_threads(1)
    ops_host.stub_launches()
    args.steps, args.repeats = args.steps or 300, args.repeats or 15
    rows = []
    for op, (inputs, grad_of, fns) in ops_host.cases(args.ops).items():
        rows += ops_host.run_op(op, {**fns, **settings_providers(op)}, inputs, grad_of, args.steps, args.repeats)
    print(ops_host.render(rows, args.steps, args.repeats, "launches stubbed (CPU)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
