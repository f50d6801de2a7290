"""The browser driver for real: headless Chromium (WebGPU on SwiftShader) boots Pyodide, installs
the freshly built ember wheel, awaits ``ember.webgpu.init()`` and runs ops on ``"webgpu"`` and on
``"python"`` in the page; the host compares them. Stands alone: a plain ``http.server`` on
127.0.0.1 (random port) serves a temporary folder with the wheel, the npm Pyodide files and one
HTML page. Skipped where Chromium, Playwright or the Pyodide files are missing
(``python build.py setup`` fetches Pyodide)."""
import pytest

from browser_page import SKIPS, run_page

pytestmark = SKIPS

# Runs inside the page (Python 3.14 in Pyodide, no numpy): every op on webgpu and on python.
PAGE_CODE = r'''
import json, math
import ember
import ember.webgpu as wg
from ember.errors import DeviceError

out = {}
info = await wg.init()
out["adapter"] = {k: info.get(k) for k in ("vendor", "architecture", "device", "backend", "driver")}
out["features"] = info["features"]
out["devices"] = ember.devices()

def vals(n, seed):
    x = seed
    res = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        res.append(x / 2147483648.0 * 4.0 - 2.0)
    return res

def mat(r, c, seed):
    v = vals(r * c, seed)
    return [v[i * c:(i + 1) * c] for i in range(r)]

def both(fn, *data):
    res = {}
    for dev in ("python", "webgpu"):
        ts = [ember.tensor(d, device=dev) for d in data]
        res[dev] = fn(*ts).tolist()          # sync read: JSPI on webgpu
    return res

A, B = mat(33, 20, 1), mat(20, 17, 2)
out["matmul"] = both(lambda a, b: a @ b, A, B)
out["matmul_wT"] = both(lambda a, b: a @ ember.matrix_transpose(b), A, mat(17, 20, 3))
X = vals(4096, 4)
out["gelu_chain"] = both(lambda x: x * ((x / math.sqrt(2)).erf() + 1) / 2, X)
M = mat(24, 50, 5)
out["sum"] = both(lambda x: x.sum(axis=1), M)
out["max"] = both(lambda x: ember.max(x, axis=0), M)
out["softmax"] = both(lambda x: ember.softmax(x, axis=-1), M)
out["layer_norm"] = both(lambda x: ember.layer_norm(x, 50), M)

# every kernel file compiles under Chromium's compiler and agrees with the python backend
from ember.webgpu import autotune, fusion, linalg
rt = wg.get_runtime()
fusion._HEAVY_OFF = False     # (GELU in the epilogues: their compile under Chromium is what is checked)
for v in linalg.VARIANTS:
    if linalg.eligible(rt, v, 8, 17, 20, "f32"):
        autotune.force("matmul", v)
        out["matmul_" + v] = both(lambda a, b: a @ b, mat(8, 20, 6), B)
        wg.reset_stats()   # matmul + bias + gelu as one kernel (the epilogue)
        out["epilogue_" + v] = both(lambda x, w, b: ember.gelu(x @ ember.matrix_transpose(w) + b),
                                    mat(8, 20, 6), mat(17, 20, 3), vals(17, 11))
        out["epilogue_" + v]["fused"] = wg.stats()["fused_epilogues"]
autotune.force("matmul", "mv")    # B stored (K, N) with N % 4 == 0: the mv kernel, with an epilogue
out["mv_kn"] = both(lambda x, w, b: ember.gelu(x @ w + b), mat(8, 20, 6), mat(20, 24, 9), vals(24, 12))
out["mv_kn"]["pipelines"] = sum(1 for key in rt.pipelines if key[0] == "matmul_mv")
autotune.force("matmul", None)
fusion._HEAVY_OFF = True
img, w4 = mat(2 * 3 * 7, 6, 7), mat(4 * 3 * 3, 3, 8)
def nchw(t, shape):
    return t.reshape(shape)
out["conv2d"] = both(lambda x, w: ember.conv2d(nchw(x, (2, 3, 7, 6)), nchw(w, (4, 3, 3, 3)), padding=1, stride=(2, 1)), img, w4)
out["conv_transpose2d"] = both(lambda x, w: ember.conv_transpose2d(nchw(x, (2, 3, 7, 6)), nchw(w, (3, 4, 3, 3)), stride=2), img, w4)
out["max_pool2d"] = both(lambda x: ember.max_pool2d(nchw(x, (2, 3, 7, 6)), 2), img)
out["avg_pool2d"] = both(lambda x: ember.avg_pool2d(nchw(x, (2, 3, 7, 6)), 3, stride=2, padding=1), img)
out["cumsum"] = both(lambda x: ember.cumsum(x, axis=1), M)
out["sort"] = both(lambda x: ember.sort(x, axis=1), M)
out["argmax"] = both(lambda x: ember.argmax(x, axis=1), M)
out["pad"] = both(lambda x: ember.pad(x, ((1, 2), (3, 0)), mode="reflect"), M)
# a read started, more work submitted, then the read waited for (the LLM decode loop's order)
from ember.webgpu import replay
ids = [ember.argmax(ember.tensor(mat(3, 5, 20 + k), device="webgpu").sum(axis=0)) for k in range(3)]
later = replay.read_ints_later(ids)
busy = ember.tensor(X, device="webgpu") * 3
wg.get_runtime().driver.flush()
out["read_later"] = {"got": later(), "want": [int(t.tolist()) for t in ids], "busy": busy.sum().tolist(),
                     "busy_want": (ember.tensor(X, device="python") * 3).sum().tolist()}
out["take_concat"] = both(lambda x: ember.concat([ember.take(x, [3, 0, 5], axis=0), x[:2]], axis=0), M)
out["arange"] = both(lambda x: ember.arange(7, device=x.device) * x[0, :7], M)
q, k = mat(2 * 5, 8, 9), mat(2 * 6, 8, 10)
out["attention"] = both(lambda q_, k_: ember.scaled_dot_product_attention(
    q_.reshape((2, 5, 8)), k_.reshape((2, 6, 8)), k_.reshape((2, 6, 8)), is_causal=False), q, k)

x = ember.tensor(X, device="webgpu")
wg.reset_stats()
y = x * ((x / math.sqrt(2)).erf() + 1) / 2
wg.evaluate(y)
out["gelu_stats"] = wg.stats()
out["data_async"] = await (ember.tensor([[1.5, 2.5]], device="webgpu") * 2).data_async()
try:
    wg.get_runtime().driver.pipeline("@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }")
    out["compile_error"] = None
except DeviceError as e:
    out["compile_error"] = str(e)
out["stats"] = wg.stats()

# issue 12: over a (lowered) binding limit, elementwise chains and matmul run in chunks
old = wg.set_limits(8192)   # (Chromium aligns bindings to 256 bytes: 16 rows of a 12-wide C)
CH = mat(37, 101, 12)
out["chunked_elementwise"] = both(lambda x, r: (x * 2 + r).tanh(), CH, vals(101, 13))
out["chunked_matmul"] = both(lambda a, b: a @ b, mat(200, 64, 14), mat(64, 12, 15))
try:
    ember.tensor(CH, device="webgpu").sum(axis=0)
    out["limit_error"] = None
except DeviceError as e:
    out["limit_error"] = [type(e).__name__, str(e)]
wg.set_limits(None, None)

# issue 10: an Adam step is one dispatch per parameter, same values as on python
from ember import optim
res = {}
for dev in ("python", "webgpu"):
    ps = [ember.tensor(mat(5, 7, 16), device=dev).requires_grad_(), ember.tensor(vals(7, 17), device=dev).requires_grad_()]
    opt = optim.AdamW(ps, lr=0.01, amsgrad=True)
    for k in range(3):
        for i, p in enumerate(ps):
            p.grad = ember.tensor(mat(5, 7, 20 + k) if i == 0 else vals(7, 30 + k), device=dev)
            if dev == "webgpu":
                wg.evaluate(p.grad)
        if dev == "webgpu":
            wg.reset_stats()
        opt.step()
        if dev == "webgpu":
            res["dispatches"] = res.get("dispatches", []) + [wg.stats()["dispatches"]]
    res[dev] = [p.tolist() for p in ps]
out["adamw"] = res

# issue 20: a compiled plan replays as one prebuilt dispatch stream (one JavaScript call encodes
# every dispatch); the same bits as the step-by-step replay; an index guard still raises
from ember.webgpu import replay
W1, W2 = ember.tensor(mat(20, 16, 40), device="webgpu"), ember.tensor(mat(16, 8, 41), device="webgpu")
tbl = ember.tensor(mat(10, 8, 42), device="webgpu")
ar = ember.arange(3, dtype="int32", device="webgpu")
def step(x, pos):
    h = ember.gelu(x @ W1) @ W2
    return ember.softmax(h, axis=-1) + ember.take(tbl, pos + ar, axis=0).sum(axis=0)
res = {}
for on in (True, False):
    replay.ENABLED = on
    f = ember.compile(step)
    xs = [ember.tensor(mat(3, 20, 50 + i), device="webgpu") for i in range(4)]
    res["stream" if on else "steps"] = [f(x, ember.tensor([i], dtype="int32", device="webgpu")).tolist()
                                        for i, x in enumerate(xs)]
    if on:
        res["describe"] = f.plan_for(xs[0], ember.tensor([0], dtype="int32", device="webgpu")).fast.describe()
        try:
            f(xs[0], ember.tensor([8], dtype="int32", device="webgpu"))
            res["guard"] = None
        except Exception as e:
            res["guard"] = type(e).__name__
replay.ENABLED = True
out["stream"] = res

# issue 23: a user's WGSL kernel (ember.webgpu.custom_op) through the browser driver: forward,
# its grad rule, a compiled replay, and bad WGSL as a ShaderError with Chromium's line and column
from ember.errors import ShaderError
CUBE = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, 2>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 64u;
  if (i >= info[1].x) { return; }
  out[i] = x[i] * x[i] * x[i];
}"""
cube = wg.custom_op("page_cube", CUBE, shape="same", dtype="same", grad=lambda g, y, x, **_: g * 3.0 * x * x,
                    python=lambda x: x * x * x)
res = both(lambda x: cube(x * 0.5 + 0.25), vals(300, 60))
xg = ember.tensor(vals(300, 61), device="webgpu", requires_grad=True)
cube(xg).sum().backward()
res["grad"] = xg.grad.tolist()
res["grad_want"] = [3 * v * v for v in vals(300, 61)]
fc = ember.compile(lambda x: cube(x) + 1.0)
res["replay"] = [fc(ember.tensor(vals(300, 62 + i), device="webgpu")).tolist() for i in range(3)][-1]
res["replay_want"] = [v ** 3 + 1 for v in vals(300, 64)]
try:
    wg.custom_op("page_bad", CUBE.replace("x[i] * x[i] * x[i]", "x[i] * y[i]"), shape="same", dtype="same")
    res["error"] = None
except ShaderError as e:
    res["error"] = [e.line, e.column, str(e)]
res["after_error"] = (ember.tensor([1.0, 2.0], device="webgpu") * 2).tolist()
out["custom_op"] = res

# the LLM decode kernels under Chromium's compiler: gemv with its RMSNorm prologue and rope
# epilogue and attn (reductions by subgroup shuffles where the adapter has subgroups), and gemv8
# (x as int8 per block, dot4I8Packed) where the WGSL has packed_4x8_integer_dot_product
import os, struct
from ember.quant import QTensor
from ember.ops.llm import qlinear_rms_rope, rope_tables
dec = {"wgsl_features": sorted(getattr(rt.driver, "wgsl_features", ()))}
Wq = QTensor.quantize(ember.tensor(mat(32, 64, 70), device="python"), "q8_0")
for dev in ("python", "webgpu"):
    cs, sn = rope_tables(16, 8, 10000.0, device=dev)
    dec["rms_rope_" + dev] = qlinear_rms_rope(
        ember.tensor([vals(64, 71)], device=dev), ember.tensor(vals(64, 72), device=dev), Wq.to(dev), cs, sn,
        ember.tensor([2], dtype="int32", device=dev), rope_rows=24, head_dim=8).tolist()
    kc = ember.tensor([[vals(8, 80 + r)] * 2 for r in range(40)], device=dev)
    vcache = ember.tensor([[vals(8, 130 + r)] * 2 for r in range(40)], device=dev)
    dec["attn_" + dev] = ember.attention_cached(
        ember.tensor([[vals(8, 73 + h) for h in range(4)]], device=dev), ember.tensor([[vals(8, 77)] * 2], device=dev),
        ember.tensor([[vals(8, 78)] * 2], device=dev), kc, vcache, ember.tensor([37], dtype="int32", device=dev)).tolist()
# a 1040 x 4096 q8_0 weight of random bytes (scale 1/64 in every block): gemv8 vs the float kernel
blk = bytearray(os.urandom(34 * 1040 * 128))
for b in range(0, len(blk), 34):
    blk[b:b + 2] = struct.pack("<e", 1 / 64)
W8 = QTensor(ember.tensor(list(struct.unpack(f"<{len(blk) // 4}i", bytes(blk))), dtype="int32", device="webgpu"),
             "q8_0", (1040, 4096))
x8 = ember.tensor([vals(4096, 90)], device="webgpu")
for key, i8 in (("gemv8", "1"), ("gemv_float", "0")):
    os.environ["EMBER_QLINEAR_I8"] = i8
    dec[key] = ember.qlinear(x8, W8.data, qtype="q8_0", n=1040, k=4096).tolist()[0]
os.environ.pop("EMBER_QLINEAR_I8")
out["decode"] = dec

# device loss (GPUDevice.destroy()): a typed DeviceLostError, and init() opens a new device
x = ember.tensor([1.0, 2.0], device="webgpu")
dev = wg.get_runtime().driver._dev
dev.destroy()
await dev.lost
try:
    (x * 2).tolist()
    out["lost"] = None
except DeviceError as e:
    out["lost"] = [type(e).__name__, str(e)]
await wg.init()
out["after_lost"] = (ember.tensor([1.0, 2.0], device="webgpu") * 3).tolist()
json.dumps(out)
'''

