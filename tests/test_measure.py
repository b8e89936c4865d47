"""kernelab.measure (kernel classification, Inductor names, trace parsing) and kernelab.targets."""

import json
import os

import pytest
import torch

from kernelab.measure import (
    KERNEL_CATEGORIES,
    classify_kernel,
    kernels_from_trace,
    measure_kernels,
    ops_from_inductor_name,
)
from kernelab.targets import prepare_on_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TRUTH = os.path.join(os.path.dirname(__file__), "data", "kernels_h200.json")

# Kernel names as the profiler reports them (demangled), and the category each must get.
KERNEL_NAMES = [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)", "pointwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
     "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::"
     "ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
     "{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)", "pointwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
     "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const"
     "::{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>>(...)", "copy"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
     "{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, ...)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "fill"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const"
     "::{lambda()#7}::operator()() const::{lambda(float, bool)#1}>(...)", "pointwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, ...>)", "reduction"),
    ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, (anonymous namespace)"
     "::SoftMaxForwardEpilogue>(float*, float const*, int)", "reduction"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, "
     "float, float const*, float const*, float const*, float*, float*, float*)", "reduction"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, "
     "32u, 256u, false, false, true>(long, long, float const*, ...)", "reduction"),
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, true, 1>(float, float, cudnnTensorStruct, "
     "float const*, ...)", "pointwise"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1, true>(cudnnTensorStruct, ...)", "reduction"),
    ("void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, float, float, float, "
     "int>(at::GenericPackedTensorAccessor<...>)", "reduction"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, "
     "long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)", "reduction"),
    ("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x16_warpgroupsize1x1x1_execute_segment_k_off"
     "_kernel__5x_cublas", "matmul"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x5_tn_align4>(cutlass_80_tensorop_"
     "s1688gemm_128x128_16x5_tn_align4::Params)", "matmul"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<...> >(...)", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(...)", "matmul"),
    ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nchwkcrs_nchw_tilesize128x64x32_warpgroupsize"
     "1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn", "conv"),
    ("void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>(int, ...)", "conv"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
     "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, ...)", "copy"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<...> >, false, true, false, false, true, true, false, "
     "false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
     "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous "
     "namespace)::OpaqueType<4u>, unsigned int, 2, 128, 1>(...)", "copy"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, "
     "-2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, ...)", "index"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
     "index_kernel_impl<at::native::OpaqueType<4> >(...)", "index"),
    ("void at::native::_scatter_gather_elementwise_kernel<128, 8, at::native::_cuda_scatter_gather_"
     "internal_kernel<true, float>::operator()<at::native::ReduceAdd>(...)", "index"),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(...)", "index"),
    ("void at_cuda_detail::cub::DeviceScanKernel<at_cuda_detail::cub::DeviceScanPolicy<float, "
     "std::plus<float> >::Policy900, float const*, float*, ...>(...)", "scan"),
    ("void at::native::tensor_kernel_scan_innermost_dim<float, std::plus<float> >(float*, float const*, "
     "unsigned int, unsigned int, unsigned int, float, std::plus<float>)", "scan"),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSort"
     "Policy<float, long, int>::Policy900, false, float, long, int, int, ...>(...)", "sort"),
    ("void at_cuda_detail::cub::DeviceRadixSortExclusiveSumKernel<at_cuda_detail::cub::"
     "DeviceRadixSortPolicy<long, long, int>::Policy900, int>(int*)", "sort"),
    ("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::LTOp<float, "
     "true>, unsigned int>(...)", "sort"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::"
     "TensorInfo<float const, unsigned int>, ...)", "sort"),
    ("void at::native::mbtopk::radixFindKthValues<float, unsigned int, unsigned int, 2>(...)", "sort"),
    ("triton_poi_fused_add_relu_0", "pointwise"),
    ("triton_red_fused_sum_0", "reduction"),
    ("triton_per_fused__softmax_0", "reduction"),
    ("triton_per_fused_add_mean_mul_pow_rsqrt_0", "reduction"),
    ("triton_tem_fused_addmm_relu_0", "matmul"),
    ("triton_per_fused_cumsum_0", "scan"),
    ("triton_for_fused_0", "pointwise"),
    ("Memcpy DtoH (Device -> Pinned)", "memcpy"),
    ("Memset (Device)", "memset"),
    ("some_kernel_nobody_knows", "other"),
]

