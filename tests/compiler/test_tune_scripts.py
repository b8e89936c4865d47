"""The compiler's tuning scripts (``benchmarks/row_tune.py``, ``column_tune.py``,
``bn_backward_parts.py``) run on a GPU only;
here they are imported and the launch data they pass (``options={"tiling": ...}``) is built and
compiled with, so that a renamed API breaks CI rather than the next session's device call."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import kernelab.compiler as kc
from kernelab.compiler.tiling import ColumnTiling, RowTiling, Tiling

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(f"kl_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_column_tune_passes_a_column_tiling():
    tiling = _script("column_tune").tiling(64, 4096, 8, 2, 4)
    assert tiling == Tiling(columns=ColumnTiling(64, 4096, 4096, 8, 8, 2, 4))


def test_row_tune_passes_a_row_tiling():
    tiling = _script("row_tune").tiling(8, True)
    assert tiling.rows == RowTiling(per_thread=8, looped_per_thread=8, looped=True, var_persistent_max=8192)


@pytest.mark.parametrize("name, args", [("column_tune", (32, 8192, 4, 2)), ("row_tune", (16, False))])
def test_their_tilings_compile_and_match_eager(name, args):
    tiling = _script(name).tiling(*args)
    x, y = torch.randn(64, 48), torch.randn(48)
    fn = kc.compile(lambda x, y: ((x * y).sum(0), (x * y).softmax(-1)), options={"tiling": tiling})
    got = fn(x, y)
    torch.testing.assert_close(got[0], (x * y).sum(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], (x * y).softmax(-1), rtol=1e-5, atol=1e-6)


def test_host_time_stub_zeroes_the_indices_it_leaves_unwritten():
    """``compiler_host_cpu.py`` stubs every launch: an index tensor a kernel would have computed
    keeps whatever its allocation held, and an ATen op reading it stops (T5's position buckets,
    "index out of range"). The stub zeroes integer arguments and leaves floating-point ones alone,
    launched either way torch's launcher is (its ``launch``, or its entry with the runtime tail)."""
    stub = _script("compiler_host_cpu").NoLaunch
    for through_entry in (False, True):
        idx, values = torch.full((3,), 99, dtype=torch.int64), torch.full((3,), 2.5)
        launcher = stub((idx, values, 7, 1))
        assert launcher.keep == (0, 1, 2)  # the 1 a constant of the binary, as Triton makes it
        if through_entry:
            tail = launcher.runtime_tail(2, (7, 1))
            assert tail == (7, None)  # the constant left out, the scratch placeholder added
            launcher.entry(0, 1, 1, 1, 4, 0, "", (idx, values, *tail), 0)
        else:
            launcher.launch((1, 1, 1), 0, (idx, values, 7, 1))
        assert idx.tolist() == [0, 0, 0] and values.tolist() == [2.5, 2.5, 2.5]


def test_bn_backward_parts_smoke_compares_every_setting_with_eager(tmp_path):
    """``bn_backward_parts.py --smoke`` (CPU, interpreter): every provider and launch setting of the
    batch norm's backward computes eager's gradients, and the CSV holds a row for each."""
    import csv
    import os
    import subprocess

    root = BENCHMARKS.parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bn_backward_parts.py"), str(tmp_path), "--smoke",
                           "--variants", "gen", "gen_pw1024x4", "gen_col64_e4096_w8"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "bn_backward_parts.csv")))
    assert {r["provider"] for r in rows} == {"eager", "kernelab", "gen", "gen_pw1024x4", "gen_col64_e4096_w8"}
    assert len(rows) == 5 * 2 * 2  # providers x smoke shapes x patterns
    assert max(float(r["grad_err"]) for r in rows) < 1e-5


def test_bn_backward_parts_smoke_needs_the_interpreter(tmp_path):
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(BENCHMARKS.parent)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bn_backward_parts.py"), str(tmp_path), "--smoke"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "set TRITON_INTERPRET=1" in done.stderr
