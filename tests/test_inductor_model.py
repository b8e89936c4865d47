"""The Inductor model on hand-written programs whose Inductor kernels are known."""
import math

import torch
import torch.nn.functional as F

import kernelab
from kernelab.inductor_model import num_splits


def _inductor(fn, *args):
    return kernelab.count(fn, *args, mode="inductor", predict=True)


def test_hand_written_softmax_is_one_reduction_kernel():
    def softmax(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    r = _inductor(softmax, torch.randn(4096, 1024))
    assert (r.num_kernels, r.categories) == (1, ["reduction"])
    assert r.transfers == 2.0  # read x once, write the result once


def test_hand_written_rms_norm_is_one_kernel_and_eager_is_many():
    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = torch.randn(2048, 4096), torch.randn(4096)
    assert _inductor(rms_norm, x, w).num_kernels == 1
    eager = kernelab.count(rms_norm, x, w, predict=True)
    assert eager.num_kernels == 6 and len(eager.round_trips) >= 4


def test_matmul_epilogue_stays_a_separate_kernel():
    r = _inductor(lambda a, b, bias: F.gelu(a @ b + bias), torch.randn(512, 256), torch.randn(256, 128),
                  torch.randn(128))
    assert r.categories == ["matmul", "pointwise"]


def test_unrelated_pointwise_ops_are_not_fused():
    r = _inductor(lambda a, b: (a.sin(), b.cos()), torch.randn(1000), torch.randn(1000))
    assert r.num_kernels == 2


def test_split_reduction_heuristic_follows_inductor():
    sms = 132
    assert num_splits(1, 4 * 1024 * 1024, True, sms) > 1  # x.sum() over 4M values
    assert num_splits(4096, 1024, True, sms) == 1  # row reductions: enough outputs
    assert num_splits(1024, 4096, False, sms) > 1  # column amax of (4096, 1024)
    assert num_splits(1, 4096, True, sms) == 1  # small: one block does it
    assert num_splits(100_000, 64, True, sms) == 1


def test_whole_tensor_sum_is_split_into_two_kernels():
    r = _inductor(lambda x: x.sum(), torch.randn(1 << 22))
    assert (r.num_kernels, r.categories) == (2, ["reduction", "reduction"])


def test_manual_attention_becomes_one_attention_call():
    def attention(q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(s, dim=-1) @ v

    q = torch.randn(2, 8, 256, 64, dtype=torch.bfloat16)
    r = _inductor(attention, q, q, q)
    assert r.categories == ["memset", "attention"]
    assert kernelab.count(attention, q, q, q, predict=True).num_kernels == 4
