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


def _rewrite(graph, drop: set, new: dict) -> int:
    """Apply a rewrite's scan: nodes whose ids are in ``drop`` go, those in ``new`` (id -> the
    node replacing it) are replaced in place; positions renumbered. Returns ``len(new)``."""
    if drop or new:
        graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
        for i, n in enumerate(graph.nodes):
            n.index = i
    return len(new)


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
        return _onnx(n, op, 2)

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
    return _rewrite(graph, drop, new)


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
    return _rewrite(graph, drop, new)


def _onnx(n, op, nin=None) -> bool:
    """``n`` is a default-domain ``op`` node (with ``nin`` inputs where given)."""
    return n is not None and n.op_type == op and (n.domain or "ai.onnx") in ("ai.onnx", "onnx") \
        and (nin is None or len(n.inputs) == nin)


def fuse_attention(graph, consts: dict, protected=(), opset: int = 13) -> int:
    """``MatMul(softmax(MatMul(q, kt) [/ c | * c] [+ mask], axis=-1), v)``, the attention every
    exporter writes for BERT-style models, becomes one ``ai.ember`` Attention node
    (``scaled_dot_product_attention(q, kt^T, v, mask, scale)``): one kernel instead of a scores
    product, a scale, a mask add, a softmax and a second product, and no (..., L, S) scores in
    memory (onnxruntime's transformer optimizer makes the same fusion). The node falls back to
    the five ops where its inputs do not fit (see ``ember_attention`` in ops.py); a row whose
    mask is -inf at every key gives zeros there where the unfused ops give NaN."""
    from .proto import Attribute, Node
    producer, readers = _links(graph)
    protected = set(protected)

    def sole(name, reader):
        r = readers.get(name, [])
        return len(r) == 1 and r[0] is reader and name not in protected

    def scores(name):
        n = producer.get(name)
        if _onnx(n, "Div", 2) or _onnx(n, "Mul", 2):
            return any(_onnx(producer.get(i), "MatMul") for i in n.inputs)
        return _onnx(n, "MatMul")

    drop, new = set(), {}
    for sm in graph.nodes:
        if not _onnx(sm, "Softmax", 1):
            continue
        a = sm.attrs.get("axis")
        axis = a.value if a is not None else (-1 if opset >= 13 else 1)
        if axis != -1 or len(sm.outputs) != 1:
            continue
        out = readers.get(sm.outputs[0], [])
        mm2 = out[0] if len(out) == 1 else None
        if not _onnx(mm2, "MatMul", 2) or mm2.inputs[0] != sm.outputs[0] or sm.outputs[0] in protected:
            continue
        chain, mask = [mm2, sm], ""              # (chain[-1]: the node reading the value at hand)
        cur = producer.get(sm.inputs[0])
        if _onnx(cur, "Add", 2) and sole(cur.outputs[0], sm):
            s_in, m_in = cur.inputs
            if not scores(s_in) and scores(m_in):
                s_in, m_in = m_in, s_in            # the scores: the operand a product (and a scale) wrote
            chain.append(cur)
            mask = m_in
            cur_out, cur = s_in, producer.get(s_in)
            if not sole(cur_out, chain[-1]):
                continue
        else:
            cur_out = sm.inputs[0]
        scale, scale_op = "", ""
        if (_onnx(cur, "Div", 2) or _onnx(cur, "Mul", 2)) and sole(cur.outputs[0], chain[-1]):
            x, c = cur.inputs
            if cur.op_type == "Mul" and _scalar(consts, x) is not None and _scalar(consts, c) is None:
                x, c = c, x
            if _scalar(consts, c) is None:
                continue
            scale, scale_op = c, cur.op_type
            chain.append(cur)
            cur_out, cur = x, producer.get(x)
            if not sole(cur_out, chain[-1]):
                continue
        mm1 = cur
        if not _onnx(mm1, "MatMul", 2) or not sole(mm1.outputs[0], chain[-1]) or mask in mm1.outputs:
            continue
        if any(id(n) in drop for n in chain + [mm1]):
            continue
        q, kt = mm1.inputs
        node = Node()
        node.op_type, node.domain, node.name = "Attention", "ai.ember", (mm2.name or "attention") + "::fused"
        node.inputs, node.outputs = [q, kt, mm2.inputs[1], mask, scale], [mm2.outputs[0]]
        if scale_op:
            node.attrs["scale_op"] = Attribute("scale_op", 3, scale_op)
        drop.update(id(n) for n in chain + [mm1])
        new[id(mm2)] = node
    return _rewrite(graph, drop, new)


