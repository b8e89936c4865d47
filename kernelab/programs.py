"""Built-in example programs: the functions kernelab counts, measures and records ground truth for.

Each program is a plain function or an nn.Module plus a deterministic argument factory. Targets and
arguments are built on the CPU, with sizes large enough to be realistic kernels (1M elements,
4096x1024 matrices) but small enough to build in well under a second. Nothing is built at import:
``all_programs()`` makes the table, ``make_target()`` / ``make_args()`` make the tensors.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Program", "all_programs", "get_program"]


@dataclass(frozen=True)
class Program:
    name: str                                  # snake_case, unique
    description: str                           # one line
    make_target: Callable[[], Any]             # a function or an nn.Module (built on CPU)
    make_args: Callable[[], tuple]             # CPU tensors, deterministic, never all zeros


# ----------------------------------------------------------------------------- argument helpers

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=torch.float32, scale=1.0, requires_grad=False):
    x = (torch.randn(*shape, generator=g) * scale).to(dtype)
    return x.requires_grad_(requires_grad)


def _randint(g, high, *shape):
    return torch.randint(0, high, shape, generator=g)


def _init_module(module: nn.Module, seed: int) -> nn.Module:
    """Deterministic parameters (fan-in scaled normal), biases small, BN statistics realistic."""
    g = _gen(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            fan_in = p[0].numel() if p.dim() > 1 else 1
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif p.dim() == 1:  # norm weights near 1
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return module


# ----------------------------------------------------------------------------- pointwise

def add_relu(a, b):
    return (a + b).relu()


def gelu_affine(x, w, b):
    return F.gelu(x * w + b)


def silu_gate(x, gate):
    return F.silu(gate) * x


def sigmoid_tanh(x, y):
    return torch.sigmoid(x) * torch.tanh(y)


def outer_add(col, row):
    # (4096, 1) + (1024,) broadcasts to a (4096, 1024) output
    return col + row


def transposed_add(xt, y):
    # xt is a transposed (column-major) view: one operand read with stride 4096
    return xt + y


def strided_scale(x_every_2nd):
    # the input is a view taking every 2nd column: a non-contiguous, non-dense operand
    return x_every_2nd * 2.0 + 1.0


def inplace_chain(x):
    return x.add_(1.0).mul_(2.0).relu_()


def where_leaky(x, y):
    return torch.where(x > 0, x, 0.1 * y)


def factories(x):
    n = x.shape[0]
    pos = torch.arange(n, device=x.device, dtype=x.dtype)
    ones = torch.ones(n, device=x.device, dtype=x.dtype)
    half = torch.full((n,), 0.5, device=x.device, dtype=x.dtype)
    acc = torch.zeros(n, device=x.device, dtype=x.dtype)
    buf = torch.empty(n, device=x.device, dtype=x.dtype)
    buf.copy_(x)
    acc += buf * pos
    return acc + ones * half


def rms_norm_manual(x, w):
    # x * rsqrt(mean(x^2) + eps) * w written op by op: a row reduction plus pointwise ops
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * w


# ----------------------------------------------------------------------------- reductions

def sum_all(x):
    return x.sum()


def row_mean(x):
    return x.mean(dim=1)


def col_amax(x):
    return x.amax(dim=0)


def row_var(x):
    return x.var(dim=-1)


def vector_norm(x):
    return torch.linalg.vector_norm(x, dim=-1)


def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def layer_norm_backward(x, w, b, grad_out):
    out = F.layer_norm(x, (x.shape[-1],), w, b)
    out.backward(grad_out)
    return out.detach()


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def cross_entropy_backward(logits, target):
    loss = F.cross_entropy(logits, target)
    loss.backward()
    return loss.detach()


# ----------------------------------------------------------------------------- index, scan, sort

def index_select_rows(x, idx):
    return torch.index_select(x, 0, idx)


def gather_cols(x, idx):
    return torch.gather(x, 1, idx)


def scatter_add_bins(values, bins):
    out = torch.zeros(1024, device=values.device, dtype=values.dtype)
    return out.scatter_add_(0, bins, values)


def masked_fill_causal(scores, keep):
    return scores.masked_fill(~keep, float("-inf"))


def boolean_mask(x):
    return x[x > 0]


def embedding(idx, weight):
    return F.embedding(idx, weight)


def embedding_backward(idx, weight, grad_out):
    out = F.embedding(idx, weight)
    out.backward(grad_out)
    return out.detach()


def cumsum_rows(x):
    return x.cumsum(dim=-1)


def cumsum_flat(x):
    return x.cumsum(dim=0)


def sort_rows(x):
    return torch.sort(x, dim=-1)


def topk_rows(x):
    return torch.topk(x, 16, dim=-1)


# ----------------------------------------------------------------------------- layout and dtype

def cat_three(a, b, c):
    return torch.cat([a, b, c], dim=1)


def stack_pair(a, b):
    return torch.stack([a, b], dim=0)


def half_roundtrip(x):
    return x.half().float()


def to_bf16(x):
    return x.to(torch.bfloat16)


def clone(x):
    return x.clone()


def transpose_contiguous(x):
    return x.t().contiguous()


# ----------------------------------------------------------------------------- matmul, attention

def matmul(a, b):
    return a @ b


def linear_bias(x, w, b):
    return F.linear(x, w, b)


def addmm_relu(bias, x, w):
    return torch.addmm(bias, x, w).relu()


def bmm_bf16(a, b):
    return torch.bmm(a, b)


def autocast_linear_gelu(x, w, b):
    # mixed precision: float32 inputs, the matmul runs in bf16 under autocast, result back in fp32
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        y = F.gelu(F.linear(x, w, b))
    return y.float()


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def attention_manual(q, k, v):
    # softmax(q k^T / sqrt(d)) v, op by op: the (S x S) scores round-trip through memory
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


# ----------------------------------------------------------------------------- modules

class ConvBnRelu(nn.Module):
    def __init__(self, channels: int = 64):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class MLPTrainStep(nn.Module):
    """Two-layer MLP; forward computes an MSE loss and runs backward (parameters get .grad)."""

    def __init__(self, dim: int = 1024, hidden: int = 4096):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x, y):
        loss = F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)
        loss.backward()
        return loss.detach()


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln1(x)); x + mlp(ln2(x)); attention through SDPA (causal)."""

    def __init__(self, dim: int = 512, heads: int = 8):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, s, head_dim)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _conv_bn_relu_eval() -> nn.Module:
    return _init_module(ConvBnRelu(), 11).eval()


