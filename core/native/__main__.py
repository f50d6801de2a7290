"""``python -m ember.native [--if-stale]``: build the native kernels for this machine (see ``ember.native``).

With ``--if-stale`` nothing is done when the library is current. Exit status 0 when the library
is current or was built, or when there is no C compiler (then the numpy backend runs without
it and this says so); 1 when the compiler failed.
"""
from __future__ import annotations

import os
import sys
import time

from . import build, find_compiler, lib_path, up_to_date
from ..errors import DeviceError


def main(argv: list[str]) -> int:
    if "--if-stale" in argv and up_to_date():
        return 0
    if find_compiler() is None:
        print("[ember.native] no C compiler (cc, gcc or clang): the numpy backend runs without native kernels")
        return 0
    t0 = time.time()
    print(f"[ember.native] building {os.path.basename(lib_path())} with {find_compiler()}", flush=True)
    try:
        build()
    except DeviceError as exc:
        print(f"[ember.native] {exc}", file=sys.stderr)
        return 1
    print(f"[ember.native] built in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
