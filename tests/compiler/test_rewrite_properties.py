"""Randomized programs through the rewrites of stop 34 (hypothesis, kept small: every example
compiles): a one-dim ``F.pad`` sliced back (``pads_as_cats``, ``slices_through_cats``), a tree of
elementwise ops and a cat under a transpose that a copy reads (``permuted_trees_into_copies``),
integer division by a constant (``kl_math.int_div_floor``/``int_div_trunc``). Values, dtypes,
shapes and strides as eager's."""
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    torch.testing.assert_close(got, want, equal_nan=True)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data(),
       value=st.sampled_from([0, -100, 1.5, float("nan")]), dtype=st.sampled_from([torch.float32, torch.int64]))
def test_a_padded_then_sliced_dim_matches_eager(shape, data, value, dtype):
    rank = len(shape)
    back = data.draw(st.integers(0, rank - 1), "padded dim from the end")
    lo, hi = data.draw(st.integers(0, 3), "lo"), data.draw(st.integers(1, 3), "hi")
    dim = rank - 1 - back
    size = shape[dim] + lo + hi
    start, end = data.draw(st.integers(-size, size), "start"), data.draw(st.integers(-size, size), "end")
    value = -7 if dtype == torch.int64 and isinstance(value, float) else value
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 10).to(dtype)

    def fn(x):
        padded = F.pad(x, [0, 0] * back + [lo, hi], value=value)
        kept = [slice(None)] * rank
        kept[dim] = slice(start, end)
        return padded[tuple(kept)] * 2

    torch._dynamo.reset()
    _same(torch.compile(fn, backend="kernelab")(x), fn(x))


@SETTINGS
@given(heads=st.integers(1, 4), seq=st.integers(1, 4), width=st.sampled_from([4, 8]),
       perm=st.sampled_from([(0, 2, 1, 3), (0, 1, 3, 2), (3, 2, 1, 0), (1, 0, 2, 3)]))
def test_an_elementwise_tree_transposed_into_a_copy_matches_eager(heads, seq, width, perm):
    g = torch.Generator().manual_seed(heads * 7 + seq)
    x, table, row = torch.randn(2, heads, seq, width, generator=g), torch.randn(seq, width, generator=g), \
        torch.randn(1, 1, seq, width, generator=g)
    half = width // 2

    def fn(x, table, row):
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return ((rotated * table + x.sigmoid() * row) - 0.5).permute(*perm).contiguous()

    torch._dynamo.reset()
    _same(torch.compile(fn, backend="kernelab")(x, table, row), fn(x, table, row))


@SETTINGS
@given(divisor=st.integers(-9, 9).filter(bool), mode=st.sampled_from(["floor", "trunc"]),
       dtype=st.sampled_from([torch.int64, torch.int32, torch.int16]))
def test_integer_division_by_a_constant_matches_eager(divisor, mode, dtype):
    x = torch.arange(-40, 41, dtype=dtype)

    def fn(x):
        return torch.div(x * 1, divisor, rounding_mode=mode) + 1

    torch._dynamo.reset()
    _same(torch.compile(fn, backend="kernelab")(x), fn(x))
