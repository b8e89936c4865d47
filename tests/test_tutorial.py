"""The tutorial's experiment: (a + b).relu() is 2 kernels / 5 transfers eager, 1 / 3 fused."""
import torch

import kernelab
from kernelab.programs import add_relu


def _inputs(n=1_000_000):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def test_eager_counts_match_the_tutorial():
    r = kernelab.count(add_relu, *_inputs(), predict=True)
    assert (r.num_kernels, r.num_memops) == (2, 0)
    assert r.transfers == 5.0
    assert len(r.round_trips) == 1
    assert r.ideal_transfers == 3.0
    assert r.fusion_headroom == 5.0 / 3.0
    assert [k.category for k in r.kernels] == ["pointwise", "pointwise"]
    # add reads a and b (8 MB) and writes t (4 MB); relu reads t and writes the result.
    assert [(k.bytes_read, k.bytes_written) for k in r.kernels] == [(8_000_000, 4_000_000), (4_000_000, 4_000_000)]
    assert not r.measured and all(not k.measured for k in r.kernels)


def test_round_trip_is_the_intermediate_sum():
    r = kernelab.count(add_relu, *_inputs(1000), predict=True)
    trip = r.round_trips[0]
    assert (trip.writer, trip.readers, trip.shape, trip.dtype) == (0, [1], (1000,), "float32")
    assert trip.bytes == 8000  # written once, read back once


def test_inductor_fuses_to_one_kernel_and_three_transfers():
    r = kernelab.count(add_relu, *_inputs(), mode="inductor", predict=True)
    assert (r.num_kernels, r.transfers, len(r.round_trips)) == (1, 3.0, 0)
    assert r.kernels[0].ops == ["add", "relu"]
    assert r.fusion_headroom == 1.0


def test_compare_summary_line_is_repeatable():
    c = kernelab.compare(add_relu, *_inputs(), predict=True)
    line = c.summary()
    assert line.startswith("eager: 2 kernels, 5 array transfers, 1 round trip")
    assert "inductor: 1 kernel, 3 array transfers, 0 round trips" in line


def test_transfers_do_not_depend_on_dtype_or_size():
    for n, dtype in [(7, torch.float16), (4097, torch.bfloat16), (1 << 20, torch.float32)]:
        a, b = (t.to(dtype) for t in _inputs(n))
        r = kernelab.count(add_relu, a, b, predict=True)
        assert r.transfers == 5.0 and r.bytes == 5 * n * a.element_size()


def test_predicted_time_follows_the_profile():
    from kernelab.hardware import get_profile

    h200, a100 = get_profile("h200"), get_profile("a100")
    big = _inputs(10_000_000)
    t_h200 = kernelab.count(add_relu, *big, predict=True, profile="h200").kernel_time_us
    t_a100 = kernelab.count(add_relu, *big, predict=True, profile="a100").kernel_time_us
    # bandwidth-bound: 5 arrays of 40 MB over each profile's copy bandwidth
    assert abs(t_h200 - 200e6 / h200.copy_bandwidth * 1e6) < 1e-6
    assert abs(t_a100 / t_h200 - h200.copy_bandwidth / a100.copy_bandwidth) < 1e-9


def test_over_2_31_bytes_eager_launches_each_op_in_two_pieces():
    # 1e9 float32 = 4 GB: TensorIterator's 32-bit indexing halves each op (measured on the H200)
    with torch.device("meta"):
        a, b = torch.empty(10**9), torch.empty(10**9)
    r = kernelab.count(add_relu, a, b, predict=True)
    assert r.num_kernels == 4 and r.transfers == 5.0
    assert [k.bytes for k in r.kernels] == [6 * 10**9, 6 * 10**9, 4 * 10**9, 4 * 10**9]
    fused = kernelab.count(add_relu, a, b, mode="inductor", predict=True)
    assert fused.num_kernels == 1 and fused.transfers == 3.0


def test_kernelab_mode_is_predicted_from_the_compilers_plan():
    r = kernelab.count(add_relu, *_inputs(), mode="kernelab", predict=True)
    assert (r.num_kernels, r.transfers, len(r.round_trips)) == (1, 3.0, 0)
    assert r.kernels[0].name.startswith("kl_fused_") and r.kernels[0].category == "pointwise"
    c = kernelab.compare(add_relu, *_inputs(), modes=("eager", "inductor", "kernelab"), predict=True)
    assert c.summary().endswith("kernelab: 1 kernel, 3 array transfers, 0 round trips, 21 µs predicted")
