#!/usr/bin/env python3
"""ONNX conformance report: the official ``onnx.backend.test`` node cases through ember's
run-time loader (``ember.onnx.load``), per backend, with a per-case timeout.

    python build.py onnx-report                 # python and numpy (and webgpu where it exists)
    python tests/onnx_report.py --devices numpy --ops Conv,Resize -v

Writes a markdown table to stdout and to ``onnx_report.md`` (repo root): per op, cases
passed / failed / unsupported / skipped per backend, then totals. A case is one ONNX model
with one or more input/output data sets; it passes when every output matches the reference
(``np.testing.assert_allclose`` with the case's rtol/atol, after mapping the reference dtype
the way ember reads it: float64 -> float32) in dtype and shape.

Outcomes: ``pass``; ``fail`` (wrong values/shape/dtype, or an error while running);
``unsupported`` (UnsupportedOp at load or run: op, attribute or dtype ember does not have);
``timeout``; ``skip`` (the python backend skips cases whose inputs hold more than
``--python-max`` elements, reported separately); ``n/a`` (a case the harness cannot express,
e.g. sequence or optional inputs).

The headline number is the pass rate over the "core" cases: those whose inputs and outputs are
all float32, int64 or bool (the dtypes models use), as the brief asks; the rate over all cases
is printed next to it.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_DTYPES = {"float32", "int64", "bool"}


def _cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import numpy as np  # noqa: F401
        from onnx.backend.test.case.node import collect_testcases
        import io
        import contextlib
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return collect_testcases(None)


def _op_of(case):
    name = case.name[len("test_"):]
    # the op is the node type of a single-node model; expanded (function body) cases say so
    nodes = case.model.graph.node
    op = nodes[0].op_type if len(nodes) == 1 else None
    if op is None:
        # "test_layer_normalization_..._expanded": the first real op mentioned by the name
        op = name.split("_expanded")[0]
        return op + " (expanded)"
    return op


def _dtype_names(case):
    import numpy as np
    names = set()
    for inputs, outputs in _arrays(case):
        for a in list(inputs) + list(outputs):
            if isinstance(a, np.ndarray) or np.isscalar(a):
                names.add(np.asarray(a).dtype.name)
            else:
                names.add(type(a).__name__)
    return names


def _arrays(case):
    """The case's data sets as numpy arrays (TensorProtos decoded, bfloat16 widened to float32,
    which is how ember reads BFLOAT16)."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    def conv(a):
        if isinstance(a, TensorProto):
            a = numpy_helper.to_array(a)
        if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
            a = a.astype(np.float32)
        return a
    return [([conv(a) for a in inputs], [conv(a) for a in outputs]) for inputs, outputs in case.data_sets]


def run_case(case, device, python_max):
    """Return (outcome, detail)."""
    import numpy as np
    import ember
    import ember.onnx
    from ember.errors import UnsupportedOp

    data_sets = _arrays(case)
    for inputs, outputs in data_sets:
        for a in list(inputs) + list(outputs):
            if not isinstance(a, np.ndarray) and not np.isscalar(a):
                return "n/a", f"{type(a).__name__} input/output"
    if device == "python":
        n = sum(np.asarray(a).size for inputs, _ in data_sets for a in inputs)
        if n > python_max:
            return "skip", f"{n} input elements"
    data = case.model.SerializeToString()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ember.onnx.load(data, device=device)
    except UnsupportedOp as e:
        return "unsupported", str(e)
    except Exception as e:  # noqa: BLE001
        return "fail", f"load: {type(e).__name__}: {e}"
    for inputs, outputs in data_sets:
        try:
            feeds = {}
            for name, a in zip(model.input_names, inputs):
                a = np.asarray(a)
                feeds[name] = ember.from_numpy(a, device=device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = model.run(feeds)
        except UnsupportedOp as e:
            return "unsupported", str(e)
        except Exception as e:  # noqa: BLE001
            return "fail", f"run: {type(e).__name__}: {e}"
        bf16 = {o.name for o in case.model.graph.output if o.type.tensor_type.elem_type == 16}
        for name, ref in zip(model.output_names, outputs):
            ref = np.asarray(ref)
            loose = 1e-2 if name in bf16 else 0.0  # ember computes BFLOAT16 graphs in float32
            t = got[name]
            want_dt = {"float64": "float32"}.get(ref.dtype.name, ref.dtype.name)
            if t.dtype.name != want_dt:
                return "fail", f"output {name}: dtype {t.dtype.name}, expected {want_dt}"
            if tuple(t.shape) != ref.shape:
                return "fail", f"output {name}: shape {t.shape}, expected {ref.shape}"
            out = t.numpy()
            try:
                if ref.dtype.kind in "fc":
                    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64),
                                               rtol=max(case.rtol, loose, 1e-5 if ref.dtype == np.float64 else 0),
                                               atol=max(case.atol, loose, 1e-6 if ref.dtype == np.float64 else 0))
                else:
                    np.testing.assert_array_equal(out, ref)
            except AssertionError as e:
                msg = " ".join(str(e).split())[:300]
                return "fail", f"output {name}: {msg}"
    return "pass", ""


def _worker(conn, python_max):
    cases = _cases()
    by_name = {c.name: c for c in cases}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, device = msg
        try:
            res = run_case(by_name[name], device, python_max)
        except BaseException as e:  # noqa: BLE001
            res = ("fail", f"harness: {type(e).__name__}: {e}\n{traceback.format_exc()[-800:]}")
        conn.send(res)


