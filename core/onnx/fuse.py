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


def _links(graph) -> tuple[dict, dict]:
    """``producer[name]``: the node writing value ``name``; ``readers[name]``: the nodes reading it."""
    producer, readers = {}, {}
    for n in graph.nodes:
        for o in n.outputs:
            producer[o] = n
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
    return producer, readers


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


def _per_channel(consts, name, channels: int, spatial: int):
    """A float32 constant that multiplies or adds per output channel of a convolution: one
    element, or shape (C, 1, ..) / (1, C, 1, ..) (``spatial`` trailing ones); as a (C,) or
    one-element Tensor, else None."""
    t = consts.get(name)
    if t is None or t.dtype is not _dt.float32 or t.ndim > spatial + 2:    # (more axes: a wider result)
        return None
    if t.size == 1:
        return E.reshape(t, (1,))
    shape = tuple(t.shape)
    while len(shape) > spatial + 1 and shape[0] == 1:
        shape = shape[1:]
    if shape != (channels,) + (1,) * spatial:
        return None
    return E.reshape(t, (channels,))


def fold_conv_affine(graph, consts: dict, protected=()) -> int:
    """Fold ``Mul`` and then ``Add`` by per-channel (or one-element) constants that follow a Conv
    with constant weights into it, as onnxruntime's ConvMulFusion / ConvAddFusion do:
    ``(conv(x, w) + b) * s + t = conv(x, w * s) + (b * s + t)``. PaddleOCR's PP-LCNetV3 writes
    such a scale and shift after most of its convolutions; each was two more passes over the
    activations. Returns how many Mul/Add nodes were folded."""
    producer, readers = _links(graph)
    graph_inputs = {vi.name for vi in graph.inputs} - set(consts)
    protected = set(protected)
    drop, folded = set(), 0

    def onnx_op(n, op):
        return n is not None and n.op_type == op and (n.domain or "ai.onnx") in ("ai.onnx", "onnx") \
            and len(n.inputs) == 2 and len(n.outputs) == 1 and id(n) not in drop

    for conv in graph.nodes:
        if conv.op_type != "Conv" or (conv.domain or "ai.onnx") not in ("ai.onnx", "onnx") or len(conv.outputs) != 1:
            continue
        w_name = conv.inputs[1] if len(conv.inputs) > 1 else None
        b_name = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else None
        w = consts.get(w_name)
        if w is None or w_name in graph_inputs or w.dtype is not _dt.float32 or w.ndim < 3 or \
                (b_name and (b_name not in consts or b_name in graph_inputs or consts[b_name].shape != (w.shape[0],))):
            continue
        c, spatial = w.shape[0], w.ndim - 2
        wt = w
        bt = consts[b_name] if b_name else None
        out, changed = conv.outputs[0], False
        for op in ("Mul", "Add"):
            r = readers.get(out, [])
            if len(r) != 1 or out in protected or not onnx_op(r[0], op):
                break
            node = r[0]
            other = node.inputs[1] if node.inputs[0] == out else node.inputs[0]
            if other == out or other in graph_inputs:
                break
            v = _per_channel(consts, other, c, spatial)
            if v is None:
                break
            v = v.to(wt.device)
            if op == "Mul":
                wt = E.multiply(wt, E.reshape(v, (v.shape[0],) + (1,) * (w.ndim - 1)))
                if bt is not None:
                    bt = E.multiply(bt.to(wt.device), v)
            else:
                bt = E.add(bt.to(wt.device), v) if bt is not None else E.add(E.zeros((c,), device=wt.device), v)
            drop.add(id(node))
            out, changed = node.outputs[0], True
            folded += 1
        if not changed:
            continue
        tag = out
        consts[f"{tag}::conv_w"] = wt
        conv.inputs = [conv.inputs[0], f"{tag}::conv_w"]
        if bt is not None:
            consts[f"{tag}::conv_b"] = bt
            conv.inputs.append(f"{tag}::conv_b")
        conv.outputs = [out]
    if folded:
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
        for i, n in enumerate(graph.nodes):
            n.index = i
    return folded


def _scalar(consts, name):
    """The value of a one-element float constant, else None."""
    t = consts.get(name)
    if t is None or t.size != 1 or t.dtype.kind != "f":
        return None
    from .functional import flat_values
    return float(flat_values(t)[0])


def _near(v, target):
    return v is not None and abs(v - target) <= 1e-6 * abs(target)


