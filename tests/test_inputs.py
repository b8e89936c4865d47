"""Input specs and target loading."""
import pytest
import torch

from kernelab.inputs import InputSpec, SpecError, load_target, make_inputs, parse_spec


@pytest.mark.parametrize("text, dims, dtype, grad", [
    ("1000000", (1000000,), torch.float32, False),
    ("1e6", (1000000,), torch.float32, False),
    ("32x4096:bf16", (32, 4096), torch.bfloat16, False),
    ("64x64:f32:grad", (64, 64), torch.float32, True),
    ("4096xn:fp16", (4096, "n"), torch.float16, False),
])
def test_parse_shapes_and_dtypes(text, dims, dtype, grad):
    spec = parse_spec(text)
    assert (spec.dims, spec.dtype, spec.requires_grad) == (dims, dtype, grad)


def test_integer_range_spec_draws_inside_the_range():
    spec = parse_spec("int64[0,1000):512")
    assert (spec.dims, spec.dtype, spec.low, spec.high) == ((512,), torch.int64, 0, 1000)
    (t,) = make_inputs([spec])
    assert t.dtype == torch.int64 and t.shape == (512,)
    assert 0 <= int(t.min()) and int(t.max()) < 1000 and len(t.unique()) > 100


@pytest.mark.parametrize("bad", ["", "12xq", "32x4096:bf17", "float32[0,10):5", "int64[5,5):3", "1.5",
                                 "8:i64:grad", "a:b:c:d"])
def test_malformed_specs_are_refused_with_a_reason(bad):
    with pytest.raises(SpecError) as info:
        parse_spec(bad)
    assert str(info.value)


def test_inputs_are_deterministic_and_not_zero():
    specs = [parse_spec("1000"), parse_spec("10x10:f16")]
    a = make_inputs(specs)
    b = make_inputs(specs)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert float(a[0].abs().mean()) > 0.5


def test_sweep_size_placeholder():
    spec = parse_spec("n")
    assert spec.shape(128) == (128,)
    with pytest.raises(SpecError):
        spec.shape()


def test_load_target(tmp_path):
    f = tmp_path / "model.py"
    f.write_text("import torch\ndef fn(a):\n    return a * 2\nclass M(torch.nn.Module):\n"
                 "    def forward(self, x):\n        return x\nvalue = 3\n")
    fn, module = load_target(f"{f}:fn")
    assert fn(torch.ones(2)).tolist() == [2.0, 2.0]
    m, _ = load_target(f"{f}:M")
    assert isinstance(m, torch.nn.Module)
    for ref, msg in [(f"{f}:nope", "has no function"), (f"{tmp_path}/missing.py:fn", "no such file"),
                     (f"{f}", "should look like"), (f"{f}:value", "not a function")]:
        with pytest.raises(SpecError, match=msg):
            load_target(ref)