def fuse_parallel_linears(graph, consts: dict, protected=()) -> int:
    """``ai.ember`` Linear nodes (``fuse_linear``'s) that read the same input with constant
    weights of the same dtype and input width, all with a bias or all without (a BERT layer's
    query, key and value projections), become one Linear over the weights side by side whose
    output is split back into the original values (views: no copy): one GEMM three times as
    wide instead of three, which fills a GPU where each alone does not, and one weight read per
    row of x on a CPU. The concatenated weights replace the parts in ``consts``."""
    import ember as E
    from .proto import Attribute
    groups = {}
    for n in graph.nodes:
        if n.op_type != "Linear" or n.domain != "ai.ember" or len(n.outputs) != 1 or "split" in n.attrs:
            continue
        x, w = n.inputs[0], n.inputs[1]
        b = n.inputs[2] if len(n.inputs) > 2 else ""
        wt = consts.get(w)
        if wt is None or wt.ndim != 2 or (b and consts.get(b) is None):
            continue
        groups.setdefault((x, wt.shape[0], wt.dtype.name, bool(b), wt.device), []).append(n)
    _, readers = _links(graph)
    fixed = {vi.name for vi in graph.inputs} | set(protected)
    plans = []
    for (x, _k, _dt_name, has_b, _dev), nodes in groups.items():
        ws = [n.inputs[1] for n in nodes]
        if len(nodes) < 2 or len(set(ws)) != len(ws) \
                or any(w in fixed or len(readers.get(w, [])) != 1 for w in ws):
            continue
        w_all = E.concat([consts[w] for w in ws], axis=1)
        b_all = E.concat([consts[n.inputs[2]] for n in nodes], axis=0) if has_b else None
        plans.append((x, nodes, ws, w_all, b_all))
    drop, made = set(), 0
    for x, nodes, ws, w_all, b_all in plans:       # (the graph changes only after the scan)
        first = nodes[0]
        wname = f"{ws[0]}::parallel"
        consts[wname] = w_all
        first.inputs = [x, wname]
        if b_all is not None:
            consts[wname + ".bias"] = b_all
            first.inputs.append(wname + ".bias")
        first.outputs = [n.outputs[0] for n in nodes]
        first.attrs = {"split": Attribute("split", 7, [int(consts[w].shape[1]) for w in ws])}
        first.name = (first.name or "linear") + "::parallel"
        drop.update(id(n) for n in nodes[1:])
        made += len(nodes) - 1
        for w in ws:               # the parts' weights go (no other node reads them)
            consts.pop(w, None)
    _rewrite(graph, drop, {})
    return made


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


def fuse_graph(graph, consts: dict, protected=(), opset: int = 13) -> dict:
    """Every rewrite of this module, in order; returns how many of each were made.
    ``EMBER_ONNX_FUSE=off`` makes none; ``EMBER_ONNX_FUSE=-attention,-parallel_linear`` (names of
    the result's keys, each with a minus) leaves those out."""
    import os
    env = os.environ.get("EMBER_ONNX_FUSE", "on").strip()
    if env == "off":
        return {}
    skip = {w.strip()[1:] for w in env.split(",") if w.strip().startswith("-")}
    passes = (("constants", hoist_constants), ("batch_norm", fold_batch_norms), ("conv_affine", fold_conv_affine),
              ("gelu", fuse_gelu), ("linear", fuse_linear), ("parallel_linear", fuse_parallel_linears),
              ("attention", lambda g, c, p: fuse_attention(g, c, p, opset)))
    return {name: 0 if name in skip else _guarded(rewrite, graph, consts, protected) for name, rewrite in passes}


def _guarded(rewrite, graph, consts, protected) -> int:
    """Run one rewrite; a malformed node it trips over (an Erf without inputs, a MatMul with
    three) means no rewrite: each pass changes the graph only after its scan, and the load-time
    checks then report the node with an OnnxError naming it."""
    try:
        return rewrite(graph, consts, protected)
    except (IndexError, ValueError, KeyError):
        return 0