def fuse_gelu(graph, consts: dict, protected=()) -> int:
    """Rewrite the exact-GELU subgraph exporters write, ``x * 0.5 * (1 + erf(x / sqrt 2))`` in
    its usual arrangements (Div by sqrt 2 or Mul by 1/sqrt 2; the 0.5 first or last), into one
    ``com.microsoft`` Gelu node: one kernel instead of five passes over the activations."""
    from .proto import Node
    producer, readers = _links(graph)
    protected = set(protected)

    def only_reader(name):
        r = readers.get(name, [])
        return r[0] if len(r) == 1 and name not in protected else None

    def other(node, name):
        a, b = node.inputs
        return b if a == name else a if b == name else None

    def is_op(n, op):
        return n is not None and n.op_type == op and (n.domain or "ai.onnx") in ("ai.onnx", "onnx") and len(n.inputs) == 2

    drop, new = set(), {}
    for erf in graph.nodes:
        if erf.op_type != "Erf" or (erf.domain or "ai.onnx") not in ("ai.onnx", "onnx"):
            continue
        scale = producer.get(erf.inputs[0])
        if only_reader(erf.inputs[0]) is not erf or not (is_op(scale, "Div") or is_op(scale, "Mul")):
            continue
        x, c = scale.inputs
        if scale.op_type == "Mul" and x in consts and c not in consts:
            x, c = c, x
        cv = _scalar(consts, c)
        if not (_near(cv, 2 ** 0.5) if scale.op_type == "Div" else _near(cv, 2 ** -0.5)):
            continue
        add = only_reader(erf.outputs[0])
        if not is_op(add, "Add") or not _near(_scalar(consts, other(add, erf.outputs[0])), 1.0):
            continue
        m1 = only_reader(add.outputs[0])
        if not is_op(m1, "Mul"):
            continue
        o = other(m1, add.outputs[0])
        if o == x:                                   # x * (1 + erf) then * 0.5
            m2 = only_reader(m1.outputs[0])
            if not is_op(m2, "Mul") or not _near(_scalar(consts, other(m2, m1.outputs[0])), 0.5):
                continue
            chain = (scale, erf, add, m1, m2)
        else:                                        # (x * 0.5) * (1 + erf)
            half = producer.get(o)
            if not is_op(half, "Mul") or only_reader(o) is not m1 or x not in half.inputs or \
                    not _near(_scalar(consts, other(half, x)), 0.5):
                continue
            m2 = m1
            chain = (scale, erf, add, half, m1)
        if any(id(n) in drop for n in chain):
            continue
        g = Node()
        g.op_type, g.domain, g.name = "Gelu", "com.microsoft", (m2.name or "gelu") + "::fused"
        g.inputs, g.outputs = [x], [m2.outputs[0]]
        drop.update(id(n) for n in chain)
        new[id(m2)] = g
    if not new:
        return 0
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    for i, n in enumerate(graph.nodes):
        n.index = i
    return len(new)


def fuse_linear(graph, consts: dict, protected=()) -> int:
    """``Add(MatMul(x, W), b)`` with ``W`` a constant 2-D float matrix and ``b`` a constant
    vector of its width becomes one ``ai.ember`` Linear node (``linear(x, W.T, b)``: one GEMM
    with the bias added in place, one node instead of two)."""
    from .proto import Node
    producer, readers = _links(graph)
    protected = set(protected)
    drop, new = set(), {}
    for add in graph.nodes:
        if add.op_type != "Add" or (add.domain or "ai.onnx") not in ("ai.onnx", "onnx") or len(add.inputs) != 2:
            continue
        for mm_out, b in (add.inputs, add.inputs[::-1]):
            mm = producer.get(mm_out)
            if mm is None or mm.op_type != "MatMul" or (mm.domain or "ai.onnx") not in ("ai.onnx", "onnx"):
                continue
            if len(readers.get(mm_out, [])) != 1 or mm_out in protected or id(mm) in drop:
                continue
            x, w = mm.inputs
            wt, bt = consts.get(w), consts.get(b)
            if wt is None or bt is None or x in consts or wt.ndim != 2 or wt.dtype.kind != "f" \
                    or bt.dtype is not wt.dtype or tuple(bt.shape) != (wt.shape[1],):
                continue
            node = Node()
            node.op_type, node.domain, node.name = "Linear", "ai.ember", (add.name or "linear") + "::fused"
            node.inputs, node.outputs = [x, w, b], [add.outputs[0]]
            drop.add(id(mm))
            new[id(add)] = node
            break
    if not new:
        return 0
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    for i, n in enumerate(graph.nodes):
        n.index = i
    return len(new)


def hoist_constants(graph, consts: dict, protected=()) -> int:
    """Float32 ``Constant`` nodes become initializers (entries of ``consts``, on the host as the
    Constant handler makes them), so the rewrites after this one see their values: Paddle2ONNX
    writes every weight of PP-OCR's models as a Constant node. Returns how many were hoisted."""
    from . import proto
    from .runtime import HOST, tensor_from_proto
    protected = set(protected)
    keep, n = [], 0
    for node in graph.nodes:
        a = node.attrs.get("value") if node.op_type == "Constant" else None
        if a is None or (node.domain or "ai.onnx") not in ("ai.onnx", "onnx") or set(node.attrs) != {"value"} \
                or len(node.outputs) != 1 or not node.outputs[0] or node.outputs[0] in protected \
                or node.outputs[0] in consts or not isinstance(a.value, proto.TensorProto) \
                or a.value.data_type != proto.FLOAT:
            keep.append(node)
            continue
        consts[node.outputs[0]] = tensor_from_proto(a.value, HOST, what=f"Constant {node.outputs[0]!r}")
        n += 1
    if n:
        graph.nodes = keep
        for i, node in enumerate(graph.nodes):
            node.index = i
    return n


def fuse_graph(graph, consts: dict, protected=()) -> dict:
    """Every rewrite of this module, in order; returns how many of each were made."""
    import os
    if os.environ.get("EMBER_ONNX_FUSE", "on") == "off":
        return {}
    return {"constants": _guarded(hoist_constants, graph, consts, protected),
            "batch_norm": _guarded(fold_batch_norms, graph, consts, protected),
            "conv_affine": _guarded(fold_conv_affine, graph, consts, protected),
            "gelu": _guarded(fuse_gelu, graph, consts, protected),
            "linear": _guarded(fuse_linear, graph, consts, protected)}


def _guarded(rewrite, graph, consts, protected) -> int:
    """Run one rewrite; a malformed node it trips over (an Erf without inputs, a MatMul with
    three) means no rewrite: each pass changes the graph only after its scan, and the load-time
    checks then report the node with an OnnxError naming it."""
    try:
        return rewrite(graph, consts, protected)
    except (IndexError, ValueError, KeyError):
        return 0
