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
