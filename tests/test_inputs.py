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


@pytest.mark.parametrize("bad, message", [
    ("1e400", "is too large"),
    ("99999999999999999999999", "at most 2^63 - 1"),
    ("1e19x2", "at most 2^63 - 1"),
])
def test_dimensions_beyond_64_bits_are_refused(bad, message):
    with pytest.raises(SpecError, match=message.replace("^", r"\^")):
        parse_spec(bad)


def test_a_tensor_larger_than_64_bit_sizes_is_refused_when_made():
    spec = parse_spec("4294967296x4294967296:f32")  # each dimension fits, 2^64 elements do not
    with pytest.raises(SpecError, match="more than a 64-bit size can address"):
        make_inputs([spec], device="meta")


def test_meta_inputs_have_shapes_and_dtypes_only():
    a, b, c = make_inputs([parse_spec("100000000000"), parse_spec("int64[0,10):7x3"), parse_spec("4x4:f16:grad")],
                          device="meta")
    assert a.is_meta and a.shape == (10**11,) and a.dtype == torch.float32
    assert b.is_meta and b.dtype == torch.int64 and b.shape == (7, 3)
    assert c.is_meta and c.requires_grad and c.dtype == torch.float16
    with torch.device("meta"):  # sweep's way: the default device decides
        (d,) = make_inputs([parse_spec("n")], 10**12)
    assert d.is_meta and d.shape == (10**12,)


def test_a_module_class_that_needs_arguments_is_refused_with_a_hint(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import torch\n"
                    "class Block(torch.nn.Module):\n"
                    "    def __init__(self, width, depth=2):\n"
                    "        super().__init__()\n"
                    "        self.linear = torch.nn.Linear(width, width)\n"
                    "class Broken(torch.nn.Module):\n"
                    "    def __init__(self):\n"
                    "        raise RuntimeError('no weights here')\n"
                    "class Fine(torch.nn.Module):\n"
                    "    def forward(self, x):\n"
                    "        return x\n")
    with pytest.raises(SpecError) as info:
        load_target(f"{path}:Block")
    assert "Block is an nn.Module class whose __init__ needs arguments (Block(width, depth=2))" in str(info.value)
    assert "m.py:model" in str(info.value)
    with pytest.raises(SpecError, match=r"building Broken\(\) raised RuntimeError: no weights here"):
        load_target(f"{path}:Broken")
    target, _ = load_target(f"{path}:Fine")
    assert isinstance(target, torch.nn.Module)
