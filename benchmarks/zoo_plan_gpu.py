#!/usr/bin/env python
"""A zoo model's compiled plan and generated runners as they are on this machine's GPU (the graphs a
GPU traces differ from the CPU's: attention paths, padding, conv layouts), for locating what a
GPU-only measurement shows (a kernel the CPU plan does not predict, a buffer held to the end).

    python3 benchmarks/zoo_plan_gpu.py OUT_DIR gpt2:infer convnext:infer [llama:train ...]

Per model and step, into OUT_DIR: ``NAME_STEP_explain.txt`` (``kernelab.explain``: every group,
every op left to ATen and why, padding, memory reuse) and ``NAME_STEP_runnerK.py`` (each generated
runner's source, the specialized ones after the first call too: the lines ``zoo_profile.py
--memory`` names as ``runner:LINE``). Two steps run, so the runners specialize.
"""
from __future__ import annotations

import builtins
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernelab  # noqa: E402
import kernelab.compiler  # noqa: E402,F401 - registers backend="kernelab"
from kernelab.compiler import runtime  # noqa: E402
from kernelab.zoo import ZOO  # noqa: E402


def _capture_sources(sources: list) -> None:
    """Every runner source the compiler compiles is appended to ``sources``."""
    def compile_and_keep(source, filename, mode, *args, **kwargs):
        if "kernelab runner" in filename:
            sources.append((filename, source))
        return builtins.compile(source, filename, mode, *args, **kwargs)

    runtime.compile = compile_and_keep  # the module's global shadows the builtin


def one(out: Path, name: str, step: str) -> None:
    zm = ZOO[name]
    model, inputs = zm.build("bench", device="cuda", dtype=zm.dtype)
    train = step == "train"
    model.train(train)

    def run(module):
        if train:
            zm.loss(module, inputs).backward()
            return None
        with torch.no_grad():
            return zm.forward(module, inputs)

    sources: list = []
    _capture_sources(sources)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kernelab")
    for _ in range(2):
        run(compiled)
    torch.cuda.synchronize()
    for k, (filename, source) in enumerate(sources):
        (out / f"{name}_{step}_runner{k}.py").write_text(f"# {filename}\n{source}")
    torch._dynamo.reset()
    plan = kernelab.explain(lambda m, i: run(m), model, inputs)
    (out / f"{name}_{step}_explain.txt").write_text(str(plan))
    print(f"{name}:{step}: {len(sources)} runner sources, plan written")


def _specs(args: list[str]) -> list[tuple[str, str]]:
    """(model, step) of each NAME[:STEP] argument; a clear SystemExit for anything else."""
    specs = []
    for spec in args:
        name, _, step = spec.partition(":")
        step = step or "infer"
        if name not in ZOO or step not in ("train", "infer"):
            raise SystemExit(f"zoo_plan_gpu.py: {spec!r} is not MODEL[:train|infer] with MODEL one of {', '.join(ZOO)}")
        specs.append((name, step))
    return specs


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python3 benchmarks/zoo_plan_gpu.py OUT_DIR MODEL[:train|infer] ...")
    specs = _specs(sys.argv[2:])
    if not torch.cuda.is_available():
        raise SystemExit("zoo_plan_gpu.py: no CUDA GPU here (the plans it writes are the GPU's)")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, step in specs:
        try:
            one(out, name, step)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a line, the others still run
            failed += 1
            print(f"{name}:{step}: {type(exc).__name__}: {exc}")
    if failed:
        raise SystemExit(f"zoo_plan_gpu.py: {failed} of {len(specs)} failed")


if __name__ == "__main__":
    main()
