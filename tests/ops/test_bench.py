"""The benchmark harness on CPU: specs, correctness flagging, ratios, CSV/table/plot, CLI.

Timing itself needs a GPU (CUDA events); here a fake timer stands in, and the kernelab provider
runs under the interpreter.
"""

import argparse
import csv
import math

import pytest
import torch

from kernelab.bench import cli, report, runner, specs, timing

ENV = {"date": "2026-12-02T00:00:00Z", "gpu": "cpu", "torch": torch.__version__, "triton": "x", "liger": "absent"}


def fake_timer(step, sets):
    step(*sets[0])  # the timed function must run
    return 0.5


def test_specs_and_bytes():
    all_specs = specs.specs()
    assert set(runner.cases(["softmax"], torch.bfloat16)[0].__dict__) == {"op", "shape", "dtype", "backward"}
    for name, spec in all_specs.items():
        assert {"kernelab", "eager"} <= set(spec.providers), name
        assert spec.note and spec.shapes
    s = all_specs["softmax"]
    assert specs.bytes_moved(s, (32768, 4096), torch.bfloat16, False) == 2 * 32768 * 4096 * 2
    assert specs.bytes_moved(s, (32768, 4096), torch.bfloat16, True) == 5 * 32768 * 4096 * 2
    assert specs.bytes_moved(all_specs["cross_entropy"], (8192, 32000), torch.bfloat16, True) == 3 * 8192 * 32000 * 2
    for n in (256, 1024, 4096, 16384, 65536, 131072, 262144):  # the row lengths
        assert any(shape[1] == n for shape in specs.ROW_GRID)


@pytest.mark.parametrize("op,shape", [("softmax", (6, 300)), ("layer_norm", (5, 20000)), ("cross_entropy", (4, 33)), ("silu_mul", (3, 64)), ("bias_gelu", (3, 64))])
@pytest.mark.parametrize("backward", [False, True])
def test_run_case_checks_and_times(op, shape, backward):
    case = runner.Case(op, shape, torch.float32, backward)
    rows = runner.run_case(case, ("kernelab", "eager"), torch.device("cpu"), ENV, copy=4.0, timer=fake_timer)
    assert [r.provider for r in rows] == ["kernelab", "eager"]
    for r in rows:
        assert r.status == "ok", r.status
        assert r.rel_err is not None and r.rel_err < 1e-4
        assert r.ms == 0.5 and r.tbps == pytest.approx(r.bytes / 0.5e-3 / 1e12)
        assert r.pct_copy == pytest.approx(100 * r.tbps / 4.0)
        assert r.gpu == "cpu" and r.date and r.torch
    assert rows[0].vs_eager == pytest.approx(1.0)


def test_wrong_and_failing_providers_are_flagged(monkeypatch):
    spec = specs.specs()["softmax"]
    spec.providers["kernelab"] = lambda x: torch.softmax(x, -1) * 1.01
    spec.providers["liger"] = lambda x: (_ for _ in ()).throw(RuntimeError("n too large"))
    monkeypatch.setattr(specs, "specs", lambda: {"softmax": spec})
    rows = runner.run_case(runner.Case("softmax", (4, 50), torch.float32, False), ("kernelab", "eager", "liger"),
                           torch.device("cpu"), ENV, copy=4.0, timer=fake_timer)
    status = {r.provider: r.status for r in rows}
    assert status["kernelab"].startswith("wrong") and status["eager"] == "ok"
    assert status["liger"].startswith("error: RuntimeError: n too large")


def test_compare_catches_unwritten_outputs():
    ref = torch.randn(10, dtype=torch.float64)
    out = ref.float().clone()
    assert timing.compare(out, ref) < 1e-6
    out[3] = float("nan")
    assert math.isinf(timing.compare(out, ref))
    assert math.isinf(timing.compare([out[:5]], [ref]))
    assert timing.sets_needed(2**30) == 1 and timing.sets_needed(1024, cap=64) == 64


