"""Build ember's WebAssembly SIMD kernel module from the C sources in ``wasm/kernels/``.

    python wasm/build_kernels.py [--out PATH] [--check]

One standalone module, compiled and linked by clang + lld (Debian's ``clang`` and ``lld``
packages; ``build.py`` installs them): no emscripten, no libc, memory imported (in the page it
is Pyodide's own memory). The linked module is post-processed by ``wasmbin.strip_module``
(no globals, no table, no custom sections) and gets one custom section, ``ember.sources``,
holding the SHA-256 of the sources and flags it was built from, so anyone can tell which
sources a shipped module came from. The build is deterministic: the same sources and clang
give the same bytes (tests/test_wasm_module.py rebuilds and compares).

``--check`` exits 1 when the module at ``--out`` is missing or was built from other sources.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "kernels")
OUT = os.path.join(HERE, "kernels.wasm")
SECTION = "ember.sources"
# -ffreestanding/-fno-builtin: never call memset/memcpy (there is no libc to link);
# -mbulk-memory: a struct copy becomes memory.copy instead of a call; -mnontrapping-fptoint:
# saturating float -> int conversions (the cast semantics ember pins on every backend).
CFLAGS = ["--target=wasm32", "-O3", "-msimd128", "-mbulk-memory", "-mnontrapping-fptoint", "-nostdlib", "-ffreestanding",
          "-fno-builtin", "-std=c11", "-Wall", "-Werror", "-Wno-unused-function"]
LDFLAGS = ["-Wl,--no-entry", "-Wl,--import-memory", "-Wl,--strip-all", "-Wl,-z,stack-size=0"]


def sources() -> list:
    """The C sources and headers, sorted by name (what the hash covers)."""
    if not os.path.isdir(SRC):
        return []
    return sorted(f for f in os.listdir(SRC) if f.endswith((".c", ".h")))


def source_hash() -> str:
    h = hashlib.sha256()
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    for name in sources():
        h.update(b"\0" + name.encode() + b"\0")
        with open(os.path.join(SRC, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def embedded_hash(data: bytes):
    """The ``ember.sources`` hash of a built module, or None."""
    raw = _wasmbin().parse(data).custom().get(SECTION)
    return raw.decode("ascii") if raw is not None else None


def _wasmbin():
    try:
        from . import wasmbin
    except ImportError:  # loaded as a plain module (a script, build.py): wasmbin.py is next to it
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        import wasmbin
    return wasmbin


def find_clang():
    for name in ("clang", "clang-16", "clang-15", "clang-14"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build(out: str = OUT) -> str:
    """Compile and link the module into ``out``; returns ``out``. Raises SystemExit with what
    is missing when clang or lld are not installed."""
    wb = _wasmbin()
    clang = find_clang()
    if clang is None:
        raise SystemExit("building the wasm kernels needs clang and lld "
                         "(Debian/Ubuntu: apt-get install clang lld)")
    cs = [os.path.join(SRC, f) for f in sources() if f.endswith(".c")]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "k.wasm")
        # Relative paths and a fixed working dir keep the output independent of the checkout path.
        cmd = [clang, *CFLAGS, *LDFLAGS, "-o", raw, *[os.path.relpath(c, SRC) for c in cs]]
        proc = subprocess.run(cmd, cwd=SRC, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"wasm kernel build failed ({' '.join(cmd)}):\n{proc.stderr}")
        with open(raw, "rb") as f:
            data = f.read()
    data = wb.strip_module(data, {SECTION: source_hash().encode("ascii")})
    problems = wb.check_kernel_module(data)
    if problems:
        raise SystemExit("the kernel module breaks its rules: " + "; ".join(problems))
    _validate(data)
    tmp_out = out + ".tmp"
    with open(tmp_out, "wb") as f:
        f.write(data)
    os.replace(tmp_out, out)
    return out


def _validate(data: bytes) -> None:
    """Let a real engine validate the stripped module (code that still used the stack or a
    global fails here): Node's V8 where Node is installed, else wasmtime, else nothing."""
    node = shutil.which("node")
    if node:
        js = ("const d=require('fs').readFileSync(0);"
              "try{new WebAssembly.Module(d)}catch(e){console.error(String(e));process.exit(1)}")
        proc = subprocess.run([node, "-e", js], input=data, capture_output=True)
        if proc.returncode != 0:
            raise SystemExit("the kernel module does not validate (a kernel uses the stack, a "
                             f"global or libc?): {proc.stderr.decode(errors='replace').strip()}")
        return
    try:
        import wasmtime
    except ImportError:
        return
    try:
        wasmtime.Module(wasmtime.Engine(), data)
    except Exception as e:  # wasmtime raises its own error types
        raise SystemExit(f"the kernel module does not validate: {e}") from None


def up_to_date(out: str = OUT) -> bool:
    if not os.path.exists(out):
        return False
    with open(out, "rb") as f:
        return embedded_hash(f.read()) == source_hash()


def ensure(out: str = OUT) -> str:
    """Build only when the module is missing or stale."""
    return out if up_to_date(out) else build(out)


def main(argv) -> int:
    out = argv[argv.index("--out") + 1] if "--out" in argv else OUT
    if "--check" in argv:
        ok = up_to_date(out)
        print(f"{out}: {'up to date' if ok else 'missing or built from other sources'}")
        return 0 if ok else 1
    path = build(out)
    print(f"built {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main(sys.argv[1:]))
