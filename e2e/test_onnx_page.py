"""ONNX in the page: ``ember.onnx.load`` (the pure-Python protobuf reader, no onnx package, no
numpy) runs committed PyTorch-exported models inside Pyodide, on the browser's WebGPU and on the
pure-Python CPU backend, and matches onnxruntime run on the host."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx"
SYMBOLIC = {"batch": 2, "seq": 5}


def _reference(name: str):
    """Inputs (seeded) and onnxruntime's outputs for a committed model."""
    sess = ort.InferenceSession(str(FIXTURES / name), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    inputs = {}
    for i in sess.get_inputs():
        assert i.type == "tensor(float)", i.type
        shape = [d if isinstance(d, int) else SYMBOLIC[d] for d in i.shape]
        inputs[i.name] = rng.standard_normal(shape).astype(np.float32)
    return inputs, sess.run(None, inputs)


@pytest.mark.parametrize("name", ["mnist_cnn.onnx", "encoder_block.onnx"])
def test_onnx_model_in_the_page_matches_onnxruntime(webgpu_ember_page, run_python, name):
    page, info = webgpu_ember_page, webgpu_ember_page.ember_info     # one boot for both models
    inputs, want = _reference(name)
    assert info["webgpu"], f"WebGPU did not start in the page: {info['webgpuError']}"
    payload = json.dumps({k: v.tolist() for k, v in inputs.items()})
    model_b64 = base64.b64encode((FIXTURES / name).read_bytes()).decode()
    got = run_python(page, f"""
import base64, json, sys
import ember, ember.onnx
assert "numpy" not in sys.modules and "onnx" not in sys.modules
raw = base64.b64decode({model_b64!r})
feeds = json.loads({payload!r})
results = {{}}
for device in ("webgpu", "python"):
    model = ember.onnx.load(raw, device=device)
    outs = model.run({{k: ember.tensor(v, device=device) for k, v in feeds.items()}})
    results[device] = [await t.data_async() for t in outs.values()]
json.dumps(results)
""")
    got = json.loads(got)
    for device in ("webgpu", "python"):
        assert len(got[device]) == len(want)
        for g, w in zip(got[device], want):
            np.testing.assert_allclose(np.array(g, dtype=np.float32), w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} on {device} in the page vs onnxruntime")
