"""Memory of a loaded GGUF model: what ember holds and what a load allocates, against the file's
size (issue 18: resident memory <= 1.3x the file). Measured with tracemalloc (Python objects and
numpy arrays) and the sizes of the buffers the model holds, on a generated llama whose weights
dominate the file (a 256-token vocabulary, so the tokenizer's objects are small next to them):

- python / wasm devices: the weights are int32 arrays filled with one copy each, from a path
  (mapped or, as in Pyodide, read piece by piece) or from bytes: the load's peak is the weights
  plus small change, never a second copy of the file;
- numpy from a path: the weights are views of the memory map (no copy at all).
"""
from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import pytest

import ember
import ember.llm
from ember.errors import DeviceError
from ember.io import gguf as gguf_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_fixtures import write_tiny_gguf  # noqa: E402

pytest.importorskip("gguf")
BIG = dict(n_layers=2, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=512, ctx=64)
LIMIT = 1.3


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mem") / "big.gguf"
    write_tiny_gguf(path, seed=3, cfg=BIG)
    return path


def _devices():
    out = ["python", "numpy"]
    try:
        ember.get_backend("wasm")
        out.append("wasm")
    except DeviceError:
        pass
    return out


def _held(llm) -> int:
    """Bytes of the buffers a loaded model holds (weights and RoPE tables)."""
    def size(t):
        b = t._buf
        return b.nbytes if hasattr(b, "nbytes") else len(b) * b.itemsize
    m = llm.model
    return sum(size(w.data if hasattr(w, "qtype") else w) for w in m.w.values()) + size(m.cos) + size(m.sin)


def _measure(load):
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        obj = load()
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return obj, now - base, peak - base


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("source", ["path", "bytes", "path-unmapped"])
def test_a_loaded_model_costs_about_its_file(model_file, device, source, monkeypatch):
    size = model_file.stat().st_size
    data = model_file.read_bytes() if source == "bytes" else None
    if source == "path-unmapped":   # what Pyodide does: header first, then each tensor read into its buffer
        monkeypatch.setattr(gguf_mod, "_MAP_FILES", False)
        monkeypatch.setattr(gguf_mod, "_FIRST_READ", 1000)   # the header is read in several rounds
    ember.get_backend(device)      # the backend's own set-up and the modules' imports are not the model's
    ember.llm.load(str(model_file), device=device, context=16)
    llm, now, peak = _measure(lambda: ember.llm.load(data if data is not None else str(model_file),
                                                     device=device, context=16))
    held = _held(llm)
    print(f"\n{device} from {source}: file {size / 1e6:.2f} MB, model buffers {held / size:.2f}x, "
          f"allocated after the load {now / size:.2f}x, peak during it {peak / size:.2f}x")
    assert held <= 1.02 * size                       # the weights at their block size, nothing expanded
    if device == "numpy" and source != "bytes":
        if source == "path":                          # views of the map: nothing copied
            assert now <= 0.2 * size, now / size
    elif device == "numpy":
        assert peak <= 0.2 * size, peak / size        # views of the caller's bytes
    else:
        assert peak <= LIMIT * size, peak / size      # one copy, no transient second one
        assert now <= LIMIT * size, now / size
    # and it still computes the same thing
    ref = ember.llm.load(str(model_file), device="numpy", context=16)
    assert llm.generate("the", max_tokens=2) == ref.generate("the", max_tokens=2)


def test_an_unmapped_file_reads_the_same_tensors(model_file, monkeypatch):
    mapped = ember.load_gguf(str(model_file))
    monkeypatch.setattr(gguf_mod, "_MAP_FILES", False)
    monkeypatch.setattr(gguf_mod, "_FIRST_READ", 64)
    unmapped = ember.load_gguf(str(model_file))
    assert unmapped.metadata == mapped.metadata and unmapped.tensors == mapped.tensors
    for name in list(mapped.tensors)[:6]:
        assert bytes(unmapped.raw(name)) == bytes(mapped.raw(name))
        a, b = mapped.tensor(name, device="python"), unmapped.tensor(name, device="python")
        assert (a.data if hasattr(a, "qtype") else a).tolist() == (b.data if hasattr(b, "qtype") else b).tolist()
    unmapped.close()


def test_a_truncated_unmapped_file_is_a_gguf_error(model_file, tmp_path, monkeypatch):
    from ember.errors import GGUFError

    monkeypatch.setattr(gguf_mod, "_MAP_FILES", False)
    monkeypatch.setattr(gguf_mod, "_FIRST_READ", 64)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_file.read_bytes()[:5000])
    with pytest.raises(GGUFError, match="truncated"):
        ember.load_gguf(str(cut))
