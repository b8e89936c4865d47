"""The torch.compile backend: dynamo graph -> aot_autograd (functional ATen, forward and backward
graphs, decomposed) -> partition -> a runner that launches one generated kernel per group.

Built only on the public contract for custom backends: ``aot_module_simplified`` with a
decomposition table and ``min_cut_rematerialization_partition`` (the backward recomputes cheap
pointwise values instead of saving them), boxed calling convention.

Where no kernel can run (no CUDA device, and Triton's interpreter is off for CPU tensors) every
graph runs as its ATen ops, which is what eager PyTorch does; that is said once per process.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import time
import warnings

import torch

from .. import config
from ..errors import KernelabFallbackWarning
from . import bounds
from .eventlog import ACTIVE_PLAN, record_fallback

__all__ = ["kernelab_backend", "decompositions", "KernelabFallbackWarning", "reset"]


def decompositions() -> dict:
    """The decomposition table aot_autograd traces with (``_decompositions``), current settings."""
    return _decompositions(config.batch_norm_backward())


def _partitioned_graph_decompositions() -> dict | None:
    """The table the partitioned graphs are decomposed further with (training batch norm's
    forward, ``KERNELAB_BN_FORWARD=generated``); None where nothing is left to decompose."""
    if config.batch_norm_forward() != "generated":
        return None
    return _decompositions(config.batch_norm_backward(), "generated")


@functools.lru_cache(maxsize=4)
def _decompositions(batch_norm_backward: str, batch_norm_forward: str = "aten") -> dict:
    """Core ATen decompositions, plus the composite ops whose primitives we fuse (softmax, layer
    norm, GELU, their backwards). mean/var/relu stay whole: the compiler handles them directly."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    extra = [
        aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
        aten.native_layer_norm, aten.native_layer_norm_backward, aten.gelu, aten.gelu_backward,
        aten.silu, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward, aten.threshold_backward,
        aten.hardtanh, aten.hardtanh_backward, aten.leaky_relu, aten.leaky_relu_backward, aten.elu,
        aten.elu_backward, aten.softplus, aten.softplus_backward, aten.hardswish, aten.hardsigmoid,
        aten.mish, aten.addcmul, aten.addcdiv, aten.lerp, aten.mse_loss, aten.mse_loss_backward,
        aten.clamp_min, aten.clamp_max, aten.rsub, aten.square, aten.logsumexp, aten.var_mean.correction,
        aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit,  # inference batch norm: pointwise
    ]
    if batch_norm_forward == "generated":
        # training batch norm, decomposed in the partitioned graphs (``_partitioned_graph_decompositions``)
        # and not before aot_autograd: its statistics become a row and a column kernel
        # (``rewrites.batch_norm_statistics_as_rows_then_columns``), the running statistics'
        # ``copy_`` the column kernel's stores into the buffers (``graph.absorb_copies``)
        extra.append(aten._native_batch_norm_legit_functional)
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(extra))
    for op in (aten.mean.dim, aten.var.correction):
        table.pop(op, None)
    # Fused attention whose backward op is not decomposed must stay whole: the CPU flash op's
    # decomposition returns a logsumexp that its (undecomposed) backward op reads differently, so
    # decomposing only the forward gave gradients off by 25-33x relative norm (issue 11)
    for op in (o for o in _KEEP_WHOLE if batch_norm_backward == "aten" or o != "native_batch_norm_backward"):
        table.pop(getattr(aten, op).default, None)
    no_training = aten._native_batch_norm_legit_no_training.default
    table[no_training] = _stats_in_their_dtype(table[no_training])
    return table


def _stats_in_their_dtype(decomposition):
    """Inference batch norm's decomposition with its (empty) saved statistics in the running
    statistics' dtype, as ATen makes them: torch's makes them in the input's dtype, and the batch
    norm backward we keep whole (below) refuses float16 statistics beside float32 running ones on
    the CPU ("mixed dtype (CPU)": a float16 model's frozen batch norm, backward through it)."""

    def batch_norm(input, weight, bias, running_mean, running_var, momentum, eps):
        out, mean, rstd = decomposition(input, weight, bias, running_mean, running_var, momentum, eps)
        return out, mean.to(running_mean.dtype), rstd.to(running_var.dtype)

    return batch_norm


