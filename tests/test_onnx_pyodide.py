"""ember.onnx inside real Pyodide (Python 3.14, no numpy, no onnx package) under Node: the
run-time loader and the code generator on the fixture models, checked against onnxruntime's
outputs computed here on the host. Uses wasm/run_pyodide.mjs like tests/test_pyodide.py."""
from __future__ import annotations

import json
import os
import textwrap

import numpy as np

from onnx_helpers import reference
from test_pyodide import REPO, _wheel, need_node, run_driver

FIX = REPO / "tests" / "fixtures" / "onnx"

DRIVER = textwrap.dedent('''
    import json, sys
    import ember, ember.onnx
    from ember.onnx.codegen import generate
    io = json.load(open("/io/inputs.json"))
    out = {"numpy_loaded": "numpy" in sys.modules, "version": list(sys.version_info[:2])}
    for name, x in io.items():
        m = ember.onnx.load(f"/fix/{name}.onnx")              # external data read from /fix too
        out[name] = m(ember.tensor(x)).tolist()
    r = generate("/fix/mnist_cnn.onnx", "/tmp/gen", progress=False)
    sys.path.insert(0, "/tmp/gen")
    import mnist_cnn
    out["generated"] = mnist_cnn.load()(ember.tensor(io["mnist_cnn"])).tolist()
    out["numpy_loaded"] = out["numpy_loaded"] or "numpy" in sys.modules
    json.dump(out, open("/io/out.json", "w"))
''')


def test_onnx_in_pyodide(tmp_path_factory):
    node = need_node()
    wheel = _wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("onnx-pyodide-io")
    rng = np.random.default_rng(11)
    inputs = {"mnist_cnn": rng.standard_normal((2, 1, 28, 28)).astype(np.float32),
              "mnist_cnn_ext": rng.standard_normal((1, 1, 28, 28)).astype(np.float32),
              "encoder_block": rng.standard_normal((1, 5, 32)).astype(np.float32)}
    (io / "inputs.json").write_text(json.dumps({k: v.tolist() for k, v in inputs.items()}))
    proc = run_driver(node, wheel, io, DRIVER, {FIX: "/fix", io: "/io"})
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    out = json.loads((io / "out.json").read_text())
    assert out["version"][0] == 3 and out["version"][1] >= 12
    assert not out["numpy_loaded"]
    for name, x in inputs.items():
        path = os.path.join(FIX, name + ".onnx")
        if name.endswith("_ext"):
            import onnxruntime as ort
            want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
        else:
            with open(path, "rb") as f:
                want = reference(f.read(), {("tokens" if "encoder" in name else "image"): x})[0]
        np.testing.assert_allclose(np.array(out[name], np.float32), want, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(np.array(out["generated"], np.float32),
                               reference(open(os.path.join(FIX, "mnist_cnn.onnx"), "rb").read(),
                                         {"image": inputs["mnist_cnn"]})[0], rtol=1e-4, atol=1e-5)