# Every distinct library kernel recorded on an H200 (torch 2.11, CUDA 13.0) by benchmarks/record_truth.py,
# with a few of Inductor's: the categories were checked by hand.
H200_KERNEL_NAMES = [
    ('void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, ', 'pointwise'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::de', 'pointwise'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<floa', 'pointwise'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<f', 'pointwise'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda', 'pointwise'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}:', 'pointwise'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::compare_scalar_kernel<float>(at::TensorIteratorBase&, at::native::(anonymous namespace)::OpType, float)::{la', 'pointwise'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::where_kernel_impl(at::TensorIterator&)::{lambda()#1}::operator()() const::{lambda()#1', 'pointwise'),
    ('void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out(c10::Scalar const&, c10::Scalar const&, c10::Scalar const&, at::Tensor&)::{lamb', 'fill'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)', 'fill'),
    ('Memcpy DtoD (Device -> Device)', 'memcpy'),
    ('void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<floa', 'reduction'),
    ('Memset (Device)', 'memset'),
    ('void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIt', 'reduction'),
    ('void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::MaxNanFunctor<float> >, unsigned int, float, 4, 4> >(at::', 'reduction'),
    ('void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::WelfordOps<float, float, int, cuda::std::__4::pair<float, float> >, unsigned int, float, 2,', 'reduction'),
    ('void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float, true>, unsigned int, float, 4, 4> >(at::native::ReduceOp<fl', 'reduction'),
    ('void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, int, int, int, bool const*, int, bool)', 'reduction'),
    ('void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue, long, 8>(float*, float c', 'reduction'),
    ('void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, float const*, float const*, float const*, float*, float*, float*)', 'reduction'),
    ('void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float, false>(float const*, float const*, float const*, float const*, float const*,', 'reduction'),
    ('void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, 256u, false, true, false>(long, long, float const*, float const*, floa', 'reduction'),
    ('void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, long const*, float const*, bool, long, lo', 'reduction'),
    ('void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, float const*, long const*, float const*, float const*, bool, int, int', 'reduction'),
    ('void at::native::(anonymous namespace)::cunn_SoftMaxBackwardSmem<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float cons', 'reduction'),
    ('void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)', 'index'),
    ('void at::native::_scatter_gather_elementwise_kernel<128, 8, at::native::_cuda_scatter_gather_internal_kernel<false, at::native::OpaqueType<4>, long>::operator()<at::nativ', 'index'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar cons', 'pointwise'),
    ('void at_cuda_detail::cub::detail::reduce::DeviceReduceKernel<at_cuda_detail::cub::detail::reduce::policy_hub<int, unsigned long long, cuda::std::__4::plus<void> >::Policy', 'reduction'),
    ('void at_cuda_detail::cub::detail::reduce::DeviceReduceSingleTileKernel<at_cuda_detail::cub::detail::reduce::policy_hub<int, unsigned long long, cuda::std::__4::plus<void>', 'reduction'),
    ('Memcpy DtoH (Device -> Pinned)', 'memcpy'),
    ('void at_cuda_detail::cub::detail::scan::DeviceCompactInitKernel<at_cuda_detail::cub::ScanTileState<int, true>, int*>(at_cuda_detail::cub::ScanTileState<int, true>, int, i', 'index'),
    ('void at_cuda_detail::cub::detail::select::DeviceSelectSweepKernel<at_cuda_detail::cub::detail::select::policy_hub<long, bool, int, false, (at_cuda_detail::cub::SelectImpl', 'index'),
    ('void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, c10::Arr', 'index'),
    ('void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortHistogramKernel<at_cuda_detail::cub::detail::radix::policy_hub<long, at::cuda::cub::detail::OpaqueType<8>, un', 'sort'),
    ('void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortExclusiveSumKernel<at_cuda_detail::cub::detail::radix::policy_hub<long, at::cuda::cub::detail::OpaqueType<8>,', 'sort'),
    ('void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::detail::radix::policy_hub<long, at::cuda::cub::detail::OpaqueType<8>, uns', 'sort'),
    ('void at_cuda_detail::cub::detail::unique_by_key::DeviceUniqueByKeySweepKernel<at_cuda_detail::cub::detail::unique_by_key::policy_hub<long, int>::Policy1000, long const*, ', 'index'),
    ('void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long const*, long)', 'index'),
    ('void at_cuda_detail::cub::detail::scan::DeviceScanInitKernel<at_cuda_detail::cub::ScanTileState<long, true> >(at_cuda_detail::cub::ScanTileState<long, true>, int)', 'scan'),
    ('void at_cuda_detail::cub::detail::scan::DeviceScanKernel<at_cuda_detail::cub::detail::scan::policy_hub<long, long, long, unsigned int, at::cuda::cub::(anonymous namespace', 'scan'),
    ('void at::native::(anonymous namespace)::compute_num_of_partial_segments<long>(long const*, long const*, long const*, long*)', 'index'),
    ('void at::native::(anonymous namespace)::krn_partial_segment_offset<long>(long*, long const*, long const*, long const*, long const*)', 'index'),
    ('void at::native::(anonymous namespace)::compute_grad_weight<float, long>(long const*, float const*, long const*, long, long, long const*, long const*, at::AccumulateType<', 'index'),
    ('void at::native::(anonymous namespace)::sum_and_scatter<float, long>(long const*, float*, long, long const*, long const*, at::AccumulateType<float, true>::type const*, lo', 'index'),
    ('void at::native::tensor_kernel_scan_innermost_dim<float, std::plus<float> >(float*, float const*, unsigned int, unsigned int, unsigned int, float, std::plus<float>)', 'scan'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() co', 'copy'),
    ('void at::native::radixSortKVInPlace<2, -1, 32, 32, float, long, unsigned int>(at::cuda::detail::TensorInfo<float, unsigned int>, unsigned int, unsigned int, unsigned int,', 'sort'),
    ('void at::native::mbtopk::fill<unsigned int, unsigned int>(unsigned int*, unsigned int, unsigned int)', 'fill'),
    ('void at::native::mbtopk::computeBlockDigitCounts<float, unsigned int, unsigned int, 2>(at::cuda::detail::TensorInfo<float const, unsigned int>, unsigned int, unsigned int', 'sort'),
    ('at::native::mbtopk::computeDigitCumSum(short*, unsigned int*, unsigned int)', 'sort'),
    ('void at::native::mbtopk::computeBlockwiseWithinKCounts<unsigned int, float>(unsigned int*, short*, unsigned int*, unsigned int*, unsigned int, int, bool, unsigned int*, f', 'sort'),
    ('void at::native::mbtopk::computeBlockwiseKthCounts<unsigned int>(unsigned int*, short*, unsigned int, unsigned int, unsigned int*)', 'sort'),
    ('void at_cuda_detail::cub::detail::scan_by_key::DeviceScanByKeyInitKernel<at_cuda_detail::cub::ReduceByKeyScanTileState<unsigned int, int, true>, thrust::THRUST_300001_SM_', 'scan'),
    ('void at::native::mbtopk::gatherTopK<float, unsigned int, 2>(at::cuda::detail::TensorInfo<float const, unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsig', 'sort'),
    ('void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>(at::cuda::detail::TensorInfo<float, unsigned int>, unsigned', 'sort'),
    ('void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 2, 128, 1, 16, 4>(char*, at::nativ', 'copy'),
    ('void at::native::vectorized_elementwise_kernel<8, at::native::float16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::nati', 'copy'),
    ('void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() co', 'copy'),
    ('void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::nat', 'copy'),
    ('void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)', 'matmul'),
    ('sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas', 'matmul'),
    ('nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT', 'matmul'),
    ('nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT', 'matmul'),
    ('cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0', 'attention'),
    ('fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)', 'attention'),
    ('nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT', 'matmul'),
    ('nvjet_sm90_tst_64x128_64x8_1x2_h_bz_NNN', 'matmul'),
    ('void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float', 'copy'),
    ('sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn', 'conv'),
    ('void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, true, 1>(float, float, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, cudnnTensorStruct, float const*, f', 'pointwise'),
    ('void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)', 'reduction'),
    ('sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas', 'matmul'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::mse_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const', 'pointwise'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::mse_backward_cuda_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}', 'pointwise'),
    ('sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas', 'matmul'),
    ('nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_bias_TNT', 'matmul'),
    ('nvjet_sm90_tst_128x64_64x8_1x2_h_bz_bias_TNT', 'matmul'),
    ('triton_poi_fused_add_relu_0', 'pointwise'),
    ('triton_red_fused_sum_0', 'reduction'),
    ('triton_per_fused__softmax_exp_prepare_softmax_online_sub_0', 'reduction'),
    ('triton_red_fused__log_softmax__log_softmax_backward_data_arange_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0', 'reduction'),
    ('triton_poi_fused_index_select_0', 'pointwise'),
    ('triton_per_fused_cumsum_0', 'scan'),
    ('triton_spl_fused_cumsum_0', 'scan'),
]


@pytest.mark.parametrize("name,category", KERNEL_NAMES + H200_KERNEL_NAMES,
                         ids=[f"{c}-{i}" for i, (_, c) in enumerate(KERNEL_NAMES + H200_KERNEL_NAMES)])
def test_classify_kernel(name, category):
    assert classify_kernel(name) == category


def test_categories_are_the_documented_set():
    assert {c for _, c in KERNEL_NAMES + H200_KERNEL_NAMES} <= set(KERNEL_CATEGORIES)
    assert set(KERNEL_CATEGORIES) == {"pointwise", "reduction", "matmul", "conv", "attention", "copy",
                                      "fill", "index", "scan", "sort", "memset", "memcpy", "other"}


@pytest.mark.skipif(not os.path.exists(TRUTH), reason="no recorded ground truth")
def test_recorded_ground_truth_classifies_as_recorded():
    """Every kernel the GPU recorded still gets the category that was stored with it."""
    with open(TRUTH) as f:
        doc = json.load(f)
    for name, entry in doc["programs"].items():
        for mode in ("eager", "inductor"):
            for k in entry.get(mode, []):
                assert classify_kernel(k["name"]) == k["category"], (name, mode, k["name"])
                assert k["category"] != "other", (name, mode, k["name"])


@pytest.mark.parametrize("name,ops", [
    ("triton_poi_fused_add_relu_0", ["add", "relu"]),
    ("triton_per_fused__softmax_0", ["_softmax"]),
    ("triton_red_fused__log_softmax_12", ["_log_softmax"]),
    ("triton_per_fused_native_layer_norm_3", ["native_layer_norm"]),
    ("triton_per_fused_add_native_layer_norm_native_layer_norm_backward_7",
     ["add", "native_layer_norm", "native_layer_norm_backward"]),
    ("triton_poi_fused__to_copy_gelu_2", ["_to_copy", "gelu"]),
    ("triton_poi_fused_index_select_1", ["index_select"]),
    ("triton_tem_fused_addmm_relu_0", ["addmm", "relu"]),
    ("triton_poi_fused_0", []),
    ("not_a_triton_kernel", []),
])
def test_ops_from_inductor_name(name, ops):
    assert ops_from_inductor_name(name) == ops


def test_ops_from_inductor_name_keeps_unknown_underscored_ops():
    assert ops_from_inductor_name("triton_poi_fused__foo_add_0", frozenset({"add"})) == ["_foo", "add"]


# ----------------------------------------------------------------------------- targets

class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((8,), 2.0))
        self.register_buffer("frozen", torch.ones(8))

    def forward(self, x, extra):
        return ((x * self.w + extra["b"][0]) * self.frozen).sum()


def test_prepare_moves_module_and_nested_args():
    module = Affine()
    x = torch.randn(4, 8, requires_grad=True)
    args = (x, {"b": [torch.randn(8)], "scale": 3})
    prepared = prepare_on_device(module, args, "cpu")
    assert prepared.module is not module and prepared.fn is prepared.module
    assert prepared.module.w.requires_grad and prepared.module.w is not module.w
    moved_x, moved_extra = prepared.args
    assert moved_x is not x and moved_x.requires_grad and moved_x.is_leaf
    assert moved_extra["scale"] == 3 and torch.equal(moved_extra["b"][0], args[1]["b"][0])
    assert {id(t) for t in prepared.leaves_requiring_grad} == {id(moved_x), id(prepared.module.w)}
    assert torch.allclose(prepared(), module(x, args[1]))


def test_prepare_never_aliases_the_callers_tensors():
    x = torch.randn(16)
    prepared = prepare_on_device(lambda t: t.add_(1), (x,), "cpu")
    before = x.clone()
    prepared()
    assert torch.equal(x, before)


def test_prepare_keeps_strides_offsets_and_aliasing():
    base = torch.randn(64, 32)
    sliced, transposed, row = base[:, ::2], base.t(), base[5]
    prepared = prepare_on_device(lambda *a: a, (sliced, transposed, row), "cpu")
    m_sliced, m_transposed, m_row = prepared.args
    assert m_sliced.stride() == (32, 2) and m_transposed.stride() == (1, 32)
    assert m_row.storage_offset() == 5 * 32
    assert torch.equal(m_sliced, sliced) and torch.equal(m_transposed, transposed) and torch.equal(m_row, row)
    # the three views still share one (new) storage
    assert m_sliced.untyped_storage().data_ptr() == m_row.untyped_storage().data_ptr()
    assert m_sliced.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()


def test_reset_grads_clears_inputs_and_params():
    prepared = prepare_on_device(Affine(), (torch.randn(4, 8, requires_grad=True), {"b": [torch.randn(8)]}), "cpu")
    prepared().backward()
    assert all(leaf.grad is not None for leaf in prepared.leaves_requiring_grad)
    first = [leaf.grad.clone() for leaf in prepared.leaves_requiring_grad]
    prepared.reset_grads()
    assert all(leaf.grad is None for leaf in prepared.leaves_requiring_grad)
    prepared().backward()  # a fresh gradient, not an accumulated one
    for leaf, g in zip(prepared.leaves_requiring_grad, first):
        torch.testing.assert_close(leaf.grad, g)


@pytest.mark.parametrize("target,args,match", [
    (42, (), "not callable"),
    ("relu", (), "not callable"),
    (torch.relu, torch.randn(3), "args must be a tuple"),
])
def test_prepare_refuses_bad_targets(target, args, match):
    with pytest.raises(ValueError, match=match):
        prepare_on_device(target, args, "cpu")


# ----------------------------------------------------------------------------- trace parsing

def _ev(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _synthetic_trace():
    """Two calls of (a + b).relu(); the second call's relu launches from the autograd thread."""
    events = []
    for call, base in enumerate((100.0, 300.0)):
        corr, ext = 10 * (call + 1), 100 * (call + 1)
        relu_tid = 1 if call == 0 else 2
        events += [
            _ev("user_annotation", f"kernelab.call[{call}]", base, 150, **{"External id": ext}),
            _ev("cpu_op", "aten::add", base + 10, 20, **{"External id": ext + 1}),
            _ev("cuda_runtime", "cudaLaunchKernel", base + 15, 5, correlation=corr, **{"External id": ext + 1}),
            _ev("cpu_op", "aten::relu", base + 40, 30, tid=relu_tid, **{"External id": ext + 2}),
            _ev("cpu_op", "aten::clamp_min", base + 45, 20, tid=relu_tid, **{"External id": ext + 3}),
            _ev("cuda_runtime", "cudaLaunchKernel", base + 50, 5, tid=relu_tid, correlation=corr + 1),
            _ev("cuda_runtime", "cudaMemsetAsync", base + 80, 2, correlation=corr + 2),
            # device events, listed out of order: the parser sorts by device time
            _ev("kernel", "void at::native::vectorized_elementwise_kernel<4, clamp_min>", base + 70, 3.0 + call,
                tid=7, correlation=corr + 1, grid=[977, 1, 1], block=[128, 1, 1], **{"External id": ext + 3}),
            _ev("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
                base + 60, 4.0 + call, tid=7, correlation=corr, grid=[977, 1, 1], block=[128, 1, 1]),
            _ev("gpu_memset", "Memset (Device)", base + 90, 1.0, tid=7, correlation=corr + 2),
        ]
    # a kernel launched outside the timed calls (by reset()) is ignored
    events.append(_ev("cuda_runtime", "cudaLaunchKernel", 290, 1, correlation=999))
    events.append(_ev("kernel", "stray", 291, 1, tid=7, correlation=999))
    return {"traceEvents": events}


def test_kernels_from_trace_splits_calls_and_finds_innermost_ops():
    calls = kernels_from_trace(_synthetic_trace(), 2)
    for call in calls:
        assert ["CUDAFunctor_add" in call[0].name, "clamp_min" in call[1].name, call[2].name] == [True, True, "Memset (Device)"]
    first = calls[0]
    assert [e.op for e in first] == ["aten::add", "aten::clamp_min", None]
    assert [e.kind for e in first] == ["kernel", "kernel", "memset"]
    assert first[0].grid == (977, 1, 1) and first[2].grid is None
    assert calls[1][1].op == "aten::clamp_min"  # found on the launching (autograd) thread


def test_kernels_from_trace_refuses_missing_calls():
    with pytest.raises(RuntimeError, match="call ranges"):
        kernels_from_trace(_synthetic_trace(), 3)


def test_merge_refuses_calls_that_differ():
    from kernelab.measure import _merge_calls

    calls = kernels_from_trace(_synthetic_trace(), 2)
    merged = _merge_calls(calls)
    assert [k.duration_us for k in merged] == [4.5, 3.5, 1.0]  # median per position
    assert [k.category for k in merged] == ["pointwise", "pointwise", "memset"]
    with pytest.raises(RuntimeError, match="calls launch different kernels"):
        _merge_calls([calls[0], calls[1][:2]])


def test_measure_kernels_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        measure_kernels(torch.relu, (torch.randn(4),))


# ----------------------------------------------------------------------------- on a GPU

@needs_cuda
def test_measure_add_relu_launches_two_pointwise_kernels():
    a, b = (torch.randn(1 << 20, device="cuda") for _ in range(2))
    kernels = measure_kernels(lambda x, y: (x + y).relu(), (a, b), warmup=1, repeat=3)
    assert [k.category for k in kernels] == ["pointwise", "pointwise"]
    assert [k.op for k in kernels] == ["aten::add", "aten::clamp_min"]
    assert all(k.duration_us > 0 and k.kind == "kernel" for k in kernels)


@needs_cuda
def test_measure_stops_the_profiler_when_the_target_raises():
    def boom(x):
        if boom.calls >= 1:
            raise ValueError("boom")
        boom.calls += 1
        return x + 1
    boom.calls = 0
    with pytest.raises(ValueError, match="boom"):
        measure_kernels(boom, (torch.randn(8, device="cuda"),), warmup=1, repeat=2)
    assert not torch.autograd.profiler._is_profiler_enabled  # the failed measurement stopped it
    kernels = measure_kernels(torch.neg, (torch.randn(8, device="cuda"),), warmup=1, repeat=2)
    assert len(kernels) == 1