@pytest.fixture(scope="module")
def page_result(tmp_path_factory):
    return run_page(tmp_path_factory.mktemp("ember-webgpu-site"), PAGE_CODE, webgpu=True, timeout_ms=240_000)


def _flat(x):
    if isinstance(x, list):
        return [v for item in x for v in _flat(item)]
    return [x]


def _close(a, b, rtol=1e-5, atol=1e-5):
    fa, fb = _flat(a), _flat(b)
    assert len(fa) == len(fb)
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(fa, fb)) if abs(x - y) > atol + rtol * abs(y)]
    assert not bad, f"{len(bad)} values differ, first {bad[:3]}"


def test_page_opens_webgpu_through_the_browser_driver(page_result):
    r = page_result
    assert r["adapter"]["backend"] == "browser"
    assert "webgpu" in r["devices"] and "python" in r["devices"]


@pytest.mark.parametrize("name", ["matmul", "matmul_wT", "gelu_chain", "sum", "max", "softmax", "layer_norm",
                                  "matmul_tiled", "matmul_rb32", "matmul_rb64", "matmul_rb128", "conv2d", "conv_transpose2d",
                                  "max_pool2d", "avg_pool2d", "cumsum", "sort", "argmax", "pad", "take_concat",
                                  "arange", "attention"])
