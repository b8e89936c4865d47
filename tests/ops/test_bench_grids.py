"""The benchmark grids (powers of two, model widths) and benchmarks/norm_tune.py's flow on the CPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelab.bench import report, runner, specs

ROOT = Path(__file__).resolve().parents[2]


def test_model_grid_has_the_issue_widths_and_vocabularies():
    widths = {n for _, n in specs.MODEL_ROW_GRID}
    assert widths == {768, 1024, 2048, 2560, 2880, 3072, 4096, 5120, 6144, 7168, 8192, 12288, 16384}
    assert all(4096 <= m <= 65536 for m, _ in specs.MODEL_ROW_GRID)
    assert {c for _, c in specs.MODEL_CE_GRID} == {32000, 50257, 128256, 151936, 262144}


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "softmax", "cross_entropy", "silu_mul"])
def test_grids_select_shapes(op):
    spec = specs.specs()[op]
    pow2, model, both = (specs.grid_shapes(spec, g) for g in specs.GRIDS)
    assert pow2 == spec.shapes                       # the powers of two are kept as they were
    assert set(both) == set(pow2) | set(model) and len(both) == len(set(both))
    if op in ("layer_norm", "rms_norm", "softmax"):
        assert model == specs.MODEL_ROW_GRID
    cases = runner.cases([op], torch.bfloat16, grid="model")
    assert [c.shape for c in cases[::2]] == model and {c.backward for c in cases} == {False, True}
    with pytest.raises(ValueError, match="unknown grid"):
        specs.grid_shapes(spec, "odd")


def test_norms_differentiate_weight_and_bias():
    for op, grads in (("layer_norm", (0, 1, 2)), ("rms_norm", (0, 1))):
        inputs = specs.specs()[op].make((4, 8), torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        assert inputs.grad_of == grads


def test_norm_tune_smoke(tmp_path):
    """Every setting of norm_tune.py runs and matches float64 (interpreter, tiny rows); the CSV
    and the table come out. Measures nothing."""
    out = subprocess.run([sys.executable, "benchmarks/norm_tune.py", str(tmp_path), "--smoke", "--widths", "2880"],
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = report.load_csv(tmp_path / "norm_tune.csv")
    providers = {r.provider for r in rows}
    assert {"kernelab", "eager", "kernelab~resident 2 stages", "kernelab~4/SM in waves"} <= providers
    assert not any("atomic" in p for p in providers)  # refused on GPUs: wrong on the H200
    assert {(r.op, r.pass_) for r in rows} == {(o, p) for o in ("layer_norm", "rms_norm") for p in ("fwd", "fwd+bwd")}
    assert all(r.status == "ok" for r in rows), [(r.provider, r.status) for r in rows if r.status != "ok"]
    assert "norm_tune" in out.stdout
    # the forward's long-row settings (12288-16384 columns) are among those timed
    assert {"kernelab~fwd no register cap", "kernelab~fwd teams past 8192"} <= providers


def test_ops_host_smoke(tmp_path):
    """benchmarks/ops_host.py's GPU flow on CPU tensors under the interpreter: kernelab with direct
    launches equals Triton's path and eager, the CSV holds thread and wall times, layer_norm's
    pieces and the Python Function floor print. Measures nothing."""
    out = subprocess.run([sys.executable, "benchmarks/ops_host.py", str(tmp_path), "--smoke", "--ops", "layer_norm",
                          "--at", "4x32"], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                          "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "checks: layer_norm ok" in out.stdout
    header, *rows = (tmp_path / "ops_host.csv").read_text().splitlines()
    assert header.startswith("op,pass,provider,host_us,x_eager,wall_us,wall_x_eager")
    assert {r.split(",")[2] for r in rows} == {"eager", "kernelab", "kernelab (Triton path)"}
    for piece in ("_norm_backward inside autograd's backward", "python Function floor fwd+bwd", "4x32"):
        assert piece in out.stdout


def test_ops_host_refuses_a_malformed_shape():
    out = subprocess.run([sys.executable, "benchmarks/ops_host.py", "--at", "16384x"], cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "expected ROWSxWIDTH" in out.stderr and "Traceback" not in out.stderr
