"""Lower an OpTrace to the kernels eager PyTorch launches on a CUDA device.

One rule a line in ``RULES``: an ATen op (``namespace.name``) maps to a function that returns the
kernels that op launches. Ops tagged ``pointwise`` by PyTorch need no line; views launch nothing.
An op with no rule is predicted as one kernel of category "other" at low confidence, with the
reason saying so. The rules were checked against kernels recorded on an H200 (tests/data/).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .capture import OpRecord, OpTrace, TensorInfo

CATEGORIES = (
    "pointwise", "reduction", "matmul", "conv", "attention", "copy", "fill",
    "index", "scan", "sort", "memset", "memcpy", "other",
)
MEMOPS = ("memset", "memcpy")


@dataclass
class KernelSpec:
    """A kernel as predicted (or measured and matched): what it reads and writes."""

    name: str
    category: str
    ops: list[str]
    reads: list[TensorInfo] = field(default_factory=list)
    writes: list[TensorInfo] = field(default_factory=list)
    flops: float = 0.0
    confidence: str = "high"
    reason: str = ""

    @property
    def kind(self) -> str:
        return self.category if self.category in MEMOPS else "kernel"


@dataclass(frozen=True)
class Context:
    """What the prediction depends on beyond the trace: the GPU's architecture."""

    arch: tuple[int, int] = (9, 0)


Rule = Callable[[OpRecord, Context], list[KernelSpec]]


# ---------------------------------------------------------------------------------------------
# Rule builders. Each returns the kernels of one op; reads are its tensor inputs, writes its
# outputs plus the inputs it mutates in place.


def _kernel(op: OpRecord, category: str, name: str | None = None, **kw) -> KernelSpec:
    reads = kw.pop("reads", op.inputs)
    writes = kw.pop("writes", op.written)
    return KernelSpec(name or op.short, category, [op.short], list(reads), list(writes), **kw)


def _empty(op: OpRecord) -> bool:
    """An op whose every output and mutated tensor is empty launches nothing."""
    written = op.written
    return bool(written) and all(t.numel == 0 for t in written)


def nothing(op, ctx):
    return []


def one(category: str, name: str | None = None, flops_per_output: float = 1.0) -> Rule:
    def rule(op, ctx):
        if _empty(op):
            return []
        flops = flops_per_output * sum(t.numel for t in op.written)
        return [_kernel(op, category, name, flops=flops)]
    return rule


def low(category: str, why: str, kernels: int = 1) -> Rule:
    """A rule we are unsure of: kernel counts vary with shape, library version or heuristics."""
    def rule(op, ctx):
        if _empty(op):
            return []
        first = _kernel(op, category, confidence="low", reason=why)
        rest = [_kernel(op, category, reads=[], writes=[], confidence="low", reason=why) for _ in range(kernels - 1)]
        return [first] + rest
    return rule


def reduction(op, ctx):
    if _empty(op):
        return []
    src = op.inputs[0] if op.inputs else None
    return [_kernel(op, "reduction", flops=src.numel if src else 0)]


def fill(op, ctx):
    """Factories and fill_/zero_: a FillFunctor elementwise kernel; reads nothing."""
    if _empty(op):
        return []
    return [_kernel(op, "fill", reads=[])]


def random(op, ctx):
    """Random generators (randn, bernoulli_, ...): one elementwise kernel writing the samples."""
    if _empty(op):
        return []
    return [_kernel(op, "pointwise", reads=[t for t in op.inputs if t.region not in {m.region for m in op.mutated}])]


def _same_layout(a: TensorInfo, b: TensorInfo) -> bool:
    return a.shape == b.shape and a.stride == b.stride and a.dtype == b.dtype


def _memcpy_or_copy(op: OpRecord, src: TensorInfo, dst: TensorInfo) -> list[KernelSpec]:
    """copy_ semantics: cudaMemcpy when both sides are dense with one layout, else a copy kernel."""
    if src.numel == 0:
        return []
    if src.device != dst.device:
        return [_kernel(op, "memcpy", f"memcpy {src.device}->{dst.device}", reads=[src], writes=[dst])]
    if _same_layout(src, dst) and src.is_contiguous:
        return [_kernel(op, "memcpy", "memcpy DtoD", reads=[src], writes=[dst])]
    return [_kernel(op, "copy", "copy", reads=[src], writes=[dst])]


