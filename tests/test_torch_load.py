"""PyTorch checkpoint loader: a committed torch.save fixture loads to the values PyTorch wrote
(tests/fixtures/make_fixtures.py), hand-built malicious pickles are refused without running
anything, and corrupt archives end in WeightsError. torch is not needed here."""
import io
import json
import os
import struct
import zipfile

import pytest

import ember
from ember.errors import DTypeError, WeightsError

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "torch")
CKPT = os.path.join(FIX, "checkpoint.pt")
LEGACY = os.path.join(FIX, "checkpoint_legacy.pt")   # the same dict, torch.save(..., _use_new_zipfile_serialization=False)


def _flatten(obj, path, out):
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{path}.{k}" if path else k, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(v, f"{path}.{i}", out)
    else:
        out[path] = obj
    return out


@pytest.mark.parametrize("path", [CKPT, LEGACY], ids=["zip", "legacy"])
def test_fixture_checkpoint_matches_pytorch(device, path):
    expected = ember.load_safetensors(os.path.join(FIX, "expected.safetensors"))
    if device == "webgpu":
        # The fixture holds int64 values beyond int32, which the GPU cannot store (WGSL has no
        # 64-bit ints): the loader names the tensor. The dtypes themselves are covered on webgpu
        # by test_hand_built_checkpoint_dtypes.
        with pytest.raises(DTypeError, match=r"tensor 'long': webgpu: int64"):
            ember.load_torch(path, device=device)
        return
    got = ember.load_torch(path, device=device)
    flat = _flatten(got, "", {})
    plain = json.loads(expected.metadata["plain"])
    assert set(flat) == set(expected) | set(plain)
    for k, v in plain.items():
        assert flat[k] == v, k
    for k in expected:
        t, ref = flat[k], expected[k]
        assert (t.shape, t.dtype, t.device) == (ref.shape, ref.dtype, device), k
        assert t._bytes() == ref._bytes(), k  # bit-exact, including the strided views and bf16
    assert isinstance(got["nested"]["pair"], tuple) and got["nested"]["name"] == "ckpt"


@pytest.mark.parametrize("path", [CKPT, LEGACY], ids=["zip", "legacy"])
def test_fixture_from_bytes_equals_from_path(path):
    a = ember.load_torch(path)
    with open(path, "rb") as f:
        b = ember.load_torch(memoryview(f.read()))
    fa, fb = _flatten(a, "", {}), _flatten(b, "", {})
    assert fa.keys() == fb.keys()
    for k in fa:
        assert (fa[k].tolist() if hasattr(fa[k], "tolist") else fa[k]) == \
               (fb[k].tolist() if hasattr(fb[k], "tolist") else fb[k])


# ---- hand-built pickles (protocol 2 opcodes) -------------------------------------------------

def G(module, name):  # GLOBAL
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def S(s):  # BINUNICODE
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def I(n):  # BININT
    return b"J" + struct.pack("<i", n)


def tup(*items):
    return b"(" + b"".join(items) + b"t"


