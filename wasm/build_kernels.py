"""Build ember's WebAssembly SIMD kernel modules from the C sources in ``wasm/kernels/``.

    python wasm/build_kernels.py [--relaxed] [--out PATH] [--check]

Two modules from the same sources: ``kernels.wasm`` (plain SIMD, runs on every engine with
wasm SIMD) and, with ``--relaxed``, ``kernels_relaxed.wasm`` (``-mrelaxed-simd``: the float
GEMM's multiply-adds are ``f32x4.relaxed_madd``, one rounding per multiply-add where the engine
fuses them). The relaxed one needs a clang with the relaxed intrinsics (16 or newer: Debian's
``clang-19`` + ``lld-19``); ``runtime.py`` picks it where the engine validates relaxed SIMD.

One standalone module, compiled and linked by clang + lld (Debian's ``clang`` and ``lld``
packages; ``build.py`` installs them): no emscripten, no libc, memory imported (in the page it
is Pyodide's own memory). The linked module is post-processed by ``wasmbin.strip_module``
(no globals, no table, no custom sections) and gets one custom section, ``ember.sources``,
holding the SHA-256 of the sources and flags it was built from, so anyone can tell which
sources a shipped module came from. The build is deterministic: the same sources and clang
give the same bytes (tests/test_wasm_module.py rebuilds and compares).

``--check`` exits 1 when the module at ``--out`` is missing or was built from other sources.

The dispatch of ``kernels/exec.c`` (the command-table runner a replayed plan calls once, see
``plan_exec.py``) is generated here, into the build's temporary folder: every exported kernel
(``EXPORT(name)`` in the preprocessed sources, ``ember_*`` aside) becomes one ``case`` of a
switch, numbered in the order of its sorted name, that loads its arguments from the table's
words. No function pointers: the build strips tables. The numbering and the argument types
are fixed by the exports alone, so the Python side derives the same list from the module's
export and type sections; ``ember_abi()`` returns a hash of that list (``abi_hash``) that the
Python side compares before it runs any table.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "kernels")
OUT = os.path.join(HERE, "kernels.wasm")
OUT_RELAXED = os.path.join(HERE, "kernels_relaxed.wasm")
SECTION = "ember.sources"
DISPATCH_HEADER = "ember_dispatch.h"   # generated into the build folder, included by exec.c
GENERATOR = "exec-dispatch 2"         # part of the source hash: a new generator rebuilds
# -ffreestanding/-fno-builtin: never call memset/memcpy (there is no libc to link);
# -mbulk-memory: a struct copy becomes memory.copy instead of a call; -mnontrapping-fptoint:
# saturating float -> int conversions (the cast semantics ember pins on every backend);
# -matomics: the team runner's barriers (kernels/team.h). The module is linked against a plain
# memory import; ember.wasm.team patches the import to a shared memory for its workers.
CFLAGS = ["--target=wasm32", "-O3", "-msimd128", "-mbulk-memory", "-mnontrapping-fptoint", "-matomics", "-nostdlib", "-ffreestanding",
          "-fno-builtin", "-std=c11", "-Wall", "-Werror", "-Wno-unused-function"]
LDFLAGS = ["-Wl,--no-entry", "-Wl,--import-memory", "-Wl,--strip-all", "-Wl,-z,stack-size=0"]
# Flags for one source only. gemm.c: LLVM's loop strength reduction rewrites the microkernel's
# loads as pointers of their own (`p + 4` becomes an i32.add per load, since its new pointers are
# not `inbounds`, so the constant offsets no longer fold into the loads' offset immediates); V8
# then spends an x64 lea per load and spills. Without it the 4x8 GEMM runs ~15% faster in V8
# (MiniLM 8x64's products 319 -> 275 ms in Node, one thread). Not module-wide: quant.c's
# matrix-vector loops ran ~30% slower without it.
FILE_CFLAGS = {"gemm.c": ["-mllvm", "-disable-lsr"]}
# The relaxed module: the same sources with relaxed SIMD on (kernels test __wasm_relaxed_simd__).
RELAXED_CFLAGS = ["-mrelaxed-simd"]
# clang versions whose relaxed SIMD opcodes are the standard's (LLVM 16 renumbered them)
RELAXED_CLANGS = ("clang-19", "clang-20", "clang-18", "clang-17", "clang-16")


def sources() -> list:
    """The C sources and headers, sorted by name (what the hash covers)."""
    if not os.path.isdir(SRC):
        return []
    return sorted(f for f in os.listdir(SRC) if f.endswith((".c", ".h")))


def cflags(relaxed: bool = False) -> list:
    """The module-wide compile flags of the plain or the relaxed module."""
    return CFLAGS + RELAXED_CFLAGS if relaxed else list(CFLAGS)


def source_hash(relaxed: bool = False) -> str:
    h = hashlib.sha256()
    h.update(" ".join(cflags(relaxed) + LDFLAGS + [GENERATOR]).encode())
    for name in sorted(FILE_CFLAGS):
        h.update(("\0" + name + ":" + " ".join(FILE_CFLAGS[name])).encode())
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


def find_clang(relaxed: bool = False):
    """The clang that builds the plain module (the default ``clang`` first), or, with
    ``relaxed``, one with the standard relaxed SIMD intrinsics (``RELAXED_CLANGS``); None when
    there is none."""
    for name in RELAXED_CLANGS if relaxed else ("clang", "clang-16", "clang-15", "clang-14"):
        path = shutil.which(name)
        if path:
            return path
    return None


# ---- the generated dispatch of exec.c ------------------------------------------------------

_EXPORT = re.compile(r'__attribute__\(\(export_name\("(\w+)"\)\)\)\s*([\w\s\*]+?)\s*\b(\w+)\s*\(([^)]*)\)')
_SCALARS = {"f32": "f", "float": "f", "double": "F", "i64": "I", "long long": "I", "unsigned long long": "I",
            "u64": "I"}


def _wasm_type(ctype: str) -> str:
    """The WebAssembly value type of a C parameter or result type, as one letter: i (i32, and
    every pointer), f (f32), I (i64), F (f64); '' for void."""
    t = " ".join(w for w in ctype.replace("*", " * ").split() if w not in ("const", "volatile", "restrict"))
    if "*" in t or "[" in t:
        return "i"
    if t == "void":
        return ""
    return _SCALARS.get(t, "i")


def _param(text: str) -> tuple:
    """(C type, wasm letter) of one parameter declaration such as ``const f32 *x``."""
    text = text.strip()
    if "[" in text:
        text = text[:text.index("[")].strip() + " *"
        return text, "i"
    m = re.match(r"^(.*?)(\w+)$", text)
    ctype = m.group(1).strip() if m and m.group(1).strip() else text
    return ctype, _wasm_type(ctype)


def signature_ok(params: str, result: str) -> bool:
    """Whether a kernel of this wasm signature can sit in a command table (the same rule the
    Python side applies to the module's types): scalar/pointer parameters, no result or an i32."""
    return set(params) <= set("ifIF") and result in ("", "i")


_VALTYPES = {0x7F: "i", 0x7E: "I", 0x7D: "f", 0x7C: "F"}


def module_signatures(data: bytes) -> dict:
    """{export name: (params, result)} of a module's exported functions, wasm value types as
    letters i f I F (``v`` for any other)."""
    wb = _wasmbin()
    m = wb.parse(data)
    types, funcs = [], []
    for s in m.sections:
        p = s.payload
        if s.id == 1:
            n, at = wb.read_uleb(p, 0)
            for _ in range(n):
                if p[at] != 0x60:
                    raise wb.WasmFormatError(f"type {len(types)}: not a function type")
                n_params, at = wb.read_uleb(p, at + 1)
                params = "".join(_VALTYPES.get(b, "v") for b in p[at:at + n_params])
                at += n_params
                n_results, at = wb.read_uleb(p, at)
                result = "".join(_VALTYPES.get(b, "v") for b in p[at:at + n_results])
                at += n_results
                types.append((params, result))
        elif s.id == 3:
            n, at = wb.read_uleb(p, 0)
            for _ in range(n):
                t, at = wb.read_uleb(p, at)
                funcs.append(t)
    n_imported = sum(1 for _, _, kind in m.imports() if kind == "func")
    return {name: types[funcs[idx - n_imported]] for name, kind, idx in m.exports()
            if kind == "func" and idx >= n_imported}


def dispatchable(sigs: dict) -> list:
    """[(name, params, result)] of the kernels a command table can call, in id order: every
    exported function but ``ember_*`` whose signature passes ``signature_ok``, sorted by name."""
    return [(n, *sigs[n]) for n in sorted(sigs) if not n.startswith("ember_") and signature_ok(*sigs[n])]


def abi_hash(kernels) -> int:
    """32-bit FNV-1a of ``name:params:result;`` over the dispatchable kernels in id order."""
    h = 0x811C9DC5
    for name, params, result in kernels:
        for b in f"{name}:{params}:{result};".encode():
            h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def exported_kernels(clang: str) -> list:
    """[(name, C result type, [(C type, wasm letter)...])] of every ``EXPORT``ed kernel, from the
    preprocessed sources (macros expanded), sorted by name. (The plain flags: both modules export
    the same kernels, and the build checks the linked module's exports against this list.)"""
    found = {}
    for f in sources():
        if not f.endswith(".c") or f == "exec.c":
            continue
        proc = subprocess.run([clang, *CFLAGS, "-E", "-P", f], cwd=SRC, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"preprocessing {f} failed:\n{proc.stderr}")
        text = " ".join(proc.stdout.split())
        for m in _EXPORT.finditer(text):
            name, ret, fname, params = m.groups()
            if name != fname or name.startswith("ember_"):
                continue
            plist = [] if params.strip() in ("", "void") else [_param(p) for p in params.split(",")]
            found[name] = (name, ret.strip(), plist)
    return [found[k] for k in sorted(found)]


def dispatch_source(kernels: list) -> str:
    """The C header exec.c includes: declarations, EMBER_ABI and ``ember_dispatch``."""
    table, lines = [], []
    for name, ret, plist in kernels:
        params, result = "".join(w for _, w in plist), _wasm_type(ret)
        if signature_ok(params, result):
            table.append((name, ret, plist, params, result))
    lines.append("/* Generated by wasm/build_kernels.py from the EXPORTed kernel prototypes: do not edit. */")
    lines.append(f"#define EMBER_ABI 0x{abi_hash([(n, p, r) for n, _, _, p, r in table]):08x}u")
    lines.append(f"#define EMBER_KERNELS {len(table)}")
    for k, (name, _, _, _, _) in enumerate(table):
        lines.append(f"#define EMBER_KID_{name} {k}")
    for name, ret, plist, _, _ in table:
        decl = ", ".join(f"{t} a{i}" for i, (t, _) in enumerate(plist)) or "void"
        lines.append(f"{ret} {name}({decl});")
    lines.append("/* Runs kernel `id` on the argument words `a` (n of them): -1 for an unknown id or a wrong")
    lines.append("   word count, else (has_result << 32) | result. With run == 0 it only checks id and count. */")
    lines.append("static inline i64 ember_dispatch(i32 id, const i32 *a, i32 n, i32 run) {")
    lines.append("  switch (id) {")
    for k, (name, ret, plist, params, result) in enumerate(table):
        args, w = [], 0
        for t, letter in plist:
            if letter == "f":
                args.append(f"ember_word_f32(a[{w}])")
            elif letter == "I":
                args.append(f"ember_word_i64(a[{w}], a[{w + 1}])")
            elif letter == "F":
                args.append(f"ember_word_f64(a[{w}], a[{w + 1}])")
            elif "*" in t:
                args.append(f"({t})(__UINTPTR_TYPE__)(u32)a[{w}]")
            else:
                args.append(f"({t})a[{w}]")
            w += 2 if letter in "IF" else 1
        call = f"{name}({', '.join(args)})"
        body = (f"return ((i64)1 << 32) | (u32)(i32){call};" if result else f"{call}; return 0;")
        lines.append(f"  case {k}: if (n != {w}) return -1; if (!run) return 0; {body}")
    lines.append("  default: return -1;")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def build(out: str | None = None, relaxed: bool = False) -> str:
    """Compile and link the plain (or ``relaxed``) module into ``out`` (default ``OUT`` /
    ``OUT_RELAXED``); returns ``out``. Raises SystemExit with what is missing when clang or
    lld are not installed."""
    wb = _wasmbin()
    out = out or (OUT_RELAXED if relaxed else OUT)
    clang = find_clang(relaxed)
    if clang is None:
        raise SystemExit("building the relaxed-SIMD wasm kernels needs clang 16+ and its lld "
                         "(Debian: apt-get install clang-19 lld-19)" if relaxed else
                         "building the wasm kernels needs clang and lld "
                         "(Debian/Ubuntu: apt-get install clang lld)")
    flags = cflags(relaxed)
    cs = [os.path.join(SRC, f) for f in sources() if f.endswith(".c")]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "k.wasm")
        kernels = exported_kernels(clang)
        generated = [(n, "".join(w for _, w in plist), _wasm_type(ret)) for n, ret, plist in kernels]
        generated = [g for g in generated if signature_ok(g[1], g[2])]
        generated_abi = abi_hash(generated)
        with open(os.path.join(tmp, DISPATCH_HEADER), "w") as f:
            f.write(dispatch_source(kernels))
        # Relative paths and a fixed working dir keep the output independent of the checkout path.
        # Each source is compiled on its own (FILE_CFLAGS), then all are linked in name order.
        objs = []
        for c in cs:
            name = os.path.basename(c)
            obj = os.path.join(tmp, name[:-2] + ".o")
            _run([clang, *flags, *FILE_CFLAGS.get(name, []), "-I", tmp, "-c", "-o", obj, name])
            objs.append(obj)
        _run([clang, *flags, *LDFLAGS, "-o", raw, *objs])
        with open(raw, "rb") as f:
            data = f.read()
    data = wb.strip_module(data, {SECTION: source_hash(relaxed).encode("ascii")})
    problems = wb.check_kernel_module(data)
    # the generated dispatch must number exactly the kernels the module exports (an export the
    # prototype scan missed would make every table of the Python side refuse to run)
    table = dispatchable(module_signatures(data))
    if abi_hash(table) != generated_abi:
        scanned = {n for n, _, _ in generated}
        exported = {n for n, _, _ in table}
        problems.append(f"the command-table dispatch does not match the exports (only exported: "
                        f"{sorted(exported - scanned)}, only scanned: {sorted(scanned - exported)}; "
                        f"or a parameter type read differently)")
    if problems:
        raise SystemExit("the kernel module breaks its rules: " + "; ".join(problems))
    _validate(data, relaxed)
    tmp_out = out + ".tmp"
    with open(tmp_out, "wb") as f:
        f.write(data)
    os.replace(tmp_out, out)
    return out