def copy_(op, ctx):
    dst, src = op.args["self"], op.args["src"]
    return _memcpy_or_copy(op, src, dst)


def clone(op, ctx):
    return _memcpy_or_copy(op, op.inputs[0], op.outputs[0])


def to_copy(op, ctx):
    """.to(dtype)/.to(device)/.contiguous(): a cast is a copy kernel, a same-type copy a memcpy."""
    return _memcpy_or_copy(op, op.inputs[0], op.outputs[0])


def _gemm_flops(op: OpRecord) -> float:
    out = op.outputs[0]
    a = op.args.get("mat1") or op.args.get("self") or op.args.get("batch1")
    k = a.shape[-1] if isinstance(a, TensorInfo) and a.shape else 1
    return 2.0 * out.numel * k


def matmul(op, ctx):
    """cuBLAS: one GEMM kernel. Skinny shapes may add a split-K reduce kernel (low confidence)."""
    if _empty(op):
        return []
    return [_kernel(op, "matmul", "gemm (cuBLAS)", flops=_gemm_flops(op))]


def addmm(op, ctx):
    """A 1-D bias is fused into the GEMM's epilogue by cuBLASLt; any other bias is first copied
    into the output (a copy kernel), then the GEMM accumulates onto it (beta=1)."""
    if _empty(op):
        return []
    bias = op.args["self"]
    out = op.outputs[0]
    fusable = len(bias.shape) == 1 and bias.is_contiguous and op.args.get("beta", 1) == 1 and out.shape[0] > 1
    gemm = _kernel(op, "matmul", "gemm+bias (cuBLASLt)" if fusable else "gemm (cuBLAS)", flops=_gemm_flops(op))
    if fusable:
        return [gemm]
    copy = _kernel(op, "copy", "copy bias into output", reads=[bias], writes=[out])
    gemm.reads = [t for t in gemm.reads if t.region != bias.region] + [out]
    return [copy, gemm]


def _sdpa_backend(q: TensorInfo, ctx: Context) -> str:
    """The backend PyTorch's SDPA dispatcher picks on CUDA for these inputs."""
    half = q.dtype in ("float16", "bfloat16")
    if half and q.shape[-1] <= 128 and ctx.arch >= (9, 0):
        return "cudnn"
    if half and q.shape[-1] <= 256 and ctx.arch >= (8, 0):
        return "flash"
    return "efficient"


def _sdpa_flops(q: TensorInfo, k: TensorInfo, causal: bool) -> float:
    b_h = q.numel // (q.shape[-2] * q.shape[-1])
    flops = 4.0 * b_h * q.shape[-2] * k.shape[-2] * q.shape[-1]
    return flops / 2 if causal else flops


def sdpa(op, ctx):
    q, k = op.args["query"], op.args["key"]
    backend = _sdpa_backend(q, ctx)
    flops = _sdpa_flops(q, k, bool(op.args.get("is_causal", False)))
    return [_kernel(op, "attention", f"attention forward ({backend})", flops=flops)]


def sdpa_backward(op, ctx):
    q = op.inputs[1] if len(op.inputs) > 1 else op.inputs[0]
    backend = _sdpa_backend(q, ctx)
    return [_kernel(op, "attention", f"attention backward ({backend})", confidence="low",
                    reason=f"{backend} backward may add preprocessing kernels and memsets")]


def nll_loss_backward(op, ctx):
    """grad_input is zero-filled, then the target positions are scattered."""
    grad_input = op.outputs[0]
    return [_kernel(op, "fill", "zero grad_input", reads=[], writes=[grad_input]),
            _kernel(op, "reduction", "nll_loss backward")]


def logsumexp(op, ctx):
    """CompositeExplicit on CUDA: amax, then a fused sub-exp-sum reduction, then log + add."""
    return [_kernel(op, "reduction", "amax"), _kernel(op, "reduction", "sum(exp(x - max))"),
            _kernel(op, "pointwise", "log + max")]


