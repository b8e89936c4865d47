"""Convolutions in channels-last layout (``KERNELAB_CONV_LAYOUT``; its default, ``auto``, asks for
it in graphs on GPU tensors and in plans recorded for the GPU, not in graphs run on the CPU: ATen's
CPU batch norm on channels-last activations is less exact than on NCHW, and cuDNN is the reason).

cuDNN's fast convolution kernels on Hopper read and write NHWC. Fed NCHW (PyTorch's default), each
convolution converts its input to NHWC and its output back (cuDNN's ``nchwToNhwcKernel`` /
``nhwcToNchwKernel``: 194 launches and ~4 ms of a ResNet-50 training step on an H100), and
ATen's batch-norm backward on NCHW runs one block per channel (~10 ms of that step). Inductor
avoids both by laying the activations of convolution graphs out channels-last.

Here the same happens before aot_autograd traces the graph: every 2-D convolution's input is asked
for channels-last (``x.contiguous(memory_format=torch.channels_last)``). Traced, that is one copy
for the graph's input image; every later activation is already channels-last, because the ops in
between keep their input's memory format (elementwise ops, batch norm, pooling, the residual adds
of two channels-last tensors), so the request is a no-op there, and cuDNN writes its output NHWC.
The backward follows: gradients come back in the layout of the forward's values. A training batch
norm's statistics are then the columns of an [N*H*W, C] matrix, one column kernel
(``rewrites.batch_norm_statistics_as_columns``), and the backward's per-channel sums likewise
(``rewrites.innermost_kept_sums_as_columns``). Measured on an H100
(``benchmarks/results/host_events_conv_layout_stop36_h100.txt``): ResNet-50's training step 35.2 ms
NCHW, 27.3 ms channels-last with ATen's norm, Inductor 24.2 ms; with the generated norm
(``host_events_resnet_bn_columns_stop37_h100.txt``, another H100) 25.1 ms against Inductor's
23.8. Values are unchanged: only strides differ, and whatever leaves
the graph is handed back in eager's layout: an output eager makes contiguous is asked for
``contiguous()`` (a copy only where it came out channels-last: a feature map a model returns), so
that the caller's ``view``s and strides are what eager gives.
"""
from __future__ import annotations

import torch
import torch.fx as fx

#: dynamo's spelling of a 2-D convolution (``F.conv2d`` is ``torch.conv2d``; ``nn.Conv2d`` inlined)
_CONV2D = {torch.conv2d, torch.nn.functional.conv2d}


def _input_4d(node: fx.Node) -> bool:
    """The convolution's input is a 4-D tensor (batched; an unbatched 3-D input has no N)."""
    val = node.args[0].meta.get("example_value") if isinstance(node.args[0], fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 4


#: ops whose values depend on the strides dynamo traced with (eager's NCHW): no request in such a graph
_STRIDED = {torch.as_strided, torch.Tensor.as_strided, "as_strided", "as_strided_"}


def channels_last_convolutions(gm: fx.GraphModule) -> list:
    """Ask each batched 2-D convolution of dynamo's graph ``gm`` for a channels-last input, in
    place, and the graph's outputs for eager's layout. Returns the nodes inserted (``undo`` takes
    them out again); none where the graph has no such convolution or reads strides
    (``as_strided``: its values would change with the layout)."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _CONV2D and _input_4d(n)]
    if not convs or any(n.op in ("call_function", "call_method") and n.target in _STRIDED for n in gm.graph.nodes):
        return []
    inserted = []
    for node in convs:
        with gm.graph.inserting_before(node):
            request = gm.graph.call_method("contiguous", (node.args[0],), {"memory_format": torch.channels_last})
        node.update_arg(0, request)
        inserted.append(request)
    inserted += _outputs_as_eager_lays_them_out(gm)
    gm.recompile()
    return inserted


def undo(gm: fx.GraphModule, inserted: list) -> None:
    """Take the nodes ``channels_last_convolutions`` inserted out of ``gm``: the graph as dynamo
    made it (for a graph that cannot be traced with the new layout: ``x.view(n, -1)`` of a
    channels-last activation raises)."""
    for node in reversed(inserted):
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
    gm.recompile()


def _outputs_as_eager_lays_them_out(gm: fx.GraphModule) -> list:
    """Each output tensor that eager makes contiguous (dynamo's example value) asked for
    ``contiguous()``: a no-op unless the channels-last activations reached it."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    inserted = []

    def restored(a):
        val = a.meta.get("example_value")
        if not (isinstance(val, torch.Tensor) and val.dim() >= 2 and val.is_contiguous()):
            return a
        with gm.graph.inserting_before(output):
            inserted.append(gm.graph.call_method("contiguous", (a,)))
        return inserted[-1]

    output.args = fx.node.map_arg(output.args, restored)
    return inserted
