"""``python -m ember.examples LIST | NAME [options]``."""
from __future__ import annotations

import os
import sys

from . import EXAMPLES, load


_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _blas_threads(argv: list) -> list:
    """``--threads N`` (any example): BLAS threads, set before numpy loads. Without it and without
    the variables set, one: these examples' matmuls are small, and OpenBLAS's spinning pool on a
    busy machine is far slower (2 shared cores: 69 ms vs 4 ms for a 64x784 @ 784x256 float32
    matmul, measured 2026-12-02)."""
    n = None
    if "--threads" in argv:
        i = argv.index("--threads")
        n = argv[i + 1] if i + 1 < len(argv) else None
        argv = argv[:i] + argv[i + 2:]
        if n is None or not n.isdigit():
            raise SystemExit("ember.examples: --threads needs a number")
    if n is not None or not any(v in os.environ for v in _BLAS_VARS):
        for v in _BLAS_VARS:
            os.environ[v] = n or "1"
    return argv


def main(argv=None) -> int:
    argv = _blas_threads(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("LIST", "list", "-h", "--help"):
        print("usage: python -m ember.examples NAME [options] [--threads N]   (NAME --help for its options)\n")
        w = max(map(len, EXAMPLES))
        for name, (_, line) in EXAMPLES.items():
            print(f"  {name:<{w}}  {line}")
        return 0
    try:
        mod = load(argv[0])
    except KeyError as e:
        print(f"ember.examples: {e.args[0]}", file=sys.stderr)
        return 2
    try:
        return mod.main(argv[1:])
    except FileNotFoundError as e:     # data or demos missing (an installed wheel has no demos/)
        print(f"ember.examples {argv[0]}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