def item(op, ctx):
    return [_kernel(op, "memcpy", "memcpy DtoH (.item())", writes=[])]


def nonzero(op, ctx):
    return [_kernel(op, "scan", "nonzero (cub select)", confidence="low",
                    reason="nonzero runs several cub kernels and syncs the host for the count")]


RULES: dict[str, Rule] = {
    # allocation and metadata: no kernel
    "aten.empty": nothing, "aten.empty_like": nothing, "aten.empty_strided": nothing,
    "aten.new_empty": nothing, "aten.new_empty_strided": nothing, "aten.lift_fresh": nothing,
    "aten.detach": nothing, "aten.alias": nothing, "aten._unsafe_view": nothing,
    "aten.squeeze_": nothing, "aten.unsqueeze_": nothing, "aten.t_": nothing, "aten.transpose_": nothing,
    "aten.as_strided_": nothing, "aten.resize_": nothing, "aten.set_": nothing,
    "aten.sym_size": nothing, "aten.sym_stride": nothing, "aten.sym_numel": nothing, "aten.is_same_size": nothing,
    # fills and factories
    "aten.zeros": fill, "aten.ones": fill, "aten.full": fill, "aten.zeros_like": fill, "aten.ones_like": fill,
    "aten.full_like": fill, "aten.new_zeros": fill, "aten.new_ones": fill, "aten.new_full": fill,
    "aten.fill_": fill, "aten.zero_": fill, "aten.scalar_tensor": fill,
    "aten.arange": one("pointwise", "arange"), "aten.linspace": one("pointwise", "linspace"),
    # random numbers
    "aten.randn": random, "aten.rand": random, "aten.randint": random, "aten.normal_": random,
    "aten.uniform_": random, "aten.bernoulli_": random, "aten.random_": random, "aten.bernoulli": random,
    "aten.randn_like": random, "aten.rand_like": random, "aten.randint_like": random,
    "aten.native_dropout": one("pointwise", "fused dropout"),
    # copies and casts
    "aten.copy_": copy_, "aten.clone": clone, "aten._to_copy": to_copy, "aten.copy": clone,
    "aten._local_scalar_dense": item,
    # reductions (one reduce kernel each)
    "aten.sum": reduction, "aten.mean": reduction, "aten.amax": reduction, "aten.amin": reduction,
    "aten.max": reduction, "aten.min": reduction, "aten.argmax": reduction, "aten.argmin": reduction,
    "aten.prod": reduction, "aten.any": reduction, "aten.all": reduction, "aten.var": reduction,
    "aten.std": reduction, "aten.var_mean": reduction, "aten.std_mean": reduction,
    "aten.linalg_vector_norm": reduction, "aten.norm": reduction, "aten.aminmax": reduction,
    "aten.logsumexp": logsumexp,
    "aten._softmax": reduction, "aten._log_softmax": reduction,
    "aten._softmax_backward_data": reduction, "aten._log_softmax_backward_data": reduction,
    "aten.nll_loss_forward": one("reduction", "nll_loss forward"), "aten.nll_loss_backward": nll_loss_backward,
    "aten.nll_loss2d_forward": one("reduction", "nll_loss2d forward"),
    # normalization
    "aten.native_layer_norm": one("reduction", "layer_norm"),
    "aten.native_layer_norm_backward": low("reduction", "layer_norm backward: input grad plus weight/bias grads", 2),
    "aten._native_batch_norm_legit_no_training": one("pointwise", "batch_norm (eval)"),
    "aten._native_batch_norm_legit": low("reduction", "batch_norm (train): statistics then normalize", 2),
    "aten._native_batch_norm_legit_functional": low("reduction", "batch_norm (train): statistics then normalize", 2),
    "aten.native_batch_norm": low("reduction", "batch_norm (train): statistics then normalize", 2),
    "aten.native_batch_norm_backward": low("reduction", "batch_norm backward", 2),
    "aten.native_group_norm": low("reduction", "group_norm: statistics then normalize", 2),
    # scans and sorts
    "aten.cumsum": one("scan", "cumsum"), "aten.cumprod": one("scan", "cumprod"),
    "aten.logcumsumexp": one("scan", "logcumsumexp"),
    "aten.sort": low("sort", "sort: one segmented sort for short rows, radix sort passes for long ones"),
    "aten.topk": low("sort", "topk: radix select, plus a sort when sorted=True"),
    "aten.nonzero": nonzero,
    # indexing
    "aten.index": one("index", "index (gather)"), "aten.index_select": one("index", "index_select"),
    "aten.gather": one("index", "gather"), "aten.scatter": one("index", "scatter"),
    "aten.scatter_": one("index", "scatter_"), "aten.scatter_add": one("index", "scatter_add"),
    "aten.scatter_add_": one("index", "scatter_add_"), "aten.scatter_reduce": one("index", "scatter_reduce"),
    "aten.index_put_": one("index", "index_put_"), "aten._index_put_impl_": one("index", "index_put_"),
    "aten.index_add_": one("index", "index_add_"), "aten.index_add": one("index", "index_add"),
    "aten.embedding": one("index", "embedding (index_select)"),
    "aten.embedding_dense_backward": low("index", "embedding backward sorts the indices (cub) before accumulating", 4),
    "aten.masked_select": low("index", "masked_select: nonzero scan, host sync, then gather", 3),
    "aten.cat": one("copy", "cat"), "aten.stack": one("copy", "stack"),
    # matmul, convolution, attention
    "aten.mm": matmul, "aten.bmm": matmul, "aten.mv": matmul, "aten.dot": matmul,
    "aten.addmm": addmm, "aten.baddbmm": matmul, "aten.addmv": matmul, "aten._addmm_activation": matmul,
    "aten.convolution": low("conv", "cuDNN picks the algorithm (and layout transposes) at run time"),
    "aten.convolution_backward": low("conv", "cuDNN backward: data and weight gradients, maybe a bias reduce", 2),
    "aten.scaled_dot_product_attention": sdpa,
    "aten._scaled_dot_product_flash_attention_for_cpu": sdpa,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": sdpa_backward,
    # the CUDA backends themselves (seen when a real GPU run is captured)
    "aten._scaled_dot_product_cudnn_attention": sdpa, "aten._scaled_dot_product_flash_attention": sdpa,
    "aten._scaled_dot_product_efficient_attention": sdpa,
    "aten._scaled_dot_product_cudnn_attention_backward": sdpa_backward,
    "aten._scaled_dot_product_flash_attention_backward": sdpa_backward,
    "aten._scaled_dot_product_efficient_attention_backward": sdpa_backward,
    "aten.cudnn_batch_norm": low("reduction", "cuDNN batch norm", 1),
    "aten.cudnn_batch_norm_backward": low("reduction", "cuDNN batch norm backward", 1),
}


def rule_for(op: OpRecord) -> tuple[Rule, str]:
    """The rule of an op and, when it is a guess, why."""
    rule = RULES.get(op.packet)
    if rule is not None:
        return rule, ""
    if op.is_view:
        return nothing, ""
    if _has_tag(op, torch.Tag.pointwise):
        return one("pointwise"), ""
    return low("other", ""), f"no rule for {op.packet}: assumed one kernel"


def _has_tag(op: OpRecord, tag) -> bool:
    try:
        namespace, name, overload = op.name.split(".")
        return tag in getattr(getattr(getattr(torch.ops, namespace), name), overload).tags
    except (AttributeError, ValueError):
        return False


def lower_eager(trace: OpTrace, ctx: Context | None = None) -> list[KernelSpec]:
    """The kernels eager PyTorch launches for the trace, in launch order."""
    ctx = ctx or Context()
    kernels: list[KernelSpec] = []
    for op in trace.ops:
        rule, why = rule_for(op)
        specs = rule(op, ctx)
        for spec in specs:
            if why:
                spec.reason = why
            spec.ops = [op.short]
        kernels.extend(specs)
    return kernels
