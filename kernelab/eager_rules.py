"""Lower an OpTrace to the kernels eager PyTorch launches on a CUDA device.

One rule a line in ``RULES``: an ATen op (``namespace.name``) maps to a function that returns the
kernels that op launches. Ops tagged ``pointwise`` by PyTorch need no line; views launch nothing.
An op with no rule is predicted as one kernel of category "other" at low confidence, with the
reason saying so. The rules were checked against kernels recorded on an H200 (tests/data/).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from .capture import OpRecord, OpTrace, TensorInfo
from .library_rules import (EMBEDDING_FEATURE_KERNEL_MAX_INDICES, Gemm, conv_nchw_fp32_transposes,
                            conv_runs_as_gemm, embedding_backward_fused, gemm_memset, gemm_split_k)

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
    share: int = 1  # the op's work is split over this many launches; this kernel does one share
    modules: list[str] = field(default_factory=list)  # nn.Module paths of the ops it covers, in order
    source: str = ""  # the user's source line of its (first) op
    backward: bool = False  # part of the backward pass

    @property
    def kind(self) -> str:
        return self.category if self.category in MEMOPS else "kernel"


@dataclass(frozen=True)
class Context:
    """What the prediction depends on beyond the trace: the GPU's architecture."""

    arch: tuple[int, int] = (9, 0)
    sms: int = 132


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


def sequence(categories: list[str], why: str) -> Rule:
    """A fixed series of library kernels (cub sorts, scans): the first carries the op's traffic."""
    def rule(op, ctx):
        if _empty(op):
            return []
        return _series(op, categories, why)
    return rule


def _series(op: OpRecord, categories: list[str], why: str) -> list[KernelSpec]:
    first = _kernel(op, categories[0], confidence="low", reason=why)
    rest = [_kernel(op, c, f"{op.short} ({c})", reads=[], writes=[], confidence="low", reason=why)
            for c in categories[1:]]
    return [first] + rest


