"""Work budgets for loading and running ONNX models, so a few hostile bytes cannot make ember
work for hours (issue 12).

One ``Budget`` per load covers the work loading does on the model's behalf:

- ``inlined_nodes``: nodes that inlining model-local functions may create (functions calling
  each other several times per level grow exponentially). Over it: OnnxError naming the
  function.
- ``trace_iterations``: Loop/Scan iterations run while loading, each counted as many times as its
  body has nodes (all loops together, nested ones included). Over it: the loop is left to run time.
- ``fold_work``: estimated element operations of constant folding (a matmul counts
  ``out.size * K``; a tensor with a zero-size axis still costs its longest axis), separately for
  the pure-Python device (``"python"``) and the others. Over it: the value is left to run time.

One ``Budget`` per call covers ``loop_iterations`` and ``loop_nodes``: the Loop/Scan iterations of
one model call, and the nodes their bodies run, all loops together (a Loop nested in a Loop shares
them). Over either: OnnxError naming the node. The defaults keep a hostile loop under about two
seconds on the pure-Python device; ``set_limits`` raises them for a model that needs more.

>>> import ember.onnx
>>> old = ember.onnx.set_limits(loop_iterations=50_000)    # returns the previous values
>>> old["loop_iterations"], ember.onnx.get_limits()["loop_iterations"]
(5000, 50000)
>>> _ = ember.onnx.set_limits(**old)
"""
from __future__ import annotations

from contextlib import contextmanager
from math import prod

from ..errors import OnnxError

_DEFAULTS = {
    "inlined_nodes": 100_000,       # nodes created by function inlining, per load
    "inline_factor": 64,            # ... and at most this many times the nodes the file holds
    "trace_iterations": 4_000,      # Loop/Scan iterations x body nodes run while loading, per load
    "fold_work_python": 4_000_000,  # estimated element ops folded at load on the "python" device
    "fold_work": 400_000_000,       # ... on the other devices
    "loop_iterations": 5_000,       # Loop/Scan iterations per model call (all loops together)
    "loop_nodes": 20_000,           # nodes run by Loop/Scan bodies per model call
}
_LIMITS = dict(_DEFAULTS)


def get_limits() -> dict:
    """The current limits (a copy)."""
    return dict(_LIMITS)


def set_limits(**limits) -> dict:
    """Change limits (``loop_iterations=10**6``, ...); returns the previous values of all of
    them, so ``set_limits(**old)`` restores them. Counts must be non-negative integers."""
    old = dict(_LIMITS)
    for k, v in limits.items():
        if k not in _DEFAULTS:
            raise OnnxError(f"ember.onnx.set_limits: unknown limit {k!r}; have {', '.join(sorted(_DEFAULTS))}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise OnnxError(f"ember.onnx.set_limits: {k} must be a non-negative int, got {v!r}")
    _LIMITS.update(limits)
    return old


@contextmanager
def limits(**kw):
    """``with ember.onnx.limits(loop_iterations=10**6): ...`` -- set limits for a block."""
    old = set_limits(**kw)
    try:
        yield
    finally:
        _LIMITS.clear()
        _LIMITS.update(old)


class Budget:
    """What is left of the limits for one load (or one call)."""

    def __init__(self):
        self.left = dict(_LIMITS)

    # loops -----------------------------------------------------------------------------------
    def iterations(self, n: int, tracing: bool, where: str, what: str = "iterations", body_nodes: int = 0) -> bool:
        """Take ``n`` loop iterations (of a body of ``body_nodes`` nodes). While tracing, False when
        they do not fit (leave the loop to run time); at run time an OnnxError naming ``where``."""
        if tracing:
            work = n * max(1, body_nodes)
            if work <= self.left["trace_iterations"]:
                self.left["trace_iterations"] -= work
                return True
            self.left["trace_iterations"] = 0
            return False
        if n <= self.left["loop_iterations"] and n * body_nodes <= self.left["loop_nodes"]:
            self.left["loop_iterations"] -= n
            self.left["loop_nodes"] -= n * body_nodes
            return True
        if n > self.left["loop_iterations"]:
            key, what = "loop_iterations", f"Loop/Scan {what}"
        else:
            key, what = "loop_nodes", "nodes run by Loop/Scan bodies"
        raise OnnxError(f"{where}: the model asks for more than {_LIMITS[key]:,} {what} in one call (all "
                        f"loops together); refused. Raise the limit with ember.onnx.set_limits({key}=N) if "
                        f"the model really needs them")

    # folding ---------------------------------------------------------------------------------
    def fold(self, work: int, device: str) -> bool:
        """Whether folding ``work`` estimated element ops on ``device`` fits (taken if so)."""
        key = "fold_work_python" if device == "python" else "fold_work"
        if work <= self.left[key]:
            self.left[key] -= work
            return True
        return False


def node_limit(n_file_nodes: int) -> int:
    """How many nodes inlining functions may produce for a file holding ``n_file_nodes``."""
    return min(_LIMITS["inlined_nodes"], max(10_000, _LIMITS["inline_factor"] * n_file_nodes))


_CONTRACTIONS = {"matmul", "gemm", "linear", "matmul_integer", "qlinear_matmul", "tensordot", "vecdot",
                 "dynamic_quantize_matmul", "matmul_nbits", "fused_matmul"}


def estimate_work(fn, ins, outs) -> int:
    """Element operations ``fn`` would do on tensors ``ins`` giving ``outs`` (meta probes are fine):
    the larger of the input and output sizes, times the contracted size for matmul-like ops and
    convolutions, plus the longest axis of any tensor (a zero-size tensor with a 10**12 axis is
    not free to loop over)."""
    size_in = sum(t.size for t in ins)
    size_out = sum(t.size for t in outs)
    longest = max((d for t in list(ins) + list(outs) for d in t.shape), default=0)
    work = max(size_in, size_out)
    name = getattr(fn, "__name__", "")
    if name in _CONTRACTIONS or "matmul" in name:
        k = max((t.shape[-1] for t in ins if t.ndim >= 1), default=1)
        work = max(work, size_out * k)
    elif name.startswith("conv") or "conv" in name:
        ws = [t for t in ins if t.ndim >= 3]
        if len(ws) >= 2:
            w = ws[1]
            per = prod(w.shape[1:])
            work = max(work, size_out * per, size_in * per)
    elif name == "einsum":
        work = max(work, size_out * max(longest, 1))
    return work + longest
