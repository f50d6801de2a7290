"""Load-time graph rewrites that onnxruntime also makes (so results stay comparable), done on
the parsed graph before it is traced.

``fold_batch_norms``: a BatchNormalization (inference form) whose input is a Conv output read by
nothing else, with constant weights and statistics, is folded into that Conv:
``w' = w * s``, ``b' = (b - mean) * s + beta`` per output channel, ``s = gamma / sqrt(var + eps)``.
The folded weights are computed once with ember ops on the model's device.
"""
from __future__ import annotations

import ember as E

from .. import dtypes as _dt


def _float_attr(node, name, default):
    a = node.attrs.get(name)
    return default if a is None or a.value is None else float(a.value)


def fold_batch_norms(graph, consts: dict, protected=()) -> int:
    """Fold Conv -> BatchNormalization pairs of ``graph`` in place (``consts``: initializer
    name -> Tensor, updated with the folded weights); returns how many were folded.
    ``protected``: value names that must stay (graph outputs)."""
    producer = {}
    readers = {}
    for n in graph.nodes:
        for o in n.outputs:
            producer[o] = n
        for i in n.inputs:
            if i:
                readers[i] = readers.get(i, 0) + 1
    graph_inputs = {vi.name for vi in graph.inputs} - set(consts)
    protected = set(protected)
    drop = set()
    folded = 0
    for bn in graph.nodes:
        if bn.op_type != "BatchNormalization" or (bn.domain or "ai.onnx") not in ("ai.onnx", "onnx"):
            continue
        if len(bn.inputs) != 5 or len([o for o in bn.outputs if o]) != 1 or not bn.outputs[0]:
            continue
        if set(bn.attrs) - {"epsilon", "momentum", "spatial", "is_test", "consumed_inputs"}:
            continue                       # training_mode or anything unusual: leave it to the handler
        if "spatial" in bn.attrs and bn.attrs["spatial"].value not in (None, 1):
            continue
        x, scale, beta, mean, var = bn.inputs
        conv = producer.get(x)
        if conv is None or conv.op_type != "Conv" or (conv.domain or "ai.onnx") not in ("ai.onnx", "onnx"):
            continue
        if readers.get(x, 0) != 1 or x in protected or len(conv.outputs) != 1:
            continue
        w_name = conv.inputs[1]
        b_name = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else None
        params = [w_name, scale, beta, mean, var] + ([b_name] if b_name else [])
        if any(p not in consts or p in graph_inputs for p in params):
            continue
        w, g, bt, mu, v = (consts[p] for p in (w_name, scale, beta, mean, var))
        if w.dtype is not _dt.float32 or w.ndim < 3 or any(t.shape != (w.shape[0],) for t in (g, bt, mu, v)):
            continue
        if b_name and consts[b_name].shape != (w.shape[0],):
            continue
        dev = w.device
        g, bt, mu, v = (t.to(dev) for t in (g, bt, mu, v))
        s = E.divide(g, E.sqrt(E.add(v, _float_attr(bn, "epsilon", 1e-5))))
        w2 = E.multiply(w, E.reshape(s, (w.shape[0],) + (1,) * (w.ndim - 1)))
        b0 = consts[b_name].to(dev) if b_name else E.zeros((w.shape[0],), dtype=_dt.float32, device=dev)
        b2 = E.add(E.multiply(E.subtract(b0, mu), s), bt)
        tag = bn.outputs[0]
        consts[f"{tag}::folded_w"] = w2
        consts[f"{tag}::folded_b"] = b2
        conv.inputs = [conv.inputs[0], f"{tag}::folded_w", f"{tag}::folded_b"]
        conv.outputs = [bn.outputs[0]]
        drop.add(id(bn))
        folded += 1
    if folded:
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
        for i, n in enumerate(graph.nodes):
            n.index = i
    return folded