def _conv_bn_relu_train() -> nn.Module:
    return _init_module(ConvBnRelu(), 12).train()


def _mlp_train_step() -> nn.Module:
    return _init_module(MLPTrainStep(), 13)


def _transformer_block_bf16() -> nn.Module:
    return _init_module(TransformerBlock(), 14).to(torch.bfloat16)


# ----------------------------------------------------------------------------- the table

M, N = 4096, 1024          # the standard matrix: 4M float32 elements, 16 MB
VEC = 1_000_000            # the tutorial's vector length


def _fn(fn: Callable) -> Callable[[], Callable]:
    return lambda: fn


def _args_table() -> dict[str, tuple[str, Callable[[], Any], Callable[[torch.Generator], tuple]]]:
    """name -> (description, make_target, make_args(generator))."""
    r = _randn
    return {
        "add_relu": ("(a + b).relu() on two 1M float32 vectors: the tutorial's two kernels",
                     _fn(add_relu), lambda g: (r(g, VEC), r(g, VEC))),
        "gelu_affine": ("gelu(x * w + b), (4096, 1024) with per-column w and b",
                        _fn(gelu_affine), lambda g: (r(g, M, N), r(g, N), r(g, N, scale=0.1))),
        "silu_gate": ("silu(gate) * x, the SwiGLU gate, (4096, 1024)",
                      _fn(silu_gate), lambda g: (r(g, M, N), r(g, M, N))),
        "sigmoid_tanh": ("sigmoid(x) * tanh(y), (4096, 1024)",
                         _fn(sigmoid_tanh), lambda g: (r(g, M, N), r(g, M, N))),
        "outer_add": ("column (4096, 1) + row (1024,) broadcast to (4096, 1024)",
                      _fn(outer_add), lambda g: (r(g, M, 1), r(g, N))),
        "transposed_add": ("x.t() + y with x stored (1024, 4096): a column-major operand",
                           _fn(transposed_add), lambda g: (r(g, N, M).t(), r(g, M, N))),
        "strided_scale": ("x[:, ::2] * 2 + 1 on a non-contiguous (4096, 512) view",
                          _fn(strided_scale), lambda g: (r(g, M, N)[:, ::2],)),
        "inplace_chain": ("x.add_(1).mul_(2).relu_() in place on (4096, 1024)",
                          _fn(inplace_chain), lambda g: (r(g, M, N),)),
        "where_leaky": ("torch.where(x > 0, x, 0.1 * y), (4096, 1024)",
                        _fn(where_leaky), lambda g: (r(g, M, N), r(g, M, N))),
        "factories": ("arange/ones/full/zeros/empty made inside the function, then combined (1M)",
                      _fn(factories), lambda g: (r(g, VEC),)),
        "rms_norm_manual": ("x * rsqrt(mean(x^2) + eps) * w written op by op, (4096, 1024)",
                            _fn(rms_norm_manual), lambda g: (r(g, M, N), 1 + 0.1 * r(g, N))),
        "sum_all": ("x.sum() over 4M float32 elements", _fn(sum_all), lambda g: (r(g, M, N),)),
        "row_mean": ("x.mean(dim=1), (4096, 1024) -> 4096", _fn(row_mean), lambda g: (r(g, M, N),)),
        "col_amax": ("x.amax(dim=0), (4096, 1024) -> 1024", _fn(col_amax), lambda g: (r(g, M, N),)),
        "row_var": ("x.var(dim=-1), (4096, 1024)", _fn(row_var), lambda g: (r(g, M, N),)),
        "vector_norm": ("torch.linalg.vector_norm(x, dim=-1), (4096, 1024)",
                        _fn(vector_norm), lambda g: (r(g, M, N),)),
        "softmax": ("softmax(x, dim=-1), (4096, 1024)", _fn(softmax), lambda g: (r(g, M, N),)),
        "log_softmax": ("log_softmax(x, dim=-1), (512, 8192)",
                        _fn(log_softmax), lambda g: (r(g, 512, 8192),)),
        "layer_norm": ("F.layer_norm over the last dim, (4096, 1024), affine",
                       _fn(layer_norm), lambda g: (r(g, M, N), 1 + 0.1 * r(g, N), 0.1 * r(g, N))),
        "layer_norm_backward": ("layer_norm forward + backward: grads of x, weight and bias",
                                _fn(layer_norm_backward),
                                lambda g: (r(g, M, N, requires_grad=True),
                                           (1 + 0.1 * r(g, N)).requires_grad_(),
                                           (0.1 * r(g, N)).requires_grad_(), r(g, M, N))),
        "cross_entropy": ("F.cross_entropy, (1024, 4096) logits, int64 targets",
                          _fn(cross_entropy), lambda g: (r(g, 1024, 4096), _randint(g, 4096, 1024))),
        "cross_entropy_backward": ("F.cross_entropy then loss.backward(): grad of the logits",
                                   _fn(cross_entropy_backward),
                                   lambda g: (r(g, 1024, 4096, requires_grad=True),
                                              _randint(g, 4096, 1024))),
        "index_select_rows": ("index_select 2048 random rows of a (4096, 1024) matrix",
                              _fn(index_select_rows), lambda g: (r(g, M, N), _randint(g, M, 2048))),
        "gather_cols": ("torch.gather(x, 1, idx) picking 256 columns per row, (4096, 1024)",
                        _fn(gather_cols), lambda g: (r(g, M, N), _randint(g, N, M, 256))),
        "scatter_add_bins": ("zeros(1024).scatter_add_ of 1M values into random bins",
                             _fn(scatter_add_bins), lambda g: (r(g, VEC), _randint(g, 1024, VEC))),
        "masked_fill_causal": ("scores.masked_fill(~causal_mask, -inf), (8, 512, 512)",
                               _fn(masked_fill_causal),
                               lambda g: (r(g, 8, 512, 512),
                                          torch.ones(512, 512, dtype=torch.bool).tril())),
        "boolean_mask": ("x[x > 0]: data-dependent output size (a device-to-host sync)",
                         _fn(boolean_mask), lambda g: (r(g, VEC),)),
        "embedding": ("F.embedding of (8, 512) token ids into a (8192, 512) table",
                      _fn(embedding), lambda g: (_randint(g, 8192, 8, 512), r(g, 8192, 512))),
        "embedding_backward": ("embedding forward + backward into the table's grad",
                               _fn(embedding_backward),
                               lambda g: (_randint(g, 8192, 8, 512),
                                          r(g, 8192, 512, requires_grad=True), r(g, 8, 512, 512))),
        "cumsum_rows": ("x.cumsum(dim=-1), (4096, 1024)", _fn(cumsum_rows), lambda g: (r(g, M, N),)),
        "cumsum_flat": ("x.cumsum(0) over one 1M vector", _fn(cumsum_flat), lambda g: (r(g, VEC),)),
        "sort_rows": ("torch.sort along the last dim, (1024, 1024)",
                      _fn(sort_rows), lambda g: (r(g, 1024, 1024),)),
        "topk_rows": ("torch.topk(x, 16, dim=-1), (4096, 1024)",
                      _fn(topk_rows), lambda g: (r(g, M, N),)),
        "cat_three": ("torch.cat of three (4096, 256) blocks along dim 1",
                      _fn(cat_three), lambda g: (r(g, M, 256), r(g, M, 256), r(g, M, 256))),
        "stack_pair": ("torch.stack of two (4096, 1024) matrices",
                       _fn(stack_pair), lambda g: (r(g, M, N), r(g, M, N))),
        "half_roundtrip": ("x.half().float(): two casts, 4M elements",
                           _fn(half_roundtrip), lambda g: (r(g, M, N),)),
        "to_bf16": ("x.to(torch.bfloat16), 4M elements", _fn(to_bf16), lambda g: (r(g, M, N),)),
        "clone": ("x.clone(), 4M float32 elements", _fn(clone), lambda g: (r(g, M, N),)),
        "transpose_contiguous": ("x.t().contiguous(), (4096, 1024) -> (1024, 4096)",
                                 _fn(transpose_contiguous), lambda g: (r(g, M, N),)),
        "matmul_fp32": ("a @ b, (4096, 1024) x (1024, 1024) float32",
                        _fn(matmul), lambda g: (r(g, M, N), r(g, N, N, scale=N ** -0.5))),
        "linear_bias": ("F.linear(x, w, b), (4096, 1024) x (1024, 1024)^T + bias",
                        _fn(linear_bias),
                        lambda g: (r(g, M, N), r(g, N, N, scale=N ** -0.5), r(g, N, scale=0.02))),
        "addmm_relu": ("torch.addmm(bias, x, w).relu(), (4096, 1024) x (1024, 1024)",
                       _fn(addmm_relu),
                       lambda g: (r(g, N, scale=0.02), r(g, M, N), r(g, N, N, scale=N ** -0.5))),
        "bmm_bf16": ("torch.bmm in bf16, (16, 512, 64) x (16, 64, 512)",
                     _fn(bmm_bf16), lambda g: (r(g, 16, 512, 64, dtype=torch.bfloat16),
                                               r(g, 16, 64, 512, dtype=torch.bfloat16))),
        "autocast_linear_gelu": ("gelu(linear) under autocast(bf16) on float32 inputs, result .float()",
                                 _fn(autocast_linear_gelu),
                                 lambda g: (r(g, M, N), r(g, N, N, scale=N ** -0.5), r(g, N, scale=0.02))),
        "sdpa_bf16_causal_d64": ("causal SDPA in bf16, (4, 8, 512, 64)", _fn(sdpa_causal),
                                 lambda g: tuple(r(g, 4, 8, 512, 64, dtype=torch.bfloat16) for _ in range(3))),
        "sdpa_bf16_causal_d128": ("causal SDPA in bf16, (4, 8, 512, 128)", _fn(sdpa_causal),
                                  lambda g: tuple(r(g, 4, 8, 512, 128, dtype=torch.bfloat16) for _ in range(3))),
        "sdpa_fp32": ("non-causal SDPA in float32, (2, 8, 512, 64)", _fn(sdpa),
                      lambda g: tuple(r(g, 2, 8, 512, 64) for _ in range(3))),
        "attention_manual": ("softmax(q k^T / sqrt(d)) v op by op in bf16, (4, 8, 512, 64)",
                             _fn(attention_manual),
                             lambda g: tuple(r(g, 4, 8, 512, 64, dtype=torch.bfloat16) for _ in range(3))),
        "conv_bn_relu_eval": ("Conv2d(64, 64, 3) + BatchNorm2d + ReLU module in eval mode, (8, 64, 56, 56)",
                              _conv_bn_relu_eval, lambda g: (r(g, 8, 64, 56, 56),)),
        "conv_bn_relu_train": ("the same module in train mode (batch statistics, running-stat update)",
                               _conv_bn_relu_train, lambda g: (r(g, 8, 64, 56, 56),)),
        "mlp_backward": ("2-layer MLP 1024-4096-1024 + MSE loss + loss.backward() on (512, 1024)",
                         _mlp_train_step, lambda g: (r(g, 512, N), r(g, 512, N))),
        "transformer_block_bf16": ("pre-norm transformer block (dim 512, 8 heads, SDPA) forward, bf16, (4, 512, 512)",
                                   _transformer_block_bf16,
                                   lambda g: (r(g, 4, 512, 512, dtype=torch.bfloat16),)),
    }


def _seeded(make: Callable[[torch.Generator], tuple], seed: int) -> Callable[[], tuple]:
    return lambda: make(_gen(seed))


def all_programs() -> dict[str, Program]:
    """Every built-in program by name (a new dict each call; building it makes no tensors)."""
    programs = {}
    for name, (description, make_target, make_args) in _args_table().items():
        # the seed depends on the name only, so adding a program changes no other's arguments
        programs[name] = Program(name, description, make_target, _seeded(make_args, zlib.crc32(name.encode())))
    return programs


def get_program(name: str) -> Program:
    programs = all_programs()
    if name not in programs:
        raise ValueError(f"no built-in program named {name!r}; known: {', '.join(programs)}")
    return programs[name]


def __getattr__(name: str):
    # PROGRAMS is built on first access, not at import
    if name == "PROGRAMS":
        return all_programs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