def test_webgpu_matches_python_in_the_page(page_result, name):
    res = page_result[name]
    loose = name.startswith(("matmul", "conv", "attention"))
    _close(res["webgpu"], res["python"], rtol=1e-4 if loose else 1e-5, atol=1e-4 if loose else 1e-5)


def test_a_read_started_before_later_work_in_the_page(page_result):
    r = page_result["read_later"]
    assert r["got"] == r["want"] and len(r["got"]) == 3, r
    _close([r["busy"]], [r["busy_want"]], rtol=1e-4, atol=1e-3)    # the work submitted meanwhile


@pytest.mark.parametrize("variant", ["tiled", "rb32", "rb64", "rb128", "sg"])
def test_matmul_epilogue_in_the_page(page_result, variant):
    res = page_result.get("epilogue_" + variant)
    if res is None:
        pytest.skip(f"{variant} is not eligible on this adapter")
    assert res["fused"] == 1
    _close(res["webgpu"], res["python"], rtol=1e-4, atol=1e-4)


def test_mv_matmul_in_the_page(page_result):
    res = page_result["mv_kn"]
    assert res["pipelines"] >= 1
    _close(res["webgpu"], res["python"], rtol=1e-4, atol=1e-4)


def test_llm_decode_kernels_in_the_page(page_result):
    d = page_result["decode"]
    print("\npage adapter features", page_result["features"], "wgsl", d["wgsl_features"])
    _close(d["rms_rope_webgpu"], d["rms_rope_python"], rtol=1e-4, atol=1e-4)
    _close(d["attn_webgpu"], d["attn_python"], rtol=1e-4, atol=1e-4)
    f, i = d["gemv_float"], d["gemv8"]
    if "packed_4x8_integer_dot_product" not in d["wgsl_features"]:
        assert i == f      # the float kernel both times
        return
    mean = sum(f) / len(f)
    spread = (sum((v - mean) ** 2 for v in f) / len(f)) ** 0.5
    err = (sum((a - b) ** 2 for a, b in zip(i, f)) / len(f)) ** 0.5
    assert 0 < err < 0.012 * spread, (err, spread)   # x's rounding to 8 bits, no more


