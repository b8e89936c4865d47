"""Measured ceilings: the per-device cache, and what happens when the cached file is corrupt."""
import json

import pytest
import torch

import kernelab.hardware as hardware


def _fake_gpu(monkeypatch, calls):
    """A stand-in GPU: the measurements return fixed rates and count how often they ran."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")

    def copy(nbytes=0):
        calls.append("copy")
        return 4.0e12

    def matmul(dtype_name, n=0):
        calls.append(dtype_name)
        return 5.0e14

    monkeypatch.setattr(hardware, "measure_copy_bandwidth", copy)
    monkeypatch.setattr(hardware, "measure_matmul_flops", matmul)


@pytest.mark.parametrize("content", ['{"gpu": "Test GPU", "torch": "x", "copy_bandw', "", "[1, 2]",
                                     '{"gpu": "Test GPU"}', '{"gpu": "g", "torch": "t", "copy_bandwidth": "fast"}'])
def test_a_corrupt_cache_is_rebuilt_with_a_warning(monkeypatch, content):
    calls = []
    _fake_gpu(monkeypatch, calls)
    path = hardware.cache_path("Test GPU", torch.__version__)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    with pytest.warns(UserWarning, match="cached ceilings file .* is corrupt.*measuring again"):
        c = hardware.measure_ceilings()
    assert c.copy_bandwidth == 4.0e12 and c.matmul_flops["bfloat16"] == 5.0e14
    assert calls == ["copy", "float32", "tfloat32", "bfloat16", "float16"]
    assert json.loads(path.read_text())["copy_bandwidth"] == 4.0e12  # rewritten
    calls.clear()
    assert hardware.measure_ceilings().copy_bandwidth == 4.0e12 and calls == []  # and trusted next time


def test_a_corrupt_cache_during_measurement_is_rebuilt_too(monkeypatch):
    calls = []
    _fake_gpu(monkeypatch, calls)
    path = hardware.cache_path("Test GPU", torch.__version__)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="is corrupt"):
        c = hardware.cached_or_copy_only()
    assert c.matmul_flops and hardware.load_cached_ceilings(path).copy_bandwidth == 4.0e12


def test_no_cache_is_not_a_warning(tmp_path, recwarn):
    assert hardware.load_cached_ceilings(tmp_path / "missing.json") is None
    assert not recwarn.list
