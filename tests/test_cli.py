"""The command line: outputs for good input, one line and exit code 2 for bad input."""
import json
import subprocess
import sys

import pytest
import torch

from kernelab.cli import main

TARGET = """
import torch

def add_relu(a, b):
    return (a + b).relu()

def boom(a):
    raise ValueError("bad shapes in user code")

def example_inputs():
    return torch.randn(1000), torch.randn(1000)

def sweep_inputs(n):
    return torch.randn(n), torch.randn(n)
"""


@pytest.fixture
def target_file(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(TARGET)
    return path


def test_count_prints_tables_and_writes_json(target_file, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["count", f"{target_file}:add_relu", "--input", "1000000", "--input", "1000000",
                 "--mode", "eager", "--mode", "inductor", "--predict", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "eager: 2 kernels, 5 array transfers, 1 round trip" in text
    assert "inductor: 1 kernel, 3 array transfers, 0 round trips" in text
    data = json.loads(out.read_text())
    assert data["eager"]["schema_version"] == 1
    assert data["eager"]["totals"]["num_kernels"] == 2 and data["eager"]["totals"]["transfers"] == 5.0
    assert data["inductor"]["totals"]["num_kernels"] == 1
    assert data["eager"]["measured"] is False
    assert data["eager"]["kernels"][0]["bytes_read"] == 8_000_000


def test_count_uses_example_inputs_when_no_input_is_given(target_file, capsys):
    assert main(["count", f"{target_file}:add_relu", "--mode", "eager", "--predict"]) == 0
    assert "eager: 2 kernels" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["count", "missing.py:f", "--input", "10"], "no such file"),
    (["count", "{f}:nope", "--input", "10"], "has no function or module named 'nope'"),
    (["count", "{f}:add_relu", "--input", "10xq"], "bad dimension"),
    (["count", "{f}:add_relu", "--input", "10:float99"], "unknown dtype"),
    (["count", "{f}:boom", "--input", "10"], "the target raised ValueError: bad shapes in user code"),
    (["count", "{f}:add_relu", "--input", "10", "--input", "11", "--predict"], "the target raised RuntimeError"),
    (["sweep", "{f}:add_relu", "--sizes", "1e9:1e2", "--predict"], "bad sizes"),
    (["sweep", "{f}:add_relu", "--out", "x.jpg", "--predict"], "must end in .png or .svg"),
    (["count", "{f}:add_relu", "--input", "10", "--input", "10", "--profile", "tpu", "--predict"], "unknown device profile"),
])
def test_bad_input_is_one_line_and_exit_code_2(target_file, capsys, argv, message):
    argv = [a.replace("{f}", str(target_file)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelab: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_measuring_without_a_gpu_is_refused(target_file, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from kernelab.api import count
    from kernelab.api import KernelabError

    with pytest.raises(KernelabError, match="needs a CUDA GPU"):
        count(lambda a: a + 1, torch.ones(3), predict=False)
    assert main(["ceilings"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


def test_sweep_draws_a_plot_and_reports_the_crossover(target_file, tmp_path, capsys):
    plot = tmp_path / "s.png"
    assert main(["sweep", f"{target_file}:add_relu", "--sizes", "1e2:1e9", "--predict", "--out", str(plot),
                 "--json", str(tmp_path / "s.json")]) == 0
    assert plot.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "inductor beats eager from n = 1e+07 on (predicted)" in out
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert len(rows) == 16 and {r["mode"] for r in rows} == {"eager", "inductor"}
    assert all(r["transfers"] == (5.0 if r["mode"] == "eager" else 3.0) for r in rows)


def test_console_script_exit_code(target_file):
    proc = subprocess.run([sys.executable, "-m", "kernelab.cli", "count", f"{target_file}:nope", "--input", "4"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("kernelab: error:") and "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(target_file):
    proc = subprocess.run([sys.executable, "-m", "kernelab.cli", "count", f"{target_file}:boom", "--input", "4",
                           "--predict", "--debug"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_tour_runs_end_to_end(tmp_path, capsys):
    plot = tmp_path / "tour.svg"
    assert main(["tour", "--predict", "--out", str(plot), "--sizes", "1e2:1e8"]) == 0
    out = capsys.readouterr().out
    assert "def add_relu(a, b):" in out and "eager: 2 kernels, 5 array transfers, 1 round trip" in out
    assert "<svg" in plot.read_text()


def test_count_kernelab_mode_from_the_command_line(target_file, capsys):
    assert main(["count", f"{target_file}:add_relu", "--mode", "kernelab", "--predict"]) == 0
    assert "kernelab: 1 kernel, 3 array transfers, 0 round trips" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_bench_without_a_gpu_is_refused_through_the_main_command(capsys):
    """`kernelab bench` is registered by kernelab.bench; the main command dispatches to it."""
    assert main(["bench", "softmax", "--shapes", "16x4096"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