def _run(cmd: list) -> None:
    proc = subprocess.run(cmd, cwd=SRC, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"wasm kernel build failed ({' '.join(cmd)}):\n{proc.stderr}")


def _validate(data: bytes, relaxed: bool = False) -> None:
    """Let a real engine validate the stripped module (code that still used the stack or a
    global fails here): Node's V8 where Node is installed (Node 20 needs a flag for relaxed
    SIMD), else wasmtime, else nothing."""
    node = shutil.which("node")
    if node:
        js = ("const d=require('fs').readFileSync(0);"
              "try{new WebAssembly.Module(d)}catch(e){console.error(String(e));process.exit(1)}")
        proc = subprocess.run([node, "-e", js], input=data, capture_output=True)
        if proc.returncode != 0 and relaxed:
            proc = subprocess.run([node, "--experimental-wasm-relaxed-simd", "-e", js], input=data,
                                  capture_output=True)
        if proc.returncode != 0:
            raise SystemExit("the kernel module does not validate (a kernel uses the stack, a "
                             f"global or libc?): {proc.stderr.decode(errors='replace').strip()}")
        return
    try:
        import wasmtime
    except ImportError:
        return
    try:
        config = wasmtime.Config()
        config.wasm_relaxed_simd = relaxed
        wasmtime.Module(wasmtime.Engine(config), data)
    except Exception as e:  # wasmtime raises its own error types
        raise SystemExit(f"the kernel module does not validate: {e}") from None


def up_to_date(out: str | None = None, relaxed: bool = False) -> bool:
    out = out or (OUT_RELAXED if relaxed else OUT)
    if not os.path.exists(out):
        return False
    with open(out, "rb") as f:
        return embedded_hash(f.read()) == source_hash(relaxed)


def ensure(out: str | None = None, relaxed: bool = False) -> str:
    """Build only when the module is missing or stale."""
    out = out or (OUT_RELAXED if relaxed else OUT)
    return out if up_to_date(out, relaxed) else build(out, relaxed)


def main(argv) -> int:
    relaxed = "--relaxed" in argv
    out = argv[argv.index("--out") + 1] if "--out" in argv else (OUT_RELAXED if relaxed else OUT)
    if "--check" in argv:
        ok = up_to_date(out, relaxed)
        print(f"{out}: {'up to date' if ok else 'missing or built from other sources'}")
        return 0 if ok else 1
    path = build(out, relaxed)
    print(f"built {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main(sys.argv[1:]))
