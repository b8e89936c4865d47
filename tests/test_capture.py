"""The recorder: ops, storages, views, in-place writes, backward, modules, device-specific calls."""
import torch
import torch.nn.functional as F

from kernelab.capture import capture


def _names(trace):
    return [op.name for op in trace]


def test_views_are_marked_and_share_storage():
    x = torch.randn(64, 32)
    trace = capture(lambda x: x.t().contiguous(), (x,))
    t, clone = trace.ops
    assert t.is_view and t.outputs[0].storage == t.inputs[0].storage == trace.inputs[0].storage
    assert t.outputs[0].stride == (1, 32)
    assert not clone.is_view and clone.outputs[0].storage != t.inputs[0].storage


def test_in_place_ops_record_the_mutated_input_not_an_output():
    x = torch.randn(100)
    trace = capture(lambda x: x.add_(1).mul_(2), (x,))
    assert _names(trace) == ["aten.add_.Tensor", "aten.mul_.Tensor"]
    for op in trace:
        assert op.outputs == [] and op.mutated[0].storage == trace.inputs[0].storage
    # the mutated input is an output of the function
    assert [t.storage for t in trace.outputs] == [trace.inputs[0].storage]


def test_backward_ops_are_flagged_and_gradients_are_outputs():
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(4, 8)

    def fn(w, x):
        loss = (x @ w.t()).sum()
        loss.backward()
        return loss

    trace = capture(fn, (w, x))
    forward = [op.short for op in trace if not op.backward and not op.is_view]
    backward = [op.short for op in trace if op.backward and not op.is_view]
    assert forward == ["mm", "sum", "ones_like"]
    assert "mm" in backward
    grad_shapes = [t.shape for t in trace.outputs]
    assert (16, 8) in grad_shapes and () in grad_shapes


def test_module_parameters_and_buffers_are_inputs():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    trace = capture(m.eval(), (torch.randn(2, 8),))
    shapes = sorted(t.shape for t in trace.inputs)
    # x, weight, bias, bn weight, bn bias, running mean, running var, num_batches_tracked
    assert shapes == sorted([(2, 8), (4, 8), (4,), (4,), (4,), (4,), (4,), ()])


def test_nothing_is_allocated_when_faking():
    # 1e9 float32 elements would be 4 GB: meta inputs become fakes, nothing is allocated
    with torch.device("meta"):
        a = torch.empty(10**9)
    trace = capture(lambda a: a * 2, (a,))
    assert trace.ops[0].outputs[0].numel == 10**9


def test_sdpa_is_recorded_as_one_cuda_op_not_the_cpu_decomposition():
    q = torch.randn(2, 4, 128, 64, dtype=torch.bfloat16)
    trace = capture(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), (q,))
    assert _names(trace) == ["aten.scaled_dot_product_attention.cuda"]
    assert trace.ops[0].args["is_causal"] is True


def test_dropout_is_recorded_as_the_fused_cuda_kernel():
    x = torch.randn(1000)
    trace = capture(lambda x: F.dropout(x, 0.1, training=True), (x,))
    assert _names(trace) == ["aten.native_dropout.default"]
    trace = capture(lambda x: F.dropout(x, 0.1, training=False), (x,))
    assert _names(trace) == []


def test_the_user_tensors_are_untouched():
    x = torch.randn(10)
    before = x.clone()
    capture(lambda x: x.mul_(3), (x,))
    assert torch.equal(x, before)
