"""``python -m ember.examples onnx``: export, import, run.

1. **Export** the MNIST demo's CNN (``demos/mnist``, with its trained weights; a small MLP with
   random weights outside a source checkout) with ``ember.onnx.export`` (batch axis dynamic).
2. **Import** it twice: at run time with ``ember.onnx.load`` (a pure-Python ONNX reader, the one
   the page uses), and as generated Python code with ``ember.onnx.import_model`` (what
   ``ember import model.onnx`` writes: an ``nn.Module`` plus safetensors, like burn-import).
3. **Run** both on every device here and compare with the original model; where onnxruntime is
   installed, with it too. The MNIST test digits give an accuracy as well.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

import ember
import ember.onnx

from . import source_root


def _model_and_inputs(n: int = 32):
    """(model, input batch, labels or None, what)."""
    root = source_root()
    if root is not None:
        from .mnist import demo_module

        mdl = demo_module().model_module()
        net = mdl.load_model(os.path.join(root, "demos", "mnist", "mnist.safetensors"), device="python")
        digits = demo_module()._load_local("ember_demo_mnist_idx", "mnist_idx.py").read_testdigits()
        x = mdl.images_tensor(digits["images"][:n], device="python")
        return net, x, digits["labels"][:n], f"the MNIST demo CNN (trained weights, {n} test digits)"
    ember.manual_seed(0)
    net = ember.nn.Sequential(ember.nn.Linear(16, 32), ember.nn.ReLU(), ember.nn.Linear(32, 10)).eval()
    return net, ember.randn(n, 16), None, "a 16-32-10 MLP (random weights; no demos/ here)"


def _diff(a, b) -> float:
    fa = [v for row in a for v in row]
    fb = [v for row in b for v in row]
    return max(abs(x - y) for x, y in zip(fa, fb))


def run(*, out_dir: str | None = None, devices=None, n: int = 32) -> dict:
    """Return {what, export (exporter's summary), path, results: {(way, device): max |diff|}, accuracy}."""
    net, x, labels, what = _model_and_inputs(n)
    out_dir = out_dir or tempfile.mkdtemp(prefix="ember-onnx-example-")
    path = os.path.join(out_dir, "model.onnx")
    with ember.no_grad():
        want = net(x).tolist()
    info = ember.onnx.export(net, (x,), path, input_names=["x"], output_names=["logits"],
                             dynamic_axes={"x": {0: "batch"}})
    gen = ember.onnx.import_model(path, os.path.join(out_dir, "generated"), name="exported", progress=False)
    spec = importlib.util.spec_from_file_location("ember_example_exported", gen["module"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results, accuracy = {}, None
    for dev in devices or ember.devices():
        xd = x.to(dev)
        got = ember.onnx.load(path, device=dev)(xd)
        got = got[0] if isinstance(got, (tuple, list)) else got
        results[("ember.onnx.load", dev)] = _diff(got.tolist(), want)
        with ember.no_grad():
            g2 = mod.load(device=dev)(xd)
        results[("ember import", dev)] = _diff(g2.tolist(), want)
        if labels is not None and accuracy is None:
            accuracy = sum(int(max(range(10), key=row.__getitem__) == lab) for row, lab in zip(got.tolist(), labels)) / len(labels)
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        pass
    else:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"x": np.array(x.tolist(), dtype=np.float32)})[0]
        results[("onnxruntime", "cpu")] = _diff(ref.tolist(), want)
    return {"what": what, "export": info, "path": path, "results": results, "accuracy": accuracy,
            "generated": gen["module"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ember.examples onnx", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for model.onnx and the generated module (default: a temp dir)")
    a = ap.parse_args(argv)
    r = run(out_dir=a.out)
    e = r["export"]
    print(f"exported {r['what']} to {r['path']}: {e['nodes']} nodes ({', '.join(e['ops'])}), "
          f"{e['initializers']} initializers")
    print(f"generated module: {r['generated']}")
    for (way, dev), d in r["results"].items():
        print(f"  {way:<16} on {dev:<7} max |diff| to the original model {d:.2e}")
    if r["accuracy"] is not None:
        print(f"  accuracy on the test digits: {r['accuracy']:.0%}")
    ok = max(r["results"].values()) < 1e-3
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
