"""Helpers for the ONNX tests: build single-node models with ``onnx.helper``, run them through
onnxruntime (the reference) and through ember (the run-time loader, or the code generator),
and compare."""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.onnx

NP_TO_ONNX = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("float16"): TensorProto.FLOAT16,
              np.dtype("int64"): TensorProto.INT64, np.dtype("int32"): TensorProto.INT32,
              np.dtype("uint8"): TensorProto.UINT8, np.dtype("bool"): TensorProto.BOOL,
              np.dtype("float64"): TensorProto.DOUBLE}


class NodeCase:
    """One single-node model: ``op`` with ``inputs`` (name -> array; None = omitted optional),
    ``inits`` (names among the inputs stored as initializers), attributes and opset."""

    def __init__(self, id, op, inputs, attrs=None, *, opset=17, outputs=1, inits=(), rtol=1e-4, atol=1e-5,
                 skip=None):
        self.id = id
        self.op = op
        self.inputs = inputs
        self.attrs = attrs or {}
        self.opset = opset
        self.outputs = outputs
        self.inits = set(inits)
        self.rtol, self.atol = rtol, atol
        self.skip = skip or {}

    def __repr__(self):
        return self.id

    def model(self) -> bytes:
        names = list(self.inputs)
        node_inputs = [n if self.inputs[n] is not None else "" for n in names]
        while node_inputs and node_inputs[-1] == "":
            node_inputs.pop()
        outs = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, node_inputs, outs, name=f"{self.op}_node", **self.attrs)
        g_inputs, inits = [], []
        for n in names:
            a = self.inputs[n]
            if a is None:
                continue
            a = np.asarray(a)
            if n in self.inits:
                inits.append(numpy_helper.from_array(a, n))
            else:
                g_inputs.append(helper.make_tensor_value_info(n, NP_TO_ONNX[a.dtype], a.shape))
        g_outputs = [helper.make_empty_tensor_value_info(o) for o in outs]
        graph = helper.make_graph([node], self.id.replace("/", "_"), g_inputs, g_outputs, inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        return m.SerializeToString()

    def feeds(self):
        return {n: np.asarray(a) for n, a in self.inputs.items() if a is not None and n not in self.inits}


def reference(model: bytes, feeds: dict):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compare(got, want, rtol, atol, what):
    want = np.asarray(want)
    want_dt = {"float64": "float32"}.get(want.dtype.name, want.dtype.name)
    assert got.dtype.name == want_dt, f"{what}: dtype {got.dtype.name}, onnxruntime gives {want_dt}"
    assert tuple(got.shape) == want.shape, f"{what}: shape {got.shape}, onnxruntime gives {want.shape}"
    g = got.numpy()
    if want.dtype.kind == "f":
        np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=what)
    else:
        np.testing.assert_array_equal(g, want, err_msg=what)


def run_ember(model: bytes, feeds: dict, device: str):
    m = ember.onnx.load(model, device=device)
    out = m.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
    return [out[n] for n in m.output_names]


def import_generated(model, out_dir, name=None):
    """Run ``ember import`` into ``out_dir`` and import the generated module."""
    r = ember.onnx.import_model(model, out_dir, name=name, progress=False)
    mod_name = f"ember_gen_{os.path.basename(out_dir)}_{r['class']}"
    spec = importlib.util.spec_from_file_location(mod_name, r["module"])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod, r


def run_generated(model: bytes, feeds: dict, device: str):
    with tempfile.TemporaryDirectory() as d:
        mod, r = import_generated(model, d, name="m")
        net = mod.load(device=device)
        out = net(*[ember.from_numpy(v, device=device) for v in feeds.values()])
    return list(out) if isinstance(out, tuple) else [out]


def check_case(case: NodeCase, device: str, via: str = "load"):
    model = case.model()
    feeds = case.feeds()
    want = reference(model, feeds)
    got = run_ember(model, feeds, device) if via == "load" else run_generated(model, feeds, device)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        compare(g, w, case.rtol, case.atol, f"{case.id} output {i} on {device} via {via}")


def node_model(op, inputs, attrs=None, *, opset=21, inits=(), n_out=1, domain="", want=None):
    """A one-node ONNX model and its feeds: ``inputs`` is name -> array (None: an omitted
    optional input), names in ``inits`` become initializers; ``want``: indices of the outputs
    to name (others left empty); a non-default ``domain`` is imported at version 1."""
    names, vis, tps = [], [], []
    for n, a in inputs.items():
        if a is None:
            names.append("")
            continue
        names.append(n)
        a = np.asarray(a)
        if n in inits:
            tps.append(numpy_helper.from_array(a, n))
        else:
            vis.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" if want is None or i in want else "" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"{op}_node", domain=domain, **(attrs or {}))
    g = helper.make_graph([node], op, vis, [helper.make_empty_tensor_value_info(o) for o in outs if o], tps)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 3 if opset < 8 else 8 if opset < 21 else 10
    feeds = {n: np.asarray(a) for n, a in inputs.items() if a is not None and n not in inits}
    return m, feeds
