"""``kernelab/config.py`` is the one home of the KERNELAB_* environment settings: every one is read
there, at call time, and listed in its table."""
import re
from pathlib import Path

import pytest
import torch

from kernelab import config

PACKAGE = Path(config.__file__).parent


def test_no_other_module_reads_a_kernelab_setting():
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "config.py":
            continue
        text = path.read_text()
        if re.search(r"(environ|getenv)[^\n]*KERNELAB_", text):
            readers.append(str(path.relative_to(PACKAGE)))
    assert readers == [], f"read KERNELAB_* outside config.py: {readers}"


def test_every_setting_read_is_in_the_table():
    source = Path(config.__file__).read_text()
    doc = config.__doc__
    read = set(re.findall(r'(?:_flag|_by_device)\("(KERNELAB_[A-Z_]+)"', source))
    listed = set(re.findall(r"^\| (KERNELAB_[A-Z_]+) \|", doc, re.M))
    assert read and read == listed


@pytest.mark.parametrize("name, fn, value, want", [
    ("KERNELAB_DEBUG", config.debug_level, "2", 2),
    ("KERNELAB_DEBUG", config.debug_level, "x", 0),
    ("KERNELAB_STRICT", config.strict, "1", True),
    ("KERNELAB_CUDAGRAPHS", config.cudagraphs, "1", True),
    ("KERNELAB_DIRECT_LAUNCH", config.direct_launch, "0", False),
    ("KERNELAB_STATIC_LAUNCH", config.static_launch, "0", False),
    ("KERNELAB_DIRECT_CALL", config.direct_call, "0", False),
    ("KERNELAB_PAD", config.pad, "0", False),
    ("KERNELAB_TEAMS", config.teams, "0", False),
    ("KERNELAB_GEMM_TUNE", config.gemm_tune, "1", True),
    ("KERNELAB_BN_FORWARD", config.batch_norm_forward, "aten", "aten"),
    ("KERNELAB_BN_FORWARD", config.batch_norm_forward, "", "generated"),
    ("KERNELAB_BN_BACKWARD", config.batch_norm_backward, "generated", "generated"),
    ("KERNELAB_BN_BACKWARD", config.batch_norm_backward, "aten", "aten"),
    ("KERNELAB_BN_BACKWARD", config.batch_norm_backward, "", "generated"),
    ("KERNELAB_CONV_LAYOUT", config.conv_layout, "traced", "traced"),
    ("KERNELAB_CONV_LAYOUT", config.conv_layout, "", "channels_last"),
    ("KERNELAB_CONV_LAYOUT", config.conv_layout, "channels_last", "channels_last"),
    ("KERNELAB_CONV_LAYOUT", lambda: config.conv_layout(on_cpu=True), "", "traced"),
    ("KERNELAB_CONV_LAYOUT", lambda: config.conv_layout(on_cpu=True), "channels_last", "channels_last"),
])
def test_read_at_call_time(monkeypatch, name, fn, value, want):
    monkeypatch.delenv(name, raising=False)
    default = fn()
    monkeypatch.setenv(name, value)
    assert fn() == want
    monkeypatch.delenv(name)
    assert fn() == default


def test_persistent_max_and_cache_root(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELAB_PERSISTENT_MAX", raising=False)
    assert config.persistent_max(8192) == 8192
    monkeypatch.setenv("KERNELAB_PERSISTENT_MAX", "1024")
    assert config.persistent_max(8192) == 1024
    monkeypatch.setenv("KERNELAB_PERSISTENT_MAX", "-3")
    with pytest.raises(ValueError, match="positive integer"):
        config.persistent_max(8192)
    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path))
    assert config.cache_root() == tmp_path


@pytest.mark.parametrize("name, fn, choices", [
    ("KERNELAB_BN_FORWARD", config.batch_norm_forward, "'auto' or 'aten' or 'generated'"),
    ("KERNELAB_BN_BACKWARD", config.batch_norm_backward, "'auto' or 'aten' or 'generated'"),
    ("KERNELAB_CONV_LAYOUT", config.conv_layout, "'auto' or 'channels_last' or 'traced'")])
def test_choice_settings_refuse_other_values(monkeypatch, name, fn, choices):
    monkeypatch.setenv(name, "cudnn")
    with pytest.raises(ValueError, match=f"{name} must be {choices}, not 'cudnn'"):
        fn()


@pytest.mark.parametrize("value, on_cpu, want", [("", False, "generated"), ("", True, "aten"), ("auto", True, "aten"),
                                                 ("generated", True, "generated"), ("aten", False, "aten")])
def test_batch_norm_forward_is_generated_by_default_except_on_the_cpu(monkeypatch, value, on_cpu, want):
    """On CUDA the generated forward is faster (ResNet-50's step on an H200: 31.4 against 36.3 ms);
    on the CPU ATen's norm accumulates in float64, as eager's does."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", value)
    assert config.batch_norm_forward(on_cpu) == want


@pytest.mark.parametrize("value, on_cpu, want", [("", False, "generated"), ("", True, "aten"), ("auto", True, "aten"),
                                                 ("generated", True, "generated"), ("aten", False, "aten")])
def test_batch_norm_backward_is_generated_by_default_except_on_the_cpu(monkeypatch, value, on_cpu, want):
    """On CUDA the generated backward is faster (ResNet-50's step on an H100, interleaved with
    ATen's: 24.19 against 25.01 ms); on the CPU ATen's norm accumulates in float64."""
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", value)
    assert config.batch_norm_backward(on_cpu) == want


def test_the_backward_table_follows_the_setting_and_the_device(monkeypatch):
    """aot_autograd's table keeps ATen's norm backward whole for CPU graphs under the default,
    and decomposes it for the others."""
    from kernelab.compiler.backend import decompositions

    op = torch.ops.aten.native_batch_norm_backward.default
    monkeypatch.delenv("KERNELAB_BN_BACKWARD", raising=False)
    assert op in decompositions(on_cpu=False) and op not in decompositions(on_cpu=True)
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", "aten")
    assert op not in decompositions(on_cpu=False)
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", "generated")
    assert op in decompositions(on_cpu=True)


def test_a_bad_batch_norm_forward_setting_stops_the_compile(monkeypatch):
    """Read when the backend starts (as KERNELAB_BN_BACKWARD is, and the backend's options), not per
    graph inside the fallback: every graph ran as ATen with a warning blaming the compiler."""
    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"

    monkeypatch.delenv("KERNELAB_STRICT", raising=False)  # (strict, the fallback raised too)
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "cudnn")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="KERNELAB_BN_FORWARD must be 'auto' or 'aten' or 'generated', not 'cudnn'"):
        torch.compile(lambda x: (x + 1).relu(), backend="kernelab")(torch.randn(4))
    monkeypatch.delenv("KERNELAB_BN_FORWARD")
    torch._dynamo.reset()
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(lambda x: (x + 1).relu(), backend="kernelab")(x), (x + 1).relu())
