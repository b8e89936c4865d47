"""CUDA graphs around the compiled graphs: ``torch.compile(fn, backend="kernelab", mode="reduce-overhead")``.

Why: a training step of a model with a few hundred small kernels is host-bound. On the H200's host
each launch costs the host ~20-40 us (Python runner, allocator, Triton's launcher, autograd), so
BERT-base's 550 kernels take ~23 ms to launch for ~18 ms of GPU work, and both kernelab and
Inductor's default mode wait on the host (``benchmarks/results/zoo_profile_host_stop23_h200.txt``).
Recorded once into a CUDA graph, the whole graph replays with one launch.

How: on torch's CUDA graph trees, the machinery behind Inductor's own ``mode="reduce-overhead"``
(``torch._dynamo.backends.cudagraphs`` wires it the same way around plain FX graphs). Each compiled
forward, backward and inference graph is wrapped: its first call runs normally (the kernels compile
there), the next one records, later ones replay. Parameters, buffers and the tensors the forward
saves for the backward are read where they are; every other input is copied into the graph's own
buffer at each replay. Outputs live in the trees' memory pool: a replay overwrites the outputs of
the previous replay of the same graph, the contract Inductor's mode has (clone an output kept
across steps; torch raises if an overwritten one is read).

A graph is not recorded (one warning, and the reason in ``kernelab.explain``'s plan) where a
CUDA graph cannot hold it: tensors off one CUDA device, an op that synchronizes with the host or
has data-dependent shapes, an input other than a parameter or buffer mutated in place, or a
backward whose forward was not recorded.

Asked for by ``mode="reduce-overhead"``, ``options={"cudagraphs": True}`` or KERNELAB_CUDAGRAPHS=1
(``options.py`` parses them).
"""
from __future__ import annotations

import warnings

import torch

from ..errors import KernelabCudaGraphWarning

__all__ = ["Pairing", "wrap"]


class Pairing:
    """What a forward's wrapping tells its backward (one per dynamo graph): whether the forward was
    recorded, and its device."""

    def __init__(self):
        self.forward_recorded = True
        self.device_index: int | None = None


def wrap(call, gm: torch.fx.GraphModule, inputs: list, kind: str, pairing: Pairing) -> tuple[object, str]:
    """``call`` (a compiled graph's boxed callable) wrapped to record and replay a CUDA graph, and a
    note for the plan ("recorded ..." or "not recorded: <reason>"). Where it cannot be recorded,
    ``call`` itself (a backward of a recorded forward: told to the trees first) and the reason."""
    why = _why_not(gm, inputs, kind, pairing)
    if why is not None:
        if kind == "forward" or kind == "inference":
            pairing.forward_recorded = False
        warnings.warn(f"kernelab: CUDA graphs not used for this {kind} graph: {why}",
                      KernelabCudaGraphWarning, stacklevel=3)
        return (_backward_outside_trees(call, pairing) if kind == "backward" and pairing.forward_recorded
                else call), f"not recorded: {why}"
    from torch._dynamo.backends.cudagraphs import get_stack_traces
    from torch._inductor.cudagraph_trees import cudagraphify_impl
    from torch._inductor.cudagraph_utils import get_placeholder_info

    device = _device_index(inputs)
    pairing.device_index = device
    call.runner.for_cuda_graphs()
    call.plan.reused = call.runner.describe_reuse()  # none: the trees' static inputs stay as recorded
    wrapped = cudagraphify_impl(
        _clearing(call), inputs, _static_inputs(gm, kind), device_index=device,
        is_backward=kind == "backward", is_inference=kind == "inference",
        stack_traces=get_stack_traces(gm), placeholders=get_placeholder_info(gm.graph),
        mutated_input_idxs=_mutated_inputs(gm))
    return _like(call, wrapped), "recorded: replayed as one CUDA graph (torch's CUDA graph trees)"


def _why_not(gm, inputs, kind: str, pairing: Pairing) -> str | None:
    """Why this graph cannot be recorded, or None."""
    if kind == "backward" and not pairing.forward_recorded:
        return "its forward graph was not recorded"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from torch._inductor.cudagraph_trees import cudagraphify_impl  # noqa: F401
        from torch._inductor.utils import get_first_incompatible_cudagraph_node
    except ImportError as exc:
        return f"this torch ({torch.__version__}) lacks the CUDA graph trees' API ({exc})"
    devices = {t.device for t in inputs if isinstance(t, torch.Tensor)}
    devices |= {n.meta["val"].device for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    devices.discard(torch.device("meta"))
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return f"its tensors are not all on one CUDA device ({', '.join(sorted(map(str, devices))) or 'none'})"
    node = get_first_incompatible_cudagraph_node(gm)
    if node is not None:
        return f"op {node.name} ({node.target}) cannot be captured (host synchronization or data-dependent shape)"
    mutated = _mutated_inputs(gm) - set(_static_inputs(gm, kind))
    if mutated:
        names = [n.name for i, n in enumerate(_placeholders(gm)) if i in mutated]
        return f"it mutates input(s) {', '.join(names)} in place, which are not parameters or buffers"
    return None


def _placeholders(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _mutated_inputs(gm) -> set[int]:
    from torch._dynamo.backends.cudagraphs import find_input_mutations

    return set(find_input_mutations(gm.graph))


def _static_inputs(gm, kind: str) -> list[int]:
    """Inputs whose memory stays put from call to call, read in place by the replay: a forward's
    parameters and buffers (aot_autograd's metadata marks them), a backward's saved tensors (the
    forward's outputs, in the trees' pool): every input but the tangents."""
    if kind == "backward":
        from torch._inductor.utils import count_tangents

        return list(range(count_tangents(gm)))
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    return list(getattr(meta, "static_input_indices", None) or [])


def _device_index(inputs) -> int:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return t.device.index if t.device.index is not None else torch.cuda.current_device()
    return torch.cuda.current_device()


def _clearing(call):
    """``call`` in the trees' boxed contract: the list handed in is emptied (the trees check it,
    so that inputs can be freed), and the call gets a list of its own (which the runner empties)."""
    def run(args):
        own = list(args)
        args.clear()
        return call(own)
    return run


def _backward_outside_trees(call, pairing: Pairing):
    """A backward that cannot be recorded, of a recorded forward: the trees must be told it runs
    (its forward's outputs stay valid) before it does, as torch's cudagraphs backend does."""
    def run(args):
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(pairing.device_index or 0, create_if_none_exists=False)
        if manager is not None:
            manager.set_to_running_backward()
        return call(args)
    return _like(call, run)


def _like(call, wrapper):
    """``wrapper`` with the compiled call's boxed convention and the attributes others read."""
    wrapper._boxed_call = True
    for name in ("plan", "raw", "runner"):
        if hasattr(call, name):
            setattr(wrapper, name, getattr(call, name))
    return wrapper