def tensor_pkl(stype="FloatStorage", key="0", numel=4, offset=0, size=(4,), stride=(1,)):
    storage = tup(S("storage"), G("torch", stype), S(key), S("cpu"), I(numel)) + b"Q"  # BINPERSID
    args = tup(storage, I(offset), tup(*map(I, size)), tup(*map(I, stride)), b"\x89",
               G("collections", "OrderedDict") + b")R")
    return G("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def state_dict_pkl(**items):
    body = b"".join(S(k) + v for k, v in items.items())
    return b"\x80\x02}(" + body + b"u."


def checkpoint(pkl, storages=None, byteorder=b"little", prefix="archive", extra=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        if byteorder is not None:
            z.writestr(f"{prefix}/byteorder", byteorder)
        for k, v in (storages or {}).items():
            z.writestr(f"{prefix}/data/{k}", v)
        for name, data in extra:
            z.writestr(name, data)
    return buf.getvalue()


F4 = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


def test_hand_built_checkpoint_views(device):
    pkl = state_dict_pkl(a=tensor_pkl(), t=tensor_pkl(size=(2, 2), stride=(1, 2)),
                         tail=tensor_pkl(offset=1, size=(3,)), rep=tensor_pkl(size=(2, 2), stride=(0, 1)))
    sd = ember.load_torch(checkpoint(pkl, {"0": F4}), device=device)
    assert all(t.device == device for t in sd.values())
    assert sd["a"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert sd["t"].tolist() == [[1.0, 3.0], [2.0, 4.0]]
    assert sd["tail"].tolist() == [2.0, 3.0, 4.0]
    assert sd["rep"].tolist() == [[1.0, 2.0], [1.0, 2.0]]


DTYPE_CASES = [  # storage class, raw little-endian bytes, ember dtype, values
    ("HalfStorage", struct.pack("<3e", 0.5, -2.0, 65504.0), "float16", [0.5, -2.0, 65504.0]),
    ("BFloat16Storage", bytes([0x80, 0x3F, 0x20, 0xC1, 0, 0]), "float32", [1.0, -10.0, 0.0]),
    ("IntStorage", struct.pack("<3i", -(2 ** 31), 0, 7), "int32", [-(2 ** 31), 0, 7]),
    ("LongStorage", struct.pack("<3q", -3, 0, 2 ** 31 - 1), "int64", [-3, 0, 2 ** 31 - 1]),
    ("ByteStorage", bytes([0, 128, 255]), "uint8", [0, 128, 255]),
    ("BoolStorage", bytes([1, 0, 1]), "bool", [True, False, True]),
]


@pytest.mark.parametrize("stype,raw,dtype,values", DTYPE_CASES, ids=[c[0] for c in DTYPE_CASES])
def test_hand_built_checkpoint_dtypes(device, stype, raw, dtype, values):
    # v: an overlapping (2, 2) view with strides (1, 1) of the same 3 elements: [[v0, v1], [v1, v2]]
    pkl = state_dict_pkl(x=tensor_pkl(stype, numel=3, size=(3,)), v=tensor_pkl(stype, numel=3, size=(2, 2), stride=(1, 1)))
    sd = ember.load_torch(checkpoint(pkl, {"0": raw}), device=device)
    assert sd["x"].dtype.name == dtype and sd["x"].tolist() == values
    assert sd["v"].tolist() == [[values[0], values[1]], [values[1], values[2]]]


def test_big_endian_checkpoint():
    pkl = state_dict_pkl(a=tensor_pkl(), n=tensor_pkl("LongStorage", "1", 2, size=(2,)))
    sd = ember.load_torch(checkpoint(pkl, {"0": struct.pack(">4f", 1.0, 2.0, 3.0, 4.0),
                                           "1": struct.pack(">2q", -5, 2 ** 40)}, byteorder=b"big"))
    assert sd["a"].tolist() == [1.0, 2.0, 3.0, 4.0] and sd["n"].tolist() == [-5, 2 ** 40]


MALICIOUS = [
    ("os.system", lambda m: G("os", "system") + tup(S(f"touch {m}")) + b"R"),
    ("posix.system", lambda m: G("posix", "system") + tup(S(f"touch {m}")) + b"R"),
    ("builtins.eval", lambda m: G("builtins", "eval") + tup(S(f"open({m!r}, 'w')")) + b"R"),
    ("builtins.exec", lambda m: G("builtins", "exec") + tup(S(f"open({m!r}, 'w')")) + b"R"),
    ("subprocess.Popen", lambda m: G("subprocess", "Popen") + tup(tup(S("touch"), S(m))) + b"R"),
    # protocol 4 STACK_GLOBAL: module and name come from the stack
    ("os.system", lambda m: S("os") + S("system") + b"\x93" + tup(S(f"touch {m}")) + b"R"),
    # INST opcode (protocol 0): module/name inline, calls the class with the marked arguments
    ("os.system", lambda m: b"(" + S(f"touch {m}") + b"ios\nsystem\n"),
    # a torch function that is not a state_dict rebuild function
    ("torch.load", lambda m: G("torch", "load") + tup(S(m)) + b"R"),
    ("torch._utils._rebuild_qtensor", lambda m: G("torch._utils", "_rebuild_qtensor") + tup() + b"R"),
]


@pytest.mark.parametrize("name,make", MALICIOUS, ids=[f"{i}-{m[0]}" for i, m in enumerate(MALICIOUS)])
def test_malicious_pickle_is_refused(tmp_path, name, make):
    marker = str(tmp_path / "pwned")
    # a normal-looking state_dict whose second entry runs the payload
    pkl = state_dict_pkl(weight=tensor_pkl(), evil=make(marker))
    path = tmp_path / "evil.pt"
    path.write_bytes(checkpoint(pkl, {"0": F4}))
    with pytest.raises(WeightsError, match=f"refers to the global {name}, which a state_dict") as ei:
        ember.load_torch(path)
    assert "evil.pt" in str(ei.value) and "nothing was run" in str(ei.value)
    assert not os.path.exists(marker)


def test_stand_ins_cannot_be_tampered_with():
    # BUILD (set state) on the allowed rebuild function must fail, not mutate it for later loads
    pkl = b"\x80\x02" + G("torch._utils", "_rebuild_tensor_v2") + b"}" + S("__defaults__") + tup(I(1)) + b"sb."
    with pytest.raises(WeightsError, match="tried to set the state"):
        ember.load_torch(checkpoint(pkl))
    # calling a storage class (not callable here) is a clean WeightsError too
    with pytest.raises(WeightsError, match="corrupt checkpoint"):
        ember.load_torch(checkpoint(b"\x80\x02" + G("torch", "FloatStorage") + tup(I(3)) + b"R."))
    assert ember.load_torch(checkpoint(state_dict_pkl(a=tensor_pkl()), {"0": F4}))["a"].tolist() == [1, 2, 3, 4]


# ---- the legacy (pre-1.6) stream: five pickles, then each storage as int64 count + bytes -----

LEGACY_HEAD = (b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19." + b"\x80\x02M\xe9\x03."
               + b"\x80\x02}(" + S("little_endian") + b"\x88u.")


def legacy_tensor_pkl(stype="FloatStorage", key="0", numel=4, offset=0, size=(4,), stride=(1,), view=b"N"):
    storage = tup(S("storage"), G("torch", stype), S(key), S("cpu"), I(numel), view) + b"Q"
    args = tup(storage, I(offset), tup(*map(I, size)), tup(*map(I, stride)), b"\x89",
               G("collections", "OrderedDict") + b")R")
    return G("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def legacy(pkl, storages=None, keys=None, head=LEGACY_HEAD):
    storages = {"0": F4} if storages is None else storages
    keys = list(storages) if keys is None else keys
    body = b"".join(struct.pack("<q", len(raw) // 4) + raw for raw in storages.values())
    return head + pkl + b"\x80\x02]q\x00(" + b"".join(S(k) for k in keys) + b"e." + body


def test_hand_built_legacy_views(device):
    # a storage view (torch < 0.4): elements 1..3 of storage '0', a tensor at offset 1 inside it
    pkl = state_dict_pkl(a=legacy_tensor_pkl(), t=legacy_tensor_pkl(size=(2, 2), stride=(1, 2)),
                         v=legacy_tensor_pkl(offset=1, size=(2,), view=tup(S("0v"), I(1), I(3))))
    sd = ember.load_torch(legacy(pkl), device=device)
    assert sd["a"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert sd["t"].tolist() == [[1.0, 3.0], [2.0, 4.0]]
    assert sd["v"].tolist() == [3.0, 4.0]


def test_legacy_malicious_pickle_is_refused(tmp_path):
    marker = str(tmp_path / "pwned")
    pkl = state_dict_pkl(weight=legacy_tensor_pkl(), evil=G("os", "system") + tup(S(f"touch {marker}")) + b"R")
    with pytest.raises(WeightsError, match="refers to the global os.system.*nothing was run"):
        ember.load_torch(legacy(pkl))
    # a global hidden in a header pickle is refused too
    head = LEGACY_HEAD.replace(b"\x80\x02}(" + S("little_endian") + b"\x88u.",
                               b"\x80\x02" + G("os", "system") + tup(S(f"touch {marker}")) + b"R.")
    with pytest.raises(WeightsError, match=r"system info pickle at byte 21 refers to the global os.system"):
        ember.load_torch(legacy(state_dict_pkl(a=legacy_tensor_pkl()), head=head))
    assert not os.path.exists(marker)


_SD = state_dict_pkl(a=legacy_tensor_pkl())
BAD_LEGACY = [
    ("truncated_head", LEGACY_HEAD[:21], r"legacy checkpoint ends at byte 21, before its system info"),
    ("bad_magic", LEGACY_HEAD.replace(b"l\xfc", b"m\xfc") + _SD, r"without PyTorch's legacy magic number"),
    ("bad_version", LEGACY_HEAD.replace(b"M\xe9\x03", b"M\xea\x03") + _SD, r"protocol version 1002; ember reads 1001"),
    ("garbled_object", LEGACY_HEAD + b"\x80\x02}(X\xff\xff\xff\x7f", r"the object pickle at byte \d+ is corrupt"),
    ("no_keys", LEGACY_HEAD + _SD, r"ends at byte \d+, before its storage key list"),
    ("keys_not_list", legacy(_SD).replace(b"]q\x00(" + S("0") + b"e.", b"K\x05."), r"key list is not a list of distinct"),
    ("dup_keys", legacy(_SD, keys=["0", "0"]), r"key list is not a list of distinct"),
    ("unlisted", legacy(_SD, keys=[]), r"never writes storage '0', which its object uses"),
    ("unused", legacy(_SD, {"0": F4, "9": F4}), r"lists storage '9' \(byte \d+\), which its object never uses"),
    ("count", legacy(_SD, {"0": F4 + F4[:4]}), r"storage '0' \(byte \d+\) holds 5 elements but the object says 4"),
    ("truncated_data", legacy(_SD)[:-3], r"storage '0' needs 16 bytes from byte \d+ but the file ends at \d+ \(truncated\)"),
    ("truncated_count", legacy(_SD)[:-20], r"inside the header of storage '0'"),
    ("view_oob", legacy(state_dict_pkl(a=legacy_tensor_pkl(size=(3,), stride=(2,))))
     , r"tensor 'a': view \(offset 0, size \(3,\), stride \(2,\)\) reaches element 4 of storage '0', which has 4"),
    ("storage_view_oob", legacy(state_dict_pkl(a=legacy_tensor_pkl(view=tup(S("v"), I(2), I(3)))))
     , r"storage '0' has a bad view"),
    ("tensor_past_storage_view", legacy(state_dict_pkl(a=legacy_tensor_pkl(size=(3,), view=tup(S("v"), I(1), I(2)))))
     , r"reaches element 2 of a storage view of 2 elements"),
    ("zip_pid", legacy(state_dict_pkl(a=tensor_pkl())), r"unexpected persistent id"),
    ("module_pid", legacy(b"\x80\x02" + tup(S("module"), S("Net"), S("net.py"), S("class Net: pass")) + b"Q.", {}),
     r"pickles a whole module \(its source code\), not a state_dict"),
    ("bytearray8", legacy(b"\x80\x05\x96" + struct.pack("<Q", 2) + b"xx.", {}), r"opcode BYTEARRAY8"),
    ("tar", b"x" * 257 + b"ustar" + bytes(250), r"tar checkpoint format \(torch < 0.1.10\)"),
]


@pytest.mark.parametrize("raw,pattern", [b[1:] for b in BAD_LEGACY], ids=[b[0] for b in BAD_LEGACY])
def test_bad_legacy_checkpoint_raises_weights_error(raw, pattern):
    with pytest.raises(WeightsError, match=pattern):
        ember.load_torch(raw)


BAD_CKPTS = [
    ("safetensors", ember.save_safetensors({"w": ember.tensor([1.0])}), r"looks like safetensors, use ember.load_safetensors"),
    ("not_zip", b"hello world, not a checkpoint", r"not a PyTorch checkpoint \(not a zip archive or a pickle stream"),
    ("bad_zip", b"PK\x03\x04garbage", r"corrupt zip archive"),
    ("no_pkl", checkpoint(b"", prefix="x", extra=()).replace(b"x/data.pkl", b"x/other.pk"), r"expected exactly one <name>/data.pkl"),
    ("torchscript", checkpoint(state_dict_pkl(), extra=[("archive/constants.pkl", b""), ("archive/code/m.py", b"")])
     .replace(b"archive/data.pkl", b"archive/dota.pkl"), r"TorchScript archive"),
    ("byteorder", checkpoint(state_dict_pkl(), byteorder=b"middle"), r"byteorder is b'middle'"),
    ("missing_storage", checkpoint(state_dict_pkl(a=tensor_pkl()), {}), r"refers to storage '0' but the archive has no 'archive/data/0'"),
    ("short_storage", checkpoint(state_dict_pkl(a=tensor_pkl()), {"0": F4[:12]}), r"holds 12 bytes but data.pkl says 4 elements of 4 bytes \(16\)"),
    ("view_oob", checkpoint(state_dict_pkl(a=tensor_pkl(size=(3,), stride=(2,))), {"0": F4}),
     r"tensor 'a': view \(offset 0, size \(3,\), stride \(2,\)\) reaches element 4 of storage '0', which has 4"),
    ("neg_stride", checkpoint(state_dict_pkl(a=tensor_pkl(size=(2,), stride=(-1,))), {"0": F4}), r"tensor 'a': bad size"),
    ("float64", checkpoint(state_dict_pkl(m=b"}" + S("d") + tensor_pkl("DoubleStorage", numel=2, size=(2,)) + b"s"),
                           {"0": bytes(16)}), r"tensor 'm.d' has dtype float64, which ember does not support"),
    ("pid", checkpoint(b"\x80\x02" + tup(S("storage"), I(1)) + b"Q."), r"unexpected persistent id"),
    ("pickle", checkpoint(b"\x80\x02}(X\x05"), r"corrupt checkpoint \(\w+"),
    ("stray_object", checkpoint(b"\x80\x02" + G("torch", "HalfStorage") + b"."), r"the checkpoint is a torch.HalfStorage object"),
    ("empty", b"", r"not a PyTorch checkpoint"),
    # a 30-byte pickle claiming a 2**50-byte bytearray / memo slot 2**32-1: refused before any allocation
    ("bytearray8", checkpoint(b"\x80\x05\x96" + struct.pack("<Q", 2 ** 50) + b"xx."), r"corrupt checkpoint \(ValueError: expected"),
    ("bytearray8_ok_len", checkpoint(b"\x80\x05\x96" + struct.pack("<Q", 2) + b"xx."), r"opcode BYTEARRAY8 \(byte 2\)"),
    ("memo", checkpoint(b"\x80\x02N" + b"r" + struct.pack("<I", 2 ** 32 - 1) + b"."), r"memo index 4294967295 \(byte 3\) is out of range"),
    ("ext", checkpoint(b"\x80\x02\x82\x01."), r"opcode EXT1"),
]


@pytest.mark.parametrize("raw,pattern", [b[1:] for b in BAD_CKPTS], ids=[b[0] for b in BAD_CKPTS])
def test_bad_checkpoint_raises_weights_error(raw, pattern):
    with pytest.raises(WeightsError, match=pattern):
        ember.load_torch(raw)


def test_compressed_entries_are_refused():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", state_dict_pkl(a=tensor_pkl()))
        z.writestr("archive/data/0", F4)
    with pytest.raises(WeightsError, match=r"entry 'archive/data.pkl' is compressed"):
        ember.load_torch(buf.getvalue())


def test_missing_file():
    with pytest.raises(WeightsError, match="cannot open"):
        ember.load_torch("/nonexistent/model.pt")


# ---- fuzzing: a corrupt checkpoint ends in WeightsError, never another exception ------------

with open(CKPT, "rb") as _f:
    VALID = _f.read()


def test_truncations_raise():
    for n in list(range(0, 64)) + list(range(64, len(VALID), 97)):
        with pytest.raises(WeightsError):
            ember.load_torch(VALID[:n])


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # e.g. inside Pyodide: the deterministic tests above still run
    given = None

if given is not None:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=4))
    def test_byte_flips_raise_only_weights_error(flips):
        raw = bytearray(VALID)
        for pos, x in flips:
            raw[pos] ^= x
        try:
            ember.load_torch(bytes(raw))
        except WeightsError:
            pass

    @settings(max_examples=150, deadline=None)
    @given(st.binary(max_size=300))
    def test_random_pickles_raise_only_weights_error(pkl):
        try:
            ember.load_torch(checkpoint(b"\x80\x02" + pkl, {"0": F4}))
        except WeightsError:
            pass
