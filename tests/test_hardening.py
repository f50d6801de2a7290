"""Hostile inputs fail fast with ember's own errors (issue 12): tiny checkpoints that claim huge
views, malformed safetensors headers, and tensor calls that would allocate more than the
per-tensor ceiling. Each case runs the way a user would hit it; the ones that used to hang run
under a time limit in a subprocess with an address-space cap, so a regression fails instead of
eating the machine."""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

import ember
from ember import limits
from ember.errors import DTypeError, EmberError, ResourceError, ShapeError, WeightsError

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "hostile")


# ---- hand-built checkpoints (the same opcodes torch.save writes, protocol 2) -----------------

def G(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def S(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def I(n):  # BININT for small values, LONG1 for the rest (what pickle writes for big ints)
    if -(2 ** 31) <= n < 2 ** 31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def tup(*items):
    return b"(" + b"".join(items) + b"t"


def tensor_pkl(stype="FloatStorage", key="0", numel=4, offset=0, size=(4,), stride=(1,)):
    storage = tup(S("storage"), G("torch", stype), S(key), S("cpu"), I(numel)) + b"Q"
    args = tup(storage, I(offset), tup(*map(I, size)), tup(*map(I, stride)), b"\x89",
               G("collections", "OrderedDict") + b")R")
    return G("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def checkpoint(pkl, storages=None):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        for k, v in (storages or {}).items():
            z.writestr(f"archive/data/{k}", v)
    return buf.getvalue()


def state_dict(**items):
    return b"\x80\x02}(" + b"".join(S(k) + v for k, v in items.items()) + b"u."


def run_isolated(code: str, timeout: float = 60, mem_gib: int = 4) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with an address-space cap; a hang or a memory blow-up
    fails the test instead of the machine."""
    prelude = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({mem_gib << 30}, {mem_gib << 30}))\n"
               f"import sys; sys.path[:0] = {sys.path!r}\n")
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=os.path.dirname(HERE))


# ---- checkpoints ------------------------------------------------------------------------------

def test_expanded_view_fixture_is_refused_fast():
    # tests/fixtures/hostile/expand_1e10.pt: torch.save({"w": torch.ones(1).expand(10**5, 10**5)})
    # -- a 4-byte storage under a (100000, 100000) view with strides (0, 0).
    path = os.path.join(FIX, "expand_1e10.pt")
    assert os.path.getsize(path) < 1024
    t0 = time.perf_counter()
    with pytest.raises(WeightsError) as ei:
        ember.load_torch(path)
    assert time.perf_counter() - t0 < 10, "a hang guard: refused in ~0.01 s on an idle machine"
    msg = str(ei.value)
    for part in ("tensor 'w'", "(100000, 100000)", "strides (0, 0)", "40000000000 bytes", "storage '0'"):
        assert part in msg, (part, msg)


def test_expanded_view_in_a_subprocess_does_not_allocate():
    r = run_isolated(f"""
        import ember, time
        t = time.perf_counter()
        try:
            ember.load_torch({os.path.join(FIX, "expand_1e10.pt")!r})
        except ember.errors.WeightsError as e:
            print("refused", round(time.perf_counter() - t, 3))
    """, timeout=60, mem_gib=1)
    assert r.returncode == 0 and r.stdout.startswith("refused"), r.stderr[-2000:]


def test_small_expanded_views_still_load_and_are_fast(device):
    # what real checkpoints hold: a broadcast bias, a transposed weight, overlapping windows
    raw = {"0": struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)}
    pkl = state_dict(rep=tensor_pkl(numel=4, size=(3, 4), stride=(0, 1)),
                     big=tensor_pkl(numel=4, size=(500, 400, 4), stride=(0, 0, 1)),
                     t=tensor_pkl(numel=4, size=(2, 2), stride=(1, 2)),
                     ov=tensor_pkl(numel=4, size=(2, 2, 2), stride=(1, 1, 1)))
    t0 = time.perf_counter()
    sd = ember.load_torch(checkpoint(pkl, raw), device=device)
    assert time.perf_counter() - t0 < 30
    assert sd["rep"].tolist() == [[1.0, 2.0, 3.0, 4.0]] * 3
    assert sd["big"].shape == (500, 400, 4) and sd["big"][499, 399].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert sd["t"].tolist() == [[1.0, 3.0], [2.0, 4.0]]
    # overlapping strides (1, 1, 1): element [a, b, c] is storage[a + b + c]
    ov = sd["ov"].tolist()
    assert all(ov[a][b][c] == [1.0, 2.0, 3.0, 4.0][a + b + c] for a in range(2) for b in range(2) for c in range(2))


def test_strided_gather_matches_an_element_by_element_reference():
    import itertools
    import random
    from array import array

    from ember.io.torch import _strided_bytes

    rng = random.Random(12)
    store = array("i", range(1000)).tobytes()
    for _ in range(300):
        nd = rng.randint(0, 4)
        size = tuple(rng.randint(0, 4) for _ in range(nd))
        stride = tuple(rng.choice([0, 1, 2, 3, 5, 12]) for _ in range(nd))
        offset = rng.randint(0, 10)
        if 0 in size:
            continue
        want = [offset + sum(i * s for i, s in zip(idx, stride))
                for idx in itertools.product(*[range(n) for n in size])]
        assert array("i", _strided_bytes(store, 4, offset, size, stride)).tolist() == want, (size, stride)


def test_many_views_cannot_multiply_one_storage():
    # 300 distinct 1 MiB views over one 4-byte storage: each under the per-tensor ceiling, but
    # together far over what a 4-byte checkpoint may materialise.
    body = b"".join(S(f"v{i}") + tensor_pkl(numel=1, offset=0, size=(256, 1024 + i), stride=(0, 0))
                    for i in range(300))
    raw = checkpoint(b"\x80\x02}(" + body + b"u.", {"0": struct.pack("<f", 1.0)})
    with pytest.raises(WeightsError, match=r"what this checkpoint's views may materialise"):
        ember.load_torch(raw)


def test_view_over_the_ceiling_names_tensor_shape_strides_bytes():
    old = ember.set_max_tensor_bytes(1 << 20)
    try:
        raw = checkpoint(state_dict(w=tensor_pkl(numel=1, size=(1024, 1024), stride=(0, 0))),
                         {"0": struct.pack("<f", 1.0)})
        with pytest.raises(WeightsError, match=r"tensor 'w'.*\(1024, 1024\) and strides \(0, 0\).*4194304 bytes"):
            ember.load_torch(raw)
        # a real (non-repeating) tensor over the ceiling is a resource problem, not a bad file
        n = 300_000
        raw = checkpoint(state_dict(w=tensor_pkl(numel=n, size=(n,))), {"0": bytes(4 * n)})
        with pytest.raises(ResourceError, match=r"load_torch: tensor 'w' of shape \(300000,\).*1200000 bytes"):
            ember.load_torch(raw)
    finally:
        ember.set_max_tensor_bytes(old)


def test_tensor_dict_keys_are_refused():
    # {tensor: tensor}: a dict key built by _rebuild_tensor_v2
    pkl = b"\x80\x02}(" + tensor_pkl() + tensor_pkl() + b"u."
    with pytest.raises(WeightsError, match=r"key that is a tensor"):
        ember.load_torch(checkpoint(pkl, {"0": bytes(16)}))
    pkl = b"\x80\x02}(" + S("a") + b"}(" + G("torch", "FloatStorage") + I(1) + b"uu."
    with pytest.raises(WeightsError, match=r"dict 'a' has a key that is a torch.FloatStorage"):
        ember.load_torch(checkpoint(pkl))


def test_huge_rank_is_refused():
    size = (1,) * 100_000
    raw = checkpoint(state_dict(w=tensor_pkl(numel=4, size=size, stride=size)), {"0": bytes(16)})
    t0 = time.perf_counter()
    with pytest.raises(WeightsError, match=r"tensor 'w': 100000 dimensions"):
        ember.load_torch(raw)
    assert time.perf_counter() - t0 < 30   # ~2 s idle (pickletools walks 200,000 opcodes): a guard against a hang, not a timing


def test_deep_nesting_is_a_weights_error():
    pkl = b"\x80\x02" + b"(" * 100_000 + b"l" * 100_000 + b"."   # a list in a list in ... 100,000 deep
    with pytest.raises(WeightsError):
        ember.load_torch(checkpoint(pkl))


# ---- safetensors ------------------------------------------------------------------------------

def st_raw(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


@pytest.mark.parametrize("header,pattern", [
    (b'{"w":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}', r"not a valid safetensors header"),
    (b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,' + b"4" * 5000 + b']}}', r"not a valid safetensors header"),
    (b'{"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}', r"shape must be a list"),
    (b'{"w":{"dtype":"F32","shape":[' + b",".join([b"1"] * 100_000) + b'],"data_offsets":[0,4]}}',
     r"shape has 100000 dimensions"),
    (b'{"w":{"dtype":"F32","shape":[0,' + str(2 ** 64).encode() + b'],"data_offsets":[0,0]}}', r"below 2\*\*63"),
    (b'{"w":{"dtype":"F32","shape":[0,' + b",".join([str(2 ** 62).encode()] * 3) + b'],"data_offsets":[0,0]}}',
     r"more than 2\*\*63 - 1 elements"),
    (b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":' + b"[" * 100_000 + b"]" * 100_000 + b'}}',
     r"nested too deeply"),
    (b'{"w":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', r"shape must be a list"),
    (b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[false,4]}}', r"data_offsets"),
    (b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{}}', r"duplicate key 'w'"),
    (b'\xff{}', r"not UTF-8"),
    (b'{"__metadata__":{"a":1}}', r"__metadata__ must be an object of strings"),
])
def test_malformed_safetensors_header_is_a_weights_error(header, pattern):
    with pytest.raises(WeightsError, match=pattern):
        ember.load_safetensors(st_raw(header, bytes(4)))


def test_safetensors_tensor_over_the_ceiling():
    raw = ember.save_safetensors({"w": ember.zeros((1000,))})
    sd = ember.load_safetensors(raw)
    old = ember.set_max_tensor_bytes(1000)
    try:
        with pytest.raises(ResourceError, match=r"load_safetensors: tensor 'w' of shape \(1000,\).*4000 bytes"):
            sd["w"]
    finally:
        ember.set_max_tensor_bytes(old)
    assert sd["w"].shape == (1000,)


# ---- the allocation ceiling -------------------------------------------------------------------

HOSTILE_CALLS = {
    "broadcast_add": "ember.zeros((10**5, 1), device=D) + ember.zeros((1, 10**5), device=D)",
    "arange": "ember.arange(0, 10**15, device=D)",
    "eye": "ember.eye(10**6, device=D)",
    "pad": "ember.pad(ember.ones((2, 2), device=D), (10**12, 10**12))",
    "conv2d": "ember.conv2d(ember.ones((1, 1, 4, 4), device=D), ember.ones((1, 1, 3, 3), device=D), padding=10**6)",
    "zeros": "ember.zeros((10**12,), device=D)",
    "linspace": "ember.linspace(0, 1, 10**12, device=D)",
    "matmul": "ember.ones((10**5, 1), device=D) @ ember.ones((1, 10**5), device=D)",
    "broadcast_to": "ember.broadcast_to(ember.ones((1,), device=D), (10**6, 10**6))",
}


@pytest.mark.parametrize("dev", ["python", "numpy"])
@pytest.mark.parametrize("name", sorted(HOSTILE_CALLS))
def test_hostile_calls_fail_fast_with_resource_error(dev, name):
    if dev == "numpy":
        pytest.importorskip("numpy")
    D = dev  # noqa: F841  (used by the expression)
    t0 = time.perf_counter()
    with pytest.raises(ResourceError) as ei:
        eval(HOSTILE_CALLS[name])
    assert time.perf_counter() - t0 < 10
    e = ei.value
    assert isinstance(e, MemoryError) and isinstance(e, EmberError)
    assert e.nbytes > limits.max_tensor_bytes() and e.op and e.shape
    assert e.op in str(e) and str(e.nbytes) in str(e) and str(e.shape[-1]) in str(e)


def test_hostile_calls_under_an_address_space_cap():
    # the original report: these ran until killed; here they must all end, at once, in ResourceError
    code = ["import ember, time", "D = 'python'"]
    for name, expr in HOSTILE_CALLS.items():
        code += [f"t = time.perf_counter()", "try:", f"    {expr}", f"    print({name!r}, 'returned')",
                 "except ember.errors.ResourceError:", f"    print({name!r}, 'ok', round(time.perf_counter() - t, 3))"]
    r = run_isolated("\n".join(code), timeout=60, mem_gib=2)
    lines = r.stdout.split("\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sum(ln.split()[1:2] == ["ok"] for ln in lines if ln) == len(HOSTILE_CALLS), r.stdout


def test_ceiling_is_configurable_and_the_default_is_sane():
    d = limits.default_max_tensor_bytes()
    assert 64 << 20 <= d <= limits.available_memory()
    old = ember.set_max_tensor_bytes("1MiB")
    try:
        assert ember.max_tensor_bytes() == 1 << 20
        ember.zeros((256, 1024))                       # exactly 1 MiB: allowed
        with pytest.raises(ResourceError):
            ember.zeros((256, 1025))
        ember.set_max_tensor_bytes(None)
        assert ember.max_tensor_bytes() is None
        with pytest.raises(TypeError):
            ember.set_max_tensor_bytes(2.5)
    finally:
        ember.set_max_tensor_bytes(old)
    assert ember.max_tensor_bytes() == old


def test_env_variable_and_pyodide_default():
    r = run_isolated("""
        import ember
        print(ember.max_tensor_bytes())
    """)
    assert int(r.stdout) == limits.default_max_tensor_bytes() or int(r.stdout) <= (4 << 30) // 4
    env = dict(os.environ, EMBER_MAX_TENSOR_BYTES="3MiB")
    out = subprocess.run([sys.executable, "-c", "import ember; print(ember.max_tensor_bytes())"],
                         capture_output=True, text=True, env=env, cwd=os.path.dirname(HERE))
    assert out.stdout.strip() == str(3 << 20), out.stderr
    assert limits.parse_bytes("4G") == 4 << 30 and limits.parse_bytes("off") is None
    assert limits.parse_bytes("1e9") == 10 ** 9 and limits.parse_bytes("2 kB") == 2000
    with pytest.raises(ValueError):
        limits.parse_bytes("lots")
    # inside Pyodide (sys.platform == "emscripten") the default is at most 2 GiB
    r = subprocess.run([sys.executable, "-c", "import sys; sys.platform = 'emscripten'\n"
                        "import ember; print(ember.max_tensor_bytes())"],
                       capture_output=True, text=True, cwd=os.path.dirname(HERE),
                       env={k: v for k, v in os.environ.items() if k != "EMBER_MAX_TENSOR_BYTES"})
    assert 0 < int(r.stdout) <= 2 << 30, r.stderr


def test_meta_device_is_not_limited():
    x = ember.ones((1,)).to("meta")
    y = ember.broadcast_to(x, (10 ** 6, 10 ** 6))
    assert y.shape == (10 ** 6, 10 ** 6) and y.device == "meta"


@pytest.mark.parametrize("shape", [(2.5,), ("3",), (True,), (2, False), 2.0, "3", (2, None), (3, -1)])
def test_shapes_accept_only_integers(shape):
    with pytest.raises(ShapeError):
        ember.zeros(shape)


def test_numpy_integer_sizes_are_fine():
    np = pytest.importorskip("numpy")
    assert ember.zeros((np.int64(2), np.int32(3))).shape == (2, 3)
    assert ember.eye(np.int64(2)).shape == (2, 2)


def test_too_many_axes_is_a_shape_error():
    with pytest.raises(ShapeError, match="more than 64 axes"):
        ember.zeros((1,) * 100_000)
    assert ember.zeros((1,) * 64).ndim == 64


@pytest.mark.parametrize("value,dtype", [(300, "uint8"), (-1, "uint8"), (2 ** 31, "int32"), (2 ** 70, "int64"),
                                         (-(2 ** 63) - 1, "int64"), (1e30, "int32"), (10 ** 400, "float32")])
def test_out_of_range_fill_is_a_dtype_error(value, dtype):
    with pytest.raises(DTypeError, match=dtype):
        ember.full((2,), value, dtype=dtype)


def test_in_range_fills_and_arange_bounds():
    assert ember.full((2,), 255, dtype="uint8").tolist() == [255, 255]
    assert ember.full((1,), -(2 ** 63)).tolist() == [-(2 ** 63)]
    assert ember.full((1,), 2.9, dtype="int32").tolist() == [2]
    with pytest.raises(DTypeError, match="int32"):
        ember.arange(2 ** 31 - 2, 2 ** 31 + 2, dtype="int32")
    with pytest.raises(DTypeError, match="int64"):
        ember.arange(2 ** 63, 2 ** 63 + 2)
    assert ember.arange(250, 256, 2, dtype="uint8").tolist() == [250, 252, 254]


def test_apply_check_rejects_non_integer_output_shapes():
    # what registry.apply runs on every op's output meta before its kernel
    for bad in [(2.0, 2), ("3",), (2, None)]:
        with pytest.raises(ShapeError):
            limits.check_output("op", bad, ember.float32)
    limits.check_output("op", (2, 3), ember.float32)
    limits.check_output("op", ((2,), (3,)), (ember.float32, ember.int64))   # multi-output ops
    with pytest.raises(ResourceError, match="split"):
        limits.check_output("split", ((2,), (10 ** 12,)), (ember.float32, ember.int64))


def test_zip_entry_shorter_than_its_directory_claims():
    # found by the fuzzer: the central directory says 16 bytes, the entry holds none
    with pytest.raises(WeightsError, match=r"storage 'archive/data/0' gave 0 bytes, not the 16"):
        ember.load_torch(os.path.join(FIX, "short_storage_entry.pt"))


def test_ceiling_inside_pyodide(tmp_path_factory):
    # the real thing: in Pyodide (wasm32, 4 GB at most) the default ceiling is 1 GiB and the
    # hostile broadcast fails at once with ResourceError
    import test_pyodide as tp

    node = tp.need_node()
    wheel = tp._wheel(tmp_path_factory)
    io_dir = tmp_path_factory.mktemp("pyodide-limits")
    driver = textwrap.dedent("""
        import json, time, ember
        t = time.perf_counter()
        try:
            ember.zeros((10**5, 1)) + ember.zeros((1, 10**5))
            got = "returned"
        except ember.errors.ResourceError as e:
            got = type(e).__name__
        json.dump({"max": ember.max_tensor_bytes(), "got": got, "s": time.perf_counter() - t},
                  open("/io/limits.json", "w"))
    """)
    proc = tp.run_driver(node, wheel, io_dir, driver, {io_dir: "/io"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((io_dir / "limits.json").read_text())
    assert res["max"] == 1 << 30 and res["got"] == "ResourceError" and res["s"] < 2, res