def test_subgroup_matmul_in_the_page(page_result):
    if "subgroups" not in page_result["features"]:
        pytest.skip("this adapter has no subgroups")
    res = page_result["matmul_sg"]
    _close(res["webgpu"], res["python"], rtol=1e-4, atol=1e-4)


def test_fusion_async_reads_and_errors_in_the_page(page_result):
    r = page_result
    assert r["gelu_stats"]["dispatches"] == 1 and r["gelu_stats"]["fused_kernels"] == 1
    assert r["data_async"] == [[3.0, 5.0]]
    assert r["compile_error"] and "failed to compile" in r["compile_error"]
    assert r["stats"]["pool_hits"] > 0


def test_chunked_kernels_under_a_lowered_limit_in_the_page(page_result):
    r = page_result
    _close(r["chunked_elementwise"]["webgpu"], r["chunked_elementwise"]["python"])
    _close(r["chunked_matmul"]["webgpu"], r["chunked_matmul"]["python"], rtol=1e-4, atol=1e-4)
    kind, msg = r["limit_error"]
    assert kind == "DeviceLimitError" and "sum" in msg and "8192" in msg


def test_fused_optimizer_step_in_the_page(page_result):
    r = page_result["adamw"]
    assert r["dispatches"] == [2, 2, 2]
    _close(r["webgpu"], r["python"], rtol=1e-5, atol=1e-6)


def test_device_loss_is_typed_and_init_reopens_in_the_page(page_result):
    kind, msg = page_result["lost"]
    assert kind == "DeviceLostError" and "lost" in msg
    assert page_result["after_lost"] == [3.0, 6.0]


def test_plan_replays_as_one_dispatch_stream_in_the_page(page_result):
    r = page_result["stream"]
    d = r["describe"]
    assert d["stream"] and d["replays"] >= 2 and d["dispatches"] >= 3 and d["guards"] >= 1, d
    assert r["stream"] == r["steps"]            # the same floats, bit for bit
    assert r["guard"] == "IndexingError"


def test_custom_wgsl_op_in_the_page(page_result):
    r = page_result["custom_op"]
    _close(r["webgpu"], r["python"])
    _close(r["grad"], r["grad_want"], rtol=1e-4)
    _close(r["replay"], r["replay_want"], rtol=1e-4)
    assert r["error"] is not None and r["error"][0] == 9 and r["error"][1], r["error"]
    assert "page_bad" in r["error"][2] and r["after_error"] == [2.0, 4.0]