class Pool:
    """One worker process; a case that runs past the timeout kills it (and a fresh one starts)."""

    def __init__(self, python_max):
        self.python_max = python_max
        self.proc = None
        self.conn = None

    def _start(self):
        # spawn, not fork: the parent may hold an initialised GPU device (ember.devices()),
        # which a forked child cannot use
        ctx = mp.get_context("spawn")
        a, b = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(b, self.python_max), daemon=True)
        self.proc.start()
        self.conn = a

    def run(self, name, device, timeout):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send((name, device))
        # the first call also waits for the worker to collect the cases
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        else:
            self.proc.kill()
            self.proc.join()
            self.proc = None
            return "timeout", f"more than {timeout:.0f} s"
        self.proc.join()
        self.proc = None
        return "fail", "the worker process died"

    def close(self):
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default=None, help="comma-separated (default: python,numpy,webgpu where available)")
    ap.add_argument("--ops", default=None, help="only cases of these ops (comma-separated)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case (default 20)")
    ap.add_argument("--python-max", type=int, default=50_000,
                    help="the python backend skips cases with more input elements (default 50000)")
    ap.add_argument("--out", default=os.path.join(ROOT, "onnx_report.md"))
    ap.add_argument("-v", "--verbose", action="store_true", help="print every non-passing case")
    args = ap.parse_args(argv)

    sys.path.insert(0, ROOT)
    os.environ.setdefault("XDG_RUNTIME_DIR", _xdg())
    import ember

    if args.devices:
        devices = [d for d in args.devices.split(",") if d]
    else:
        avail = ember.devices()
        devices = [d for d in ("python", "numpy", "webgpu") if d in avail]
    cases = _cases()
    if args.ops:
        want = set(args.ops.split(","))
        cases = [c for c in cases if _op_of(c).replace(" (expanded)", "") in want]
    info = {c.name: (_op_of(c), _dtype_names(c) <= CORE_DTYPES) for c in cases}
    results = {d: {} for d in devices}
    t0 = time.time()
    pool = Pool(args.python_max)
    first = True
    try:
        for d in devices:
            td = time.time()
            for c in cases:
                timeout = args.timeout + (120 if first else 0)
                first = False
                outcome, detail = pool.run(c.name, d, timeout)
                results[d][c.name] = (outcome, detail)
                if args.verbose and outcome != "pass":
                    print(f"[{d}] {c.name}: {outcome}: {detail[:400]}", file=sys.stderr)
            print(f"[onnx-report] {d}: {len(cases)} cases in {time.time() - td:.0f} s", file=sys.stderr)
    finally:
        pool.close()
    text = render(cases, info, results, devices, args, time.time() - t0)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"[onnx-report] wrote {args.out}", file=sys.stderr)
    return 0


def _xdg():
    import tempfile
    d = tempfile.mkdtemp(prefix="ember-xdg-")
    os.chmod(d, 0o700)
    return d


KINDS = ("pass", "fail", "unsupported", "timeout", "skip", "n/a")


def render(cases, info, results, devices, args, seconds) -> str:
    ops = {}
    for c in cases:
        ops.setdefault(info[c.name][0], []).append(c.name)
    lines = ["# ONNX conformance (onnx.backend.test node cases)", "",
             f"ember.onnx.load on {', '.join(devices)}; {len(cases)} cases; per-case timeout "
             f"{args.timeout:.0f} s; python backend skips cases with more than {args.python_max} input "
             f"elements. Generated by `python build.py onnx-report` in {seconds:.0f} s.", "",
             "Cells: passed/total (f = failed, u = unsupported, t = timeout, s = skipped for size).", ""]
    head = "| op | " + " | ".join(devices) + " |"
    lines += ["## Totals", ""]
    lines.append("| backend | core cases passed | core pass rate | all cases passed | all pass rate | failed | "
                 "unsupported | timeout | skipped (size) | n/a |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for d in devices:
        r = results[d]
        core = [n for n in r if info[n][1]]
        core_eval = [n for n in core if r[n][0] not in ("skip", "n/a")]
        core_pass = sum(r[n][0] == "pass" for n in core_eval)
        allv = [n for n in r if r[n][0] not in ("skip", "n/a")]
        all_pass = sum(r[n][0] == "pass" for n in allv)
        cnt = {k: sum(v[0] == k for v in r.values()) for k in KINDS}
        lines.append(f"| {d} | {core_pass}/{len(core_eval)} | {100 * core_pass / max(len(core_eval), 1):.1f}% | "
                     f"{all_pass}/{len(allv)} | {100 * all_pass / max(len(allv), 1):.1f}% | {cnt['fail']} | "
                     f"{cnt['unsupported']} | {cnt['timeout']} | {cnt['skip']} | {cnt['n/a']} |")
    lines += ["", "\"core\" = every input and output is float32, int64 or bool; skipped and n/a cases are "
              "left out of the rates.", "", "## Per op", "", head, "|---|" + "---|" * len(devices)]
    for op in sorted(ops):
        cells = []
        for d in devices:
            r = [results[d][n][0] for n in ops[op]]
            cell = f"{r.count('pass')}/{len(r)}"
            extra = [f"{r.count(k)}{k[0]}" for k in ("fail", "unsupported", "timeout", "skip") if r.count(k)]
            if extra:
                cell += " (" + " ".join(extra) + ")"
            cells.append(cell)
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines += ["", "## Cases that did not pass (first backend listed; reasons shortened)", ""]
    d0 = devices[0] if devices else None
    if d0:
        for c in cases:
            outcome, detail = results[d0][c.name]
            if outcome not in ("pass",):
                lines.append(f"- `{c.name}` {outcome}: {' '.join(detail.split())[:200]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
