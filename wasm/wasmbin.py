"""A small reader/writer for WebAssembly binaries: just enough to post-process and check the
kernel module that ``build_kernels.py`` links (sections, imports, exports, custom sections).

Why: clang + wasm-ld always define a ``__stack_pointer`` global (and an empty function table)
even when no code uses them; the module ember ships runs on *Pyodide's own memory*, where any
address it picked for a stack or for data would belong to Python objects. ``strip_module``
removes the global, table and custom sections, so a module whose code still touched a global
would fail to validate: "no stack, no globals, no data" becomes a property the engine checks.

>>> m = parse(bytes.fromhex("0061736d01000000"))
>>> m.sections
[]
"""
from __future__ import annotations

from typing import NamedTuple

MAGIC = b"\0asm\x01\0\0\0"
SECTION_NAMES = {0: "custom", 1: "type", 2: "import", 3: "function", 4: "table", 5: "memory",
                 6: "global", 7: "export", 8: "start", 9: "element", 10: "code", 11: "data",
                 12: "datacount"}
EXTERN_KINDS = {0: "func", 1: "table", 2: "memory", 3: "global", 4: "tag"}


class WasmFormatError(ValueError):
    """The bytes are not a WebAssembly module this reader understands."""


class Section(NamedTuple):
    id: int
    payload: bytes

    @property
    def name(self) -> str:
        return SECTION_NAMES.get(self.id, f"unknown({self.id})")


class Module(NamedTuple):
    sections: list

    def ids(self) -> list:
        return [s.id for s in self.sections]

    def custom(self) -> dict:
        """{name: payload} of the custom sections."""
        out = {}
        for s in self.sections:
            if s.id == 0:
                name, at = read_name(s.payload, 0)
                out[name] = s.payload[at:]
        return out

    def imports(self) -> list:
        """[(module, name, kind)] of the import section."""
        for s in self.sections:
            if s.id == 2:
                return _imports(s.payload)
        return []

    def exports(self) -> list:
        """[(name, kind, index)] of the export section."""
        for s in self.sections:
            if s.id == 7:
                return _exports(s.payload)
        return []


def read_uleb(data: bytes, at: int) -> tuple:
    result = shift = 0
    while True:
        if at >= len(data):
            raise WasmFormatError(f"truncated LEB128 at offset {at}")
        b = data[at]
        at += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, at
        if shift > 35:
            raise WasmFormatError(f"LEB128 too long at offset {at}")


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_name(data: bytes, at: int) -> tuple:
    n, at = read_uleb(data, at)
    if at + n > len(data):
        raise WasmFormatError(f"name runs past the end at offset {at}")
    return data[at:at + n].decode("utf-8"), at + n


def parse(data: bytes) -> Module:
    """Split a module into its sections (payloads are not decoded)."""
    if data[:8] != MAGIC:
        raise WasmFormatError("not a WebAssembly 1.0 module (bad magic/version)")
    at, sections = 8, []
    while at < len(data):
        sid = data[at]
        size, at = read_uleb(data, at + 1)
        if at + size > len(data):
            raise WasmFormatError(f"section {sid} runs past the end of the module")
        sections.append(Section(sid, bytes(data[at:at + size])))
        at += size
    return Module(sections)


def serialize(module: Module) -> bytes:
    out = bytearray(MAGIC)
    for s in module.sections:
        out.append(s.id)
        out += uleb(len(s.payload))
        out += s.payload
    return bytes(out)


def _limits(data, at):
    flag, at = read_uleb(data, at)
    _, at = read_uleb(data, at)
    if flag & 1:
        _, at = read_uleb(data, at)
    return at


def _imports(p: bytes) -> list:
    n, at = read_uleb(p, 0)
    out = []
    for _ in range(n):
        mod, at = read_name(p, at)
        name, at = read_name(p, at)
        kind = p[at]
        at += 1
        if kind == 0:
            _, at = read_uleb(p, at)
        elif kind == 1:
            at = _limits(p, at + 1)
        elif kind == 2:
            at = _limits(p, at)
        elif kind == 3:
            at += 2
        else:
            raise WasmFormatError(f"import {mod}.{name}: unknown kind {kind}")
        out.append((mod, name, EXTERN_KINDS[kind]))
    return out


def _exports(p: bytes) -> list:
    n, at = read_uleb(p, 0)
    out = []
    for _ in range(n):
        name, at = read_name(p, at)
        kind = p[at]
        idx, at = read_uleb(p, at + 1)
        out.append((name, EXTERN_KINDS.get(kind, str(kind)), idx))
    return out


def custom_section(name: str, payload: bytes) -> Section:
    raw = name.encode("utf-8")
    return Section(0, uleb(len(raw)) + raw + payload)


def strip_module(data: bytes, keep_custom: dict | None = None) -> bytes:
    """Drop the global, table and custom sections (see the module docstring) and append the
    custom sections in ``keep_custom`` ({name: payload}). Raises WasmFormatError if a global or
    table is exported or an element segment needs the table."""
    m = parse(data)
    for name, kind, _ in m.exports():
        if kind in ("global", "table"):
            raise WasmFormatError(f"the module exports {kind} {name!r}: kernels export functions only")
    if 9 in m.ids():
        raise WasmFormatError("the module has an element section (function pointers): not allowed")
    kept = [s for s in m.sections if s.id not in (0, 4, 6)]
    for name, payload in (keep_custom or {}).items():
        kept.append(custom_section(name, payload))
    return serialize(Module(kept))


def check_kernel_module(data: bytes) -> list:
    """The rules the shipped kernel module must follow; returns the list of violations (empty
    when it is fine): only ``env.memory`` imported, functions exported only, no data, no
    globals, no table, no start function."""
    m = parse(data)
    problems = []
    for s in m.sections:
        if s.id in (4, 6, 8, 9, 11, 12):
            problems.append(f"has a {s.name} section")
    imports = m.imports()
    if imports != [("env", "memory", "memory")]:
        problems.append(f"imports {imports}, expected only env.memory")
    for name, kind, _ in m.exports():
        if kind != "func":
            problems.append(f"exports {kind} {name!r}")
    return problems


def with_shared_memory(data: bytes, max_pages: int) -> bytes:
    """The module with its ``env.memory`` import turned into a *shared* memory of at most
    ``max_pages`` pages (what a team of threads instantiates it on, see ``ember.wasm.team``).
    The code is unchanged: only the import's limits differ, so the kernels are the same bytes on
    Pyodide's plain memory and on the shared one."""
    m = parse(data)
    out = []
    for s in m.sections:
        if s.id == 2:
            if _imports(s.payload) != [("env", "memory", "memory")]:
                raise WasmFormatError("with_shared_memory: the module must import env.memory only")
            n, at = read_uleb(s.payload, 0)
            _, at = read_name(s.payload, at)
            _, at = read_name(s.payload, at)
            head = s.payload[:at + 1]          # count, names, kind byte (2 = memory)
            flag, p = read_uleb(s.payload, at + 1)
            minimum, p = read_uleb(s.payload, p)
            s = Section(2, head + bytes([3]) + uleb(minimum) + uleb(max_pages))
        out.append(s)
    return serialize(Module(out))
