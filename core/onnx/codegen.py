"""``ember import model.onnx -o OUTDIR``: turn an ONNX model into a readable ember module.

Writes ``OUTDIR/<name>.py`` — an ``ember.nn.Module`` whose ``__init__`` declares the weights and
whose ``forward`` has one line per ONNX node, each with a shape comment — and
``OUTDIR/<name>.safetensors`` with the weights, keyed by the module's attribute names.

The generator does not have its own op table: it traces the graph with the run-time loader's
handlers (``ember.onnx.ops``) and writes down every ember call a handler makes
(``TraceCtx.call`` reports them to a ``Recorder``). Nodes whose values are all known at import
time (shape arithmetic on fixed shapes, Constant...) are folded away. With symbolic input dims
the graph is traced twice with different sizes; a node whose recorded call differs between the
two traces (it baked a size into its arguments) is written as a generic
``onnxf.node("OpType", ...)`` call, which runs the op table at run time, so the module works
for every size.

Identifiers come from the model through ``_ident`` (``[A-Za-z0-9_]`` only) and every literal
through ``repr`` of an int/float/str/bool, so a hostile model cannot inject code.
"""
from __future__ import annotations

import keyword
import math
import os
import re
import sys

from .. import dtypes as _dt
from ..errors import OnnxError
from ..tensor import Tensor
from . import proto
from .runtime import DEVICE, HOST, HOST_LIMIT, analyze, const_device, read_model, tensor_from_proto


class Unrenderable(Exception):
    """A handler passed something the recorder cannot write as code (internal)."""


_PH = re.compile("\x00([VT])(\\d+)\x00")


def _fn_name(fn) -> str:
    import ember
    from . import functional

    name = getattr(fn, "__name__", None)
    if name and getattr(ember, name, None) is fn:
        return f"ember.{name}"
    if name and getattr(functional, name, None) is fn:
        return f"onnxf.{name}"
    raise Unrenderable(f"function {fn!r}")


def _literal(v) -> str:
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return repr(int(v))
    if isinstance(v, float):
        if math.isnan(v):
            return "math.nan"
        if math.isinf(v):
            return "math.inf" if v > 0 else "-math.inf"
        return _short_float(float(v))
    if isinstance(v, str):
        return repr(str(v))
    if isinstance(v, _dt.DType):
        return f"ember.{v.name}"
    raise Unrenderable(f"value {type(v).__name__}")


def _short_float(v: float) -> str:
    """The shortest text for a float that came from a float32 attribute (1e-05, not
    9.999999747378752e-06); other floats keep their full repr."""
    import struct
    try:
        f32 = struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return repr(v)
    if f32 != v:
        return repr(v)
    for p in range(1, 10):
        s = f"{v:.{p}g}"
        if struct.unpack("<f", struct.pack("<f", float(s)))[0] == f32:
            return repr(float(s))
    return repr(v)


