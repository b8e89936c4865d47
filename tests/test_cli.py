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
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kernelab: error: ") and "needs a CUDA GPU" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["bench", "sofmax"], "unknown op sofmax; known: softmax"),
    (["bench", "softmax,nope,zzz"], "unknown ops nope, zzz"),
    (["bench", "softmax", "--providers", "kernelab", "triton"], "unknown provider triton"),
])
def test_bench_checks_the_request_before_the_gpu(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelab: error: ") and message in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Bad input (issue 13, part 5): one line `kernelab: error: ...`, exit code 2, no traceback.

BAD_TARGETS = """
import sys
import time
import torch

def add_relu(a, b):
    return (a + b).relu()

def exits(a):
    sys.exit(7)

def hangs(a):
    while True:
        try:
            time.sleep(0.05)
        except Exception:  # swallows whatever interrupts it: the timeout must still win
            pass

class NeedsArgs(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.linear(x)
"""

STRING_INPUTS = """
def f(a):
    return a + 1

def example_inputs():
    return "not a tensor"
"""


@pytest.fixture
def bad_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD_TARGETS)
    (tmp_path / "strings.py").write_text(STRING_INPUTS)
    return path


@pytest.mark.parametrize("argv, message", [
    (["count", "{f}:add_relu", "--input", "nxn", "--predict"], "'n' is the size that sweep varies"),
    (["count", "{f}:add_relu", "--input", "1e400", "--predict"], "dimension '1e400' in input spec '1e400' is too large"),
    (["count", "{f}:add_relu", "--input", "99999999999999999999999", "--predict"], "is too large (at most 2^63 - 1)"),
    (["count", "{f}:add_relu", "--input", "4294967296x4294967296", "--predict"], "more than a 64-bit size can address"),
    (["count", "{f}:NeedsArgs", "--input", "4x4", "--predict"],
     "NeedsArgs is an nn.Module class whose __init__ needs arguments (NeedsArgs(width))"),
    (["count", "{f}:exits", "--input", "4", "--predict"], "the target raised SystemExit(7)"),
    (["count", "{d}/strings.py:f", "--predict"], "example_inputs() returned a str ('not a tensor')"),
    (["count", "{f}:add_relu", "--input", "4", "--input", "4", "--predict", "--json", "/proc/x.json"],
     "cannot write --json /proc/x.json"),
    (["sweep", "{f}:add_relu", "--sizes", "1e2:1e3", "--predict", "--out", "/proc/x.png"], "cannot write --out /proc/x.png"),
    (["sweep", "{f}:add_relu", "--sizes", "1e2:1e3", "--predict", "--out", "{d}"], "must end in .png or .svg"),
])
def test_bad_invocations_are_one_line_and_exit_code_2(bad_file, capsys, argv, message):
    argv = [a.replace("{f}", str(bad_file)).replace("{d}", str(bad_file.parent)) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("kernelab: error: ") and message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert captured.out == ""  # refused before any table is printed


@pytest.mark.parametrize("value", ["-1", "soon", "inf"])
def test_a_bad_timeout_is_refused_by_the_parser(capsys, value):
    with pytest.raises(SystemExit) as info:
        main(["count", "x.py:f", "--timeout", value])
    assert info.value.code == 2
    assert "argument --timeout" in capsys.readouterr().err


def test_predicting_allocates_nothing_whatever_the_size(target_file, tmp_path, capsys):
    """1e11 float32 elements (400 GB an input) are predicted from meta tensors, never built."""
    out = tmp_path / "big.json"
    assert main(["count", f"{target_file}:add_relu", "--input", "100000000000", "--input", "100000000000",
                 "--mode", "eager", "--mode", "inductor", "--predict", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["inductor"]["totals"]["bytes"] == 3 * 4 * 10**11
    assert data["eager"]["totals"]["transfers"] == 5.0
    assert capsys.readouterr().err == ""


def test_inputs_are_meta_tensors_when_predicting(target_file):
    from kernelab.cli import count_inputs, build_parser

    args = build_parser().parse_args(["count", f"{target_file}:add_relu", "--input", "10x3:bf16", "--predict"])
    (x,) = count_inputs(args, None)
    assert x.is_meta and x.shape == (10, 3) and x.dtype == torch.bfloat16
    args = build_parser().parse_args(["count", f"{target_file}:add_relu", "--predict"])
    import importlib.util

    spec = importlib.util.spec_from_file_location("prog_for_meta", target_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a, b = count_inputs(args, module)  # example_inputs() is called on the meta device, like sweep_inputs(n)
    assert a.is_meta and b.is_meta and a.shape == (1000,)


def test_a_target_that_never_returns_times_out(bad_file, capsys):
    assert main(["count", f"{bad_file}:hangs", "--input", "4", "--predict", "--timeout", "0.5", "--mode", "eager"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("kernelab: error: counting hangs in eager mode did not finish within 0.5 s; "
                   "if it needs longer, raise --timeout (0: no limit)")


def test_timeout_defaults_differ_for_measuring_and_predicting(target_file):
    from kernelab.cli import TIMEOUT_MEASURE_S, TIMEOUT_PREDICT_S, count_timeout, build_parser

    parse = build_parser().parse_args
    assert count_timeout(parse(["count", "x.py:f", "--predict"])) == TIMEOUT_PREDICT_S
    assert count_timeout(parse(["count", "x.py:f", "--predict", "--timeout", "0"])) is None
    assert count_timeout(parse(["sweep", "x.py:f", "--predict", "--timeout", "12.5"])) == 12.5
    if not torch.cuda.is_available():
        assert count_timeout(parse(["count", "x.py:f"])) == TIMEOUT_PREDICT_S  # no GPU: it predicts
    assert TIMEOUT_MEASURE_S > 0


def test_a_broadcast_mismatch_is_one_line_without_fake_tensor_logs(target_file, capsys, caplog):
    assert main(["count", f"{target_file}:add_relu", "--input", "10", "--input", "11", "--predict",
                 "--mode", "eager", "--mode", "inductor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kernelab: error: the target raised RuntimeError: Attempting to broadcast a dimension")
    assert len(err.strip().splitlines()) == 1
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # FakeTensorMode's traceback log is silenced


def test_a_broadcast_mismatch_under_torch_compile_is_still_the_targets(target_file, capsys):
    """In kernelab mode torch.compile wraps the user's error (TorchRuntimeError): it is still reported as
    the target's, with the original message."""
    assert main(["count", f"{target_file}:add_relu", "--input", "10", "--input", "11", "--predict",
                 "--mode", "kernelab"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelab: error: the target raised RuntimeError: ")  # the user's error, not a wrapper's
    assert any(words in err for words in ("broadcast", "must match")) and len(err.splitlines()) == 1


def test_sweep_plot_that_cannot_be_saved_is_an_error_not_a_traceback(target_file, tmp_path, capsys, monkeypatch):
    from kernelab.sweep import SweepResult

    def refuse(self, path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(SweepResult, "plot", refuse)
    assert main(["sweep", f"{target_file}:add_relu", "--sizes", "1e2:1e3", "--predict",
                 "--out", str(tmp_path / "s.png")]) == 2
    assert capsys.readouterr().err.strip().startswith("kernelab: error: cannot write the plot")


# ---------------------------------------------------------------------------------------------
# Internal errors are never the target's (issue 11)


def _kernelab_bug(*_args, **_kwargs):
    """A fault raised inside kernelab's own code: kernelab.report.fmt_bytes cannot format a string."""
    from kernelab.report import fmt_bytes

    return fmt_bytes("not a number")


def test_an_internal_error_is_reported_as_kernelab_s_not_the_target_s(target_file, capsys, monkeypatch):
    import kernelab.api

    monkeypatch.setattr(kernelab.api, "lower_eager", _kernelab_bug)
    assert main(["count", f"{target_file}:add_relu", "--input", "10", "--input", "10", "--predict",
                 "--mode", "eager"]) == 70
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelab: internal error: TypeError:") and "(at kernelab/report.py:" in err
    assert err.endswith("(please report; --debug shows the traceback)")
    assert "the target raised" not in err and len(err.splitlines()) == 1


def test_an_internal_error_inside_torch_compile_is_kernelab_s(target_file, capsys, monkeypatch):
    """A fault in kernelab's torch.compile backend reaches the CLI wrapped by dynamo (BackendCompilerFailed):
    still an internal error, never the target raising."""
    import kernelab.compiler.backend as backend

    if not hasattr(backend, "compile_graph"):
        pytest.skip("the compiler's backend no longer has compile_graph")
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    monkeypatch.setattr(backend, "compile_graph", _kernelab_bug)
    code = main(["count", f"{target_file}:add_relu", "--input", "10", "--input", "10", "--predict", "--mode", "kernelab"])
    err = capsys.readouterr().err.strip()
    assert code == 70, err
    assert err.startswith("kernelab: internal error: ") and "the target raised" not in err


def test_the_target_raising_is_still_the_target_s(target_file, capsys):
    assert main(["count", f"{target_file}:boom", "--input", "4", "--predict", "--mode", "kernelab"]) == 2
    assert capsys.readouterr().err.strip() == "kernelab: error: the target raised ValueError: bad shapes in user code"


# ---------------------------------------------------------------------------------------------
# What a newcomer tripped on (issue 13, part 4)


def test_version_flag(capsys):
    from kernelab import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kernelab {__version__} (torch {torch.__version__.split('+')[0]}")


def test_dir_of_the_package_lists_the_public_api():
    import kernelab

    names = dir(kernelab)
    assert {"count", "compare", "sweep", "explain", "compile", "Report", "ops", "__version__"} <= set(names)
    assert "importlib" not in names and "_LAZY" not in names


def test_a_corrupt_ceilings_cache_warns_in_one_line(monkeypatch, capsys, tmp_path):
    """The CLI shows warnings as `kernelab: warning: ...` (the cache itself is tested in test_hardware)."""
    import warnings

    import kernelab.cli as cli

    def warn_and_fail(args):
        warnings.warn("the cached ceilings file x.json is corrupt")
        raise cli.UserError("stop here")

    monkeypatch.setitem(cli.COMMANDS, "ceilings", warn_and_fail)
    assert main(["ceilings"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["kernelab: warning: the cached ceilings file x.json is corrupt", "kernelab: error: stop here"]


MODULE_TARGET = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.act(self.fc(x))


model = Block()


def example_inputs():
    return (torch.randn(7, 64),)
"""


def test_count_by_module_prints_the_tree_sorted_and_names_top_wasters(tmp_path, capsys):
    path = tmp_path / "net.py"
    path.write_text(MODULE_TARGET)
    out = tmp_path / "r.json"
    code = main(["count", f"{path}:model", "--by", "module", "--sort", "waste", "--mode", "eager",
                 "--mode", "inductor", "--predict", "--json", str(out)])
    assert code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "model — eager" in text and "by module, sorted by waste" in text
    assert "fc (Linear)" in text and "act (GELU)" in text
    assert "net.py:13" in text  # the residual add's line in the target file
    assert "eager: 3 kernels" in text and "top wasters: act (" in text
    assert "spans act, model" in text  # inductor: GELU and the residual add (model's own) in one kernel
    data = json.loads(out.read_text())
    tree = data["eager"]["modules"]
    assert tree["type"] == "Block" and {c["path"] for c in tree["children"]} == {"fc", "act"}
    assert [k["module"] for k in data["eager"]["kernels"]] == ["fc", "act", ""]


def test_count_refuses_an_unknown_sort(target_file, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["count", f"{target_file}:add_relu", "--by", "module", "--sort", "size"])
    assert exc.value.code == 2
    assert "invalid choice: 'size'" in capsys.readouterr().err