#: Ops kept out of the decomposition table, each with its backward op run as ATen alongside it.
#: The CPU flash attention (see above); batch norm's backward: decomposed, it is reductions over
#: (N, H, W) per channel, which no template generates, so ATen ran them as ~10 kernels per norm
#: where its own backward is one or two (torchvision ResNet-50 training: 1359 kernels a step
#: against eager's 782, H200, benchmarks/results/models_h200_run3.csv).
_KEEP_WHOLE = ("_scaled_dot_product_flash_attention_for_cpu", "native_batch_norm_backward")
# (KERNELAB_BN_BACKWARD=generated decomposes the batch norm's backward after all: with the rewrites
# ``middle_dims_kept_as_rows_then_columns`` and ``prologues_in_row_space`` its sums over (N, H, W)
# are a row kernel with the ReLU's backward as prologue and column kernels, ~4 kernels a norm
# with the ReLU's backward instead of 2: to be timed against ATen's before it is the default)


def _debug() -> int:
    from ..report import debug_level

    return debug_level()


def kernelab_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """``torch.compile(fn, backend="kernelab")``; ``mode="reduce-overhead"`` (or
    ``options={"cudagraphs": True}``) replays each compiled graph as a CUDA graph (``cudagraphs.py``)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from . import cudagraphs
    from .options import parse

    opts = parse(mode, options)  # a mode or option we lack raises here
    pairing = cudagraphs.Pairing()
    direct = []  # the inference graph's own call, where aot_autograd's runtime wrapper has no work
    autocast = torch._C._is_any_autocast_enabled()  # aot_autograd turns it off around the compilers
    saved_bounds: dict = {}  # the forward's proofs of index ranges, for the backward (bounds.py)

    def compiler(kind):
        def compile_fn(fx_gm, inputs):
            recorder = ACTIVE_PLAN[0]
            if recorder is not None:
                recorder.suppress += 1  # tracing runs ops too: none of them is a kernel of the call
            if kind == "forward":
                saved_bounds.update(bounds.of_outputs(fx_gm))
            elif kind == "backward":
                bounds.assume_for_inputs(fx_gm, saved_bounds)
            try:
                with _outside_the_plans_fake_mode(recorder):
                    call = compile_graph(fx_gm, inputs, kind, _visible_outputs(kind), opts.tiling,
                                         _donated_inputs() if kind == "backward" else frozenset())
            finally:
                if recorder is not None:
                    recorder.suppress -= 1
            if opts.cudagraphs:  # the replayed graph gets aot_autograd's wrapper: it has the work of output aliasing
                call, call.plan.cudagraphs = cudagraphs.wrap(call, fx_gm, inputs, kind, pairing)
                if _debug() >= 1:
                    print(f"kernelab {kind} graph: CUDA graph {call.plan.cudagraphs}", file=sys.stderr)
            elif kind == "inference" and not autocast and _wrapper_has_no_work(gm, inputs, example_inputs):
                direct.append(call)
            return call
        return torch._disable_dynamo(compile_fn)  # a backward compiled inside a traced frame

    try:
        compiled = aot_module_simplified(
            gm, example_inputs, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"), decompositions=decompositions(),
            partition_fn=min_cut_rematerialization_partition,
            # mutations of inputs that need no gradient (batch norm's running statistics) stay in
            # the graph, where rewrites.batch_norms_in_place makes them the norm's own update,
            # instead of a copy_ per input in aot_autograd's epilogue
            keep_inference_input_mutations=True,
        )
    except torch._dynamo.exc.RestartAnalysis:
        # dynamo's own control flow, not a failure: it re-traces the frame (a float scalar made a
        # tensor, say) and calls the backend again. Caught below, the graph ran eagerly instead:
        # kernelab.count of Qwen3's step after Gemma-2's predicted eager's 337 kernels, not 109
        raise
    except Exception as exc:  # tracing or partitioning failed: the graph runs as dynamo captured it
        if config.strict():
            raise
        why = f"aot_autograd failed on this graph ({type(exc).__name__}: {exc}): it runs eagerly"
        record_fallback("graph", "dynamo graph", why)
        _say_fallback(why)
        return gm.forward
    return _direct_inference(direct[0]) if direct else compiled


def _outside_the_plans_fake_mode(recorder):
    """A prediction at meta sizes runs the call in a fake mode of its own (``plan._meta_as_fake_cpu``),
    and a graph compiles at its first call, inside it; the graphs' values belong to the tracing's
    fake mode, and the rewrites that build new values from them failed under the other one (and
    were skipped: Llama's RoPE backward predicted 4 kernels more at meta sizes than on the CPU)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    active = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if recorder is not None and active is not None and active is recorder.runtime_fake:
        return unset_fake_temporarily()
    return contextlib.nullcontext()


def reset() -> None:
    """On torch._dynamo.reset(): the CUDA graph trees recorded for compiled graphs go too."""
    if "torch._inductor.cudagraph_trees" in sys.modules:
        sys.modules["torch._inductor.cudagraph_trees"].reset_cudagraph_trees()


def _wrapper_has_no_work(gm, graph_inputs, example_inputs) -> bool:
    """True where aot_autograd's inference runtime wrapper would only switch grad mode off around
    the call: no input mutated, no output aliasing an input or another output, no effect tokens,
    no tensor subclass, no functionalized RNG, no dynamic-dim marks, no grad-mode change (autocast
    off is checked by the caller), and the compiled graph takes exactly dynamo's inputs (nothing deduplicated, no synthetic
    base, no lifted parameters). Read from the metadata aot_autograd leaves on the tracing context.
    On the H200's host that wrapper costs several microseconds per call: a large share of a
    small graph's whole call."""
    from torch._functorch._aot_autograd.schemas import OutputType, PlainTensorMeta
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None or not config.direct_call() or not isinstance(gm, torch.fx.GraphModule):
        return False
    if len(graph_inputs) != len(example_inputs) or any(True for _ in gm.parameters()) or any(
            True for _ in gm.buffers()):
        return False
    if getattr(meta, "is_rng_op_functionalized", False):
        return False
    if meta.tokens or meta.num_intermediate_bases or getattr(meta, "grad_enabled_mutation", None) is not None:
        return False
    if getattr(meta, "dynamic_outputs", False) or getattr(meta, "num_graphsafe_rng_states", 0):
        return False
    if any(i.mutates_data or i.mutates_metadata for i in meta.input_info):
        return False
    if any(o.output_type != OutputType.non_alias or o.requires_grad for o in meta.output_info):
        return False
    return all(isinstance(m, (int, PlainTensorMeta)) for m in meta.subclass_inp_meta)


def _direct_inference(call):
    """Dynamo's compiled function for an inference graph whose aot_autograd wrapper has no work:
    our call with grad mode off (what that wrapper does), in dynamo's unboxed convention. Dynamo
    already runs it with tracing disabled."""
    boxed = call.raw
    set_grad = torch._C._set_grad_enabled
    is_grad = torch.is_grad_enabled

    def run(*args):
        if is_grad():
            set_grad(False)
            try:
                return boxed(args)
            finally:
                set_grad(True)
        return boxed(args)

    run.plan = call.plan
    run.direct = True
    return run


def _visible_outputs(kind: str) -> int | None:
    """How many leading outputs of a training forward aot_autograd hands to the caller (tokens,
    mutated inputs, user outputs, intermediate bases, the RNG offset); the rest are tensors saved
    for the backward. None (all) where the metadata does not say."""
    if kind != "forward":
        return None
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    try:
        return int(meta.num_forward_returns) + int(getattr(meta, "num_outputs_rng_offset", 0)) + len(meta.tokens)
    except (AttributeError, TypeError):
        return None


def _donated_inputs() -> frozenset:
    """The backward's inputs whose memory it may take (``torch._functorch.config.donated_buffer``,
    on by default): saved activations that alias no input or output of the step, read by this
    backward only. aot_autograd refuses ``retain_graph=True`` for such a backward, as for
    Inductor's, so each is read once. Empty where the tracing context does not say."""
    from torch._functorch import config as functorch_config
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    donated = getattr(meta, "bw_donated_idxs", None)
    return frozenset(donated) if donated and functorch_config.donated_buffer else frozenset()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str, visible_outputs: int | None = None,
                  tiling=None, donated: frozenset = frozenset()):
    """Partition one ATen graph and return its boxed callable. ``visible_outputs``: see
    ``runtime.GraphRunner.visible_outputs``; ``tiling``: the launch heuristics (``tiling.py``);
    ``donated``: inputs whose memory kernels may store outputs over (``_donated_inputs``)."""
    from . import graph, plan, rewrites, runtime

    runnable, why = _can_run(example_inputs, gm)  # may import triton: a once-per-process cost
    t0 = time.perf_counter()
    try:
        later = _partitioned_graph_decompositions()
        if later is not None:
            rewrites.batch_norm_forwards_decomposed(gm, later)
        part = graph.partition(gm)
        runner = runtime.GraphRunner.build(gm, part, runnable and _any_cpu(example_inputs), visible_outputs, tiling,
                                           donated)
    except Exception as exc:  # a compiler bug must not break the user's program: ATen runs it
        if config.strict():
            raise
        part = graph.Partition([], {}, {n: "" for n in gm.graph.nodes}, [])
        runner = runtime.GraphRunner.build(gm, part, False)
        runnable, why = False, f"the compiler failed on this graph ({type(exc).__name__}: {exc}): it runs as ATen"
        record_fallback("graph", kind, why)
    graph_plan = plan.GraphPlan.build(kind, gm, part, time.perf_counter() - t0, None if runnable else why)
    graph_plan.padded = runner.padding.describe()
    graph_plan.reused = runner.describe_reuse()
    if _debug() >= 1:  # 1: a line per graph; 2: a line per group, op left to ATen, refusal
        print(graph_plan.decisions() if _debug() >= 2 else graph_plan.summary(), file=sys.stderr)
    if _debug() >= 3 and runner.source:  # 3: also the generated runner and every kernel's source
        print(runner.source, file=sys.stderr)

    device = _cuda_device(example_inputs)
    current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

    def call(args):
        if device is not None and current_device() != device:
            # Triton launches, and the runner allocates, on the current device: make it the
            # graph's (a model on cuda:1 run while cuda:0 is current), as Inductor's generated
            # code does with a device guard
            with torch.cuda.device(device):
                return run(args)
        return run(args)

    def run(args):
        recorder = ACTIVE_PLAN[0]
        if recorder is not None:
            return list(runner(list(args), hooks=recorder.hooks(graph_plan)))
        if not runnable:
            _say_fallback(why)
            return list(gm(*args))
        out = runner(args)
        if not graph_plan.jit_s:  # the first call generated and imported the kernels
            graph_plan.note_compile(runner)
        return out

    boxed = torch._disable_dynamo(call)  # never trace the runner (backward runs inside frames)
    boxed._boxed_call = True
    boxed.plan = graph_plan
    boxed.raw = call
    boxed.runner = runner
    return boxed


def _cuda_device(example_inputs) -> int | None:
    """The CUDA device index of the graph's first CUDA tensor input, or None."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.get_device() >= 0:
            return t.get_device()
    return None


def _any_cpu(example_inputs) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0 for t in example_inputs)


def _can_run(example_inputs, gm) -> tuple[bool, str]:
    """Generated kernels need CUDA tensors, or CPU tensors with Triton's interpreter on."""
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor) and t.dim() > 0}
    devices |= {n.meta["val"].device.type for n in gm.graph.nodes
                if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() > 0}
    if devices - {"cuda", "cpu"}:
        return False, f"tensors on {', '.join(sorted(devices - {'cuda', 'cpu'}))}: no Triton kernels there"
    if "cpu" in devices:
        from .group_runner import interpreted

        if not interpreted():
            return False, ("CPU tensors and TRITON_INTERPRET=1 was not set when Triton was imported: "
                           "every graph runs as eager ATen ops")
    return True, ""


def _say_fallback(why: str) -> None:
    warnings.warn(f"kernelab: {why}", KernelabFallbackWarning, stacklevel=2)