class Recorder:
    """Collects, per traced node, the lines of Python its handler's calls amount to. Value
    names are shared between the recorders of the two traces (``names``) so their lines can be
    compared as text."""

    def __init__(self, names: dict):
        self.names = names          # ONNX value name -> index (V placeholders)
        self.templates = {}         # node index -> tuple of (targets, expr) or None (generic)
        self.known = {}             # id(obj) -> (obj, placeholder string)
        self.aliases = {}           # ONNX value name -> placeholder of the value it is
        self._reset()

    def _reset(self):
        self.exprs = []             # intermediate n -> expr template
        self.lengths = []           # intermediate n -> its length if the call returned a tuple
        self.bad = False

    def _v(self, name):
        idx = self.names.setdefault(name, len(self.names))
        return f"\x00V{idx}\x00"

    def begin(self, node, ins):
        self._reset()
        for name, v in zip(node.inputs, ins):
            if name and isinstance(v, Tensor):
                self.known[id(v)] = (v, self.aliases.get(name, self._v(name)))

    def generic(self, node):
        self.templates[node.index] = None

    def skip(self, node, ins, outs):
        """A node the second trace reused from the first: same aliasing as ``end`` would give."""
        for name, v in zip(node.outputs, outs):
            if not name or not isinstance(v, Tensor):
                continue
            same = [i for i, x in zip(node.inputs, ins) if i and x is v]
            if same:
                self.aliases[name] = self.aliases.get(same[0], self._v(same[0]))
            else:
                self.known[id(v)] = (v, self._v(name))
        self.templates[node.index] = "reused"

    # rendering ----------------------------------------------------------------------------------
    def _render(self, v, top=True) -> str:
        if isinstance(v, Tensor) or isinstance(v, list) and id(v) in self.known:
            hit = self.known.get(id(v))
            if hit is None:
                raise Unrenderable("a tensor not produced by a recorded call")
            return hit[1]
        if v is DEVICE:
            return "device"
        if isinstance(v, (list, tuple)):
            items = [self._render(x, False) for x in v]
            if isinstance(v, tuple):
                return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
            return "[" + ", ".join(items) + "]"
        if isinstance(v, slice):
            a = "" if v.start is None else _literal(v.start)
            b = "" if v.stop is None else _literal(v.stop)
            return f"{a}:{b}" + ("" if v.step is None else f":{_literal(v.step)}")
        if callable(v) and not isinstance(v, _dt.DType):
            return _fn_name(v)
        return _literal(v)

    def render_call(self, fn, args, kw):
        if self.bad:
            return None
        import operator
        try:
            if fn is operator.getitem:
                key = args[1] if isinstance(args[1], tuple) else (args[1],)
                expr = self._render(args[0]) + "[" + ", ".join(self._render(k) for k in key) + "]"
            else:
                parts = [self._render(a) for a in args]
                parts += [f"{k}={self._render(v)}" for k, v in kw.items()]
                expr = f"{_fn_name(fn)}(" + ", ".join(parts) + ")"
        except Unrenderable:
            self.bad = True
            return None
        return expr

    def bind(self, pending, out):
        if pending is None:
            return
        n = len(self.exprs)
        self.exprs.append(pending)
        self.lengths.append(len(out) if isinstance(out, (tuple, list)) else None)
        ph = f"\x00T{n}\x00"
        if isinstance(out, (tuple, list)):
            self.known[id(out)] = (out, ph)
            for i, o in enumerate(out):
                self.known[id(o)] = (o, f"{ph}[{i}]")
        else:
            self.known[id(out)] = (out, ph)

    def end(self, node, outs):
        if self.bad:
            self.templates[node.index] = None
            return
        targets = {}
        for name, v in zip(node.outputs, outs):
            if not name:
                continue
            hit = self.known.get(id(v))
            if hit is None:
                self.templates[node.index] = None
                return
            targets[name] = hit[1]
        # How often each intermediate is read: by other intermediates and by the outputs.
        texts = list(self.exprs) + list(targets.values())
        uses = [sum(t.count(f"\x00T{n}\x00") for t in texts) for n in range(len(self.exprs))]
        # A node whose outputs are exactly the elements of one tuple-valued call: `a, b = f(...)`.
        names = [n for n in node.outputs if n]
        lines = []
        m = re.fullmatch("\x00T(\\d+)\x00\\[0\\]", targets.get(names[0], "")) if names else None
        unpack = None
        if m and len(names) > 1:    # (one name: `y = f(...)[0]`, the call may return (y,) or (y, s))
            k = int(m.group(1))
            if all(targets[nm] == f"\x00T{k}\x00[{i}]" for i, nm in enumerate(names)) and uses[k] == len(names) \
                    and self.lengths[k] == len(names):
                unpack = k
        hoist = {n for n, u in enumerate(uses) if u > 1 and n != unpack}

        def inline(text):
            def sub(mo):
                kind, idx = mo.group(1), int(mo.group(2))
                if kind == "T" and idx not in hoist and idx != unpack:
                    return inline(self.exprs[idx])
                return mo.group(0)
            return _PH.sub(sub, text)

        for n in sorted(hoist):
            lines.append(((f"\x00T{n}\x00",), inline(self.exprs[n])))
        if unpack is not None:
            lines.append((tuple(self._v(nm) for nm in names), inline(self.exprs[unpack])))
        else:
            for nm in names:
                t = targets[nm]
                if t.startswith("\x00V") and t.endswith("\x00") and _PH.fullmatch(t):
                    self.aliases[nm] = t            # the output IS an input (Identity)
                    continue
                lines.append(((self._v(nm),), inline(t)))
        self.templates[node.index] = tuple(lines)
        for nm, v in zip(node.outputs, outs):
            if nm and isinstance(v, Tensor):
                self.known[id(v)] = (v, self.aliases.get(nm, self._v(nm)))