def test_compare_in_chunks_is_the_whole_relative_error(monkeypatch):
    """The chunked comparison (memory-lean for a 151936-word vocabulary's gradient) gives the
    relative L2 error of the whole tensors, non-finite reference entries skipped, a non-finite
    output where the reference is finite caught in any chunk."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(7, 13, dtype=torch.float64, generator=gen)
    ref[2, 3] = float("inf")
    out = (ref + 1e-3 * torch.randn(7, 13, dtype=torch.float64, generator=gen)).float()
    fin = torch.isfinite(ref)
    want = float(torch.linalg.vector_norm(out.double()[fin] - ref[fin]) / torch.linalg.vector_norm(ref[fin]))
    whole = timing.compare(out, ref)
    monkeypatch.setattr(timing, "COMPARE_CHUNK", 10)
    assert timing.compare(out, ref) == pytest.approx(want, rel=1e-9) == pytest.approx(whole, rel=1e-9)
    out[6, 12] = float("nan")  # in the last chunk
    assert math.isinf(timing.compare(out, ref))


def test_report_outputs(tmp_path):
    case = runner.Case("softmax", (6, 300), torch.float32, False)
    rows = runner.run_case(case, ("kernelab", "eager"), torch.device("cpu"), ENV, copy=4.0, timer=fake_timer)
    rows += runner.run_case(runner.Case("softmax", (6, 300), torch.float32, True), ("kernelab", "eager"), torch.device("cpu"), ENV, copy=4.0, timer=fake_timer)
    path = report.append_csv(rows, tmp_path)
    report.append_csv(rows, tmp_path)
    with path.open() as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 2 * len(rows)
    assert all(line["gpu"] == "cpu" and line["torch"] and line["triton"] and line["date"] for line in lines)
    from rich.console import Console

    console = Console(record=True, width=200)
    report.table(rows, console)
    assert "softmax" in console.export_text()
    pngs = report.plot(rows, tmp_path)
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    # read back (python -m kernelab.bench.report redraws from it): the same rows, typed
    back = report.load_csv(path)[: len(rows)]
    for a, b in zip(back, rows):
        assert (a.op, a.m, a.n, a.pass_, a.provider, a.status, a.bytes, a.timer) == (b.op, b.m, b.n, b.pass_, b.provider, b.status, b.bytes, b.timer)
        assert a.ms == pytest.approx(b.ms, rel=1e-5) and a.tbps == pytest.approx(b.tbps, rel=1e-5)
        assert (a.vs_liger is None) == (b.vs_liger is None)
    assert report.main([str(path), str(tmp_path / "redrawn"), "--markdown"]) == 0
    assert list((tmp_path / "redrawn").glob("ops_softmax_*.png"))
    # the README's table: kernelab's speed-up over the only peer, eager, by do_bench (fake_timer's ms)
    ratios = report.best_peer_ratios(rows)
    md = report.markdown_table(rows).splitlines()
    assert md[0].startswith("| op |") and md[2].startswith("| softmax |")
    fwd = ratios[("softmax", "6x300", "fwd")]
    assert f"{fwd:.2f}-{fwd:.2f} ({int(fwd >= 1.0)}/1)" in md[2]
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as exit_:
        report.main([str(bad), str(tmp_path)])
    assert exit_.value.code == 2


def test_cli_parser_and_no_gpu():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    args = parser.parse_args(["bench", "softmax", "--shapes", "4x8", "16x4096", "--dtype", "bf16", "--backward", "--out", "x"])
    assert args.shapes == [(4, 8), (16, 4096)] and args.backward and args.func is cli.run
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "softmax", "--shapes", "4by8"])
    if not torch.cuda.is_available():
        from kernelab.errors import KernelabError

        with pytest.raises(KernelabError, match="needs a CUDA GPU"):  # the main command prints it, exit 2
            cli.run(args)


def test_bench_linear_command_checks_its_arguments():
    from kernelab.errors import KernelabError

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "linear", "--shapes", "64x32x48", "--budget-s", "5"])
    assert args.shapes == [(64, 32, 48)] and args.budget_s == 5
    for argv, words in ((["bench", "linear", "--shapes", "64x32"], "shapes are MxKxN"),
                        (["bench", "linear", "--backward"], "do not apply"),
                        (["bench", "softmax,linear"], "runs alone"),
                        (["bench", "softmax", "--shapes", "4x8x9"], "shapes are MxN")):
        with pytest.raises(KernelabError, match=words):
            cli.run(parser.parse_args(argv))
    if not torch.cuda.is_available():
        with pytest.raises(KernelabError, match="needs a CUDA GPU"):
            cli.run(args)


def test_bench_linear_smoke_run_writes_csv_table_and_plot(tmp_path, capsys):
    """The whole GEMM benchmark on CPU tensors under the interpreter (tiny shapes, wall clock):
    every section runs, nothing is WRONG, the CSV and the plot are written and read back."""
    from kernelab.bench import linear

    assert linear.main([str(tmp_path), "--smoke"]) == 0
    out = capsys.readouterr().out
    for section in ("configurations (tune)", "epilogue", "tune dual", "fwd+bwd", "swiglu fwd+bwd"):
        assert section in out
    rows = linear.read_csv(tmp_path / "linear_bench.csv")
    assert rows and not [r for r in rows if r["status"] not in ("ok",)]
    assert {r["section"] for r in rows} >= {"check", "tune", "fwd", "epilogue", "fwd+bwd", "swiglu fwd"}
    assert (tmp_path / "linear_bench.png").stat().st_size > 0
    assert linear.main([str(tmp_path / "again.png"), "--plot-from", str(tmp_path / "linear_bench.csv")]) == 0
    assert (tmp_path / "again.png").exists()


def test_wins_by_both_timers_and_untimed_rows():
    """best_peer_ratios / wins_table: kernelab against the fastest peer, by do_bench and by the
    GPU-only time where it was taken; a 0 ms (untimed, compile-ahead) row gets no ratio and no TB/s."""
    case = runner.Case("softmax", (6, 300), torch.float32, False)
    rows = runner.run_case(case, ("kernelab", "eager"), torch.device("cpu"), ENV, copy=4.0, timer=fake_timer,
                           extra_timers={"graph_ms": lambda step, sets: 0.25})
    for r in rows:  # kernelab 2x faster than eager on the GPU alone, equal by do_bench
        r.graph_ms = 0.25 if r.provider == "kernelab" else 0.5
    assert report.best_peer_ratios(rows, "ms") == {("softmax", "6x300", "fwd"): pytest.approx(1.0)}
    assert report.best_peer_ratios(rows, "graph_ms") == {("softmax", "6x300", "fwd"): pytest.approx(2.0)}
    from rich.console import Console

    console = Console(record=True, width=200)
    report.wins_table(rows, console)
    text = console.export_text()
    assert "do_bench" in text and "GPU only" in text and "1/1" in text
    untimed = runner.run_case(case, ("kernelab", "eager"), torch.device("cpu"), ENV, copy=4.0,
                              timer=lambda step, sets: (step(*sets[0]), 0.0)[1])
    assert all(r.status == "ok" and r.tbps is None and r.vs_eager is None for r in untimed)
