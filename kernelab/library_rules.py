"""What the GPU libraries decide at run time, as rules fitted to kernels recorded on an H200.

cuBLAS, cuDNN and ATen's own CUDA code pick kernels by heuristics nobody documents. These rules
were written from ``tests/data/grids_fit_h200.json`` (random GEMMs, convolutions, sorts and
reductions recorded by ``benchmarks/record_truth.py --set grids-fit``) and the zoo's training steps
(``tests/data/zoo_h200.json``), then checked on a sample drawn afterwards
(``tests/data/grids_fresh_h200.json``); ``tests/test_truth_grids.py`` holds the measured agreement.
Each rule says what the data showed; where the data disagrees with a rule, the rule is marked
``confidence="low"`` by its caller. H200, torch 2.11 (cuBLAS 13, cuDNN 9): another GPU or library
version may decide differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# cuBLAS's persistent ("coop") kernels for half precision and TF32 tile the output in 256x128
# blocks; when there are more tiles than two waves of SMs the kernel zero-fills a workspace first
# (a memset before the GEMM). Fitted: 21/21 large half/TF32 GEMMs of the fit sample.
COOP_TILE = (256, 128)
COOP_WAVES_BEFORE_MEMSET = 2

# Split-K (a GEMM kernel, then cublasLt's splitKreduce_kernel): few 64x64 output tiles and a long K.
SPLITK_TILE = 64
SPLITK_HALF = dict(min_k=3072, max_m=512, max_tiles=128, min_k_per_tile=32)
SPLITK_TF32 = dict(min_k=768, max_m=1 << 30, max_tiles=32, min_k_per_tile=128)
SPLITK_FP32 = dict(min_k=384, max_m=1 << 30, max_tiles=64, min_k_per_tile=64)


@dataclass(frozen=True)
class Gemm:
    """One cuBLAS call: ``batch`` products of (m x k) @ (k x n), in ``precision``."""

    batch: int
    m: int
    n: int
    k: int
    precision: str  # "half" (fp16/bf16), "tf32" (fp32 with TF32 allowed) or "fp32"

    def tiles(self, tile_m: int, tile_n: int) -> int:
        return self.batch * math.ceil(self.m / tile_m) * math.ceil(self.n / tile_n)


def gemm_memset(g: Gemm, sms: int) -> bool:
    """Does cuBLAS zero a workspace before this GEMM (persistent kernel over > 2 waves of tiles)?"""
    if g.precision == "fp32":  # full-precision fp32 runs sm80 kernels without the workspace
        return False
    return g.tiles(*COOP_TILE) > COOP_WAVES_BEFORE_MEMSET * sms


def gemm_split_k(g: Gemm) -> bool:
    """Does cuBLAS split K over CTAs and add a reduce kernel? Few output tiles, long K.

    Fit sample: half precision 78/80, TF32 15/16; full fp32 is erratic (the same shapes also show
    a memset with an in-place split, or two GEMM launches), so its callers mark it low confidence.
    """
    if g.batch != 1 or g.k <= 0:
        return False
    params = {"half": SPLITK_HALF, "tf32": SPLITK_TF32}.get(g.precision, SPLITK_FP32)
    tiles = g.tiles(SPLITK_TILE, SPLITK_TILE)
    if g.precision == "fp32" and g.m < 8:
        return False
    return (g.k >= params["min_k"] and g.m <= params["max_m"] and tiles <= params["max_tiles"]
            and g.k / tiles >= params["min_k_per_tile"])


# ----------------------------------------------------------------------------- embedding backward
# ATen's embedding_dense_backward_cuda (EmbeddingBackwardKernel.cu): up to 3072 indices one
# "feature" kernel; more: sort the indices with cub (one 8-bit pass per key byte), find segments,
# then either two passes (per-segment partial sums, then sum and scatter) or, when that second
# pass would have too few blocks, one fused atomic pass.
EMBEDDING_FEATURE_KERNEL_MAX_INDICES = 3072
NROWS_PER_THREAD = 10
MAX_ATOMIC_ACCUM_BLOCKS_PER_SM = 4
MAX_BLOCK_SIZE = 1024


def embedding_backward_fused(indices: int, num_weights: int, width: int, sms: int) -> bool:
    """ATen's use_fused_kernel: the two-pass scatter would launch fewer than 4 blocks per SM."""
    max_segments = min(indices, num_weights)
    stride_warped = math.ceil(width / 32) * 32
    block = min(stride_warped, MAX_BLOCK_SIZE)
    scatter_grid = math.ceil(max_segments * stride_warped / block)
    max_partial_segments = indices // NROWS_PER_THREAD + max_segments
    return scatter_grid < sms * MAX_ATOMIC_ACCUM_BLOCKS_PER_SM and max_partial_segments > 4 * scatter_grid


# ----------------------------------------------------------------------------- convolutions (cuDNN)

def conv_runs_as_gemm(kernel: tuple, stride: tuple, padding: tuple, groups: int) -> bool:
    """A 1x1, stride-1, unpadded, ungrouped convolution is a plain GEMM: cuBLAS kernels ran for all
    12 such convolutions of the fit sample (forward, and data/weight gradients)."""
    return all(k == 1 for k in kernel) and all(s == 1 for s in stride) and not any(padding) and groups == 1


def conv_nchw_fp32_transposes(cin: int, cout: int) -> bool:
    """cuDNN transposes NCHW float32 input and weight to NHWC (two copy kernels) for all but the
    smallest channel counts: fitted on 12 NCHW fp32 convolutions (11 agree)."""
    return cin >= 48 or cout >= 512