def _last_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def global_reduce(outputs: int, per_output: int, inner: bool, vec: int, ctx: Context) -> bool:
    """Does ATen's reduce_kernel split each output over several blocks (ctas_per_output > 1)?

    Mirrors setReduceConfig in ATen's Reduce.cuh: a 512-thread block, x along the reduced dim
    when it is the innermost one, y split over the reduction only if each thread still sums 16
    values; then, if too few blocks fill the GPU, the reduction is cut across blocks. Such a
    reduction zero-initializes its semaphores with a memset.
    """
    if not inner:  # "vectorize along output": vec outputs per thread, 512 / vec threads a block
        vec = vec if outputs % vec == 0 else (2 if outputs % 2 == 0 and vec >= 2 else 1)
    max_threads = 512 if inner else 512 // vec
    dim0, dim1 = (per_output // vec, outputs) if inner else (outputs // vec, per_output)
    d0 = max_threads if dim0 >= max_threads else _last_pow2(dim0)
    d1 = max_threads if dim1 >= max_threads else _last_pow2(dim1)
    width = min(d0, 32)
    height = min(d1, max_threads // width)
    width = min(d0, max_threads // height)
    step_in, step_out = (width, 1) if inner else (1, width)
    values = -(-per_output // step_in)  # ATen counts the inputs undivided by the vector width
    split_y = values >= height * 16 or values >= 256
    if split_y:
        step_in *= height
    else:
        step_out *= height
    values = -(-per_output // step_in)  # ATen counts the inputs undivided by the vector width
    grid_x = -(-(outputs // (1 if inner else vec)) // step_out)
    target_grid = ctx.sms * (2048 // (width * height))
    if not (split_y and values >= 256 and grid_x < target_grid):
        return False
    ctas = max(min(-(-target_grid // grid_x), -(-values // 16)), -(-values // 256))
    return ctas > 1


def reduce_geometry(op: OpRecord) -> tuple[int, int, bool]:
    """(outputs, values reduced per output, whether the reduced dims are the innermost)."""
    src = op.inputs[0]
    outputs = max((t.numel for t in op.outputs), default=1) or 1
    per_output = max(src.numel // outputs, 1)
    dims = op.args.get("dim")
    if dims is None or dims == [] or outputs == 1:
        return outputs, per_output, True
    dims = [dims] if isinstance(dims, int) else list(dims)
    rank = len(src.shape)
    dims = sorted(d % rank for d in dims)
    return outputs, per_output, dims == list(range(rank - len(dims), rank))


def reduction(op, ctx):
    """ATen's reduce_kernel: one kernel, plus a memset when the reduction spans several blocks."""
    if _empty(op):
        return []
    src = op.inputs[0] if op.inputs else None
    kernel = _kernel(op, "reduction", flops=src.numel if src else 0)
    if src is None or not op.outputs:
        return [kernel]
    outputs, per_output, inner = reduce_geometry(op)
    vec = 4 if src.is_contiguous else 1
    if global_reduce(outputs, per_output, inner, vec, ctx):
        return [_kernel(op, "memset", "memset (reduction semaphores)", reads=[], writes=[]), kernel]
    return [kernel]


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
    out = op.written[0]  # the returned product, or the ``out=`` buffer it is written into
    a = op.args.get("mat1") or op.args.get("self") or op.args.get("batch1")
    k = a.shape[-1] if isinstance(a, TensorInfo) and a.shape else 1
    return 2.0 * out.numel * k


def _gemm_shape(op: OpRecord) -> Gemm | None:
    """The cuBLAS problem of a mm/addmm/bmm/baddbmm call (None for mv/dot and odd shapes)."""
    out = op.written[0]
    a = op.args.get("mat1") or op.args.get("batch1") or op.args.get("self")
    if not isinstance(a, TensorInfo) or len(out.shape) not in (2, 3) or len(a.shape) != len(out.shape):
        return None
    batch = out.shape[0] if len(out.shape) == 3 else 1
    if out.dtype in ("float16", "bfloat16"):
        precision = "half"
    elif out.dtype == "float32":
        precision = "tf32" if op.args.get("allow_tf32") else "fp32"
    else:
        return None
    return Gemm(batch, out.shape[-2], out.shape[-1], a.shape[-1], precision)


def _gemm_kernels(op: OpRecord, ctx: Context, name: str, reads=None) -> list[KernelSpec]:
    """The GEMM, with the workspace memset or split-K reduce cuBLAS adds (library_rules)."""
    kw = {} if reads is None else {"reads": reads}
    gemm = _kernel(op, "matmul", name, flops=_gemm_flops(op), **kw)
    shape = _gemm_shape(op)
    if shape is None:
        return [gemm]
    if shape.precision == "fp32" and gemm_split_k(shape):
        gemm.confidence, gemm.reason = "low", "full-precision fp32 cuBLAS: split-K choices vary by shape"
    if gemm_memset(shape, ctx.sms):
        why = "cuBLAS persistent kernel over more than two waves of tiles zeroes a workspace first"
        return [_kernel(op, "memset", "memset (cuBLAS workspace)", reads=[], writes=[], reason=why), gemm]
    if gemm_split_k(shape):
        why = "few output tiles and a long K: cuBLAS splits K and reduces the partial products"
        reduce = _kernel(op, "matmul", "splitKreduce (cuBLAS)", reads=[], writes=[], confidence=gemm.confidence,
                         reason=why)
        return [gemm, reduce]
    return [gemm]


def matmul(op, ctx):
    """cuBLAS: one GEMM kernel, plus a workspace memset or a split-K reduce where cuBLAS adds one."""
    if _empty(op):
        return []
    return _gemm_kernels(op, ctx, "gemm (cuBLAS)")


def addmm(op, ctx):
    """A 1-D bias is fused into the GEMM's epilogue by cuBLASLt; any other bias is first copied
    into the output (a copy kernel), then the GEMM accumulates onto it (beta=1)."""
    if _empty(op):
        return []
    bias = op.args["self"]
    out = op.written[0]  # the result, or the ``out=`` tensor (the compiler's padded products)
    fusable = len(bias.shape) == 1 and bias.is_contiguous and op.args.get("beta", 1) == 1
    if fusable:
        return _gemm_kernels(op, ctx, "gemm+bias (cuBLASLt)")
    copy = _kernel(op, "copy", "copy bias into output", reads=[bias], writes=[out])
    reads = [t for t in op.inputs if t.region != bias.region] + [out]
    return [copy] + _gemm_kernels(op, ctx, "gemm (cuBLAS)", reads=reads)


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
    kernel = _kernel(op, "attention", f"attention forward ({backend})", flops=flops)
    if backend == "cudnn":  # cuDNN's frontend zero-fills a small workspace first
        return [_kernel(op, "memset", "memset (cuDNN workspace)", reads=[], writes=[]), kernel]
    return [kernel]


def sdpa_backward(op, ctx):
    """cuDNN: zero the dQ accumulator (memset), dO.O row sums, the backward kernel, dQ cast to 16 bits;
    with fewer key/value heads than query heads (GQA) two more kernels sum dK and dV over each group.
    Flash and efficient backends: one kernel at low confidence."""
    q, k = op.args.get("query"), op.args.get("key")
    if not isinstance(q, TensorInfo):
        q = op.inputs[1] if len(op.inputs) > 1 else op.inputs[0]
    backend = _sdpa_backend(q, ctx)
    if backend != "cudnn":
        return [_kernel(op, "attention", f"attention backward ({backend})", confidence="low",
                        reason=f"{backend} backward may add preprocessing kernels and memsets")]
    why = "cuDNN SDPA backward (recorded on the H200)"
    helper = dict(reads=[], writes=[], reason=why)
    specs = [_kernel(op, "memset", "memset (cuDNN dQ accumulator)", **helper),
             _kernel(op, "other", "dO.O row sums (cuDNN)", **helper),
             _kernel(op, "attention", "attention backward (cudnn)", flops=2.5 * _sdpa_flops(
                 q, k if isinstance(k, TensorInfo) else q, bool(op.args.get("is_causal", False)))),
             _kernel(op, "other", "dQ to 16 bits (cuDNN)", **helper)]
    if isinstance(k, TensorInfo) and len(k.shape) >= 3 and k.shape[-3] < q.shape[-3]:
        specs += [_kernel(op, "attention", f"sum {name} over query-head groups (cuDNN)", **helper)
                  for name in ("dK", "dV")]
    return specs


def batch_norm(op, ctx):
    """Eval: one elementwise kernel with the running statistics. Train (``native_batch_norm``,
    which a CPU trace of eager ``F.batch_norm`` records where a GPU runs ``cudnn_batch_norm``):
    cuDNN's one kernel."""
    if not op.args.get("training", True):
        return [_kernel(op, "pointwise", "batch_norm (eval)")]
    return [_kernel(op, "reduction", "batch_norm (train, cuDNN single read)", confidence="low",
                    reason="cuDNN picks single-read or two-pass statistics by size")]


def native_batch_norm_legit(op, ctx):
    """``_native_batch_norm_legit`` (called directly by compiled graphs, never by eager
    ``F.batch_norm``), training: ATen's own CUDA kernels (``batch_norm_cuda_out``): the statistics
    (``batch_norm_collect_statistics_kernel``, one block per channel, reading x), the running
    statistics' update with the inverse std (``batch_norm_update_stats_and_invert``, or the inverse
    std alone without running statistics: a kernel over C values), and the transform (reading x,
    writing y). The H200 profile of ResNet-50's compiled step shows the first and the last once per
    norm (``results/zoo_profile_resnet_bn_backward_stop27_h200.txt``)."""
    if not op.args.get("training", True):
        return [_kernel(op, "pointwise", "batch_norm (eval)")]
    x, out = op.inputs[0], op.outputs[0]
    small = [t for t in op.written if t is not out]
    return [_kernel(op, "reduction", "batch_norm statistics", reads=[x], writes=op.outputs[1:3]),
            _kernel(op, "pointwise", "batch_norm running statistics and inverse std", reads=op.outputs[1:3],
                    writes=small),
            _kernel(op, "pointwise", "batch_norm transform", reads=[x] + list(op.outputs[1:3]) + list(op.inputs[1:3]),
                    writes=[out])]


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
    """cub: count (two reduction kernels), copy the count to the host (a sync), then select."""
    return _series(op, ["reduction", "reduction", "memcpy", "index", "index"],
                   "nonzero counts on the device and syncs the host for the output size")


def has_bool_index(op: OpRecord) -> bool:
    indices = op.args.get("indices") or []
    return any(isinstance(t, TensorInfo) and t.dtype == "bool" for t in indices)


def index(op, ctx):
    """Advanced indexing; a boolean mask is first turned into positions by nonzero."""
    if _empty(op):
        return []
    gather = _kernel(op, "index", "index (gather)")
    if has_bool_index(op):
        return nonzero(op, ctx) + [gather]
    return [gather]


def masked_out_of_place(op, ctx):
    """Out-of-place masked_fill/index_put: clone (a memcpy), then the in-place kernel."""
    if _empty(op):
        return []
    src, out = op.inputs[0], op.outputs[0]
    return _memcpy_or_copy(op, src, out) + [_kernel(op, "pointwise", f"{op.short}_")]


def cumsum(op, ctx):
    """A scan over a whole 1-D tensor goes to cub (init + scan); along a dim, one ATen scan kernel."""
    if _empty(op):
        return []
    src = op.inputs[0]
    dim = op.args.get("dim", 0)
    if len(src.shape) <= 1 or src.numel == src.shape[dim]:
        return [_kernel(op, "scan", "cub scan init", reads=[], writes=[]), _kernel(op, "scan", "cub scan")]
    return [_kernel(op, "scan")]


def sort(op, ctx):
    """Rows up to 4096: copy keys (memcpy), arange indices (fill + copy), then one in-place sort."""
    if _empty(op):
        return []
    src = op.inputs[0]
    dim = op.args.get("dim", -1)
    if src.shape and src.shape[dim] <= 4096 and src.is_contiguous:
        return _series(op, ["memcpy", "fill", "copy", "memcpy", "sort"], "small-row sort path (sortKeyValueInplace)")
    return low("sort", "long rows: cub segmented radix sort, several passes")(op, ctx)


def _multiblock_topk(slices: int, size: int) -> bool:
    """ATen's choice between single-block and multi-block radix select (TensorTopK.cu)."""
    return ((slices <= 20 and size >= 20000) or (20 < slices <= 40 and size >= 10000)
            or (40 < slices <= 80 and size >= 8000) or (80 < slices < 200 and size >= 5000)
            or (200 <= slices < 800 and size >= 3000) or (800 <= slices <= 4000 and size >= 800)
            or (slices > 4000 and size >= 400))


def topk(op, ctx):
    """Radix select over the key bits (8 per pass), gather, then a bitonic sort if sorted=True."""
    if _empty(op):
        return []
    src = op.inputs[0]
    dim = op.args.get("dim", -1)
    size = src.shape[dim] if src.shape else 1
    slices = src.numel // max(size, 1)
    k = op.args.get("k", 1)
    tail = ["sort"] if op.args.get("sorted", True) and k > 1 else []
    if not _multiblock_topk(slices, size):
        return _series(op, ["sort"] + tail, "single-block radix select")
    passes = src.itemsize  # one 8-bit digit per byte of the key
    body = ["sort", "sort", "sort"] * passes + ["sort", "scan", "scan", "scan", "scan", "sort"]
    return _series(op, ["fill", "memset", "memset"] + body + tail, "multi-block radix select (mbtopk)")


def embedding_backward(op, ctx):
    """ATen's CUDA embedding backward (library_rules): up to 3072 indices, zero the gradient and run
    one feature kernel; more, arange + cub radix sort of the indices (one 8-bit pass per key byte),
    zero the gradient, find segments (unique + scan), then either per-segment partial sums and a
    sum-and-scatter pass, or one fused atomic pass (through a float32 buffer for 16-bit grads)."""
    if _empty(op):
        return []
    indices, grad = op.args.get("indices"), op.args.get("grad_output") or op.inputs[0]
    n = indices.numel if isinstance(indices, TensorInfo) else grad.numel // max(grad.shape[-1], 1)
    if n <= EMBEDDING_FEATURE_KERNEL_MAX_INDICES and not op.args.get("scale_grad_by_freq"):
        return _series(op, ["fill", "index"], "few indices: one feature kernel (embedding_backward_feature_kernel)")
    passes = indices.itemsize if isinstance(indices, TensorInfo) else 8
    cats = ["fill", "memset", "memset", "sort", "sort"] + ["memset", "sort"] * passes + [
        "fill", "index", "index", "index", "scan", "scan", "index", "index"]
    width = grad.shape[-1] if grad.shape else 1
    if embedding_backward_fused(n, int(op.args.get("num_weights", n)), width, ctx.sms):
        half = grad.dtype in ("float16", "bfloat16")
        cats += ["index"] + (["fill", "index", "copy"] if half else ["index"])
        why = "sorted indices, then one fused atomic accumulation (few segments)"
    else:
        cats += ["index", "index"]
        why = "sorted indices, per-segment partial sums, then sum and scatter"
    return _series(op, cats, why)


def _conv_geometry(op: OpRecord):
    w = op.args.get("weight")
    kernel = tuple(w.shape[2:]) if isinstance(w, TensorInfo) else ()
    stride = tuple(op.args.get("stride") or (1,) * len(kernel))
    padding = tuple(op.args.get("padding") or (0,) * len(kernel))
    return w, kernel, stride, padding, int(op.args.get("groups", 1))


def _conv_gemm(op, ctx, name: str, m: int, n: int, k: int, dtype: str) -> list[KernelSpec]:
    """A 1x1 convolution's product, with the workspace memset / split-K reduce cuBLAS adds."""
    precision = "half" if dtype in ("float16", "bfloat16") else "tf32"  # cuDNN convs allow TF32
    shape = Gemm(1, m, n, k, precision)
    gemm = _kernel(op, "matmul", name)
    if gemm_memset(shape, ctx.sms):
        return [_kernel(op, "memset", "memset (cuBLAS workspace)", reads=[], writes=[]), gemm]
    if gemm_split_k(shape):
        return [gemm, _kernel(op, "matmul", "splitKreduce (cuBLAS)", reads=[], writes=[])]
    return [gemm]


def convolution(op, ctx):
    """cuDNN (library_rules): a 1x1 stride-1 convolution is a cuBLAS GEMM; float32 depthwise runs
    ATen's own kernel; NCHW float32 input and weight are transposed to NHWC first (two copies) for
    all but small channel counts; a bias is added by a separate elementwise kernel."""
    if _empty(op):
        return []
    x, out = op.args.get("input"), op.outputs[0]
    w, kernel, stride, padding, groups = _conv_geometry(op)
    if not isinstance(x, TensorInfo) or w is None or len(x.shape) != 4:
        return _series(op, ["conv"], "cuDNN picks the algorithm and layout transposes at run time")
    cin, cout = x.shape[1], w.shape[0]
    depthwise = groups > 1 and groups == cin
    has_bias = isinstance(op.args.get("bias"), TensorInfo)
    if conv_runs_as_gemm(kernel, stride, padding, groups):
        pixels = x.numel // max(cin, 1)
        specs = _conv_gemm(op, ctx, "1x1 conv as GEMM (cuBLAS)", pixels, cout, cin, x.dtype)
    elif depthwise and x.dtype == "float32":
        return [_kernel(op, "conv", "depthwise conv (ATen)")]
    elif x.is_contiguous and x.dtype == "float32" and conv_nchw_fp32_transposes(cin, cout):
        specs = _series(op, ["copy", "copy", "conv"], "cuDNN transposes NCHW float32 to NHWC")
    else:
        specs = [_kernel(op, "conv", "conv (cuDNN)", confidence="low",
                         reason="cuDNN picks the algorithm and layout transposes at run time")]
    if has_bias:
        specs.append(_kernel(op, "pointwise", "add bias", reads=[out], writes=[out]))
    return specs


def convolution_backward(op, ctx):
    """A non-contiguous dy is copied first; then the data gradient and the weight gradient (cuBLAS
    GEMMs for 1x1 convolutions, cuDNN kernels otherwise), then the bias gradient's reduction."""
    if _empty(op):
        return []
    dy, x = op.args.get("grad_output"), op.args.get("input")
    w, kernel, stride, padding, groups = _conv_geometry(op)
    mask = list(op.args.get("output_mask") or (True, True, True))
    specs = []
    if isinstance(dy, TensorInfo) and not (dy.is_contiguous or _channels_last(dy)):
        specs.append(_kernel(op, "copy", "dy made contiguous", reads=[dy], writes=[]))
    as_gemm = isinstance(x, TensorInfo) and len(x.shape) == 4 and conv_runs_as_gemm(kernel, stride, padding, groups)
    if as_gemm:
        cin, cout, pixels = x.shape[1], w.shape[0], x.numel // max(x.shape[1], 1)
        if mask[0]:
            specs += _conv_gemm(op, ctx, "dgrad GEMM (cuBLAS)", pixels, cin, cout, x.dtype)
        if mask[1]:
            specs += _conv_gemm(op, ctx, "wgrad GEMM (cuBLAS)", cout, cin, pixels, x.dtype)
    else:
        why = "cuDNN picks the data/weight gradient algorithms (and their helpers) at run time"
        specs += [_kernel(op, "conv", name, confidence="low", reason=why)
                  for name, wanted in (("dgrad (cuDNN)", mask[0]), ("wgrad (cuDNN)", mask[1])) if wanted]
    if len(mask) > 2 and mask[2]:
        specs.append(_kernel(op, "reduction", "bias gradient (sum over N, H, W)"))
    return specs


def _channels_last(t: TensorInfo) -> bool:
    """Dense NHWC: strides (H*W*C, 1, W*C, C)."""
    if len(t.shape) != 4:
        return False
    n, c, h, w = t.shape
    return tuple(t.stride) == (h * w * c, 1, w * c, c)


def slice_backward(op, ctx):
    """select/slice backward: a zero-filled gradient of the input's size, then the slice copied in."""
    if _empty(op):
        return []
    grad, out = op.inputs[0], op.outputs[0]
    return [_kernel(op, "fill", "zeros", reads=[], writes=[out]),
            _kernel(op, "copy", "copy into the slice", reads=[grad], writes=[])]


def mse_loss(op, ctx):
    """Squared differences elementwise, then a mean/sum reduction (reduction=1|2)."""
    if _empty(op):
        return []
    squared = _kernel(op, "pointwise", "mse (x - y)^2")
    if op.args.get("reduction", 1) == 0:
        return [squared]
    n = op.inputs[0].numel
    memset = [_kernel(op, "memset", "memset (reduction semaphores)", reads=[], writes=[])] if global_reduce(
        1, n, True, 4, ctx) else []
    return [squared] + memset + [_kernel(op, "reduction", "mean", reads=[], writes=[])]


def mse_loss_backward(op, ctx):
    return [_kernel(op, "fill", "zero grad_input", reads=[], writes=[]), _kernel(op, "pointwise", "mse backward")]


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
    "aten.arange": one("fill", "arange"), "aten.linspace": one("fill", "linspace"),
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
    "aten._native_batch_norm_legit": native_batch_norm_legit,
    "aten._native_batch_norm_legit_functional": native_batch_norm_legit,
    "aten.native_batch_norm": batch_norm,
    # one kernel: cuDNN's (eager on a GPU) and ATen's fused reduction and elementwise kernel
    # (compiled graphs; NCHW, input gradient wanted: ``batch_norm_backward_cuda``)
    "aten.native_batch_norm_backward": low("reduction", "batch_norm backward", 1),
    "aten.native_group_norm": low("reduction", "group_norm: statistics then normalize", 2),
    # scans and sorts
    "aten.cumsum": cumsum, "aten.cumprod": cumsum,
    "aten.logcumsumexp": one("scan", "logcumsumexp"),
    "aten.sort": sort, "aten.topk": topk,
    "aten.nonzero": nonzero,
    # indexing
    "aten.index": index, "aten.index_select": one("index", "index_select"),
    "aten.gather": one("index", "gather"), "aten.scatter": one("index", "scatter"),
    "aten.scatter_": one("index", "scatter_"), "aten.scatter_add": one("index", "scatter_add"),
    "aten.scatter_add_": one("index", "scatter_add_"), "aten.scatter_reduce": one("index", "scatter_reduce"),
    "aten.index_put_": one("index", "index_put_"), "aten._index_put_impl_": one("index", "index_put_"),
    "aten.index_add_": one("index", "index_add_"), "aten.index_add": one("index", "index_add"),
    "aten.embedding": one("index", "embedding (index_select)"),
    "aten.embedding_dense_backward": embedding_backward,
    "aten.masked_fill": masked_out_of_place, "aten.index_put": masked_out_of_place,
    "aten.mse_loss": mse_loss, "aten.mse_loss_backward": mse_loss_backward,
    "aten.masked_select": low("index", "masked_select: nonzero scan, host sync, then gather", 3),
    "aten.cat": one("copy", "cat"), "aten.stack": one("copy", "stack"),
    # matmul, convolution, attention
    "aten.mm": matmul, "aten.bmm": matmul, "aten.mv": matmul, "aten.dot": matmul,
    "aten.addmm": addmm, "aten.baddbmm": matmul, "aten.addmv": matmul, "aten._addmm_activation": matmul,
    "aten._grouped_mm": sequence(["matmul", "matmul"], "grouped GEMM: a kernel preparing the per-group "
                                 "problem descriptors, then the CUTLASS grouped GEMM"),
    "aten.convolution": convolution,
    "aten.convolution_backward": convolution_backward,
    "aten.slice_backward": slice_backward, "aten.select_backward": slice_backward,
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


# TensorIterator indexes with 32-bit offsets: an operand spanning more bytes than this is cut in
# halves (recursively) and each piece is its own launch.
INT32_MAX = 2**31 - 1
TENSOR_ITERATOR = ("pointwise", "fill", "copy")


def _span_bytes(t: TensorInfo) -> int:
    """1 + the largest byte offset a tensor reaches from its first element."""
    return (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride) if size > 0)) * t.itemsize


def int32_pieces(spec: KernelSpec) -> int:
    """How many launches TensorIterator needs for 32-bit indexing (a power of two)."""
    span = max((_span_bytes(t) for t in spec.reads + spec.writes), default=0)
    pieces = 1
    while span > INT32_MAX:
        span = (span + 1) // 2
        pieces *= 2
    return pieces


def _split_for_int32(spec: KernelSpec) -> list[KernelSpec]:
    if spec.category not in TENSOR_ITERATOR:
        return [spec]
    pieces = int32_pieces(spec)
    if pieces == 1:
        return [spec]
    why = f"tensors span over 2^31 bytes: TensorIterator launches {pieces} pieces with 32-bit indexing"
    return [dataclasses.replace(spec, share=pieces, reason=why, flops=spec.flops / pieces) for _ in range(pieces)]


def lower_eager(trace: OpTrace, ctx: Context | None = None) -> list[KernelSpec]:
    """The kernels eager PyTorch launches for the trace, in launch order."""
    ctx = ctx or Context()
    kernels: list[KernelSpec] = []
    for op in trace.ops:
        rule, why = rule_for(op)
        for spec in rule(op, ctx):
            if why:
                spec.reason = why
            spec.ops = [op.short]
            spec.modules = [op.module] if op.module is not None else []
            spec.source, spec.backward = op.source, op.backward
            kernels.extend(_split_for_int32(spec))
    return kernels
