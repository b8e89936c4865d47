"""count/compare on modules and backward passes; pairing measured kernels with predicted ones."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import kernelab
from kernelab.api import KernelabError, attribute
from kernelab.eager_rules import KernelSpec
from kernelab.report import SCHEMA_VERSION


def test_module_parameters_count_as_inputs_and_grads_as_outputs():
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(256, 512)

        def forward(self, x):
            loss = self.linear(x).square().mean()
            loss.backward()
            return loss

    x = torch.randn(64, 256)
    r = kernelab.count(Step(), x, predict=True)
    # forward GEMM with fused bias, square, mean; backward: fills, grads of weight and bias
    assert r.categories[0] == "matmul"
    assert "reduction" in r.categories and r.categories.count("matmul") >= 2
    # ideal traffic: read x (64 KB), weight (512 KB), bias; write loss, weight grad, bias grad
    ideal = 4 * (64 * 256 + 2 * 512 * 256 + 2 * 512 + 1)
    assert r.ideal_bytes == ideal


def test_nn_module_target():
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).eval()
    r = kernelab.count(m, torch.randn(8, 32), predict=True)
    assert (r.num_kernels, r.categories) == (2, ["matmul", "pointwise"])
    assert r.target == "Sequential"


def test_json_is_versioned_and_complete():
    d = kernelab.count(lambda a: F.softmax(a, -1), torch.randn(128, 1000), predict=True).to_dict()
    assert d["schema_version"] == SCHEMA_VERSION
    assert set(d["totals"]) >= {"num_kernels", "num_memops", "bytes", "transfers", "ideal_bytes",
                                "fusion_headroom", "round_trips"}
    (k,) = d["kernels"]
    assert k["category"] == "reduction" and k["bytes_read"] == k["bytes_written"] == 128 * 1000 * 4
    assert k["measured"] is False and k["time_us"] > 0


def test_unknown_mode_and_bad_target_are_refused():
    with pytest.raises(KernelabError, match="unknown mode"):
        kernelab.count(lambda a: a, torch.ones(2), mode="xla", predict=True)
    with pytest.raises(KernelabError, match="function or an nn.Module"):
        kernelab.count(3, torch.ones(2), predict=True)


def test_a_target_that_raises_propagates_its_error():
    def bad(a):
        raise ValueError("user bug")

    with pytest.raises(ValueError, match="user bug"):
        kernelab.count(bad, torch.ones(2), predict=True)


def _measured(op, category):
    return SimpleNamespace(op=op, category=category)


def test_attribute_pairs_by_op_and_across_renamed_runs():
    measured = [_measured("aten::gather", "index"), _measured("aten::relu", "pointwise"),
                _measured("aten::sum", "memset"), _measured("aten::sum", "reduction")]
    specs = [KernelSpec("embedding", "index", ["embedding"]), KernelSpec("relu", "pointwise", ["relu"]),
             KernelSpec("memset", "memset", ["sum"]), KernelSpec("sum", "reduction", ["sum"])]
    pairs = attribute(measured, specs, "eager")
    assert [p[1].name for p in pairs] == ["embedding", "relu", "memset", "sum"]


def test_attribute_leaves_extra_measured_kernels_unpaired():
    measured = [_measured("aten::mm", "matmul"), _measured("aten::mm", "matmul"), _measured("aten::add", "pointwise")]
    specs = [KernelSpec("gemm", "matmul", ["mm"]), KernelSpec("add", "pointwise", ["add"])]
    names = [p[1] and p[1].name for p in attribute(measured, specs, "eager")]
    assert sorted(names[:2], key=str) == [None, "gemm"] and names[2] == "add"


def test_debug_switch_prints_a_line_per_kernel(monkeypatch, capsys):
    monkeypatch.setenv("KERNELAB_DEBUG", "2")
    kernelab.count(lambda a, b: (a + b).relu(), torch.randn(10), torch.randn(10), predict=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[kernelab]") and "2 kernels" in err[0]
    assert len(err) == 3 and "pointwise" in err[1] and "predicted" in err[1]


@pytest.mark.parametrize("full, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
     "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)", "vectorized_elementwise_kernel<CUDAFunctor_add>"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::"
     "(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "cunn_SoftMaxForward"),
    ("triton_poi_fused_add_relu_0", "triton_poi_fused_add_relu_0"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
])
def test_short_kernel_names_for_tables(full, short):
    from kernelab.report import short_kernel_name

    assert short_kernel_name(full) == short


def test_data_dependent_control_flow_is_refused_with_a_reason():
    def branchy(x):
        return x * 2 if bool((x > 0).any()) else x

    with pytest.raises(KernelabError, match="control flow depends on tensor values"):
        kernelab.count(branchy, torch.randn(4, 8), predict=True)
    # data-dependent sizes alone are fine: estimated, and the kernels are known
    r = kernelab.count(lambda x: x[x > 0] * 2, torch.randn(1000), predict=True)
    assert r.categories[:1] == ["pointwise"] and "memcpy" in r.categories


# ---------------------------------------------------------------------------------------------
# Printing (issue 13, part 4)


def _add_relu(a, b):
    return (a + b).relu()


def test_print_of_a_table_a_report_and_a_comparison_is_readable(capsys):
    a, b = torch.randn(1000), torch.randn(1000)
    r = kernelab.count(_add_relu, a, b, predict=True)
    print(r.table())
    print(r)
    c = kernelab.compare(_add_relu, a, b, predict=True)
    print(c)
    out = capsys.readouterr().out
    assert "rich.table" not in out and "object at 0x" not in out
    assert out.count("_add_relu — eager — h200") == 3 and out.count("_add_relu — inductor — h200") == 1
    assert "triton_poi_fused_add_relu" in out and "│ add" in out
    assert " ".join(out.split()).endswith(" ".join(c.summary().split()))  # the comparison ends with its summary
    assert repr(c) == f"<Comparison {c.summary()}>" and repr(r) == f"<Report {r.summary()}>"


def test_long_kernel_names_fold_instead_of_being_cut():
    from kernelab.report import Kernel, Report

    name = "triton_red_fused__log_softmax__to_copy_add_mul_neg_nll_loss_forward_sum_0"
    r = Report("inductor", "f", False, "h200", [Kernel(name, "reduction", ["log_softmax", "nll_loss_forward"],
                                                       1000, 4, time_us=3.0, ceiling_bytes_per_s=4e12)],
               largest_array_bytes=1000, ideal_bytes=1004)
    for width in (100, 160):
        from kernelab.report import render_text

        text = render_text(r.table(), width=width)
        assert "…" not in text
        cells = [line.split("│")[2].strip() for line in text.splitlines() if line.startswith("│")]
        assert "".join(cells) == name  # every character is there, folded over lines at the narrow width


def test_percent_of_ceiling_says_which_bound():
    x, w = torch.randn(4096, 4096), torch.randn(4096, 4096)
    r = kernelab.count(lambda a, b: (a @ b).relu(), x, w, predict=True)
    gemm, relu = r.kernels
    assert (gemm.bound, relu.bound) == ("compute", "memory")
    assert r.to_dict()["kernels"][0]["bound"] == "compute"
    rows = [line for line in str(r).splitlines() if line.startswith("│")]
    assert rows[0].rstrip("│ ").endswith("math") and rows[1].rstrip("│ ").endswith("mem")


def test_host_and_gpu_time_are_shown_apart():
    r = kernelab.count(_add_relu, torch.randn(1000), torch.randn(1000), mode="inductor", predict=True)
    text = " ".join(str(r).split())
    gpu = r.kernel_time_us
    assert gpu < r.wall_time_us / 2
    assert f"GPU busy {gpu:.3g} µs of a {r.wall_time_us:.3g} µs call (predicted): the rest is host time" in text


def test_the_fused_ideal_belongs_to_the_function_not_the_mode():
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)

        def forward(self, x):
            loss = self.l2(torch.relu(self.l1(x))).square().mean()
            loss.backward()
            return loss

    for target, args in [(Step(), (torch.randn(64, 256),)), (lambda x: x.t().contiguous() + 1, (torch.randn(512, 256),))]:
        c = kernelab.compare(target, *args, modes=("eager", "inductor", "kernelab"), predict=True)
        ideals = {m: (r.ideal_bytes, r.largest_array_bytes) for m, r in c.reports.items()}
        assert len(set(ideals.values())) == 1, ideals


# ---------------------------------------------------------------------------------------------
# Timeouts and blame


def test_count_times_out_even_when_the_target_swallows_exceptions():
    import time

    from kernelab.errors import KernelabError, TargetTimeout

    def stubborn(x):
        while True:
            try:
                time.sleep(0.05)
            except Exception:
                pass

    start = time.perf_counter()
    with pytest.raises(TargetTimeout, match="counting stubborn in eager mode did not finish within 0.3 s"):
        kernelab.count(stubborn, torch.ones(2), predict=True, timeout=0.3)
    assert time.perf_counter() - start < 5 and issubclass(TargetTimeout, KernelabError)
    r = kernelab.count(_add_relu, torch.ones(2), torch.ones(2), predict=True, timeout=30)  # in time: no effect
    assert r.num_kernels == 2


def test_blame_tells_the_target_from_kernelab():
    from kernelab.errors import blame, root_cause, where

    def user_code(x):
        return x + torch.ones(3)

    with pytest.raises(RuntimeError) as user:
        user_code(torch.ones(2))
    assert blame(user.value) == "target"  # raised inside torch, called from the user's code
    with pytest.raises(TypeError) as ours:
        from kernelab.report import fmt_bytes

        fmt_bytes("x")
    owner, location = where(ours.value)
    assert owner == "kernelab" and location.startswith("kernelab/report.py:")
    generated = compile("def run():\n    return undefined_name\n", "<kernelab runner>", "exec")
    scope = {}
    exec(generated, scope)
    with pytest.raises(NameError) as runner:
        scope["run"]()
    assert blame(runner.value) == "kernelab"  # code kernelab generated is kernelab's
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = user.value
    assert root_cause(wrapped) is user.value


def test_the_target_raising_under_capture_is_the_target_s():
    """kernelab's dispatch mode forwards every op: an op's error passes through it, blamed on the target."""
    from kernelab.errors import blame

    with pytest.raises(RuntimeError) as info:
        kernelab.count(_add_relu, torch.ones(10), torch.ones(11), predict=True)
    assert blame(info.value) == "target"


# ---------------------------------------------------------------------------------------------
# The sweep plot


def test_sweep_plot_keeps_coinciding_modes_apart(tmp_path):
    import matplotlib

    from kernelab.report import Report
    from kernelab.sweep import SweepPoint, SweepResult

    def point(size, mode, us):
        return SweepPoint(size, mode, Report(mode, "f", False, "h200", [], 1, 1, wall_time_us=us))

    sizes = [10**k for k in range(2, 10)]
    result = SweepResult("f", sizes, ("eager", "inductor", "kernelab"), False, "h200 profile")
    for n in sizes:
        eager = 7 + n * 5e-6
        result.points += [point(n, "eager", eager), point(n, "inductor", 21 + n * 3e-6), point(n, "kernelab", 21 + n * 3e-6)]
    assert result.crossover("inductor") == result.crossover("kernelab") == 10**7
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVG
    try:
        svg = (tmp_path / "s.svg")
        result.plot(str(svg))
        text = svg.read_text()
    finally:
        matplotlib.rcParams["svg.fonttype"] = "path"
    assert text.count("inductor and kernelab pay from n = 1e+07") == 1 and "pays from" not in text
    # the two coinciding lines are drawn differently (the later one dashed and thinner, on top)
    assert "stroke-dasharray" in text


def test_kernelab_gemm_ops_count_as_one_kernel_where_eager_launches_several():
    """kernelab.ops.linear with GELU and bias is one kernel (eager: cuBLASLt's gemm+bias, then
    GELU); swiglu_linear is one kernel reading x and both weights once (eager: two GEMMs, SiLU, mul)."""
    x, w, b, w2 = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48), torch.randn(48, 32)
    eager = kernelab.count(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b, predict=True)
    fused = kernelab.count(lambda x, w, b: kernelab.ops.linear(x, w, b, "gelu"), x, w, b, predict=True)
    assert (len(eager.kernels), len(fused.kernels)) == (2, 1)
    eager = kernelab.count(lambda x, a, c: F.silu(F.linear(x, a)) * F.linear(x, c), x, w, w2, predict=True)
    fused = kernelab.count(lambda x, a, c: kernelab.ops.swiglu_linear(x, a, c), x, w, w2, predict=True)
    assert (len(eager.kernels), len(fused.kernels)) == (4, 1)
    (kernel,) = fused.kernels
    assert (kernel.bytes_read, kernel.bytes_written) == ((64 * 32 + 2 * 48 * 32) * 4, 64 * 48 * 4)


def test_one_function_counted_over_many_models_stays_compiled():
    """The same ``step`` counted over eleven models in one process: dynamo stops compiling a
    function after 8 compilations (its recompile limit) and runs it eagerly with a logged
    warning, and mode="kernelab" then reported eager's kernels, silently, from the ninth model
    on (found counting 18 held-out models in one loop, 2026-12-04)."""
    def step(m, x):
        return torch.relu(m(x) * 2 + 1).sum()

    acts = [torch.nn.ReLU(), torch.nn.GELU(), torch.nn.SiLU(), torch.nn.Tanh(), torch.nn.Sigmoid(), torch.nn.ELU(),
            torch.nn.Mish(), torch.nn.Softplus(), torch.nn.Hardswish(), torch.nn.LeakyReLU(), torch.nn.SELU()]
    models = [torch.nn.Sequential(torch.nn.Linear(16, 8 + i), act) for i, act in enumerate(acts)]
    x = torch.randn(4, 16)

    def names(model):
        return [k["name"] for k in kernelab.count(step, model, x, mode="kernelab", predict=True).to_dict()["kernels"]]

    in_a_loop = [names(m) for m in models]
    for i, m in enumerate(models):  # the reference: each model counted in a fresh dynamo
        torch._dynamo.reset()
        assert in_a_loop[i] == names(m), f"model {i}"
        assert any(n.startswith("kl_fused") for n in in_a_loop[i]), f"model {i}: no generated kernel"