# ---- identifiers -------------------------------------------------------------------------------

_RESERVED = set(keyword.kwlist) | {"ember", "onnxf", "nn", "math", "self", "device", "super", "print",
                                   "len", "range", "list", "tuple", "dict", "int", "float", "str",
                                   "bool", "type", "object", "input", "load", "os"}


def _ident(name: str, fallback: str = "v", lower: bool = False) -> str:
    s = name
    for suffix in ("_output_0", ":0"):
        if s.endswith(suffix) and len(s) > len(suffix):
            s = s[: -len(suffix)]
    s = re.sub(r"[^0-9A-Za-z_]+", "_", s).strip("_")
    s = re.sub(r"_+", "_", s)
    if not s:
        s = fallback
    if s[0].isdigit():
        s = f"{fallback}{s}"
    if lower:
        s = s.lower()
    if s in _RESERVED or keyword.iskeyword(s):
        s += "_"
    return s[:60]


class _Names:
    def __init__(self):
        self.used = set(_RESERVED)

    def new(self, name, fallback="v"):
        base = _ident(name, fallback, lower=True)
        s = base
        k = 2
        while s in self.used:
            s = f"{base}_{k}"
            k += 1
        self.used.add(s)
        return s


def _class_name(stem: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", stem)
    s = "".join(p[:1].upper() + p[1:] for p in parts if p) or "Model"
    if s[0].isdigit():
        s = "Model" + s
    return s


# ---- progress --------------------------------------------------------------------------------

class _Progress:
    def __init__(self, total_bytes, enabled):
        self.total = max(total_bytes, 1)
        self.done = 0
        self.on = enabled and total_bytes > (8 << 20)
        self.last = -1

    def step(self, n, what):
        self.done += n
        if not self.on:
            return
        pct = int(100 * self.done / self.total)
        if pct != self.last:
            self.last = pct
            bar = "#" * (pct // 4) + "-" * (25 - pct // 4)
            sys.stderr.write(f"\r[ember import] [{bar}] {pct:3d}% {what}")
            sys.stderr.flush()

    def finish(self, what):
        if self.on:
            sys.stderr.write(f"\r[ember import] [{'#' * 25}] 100% {what}\n")
            sys.stderr.flush()


# ---- the generator ------------------------------------------------------------------------------

def _shape_text(t, tb, symbols) -> str:
    if not isinstance(t, Tensor):
        return ""
    dims = []
    for i, n in enumerate(t.shape):
        nb = tb.shape[i] if isinstance(tb, Tensor) and tb.ndim == t.ndim else n
        if nb == n:
            dims.append(str(n))
        else:
            sym = [k for k, v in symbols.items() if v == n]
            dims.append(_ident(sym[0], "d") if len(sym) == 1 and ":" not in sym[0] else "?")
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def generate(model, out_dir, *, name: str | None = None, input_shapes: dict | None = None,
             device: str | None = None, progress: bool = True, class_name: str | None = None) -> dict:
    """Generate ``<out_dir>/<name>.py`` and ``<name>.safetensors`` from an ONNX model (a path or
    bytes); ``name`` defaults to the model file's name, the class is named after ``class_name``
    (default: ``name``). Returns ``{"module": path, "weights": path, "class": class name, "nodes": n,
    "generic": m}``. Raises UnsupportedOp / OnnxError like ``ember.onnx.load``."""
    import ember

    data, base_dir, stem = read_model(model)
    source = f"{stem}.onnx" if base_dir is not None else "bytes"
    name = _ident(name or stem, "model").lower()
    if device is None:
        try:
            ember.get_backend("numpy")
            device = "numpy"
        except Exception:  # noqa: BLE001  (no numpy: trace on the pure-Python backend)
            device = "python"
    mp = proto.parse_model(data)
    g = mp.graph
    opsets = dict(mp.opset_import)
    opsets.setdefault("ai.onnx", 1)
    if mp.functions:
        from .runtime import _inline_functions
        _inline_functions(mp)
        opsets = dict(mp.opset_import)
    total = sum(len(t.raw_data) if t.raw_data is not None else 0 for t in g.initializers)
    bar = _Progress(total, progress)
    consts = {}
    for t in g.initializers:
        consts[t.name] = tensor_from_proto(t, const_device(t.dims, None, device), base_dir, None,
                                           what=f"initializer {t.name!r}")
        bar.step(len(t.raw_data) if t.raw_data is not None else 0, "reading initializers")
    names_shared = {}
    an = analyze(g, consts, opsets, device, input_shapes, lambda: Recorder(names_shared))
    rec = an.recorder
    bar.finish("traced")

    inv = {i: n for n, i in names_shared.items()}
    ids = _Names()
    var = {}
    inputs = [vi for vi in g.inputs if vi.name not in consts]
    for vi in inputs:
        var[vi.name] = ids.new(vi.name, "x")
    attrs = {}        # const name -> attribute name
    # temps are renamed per node
    lines_out = []
    n_generic = 0
    env_a, env_b = an.trace, an.trace_b or {}
    uses_device = False

    def unalias(name):
        for _ in range(len(rec.aliases) + 1):
            ph = rec.aliases.get(name)
            if ph is None:
                break
            nxt = inv[int(ph[2:-1])]
            if nxt == name:
                break
            name = nxt
        return name

    def ref(name):
        name = unalias(name)
        if name in an.consts:
            if name not in attrs:
                attrs[name] = ids.new(name, "c")
            return f"self.{attrs[name]}"
        if name not in var:
            var[name] = ids.new(name, "v")
        return var[name]

    def host_ref(name):
        """A generic node's parameter input: a small integer constant (starts, ends, axes, a shape part) is
        written as a literal on the host, as the loader keeps it there (int64 ends such as
        2**63 - 1 have no place on a GPU, which holds int64 as int32); onnxf.node moves what the
        op computes on to the data's device."""
        c = an.consts.get(unalias(name))
        if c is not None and c.dtype.kind in "iub" and c.size <= HOST_LIMIT:
            return f"ember.tensor({_literal_list(c.tolist())}, dtype=ember.{c.dtype.name}, device='python')"
        return ref(name)

    for node in an.plan:
        tmpl = an.templates.get(node.index)
        shape_c = ", ".join(s for s in (_shape_text(env_a.get(o), env_b.get(o), an.symbols)
                                        for o in node.outputs if o) if s)
        if tmpl == "reused":
            tmpl = None
        if tmpl is None and node.op_type in ("Reshape", "Expand") and len(node.inputs) == 2 \
                and getattr(node.attrs.get("allowzero"), "value", 0) == 0:
            # the common dynamic-shape case, written more readably than onnxf.node(...)
            fn = "reshape" if node.op_type == "Reshape" else "expand"
            lines_out.append((f"{ref(node.outputs[0])} = onnxf.{fn}({ref(node.inputs[0])}, "
                              f"onnxf.int_list({ref(node.inputs[1])}))", shape_c, node))
            n_generic += 1
            continue
        if tmpl is None:
            n_generic += 1
            # the data (input 0) stays a module buffer on the model's device, so the node's result
            # is there too; its parameters (starts, ends, axes, shapes...) are host literals
            args = ", ".join("None" if not i else ref(i) if k == 0 else host_ref(i)
                             for k, i in enumerate(node.inputs))
            kw = ", ".join(f"{k!r}: {_attr_literal(a)}" for k, a in sorted(node.attrs.items()))
            outs = [ref(o) if o else "_" for o in node.outputs]
            lhs = ", ".join(outs) + ("," if len(outs) == 1 and len(node.outputs) > 1 else "")
            code = (f"{lhs} = onnxf.node({node.op_type!r}, [{args}], {{{kw}}}, opset={opsets.get('ai.onnx', 1)}"
                    f"{'' if len(node.outputs) == 1 else f', outputs={len(node.outputs)}'})")
            lines_out.append((code, shape_c, node))
            continue
        temps = {}
        for k, (targets, expr) in enumerate(tmpl):
            def sub(mo):
                kind, idx = mo.group(1), int(mo.group(2))
                if kind == "V":
                    return ref(inv[idx])
                if idx not in temps:
                    temps[idx] = ids.new(f"t{node.index}", "t")
                return temps[idx]
            lhs = ", ".join(_PH.sub(sub, t) for t in targets)
            rhs = _PH.sub(sub, expr)
            if "device" in re.findall(r"\bdevice\b", rhs):
                uses_device = True
            last = k == len(tmpl) - 1
            lines_out.append((f"{lhs} = {rhs}", shape_c if last else "", node if last else None))

    out_refs = [ref(vi.name) for vi in g.outputs]
    cls = _class_name(_ident(class_name, "model").lower() if class_name else name)
    # weights
    tensors = {}
    decls = []
    inits = {t.name for t in g.initializers}
    for cname, attr in sorted(attrs.items(), key=lambda kv: kv[1]):
        t = an.consts[cname]
        tensors[attr] = t
        kind = "parameter" if cname in inits and t.dtype.kind == "f" else "buffer"
        decls.append((attr, t, kind, cname))
    code = _module_source(cls, name, source, mp, inputs, var, g, decls, lines_out, out_refs, uses_device,
                          an, n_generic)
    os.makedirs(out_dir, exist_ok=True)
    py_path = os.path.join(out_dir, f"{name}.py")
    st_path = os.path.join(out_dir, f"{name}.safetensors")
    from ..io.safetensors import save_safetensors
    save_safetensors({k: (v if v.device in (HOST, "numpy") else v.to(HOST)) for k, v in tensors.items()},
                     st_path, metadata={"format": "ember", "source": source[:200]})
    with open(py_path, "w") as fh:
        fh.write(code)
    return {"module": py_path, "weights": st_path, "class": cls, "nodes": len(an.plan), "generic": n_generic}


def _attr_literal(a) -> str:
    v = a.value
    if isinstance(v, proto.TensorProto):
        t = tensor_from_proto(v, HOST, what="attribute")
        return f"ember.tensor({_literal_list(t.tolist())}, dtype=ember.{t.dtype.name})"
    if isinstance(v, list):
        if any(isinstance(x, proto.TensorProto) for x in v) or any(isinstance(x, proto.Graph) for x in v):
            raise OnnxError(f"ember import: attribute {a.name!r} holds tensors/graphs, which cannot be written out")
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, proto.Graph):
        raise OnnxError(f"ember import: attribute {a.name!r} holds a graph, which cannot be written out")
    return _literal(v)


def _literal_list(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_literal_list(x) for x in v) + "]"
    return _literal(v)


def _input_doc(vi, var):
    dt = proto.DTYPE_NAMES.get(vi.elem_type, "?").lower()
    shape = "?" if vi.shape is None else "(" + ", ".join(
        str(d) if isinstance(d, int) else _ident(d or "?", "d") for d in vi.shape) + ")"
    return f"{var}: {dt} {shape}"


def _module_source(cls, name, source, mp, inputs, var, g, decls, lines, out_refs, uses_device, an, n_generic):
    producer = re.sub(r"[^0-9A-Za-z_. +-]", "", f"{mp.producer_name} {mp.producer_version}".strip())[:60]
    opset = mp.opset_import.get("ai.onnx", 1)
    src = re.sub(r"[^0-9A-Za-z_. +-]", "_", source)[:80]
    ins = ", ".join(var[vi.name] for vi in inputs)
    out = []
    w = out.append
    w(f'"""{cls}: generated by `ember import` from {src} (ONNX opset {opset}'
      + (f", {producer}" if producer else "") + ").")
    w("")
    w(f"Weights: {name}.safetensors next to this file (load with ``load()``).")
    w("Inputs:  " + "; ".join(_input_doc(vi, var[vi.name]) for vi in inputs))
    w("Outputs: " + "; ".join(_input_doc(vi, r) for vi, r in zip(g.outputs, out_refs)))
    if an.input_shapes:
        w("Specialised at import to the input shapes " + ", ".join(
            f"{_ident(k, 'x')}={tuple(v)}" for k, v in sorted(an.input_shapes.items())) + ".")
    if n_generic:
        w(f"{n_generic} node(s) take arguments that depend on input sizes or data (a reshape to a shape")
        w("computed from x.shape...): they read them at run time (onnxf.reshape/expand/node).")
    w('"""')
    w("import math  # noqa: F401")
    w("import os")
    w("")
    w("import ember")
    w("from ember import nn")
    w("from ember.onnx import functional as onnxf  # noqa: F401")
    w("")
    w("")
    w(f"class {cls}(nn.Module):")
    w("    def __init__(self, device: str | None = None):")
    w("        super().__init__()")
    for attr, t, kind, cname in decls:
        shape = "(" + ", ".join(str(s) for s in t.shape) + ("," if t.ndim == 1 else "") + ")"
        # the ONNX name, through repr (a comment must not end early on a newline in the name)
        comment = f"  # ONNX {cname!r}"[:120] if cname != attr else ""
        if kind == "parameter":
            w(f"        self.{attr} = nn.Parameter(ember.zeros({shape}, dtype=ember.{t.dtype.name}, device=device)){comment}")
        else:
            w(f"        self.register_buffer({attr!r}, ember.zeros({shape}, dtype=ember.{t.dtype.name}, device=device)){comment}")
    if not decls:
        w("        pass")
    w("")
    w(f"    def forward(self, {ins}):" if ins else "    def forward(self):")
    if uses_device:
        w(f"        device = {var[inputs[0].name]}.device" if inputs else "        device = ember.default_device()")
    for code, shape, _node in lines:
        line = f"        {code}"
        if shape:
            line += f"  # {shape}"
        w(line)
    w("        return " + (", ".join(out_refs) if out_refs else "None"))
    w("")
    w("")
    w(f"def load(weights: str | None = None, device: str | None = None) -> {cls}:")
    article = "An" if cls[:1] in "AEIOU" else "A"
    w(f'    """{article} {cls} with its weights (default: {name}.safetensors next to this file) on ``device``."""')
    w(f"    model = {cls}(device)")
    w(f"    path = weights or os.path.join(os.path.dirname(os.path.abspath(__file__)), {name + '.safetensors'!r})")
    w("    model.load_state_dict(ember.load_safetensors(path, device=device), assign=True)  # keep them on device")
    w("    return model")
    return "\n".join(out) + "\n"
