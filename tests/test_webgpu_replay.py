"""webgpu plans replayed as prebuilt dispatch streams (``ember.webgpu.replay``): the same bits as
the step-by-step replay, guards on index ranges, replaced constants, outputs never overwritten,
one read-back per decoded token. Runs on any adapter (lavapipe here)."""
import gc
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.errors import IndexingError, ShapeError


def _model(rt):
    ember.manual_seed(0)
    from ember import nn

    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).to("webgpu")
    return m


def _run_many(f, xs):
    return [f(x).numpy() for x in xs]


def test_stream_gives_the_same_bits_as_step_by_step(rt, monkeypatch):
    from ember.webgpu import replay

    rng = np.random.default_rng(0)
    xs = [ember.tensor(rng.standard_normal((5, 16)).astype(np.float32), device="webgpu") for _ in range(5)]
    m = _model(rt)
    with ember.no_grad():
        fs = ember.compile(lambda x: ember.softmax(m(x), axis=-1))
        got = _run_many(fs, xs)
        st = fs.plan_for(xs[0]).fast
        assert isinstance(st, replay.StreamReplay)
        d = st.describe()
        assert d["stream"] and d["replays"] == 3 and d["dispatches"] > 3, d
        monkeypatch.setattr(replay, "ENABLED", False)
        fp = ember.compile(lambda x: ember.softmax(m(x), axis=-1))
        want = _run_many(fp, xs)
        assert fp.plan_for(xs[0]).fast is False
    for a, b in zip(got, want):
        assert a.tobytes() == b.tobytes()


def test_outputs_are_not_overwritten_by_the_next_replay(rt):
    f = ember.compile(lambda x: x * 2.0 + 1.0)
    outs = [f(ember.tensor([float(i)] * 4, device="webgpu")) for i in range(5)]
    assert [o.tolist()[0] for o in outs] == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert f.plan_for(outs[0]).fast.describe()["stream"]


def test_replaced_constant_records_again(rt):
    w = ember.ones((3, 2), device="webgpu")
    f = ember.compile(lambda x: x @ w)
    x = ember.ones((1, 3), device="webgpu")
    for _ in range(3):
        assert f(x).tolist() == [[3.0, 3.0]]
    fast = f.plan_for(x).fast
    assert fast.describe()["stream"]
    w._set_(ember.full((3, 2), 2.0, device="webgpu"))     # another buffer behind the same tensor
    assert f(x).tolist() == [[6.0, 6.0]]                    # step by step, never the old weight
    assert f(x).tolist() == [[6.0, 6.0]]                    # recorded again
    assert f(x).tolist() == [[6.0, 6.0]]
    assert fast.describe()["records"] == 2 and fast.describe()["stream"]


def test_index_guards_raise_on_the_replay_that_breaks_them(rt):
    table = ember.tensor(np.arange(40, dtype=np.float32).reshape(10, 4), device="webgpu")
    ar = ember.arange(3, dtype="int32", device="webgpu")
    f = ember.compile(lambda pos: ember.take(table, pos + ar, axis=0).sum(axis=-1))
    for p in (0, 3, 7):
        got = f(ember.tensor([p], dtype="int32", device="webgpu")).tolist()
        assert got == [float(sum(range(4 * (p + i), 4 * (p + i) + 4))) for i in range(3)]
    fast = f.plan_for(ember.tensor([0], dtype="int32", device="webgpu")).fast
    assert fast.describe()["stream"] and fast.describe()["guards"] >= 1
    rt.reset_stats()
    f(ember.tensor([2], dtype="int32", device="webgpu"))
    assert rt.stats["reads"] == 0          # the range is known from the upload: nothing read back
    with pytest.raises(IndexingError):
        f(ember.tensor([8], dtype="int32", device="webgpu"))     # 8 + 2 = 10: out of range
    # an input computed on the GPU has no known range: that replay runs step by step, still checked
    computed = ember.tensor([4], dtype="int32", device="webgpu") * 2
    with pytest.raises(IndexingError):
        f(computed)
    assert f(ember.tensor([1], dtype="int32", device="webgpu")).tolist()[0] == 4.0 + 5 + 6 + 7


def _mlp_trajectory(device, steps, *, compiled=True, counts=None, hold=True):
    """Adam on a small MLP for ``steps`` compiled steps: (losses, parameters, gradients held
    after each step (``hold``), the compiled function, its arguments, per-step counts).
    ``counts``: {driver method: calls}, counted per step after eight warm-up steps."""
    from ember import nn
    import ember.nn.functional as F

    ember.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3)).to(device)
    opt = ember.optim.Adam(m.parameters(), lr=0.05)
    rng = np.random.default_rng(1)
    x = ember.tensor(rng.standard_normal((5, 6)).astype(np.float32), device=device)
    y = ember.tensor(rng.integers(0, 3, 5), device=device)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss
    f = ember.compile(step) if compiled else step
    losses, grads, per_step = [], [], []
    for i in range(steps):
        before = dict(counts) if counts is not None else None
        losses.append(f(x, y).item())
        if hold:     # held: a later step must not change them
            grads.append([p.grad for p in m.parameters()])
        if counts is not None and i >= 8:
            per_step.append({k: counts[k] - before[k] for k in counts})
    return (losses, [p.numpy() for p in m.parameters()], [[g.numpy() for g in gs] for gs in grads], f,
            (x, y), per_step)


def test_training_step_replays_as_one_stream_and_creates_nothing(rt, monkeypatch):
    from ember.webgpu import replay

    drv = rt.driver
    counts = {"alloc": 0, "_bind_group": 0, "stream_submit": 0, "pipeline": 0, "dispatch": 0}
    for name in counts:
        real = getattr(drv, name)

        def counted(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(drv, name, counted, raising=False)
    # (no gc.collect() anywhere: the step's garbage must go back to the pool by reference counting)
    _, _, _, f, args, per_step = _mlp_trajectory("webgpu", 12, counts=counts, hold=False)
    fast = f.plan_for(*args).fast
    assert isinstance(fast, replay.SegmentedReplay)
    d = fast.describe()
    # zero_grad, then forward and backward as ONE stream, then the gradients and Adam's step
    assert d["segments"] == 1 and d["streams"] == 1 and d["dispatches"] > 10 and d["replays"] >= 9, d
    assert d["host_steps"] == 1 + 6 + 1, d
    # after warm-up: one stream submit, no new buffers, pipelines or bind groups; what Python
    # dispatches one by one is Adam's fused kernel, one per parameter
    assert len(per_step) == 4
    for c in per_step:
        assert c == {"alloc": 0, "_bind_group": 0, "stream_submit": 1, "pipeline": 0, "dispatch": 6}, per_step
    got_l, got_p, got_g, *_ = _mlp_trajectory("webgpu", 7)
    # the same bits as eager steps on the same GPU, gradients held across steps included
    want_l, want_p, want_g, *_ = _mlp_trajectory("webgpu", 7, compiled=False)
    assert got_l == want_l and want_l[-1] < want_l[0]
    for a, b in zip(got_p + sum(got_g, []), want_p + sum(want_g, [])):
        assert a.tobytes() == b.tobytes()
    # and the numpy backend's trajectory (the reference kernels) to rounding
    ref_l, ref_p, *_ = _mlp_trajectory("numpy", 7, compiled=False)
    np.testing.assert_allclose(got_l, ref_l, rtol=1e-4, atol=1e-5)
    for a, b in zip(got_p, ref_p):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_training_steps_replay_step_by_step_when_segments_are_off(rt, monkeypatch):
    from ember.webgpu import replay

    monkeypatch.setattr(replay, "SEGMENTS", False)
    got_l, got_p, _, f, args, _ = _mlp_trajectory("webgpu", 4)
    assert f.plan_for(*args).fast is False
    want_l, want_p, *_ = _mlp_trajectory("webgpu", 4, compiled=False)
    assert got_l == want_l


def test_a_swapped_tensor_read_later_splits_the_stream(rt):
    """``_set_`` moves past kernel steps only until one reads the tensor it swaps: then the
    stream ends there, the swap runs, and the next stream reads the new value."""
    from ember.webgpu import replay

    def run(compiled):
        acc = ember.zeros((4,), device="webgpu")

        def step(x):
            acc._set_(acc * 0.5 + x)          # a running statistic, updated in place
            return (acc * 3.0).sum() + x.sum()
        f = ember.compile(step) if compiled else step
        xs = [ember.tensor([float(i), 1.0, -2.0, 0.5 * i], device="webgpu") for i in range(6)]
        return [f(x).item() for x in xs], acc.numpy(), f
    got, acc, f = run(True)
    want, acc_want, _ = run(False)
    assert got == want and acc.tobytes() == acc_want.tobytes()
    fast = f.plan_for(ember.ones((4,), device="webgpu")).fast
    assert isinstance(fast, replay.SegmentedReplay)
    d = fast.describe()
    assert d["segments"] == 2 and d["host_steps"] == 1 and d["streams"] == 2, d
    # numpy reference
    a, ref = np.zeros(4, np.float32), []
    for i in range(6):
        x = np.array([i, 1.0, -2.0, 0.5 * i], np.float32)
        a = a * np.float32(0.5) + x
        ref.append(float((a * np.float32(3.0)).sum() + x.sum()))
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_llm_decode_stream_matches_step_by_step_with_one_read_per_token(rt, tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_fixtures import write_tiny_gguf
    import ember.llm
    from ember.webgpu import replay

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    m = ember.llm.load(str(path), device="webgpu")
    first = m.generate([1, 5, 7], max_tokens=10)
    rt.reset_stats()
    again = m.generate([1, 5, 7], max_tokens=10)
    assert again == first
    n = m.stats["tokens"]
    # the prompt's logits, then the fed-back steps' tokens in batches of 2, 4, 3 (ember.llm.RUN_AHEAD)
    assert n == 10 and rt.stats["reads"] == 4
    monkeypatch.setattr(ember.llm, "RUN_AHEAD", 1)
    rt.reset_stats()
    assert m.generate([1, 5, 7], max_tokens=10) == first
    assert rt.stats["reads"] == n        # run-ahead off: then one argmax per decode step
    plan = next(iter(m._step_argmax.plans.values()))
    d = plan.fast.describe()
    assert d["stream"] and d["guards"] >= 2, d
    monkeypatch.setattr(replay, "ENABLED", False)
    m2 = ember.llm.load(str(path), device="webgpu")
    assert m2.generate([1, 5, 7], max_tokens=10) == first
    lg_stream = m._step_logits
    # logits of the stream replay, bit for bit those of the step-by-step replay
    monkeypatch.setattr(replay, "ENABLED", True)
    ids = ember.tensor([3], dtype="int32", device="webgpu")
    outs = []
    for mm in (m, m2):
        mm.model.reset()
        f = ember.compile(lambda i, p, mm=mm: mm.model.forward(i, p))
        if mm is m2:
            monkeypatch.setattr(replay, "ENABLED", False)
        outs.append([f(ids, ember.tensor([p], dtype="int32", device="webgpu")).numpy() for p in range(4)])
    for a, b in zip(*outs):
        assert a.tobytes() == b.tobytes()
    # past the context: the guard raises before anything runs
    step = ember.compile(lambda i, p: m.model.forward(i, p))
    for p in range(3):
        step(ids, ember.tensor([p], dtype="int32", device="webgpu"))
    with pytest.raises((ShapeError, IndexingError)):
        step(ids, ember.tensor([m.context], dtype="int32", device="webgpu"))
    del lg_stream
    gc.collect()


def test_decoded_token_fed_back_on_the_gpu(rt, tmp_path):
    """argmax's output carries its index range, so a step fed its previous step's token (never
    read back) replays its stream with the embedding's guard satisfied: no read per token, and
    the same tokens as a loop that reads each one back."""
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_fixtures import write_tiny_gguf
    import ember.llm
    from ember import ops as F

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    want = []
    m = ember.llm.load(str(path), device="webgpu")
    step = ember.compile(lambda i, p: F.argmax(m.model.forward(i, p), axis=-1))
    tok = 3
    for p in range(8):
        tok = int(step(ember.tensor([tok], dtype="int32", device="webgpu"),
                       ember.tensor([p], dtype="int32", device="webgpu")).tolist()[0])
        want.append(tok)
    # (the same positions again: each step rewrites the cache row it then attends to)
    r = ember.tensor([3], dtype="int32", device="webgpu")
    outs = []
    rt.reset_stats()
    for p in range(8):
        r = step(r, ember.tensor([p], dtype="int32", device="webgpu"))    # int32 ids, then int64 ones
        outs.append(r)
    reads = rt.stats["reads"]
    assert [int(o.tolist()[0]) for o in outs] == want
    assert reads == 0
    fed = step.plan_for(outs[0], ember.tensor([0], dtype="int32", device="webgpu")).fast.describe()
    assert fed["stream"] and fed["replays"] >= 5, fed      # guards met by argmax's range: no fallback


def test_onnx_gather_of_uploaded_ids_streams_with_no_read(rt):
    """An ONNX embedding lookup (Gather of the fed ids, a scalar constant index, negative ids
    allowed) replays as one dispatch stream: the ids' range is known from their upload, so no
    GPU read checks it; an id out of range still raises IndexingError (before anything runs)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    types = rng.standard_normal((2, 8)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
         helper.make_node("Gather", ["types", "zero"], ["t"], axis=0),
         helper.make_node("Add", ["e", "t"], ["y"])],
        "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "L"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(types, "types"),
         numpy_helper.from_array(np.array(0, np.int64), "zero")])
    m = ember.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                        device="webgpu")
    for k in range(4):
        ids = rng.integers(-50, 50, (2, 5)).astype(np.int64)
        rt.reset_stats()
        y = np.asarray(m.run({"ids": ids})["y"].tolist())
        np.testing.assert_allclose(y, table[ids] + types[0], rtol=1e-6)
        if k >= 2:
            assert rt.stats["reads"] == 1          # the output's, no index check
    fast = next(iter(m._compiled.plans.values())).fast
    assert fast.describe()["stream"] and fast.replays >= 2
    with pytest.raises(IndexingError, match="-51"):
        m.run({"ids": np.full((2, 5), -51, np.int64)})


def test_long_streams_go_as_chunks_with_the_same_bits(rt, monkeypatch):
    """A stream of 48 dispatches or more is submitted as command buffers of 16, 32, 64, ...
    (the GPU starts while the rest are encoded): every chunk sets its pipeline again, even where
    the dispatch before it used the same one, and the results are the bits of one buffer."""
    from ember import nn
    from ember.webgpu import native, replay

    assert native.stream_chunks(47) == [(0, 47)]
    for n in (48, 76, 154, 1000):
        ch = native.stream_chunks(n)
        assert ch[0] == (0, 16) and ch[-1][1] == n and all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ch, ch[1:]))
    if not isinstance(rt.driver, native.NativeDriver):
        pytest.skip("chunks are the native driver's")
    ember.manual_seed(1)
    m = nn.Sequential(*[nn.Linear(8, 8) for _ in range(60)]).to("webgpu")    # one pipeline, 60 times
    rng = np.random.default_rng(1)
    xs = [ember.tensor(rng.standard_normal((3, 8)).astype(np.float32), device="webgpu") for _ in range(4)]
    cut = []
    chunks = native.stream_chunks
    monkeypatch.setattr(native, "stream_chunks", lambda n: (cut.append(n), chunks(n))[1])
    got = {}
    for on in ("1", "0"):
        monkeypatch.setenv("EMBER_WEBGPU_CHUNKS", on)
        with ember.no_grad():
            f = ember.compile(lambda x: m(x))
            got[on] = _run_many(f, xs)
            st = f.plan_for(xs[0]).fast
            assert isinstance(st, replay.StreamReplay) and st.describe()["dispatches"] >= 30
    assert max(cut) >= 60
    # a stream recorded with one setting keeps its chunks when the setting changes later
    with ember.no_grad():
        monkeypatch.setenv("EMBER_WEBGPU_CHUNKS", "0")
        f = ember.compile(lambda x: m(x))
        for x in xs[:3]:
            f(x).numpy()
        assert f.plan_for(xs[0]).fast.describe()["replays"] >= 1      # the stream is prepared
        monkeypatch.setenv("EMBER_WEBGPU_CHUNKS", "1")
        assert f(xs[3]).numpy().tobytes() == got["1"][3].tobytes()
    ref = xs[0].numpy()
    for layer in m:
        ref = ref @ layer.weight.numpy().T + layer.bias.numpy()
    np.testing.assert_allclose(got["1"][0], ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(got["1"], got["0"]):
        assert a.tobytes() == b.tobytes()


def _deep_mlp(layers: int, n_inputs: int, seed: int):
    """A stream of 2 * ``layers`` dispatches (Linear + GELU each) and ``n_inputs`` (2, 16) inputs."""
    from ember import nn

    ember.manual_seed(seed)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(layers)]).to("webgpu")
    rng = np.random.default_rng(seed)
    return m, [ember.tensor(rng.standard_normal((2, 16)).astype(np.float32), device="webgpu") for _ in range(n_inputs)]


@pytest.mark.parametrize("chunks", ["0", "1"])
def test_native_encoder_gives_the_same_bits_as_the_cffi_calls(rt, monkeypatch, chunks):
    """A stream encoded by ember.native's C loop (core/native/encode.c: one call per command
    buffer, calling wgpu-native's functions itself) gives the bits of the same stream encoded by
    three cffi calls per dispatch, in one command buffer and in chunks (a stream of 30+
    dispatches, with pipelines set only where they change)."""
    from ember import native
    from ember.webgpu import native as wnative
    from ember.webgpu import replay

    if not hasattr(rt.driver, "_c"):
        pytest.skip("the browser driver encodes in JavaScript (one call per replay)")
    if native.lib() is None:
        pytest.skip(f"ember.native is not in use here ({native.info().get('reason', '')}): the cffi loop runs")
    monkeypatch.setenv("EMBER_WEBGPU_CHUNKS", "0" if chunks == "0" else "")
    monkeypatch.setattr(wnative, "STREAM_FIRST", 4)
    m, xs = _deep_mlp(30, 4, seed=3)
    got = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("EMBER_WEBGPU_NATIVE_ENCODE", mode)
        with ember.no_grad():
            f = ember.compile(m)
            got[mode] = _run_many(f, xs)
            st = f.plan_for(xs[0]).fast
        assert isinstance(st, replay.StreamReplay) and st.describe()["dispatches"] >= 30
        native_words = st.stream.prepared[4]
        assert (native_words is not None) == (mode == "1")
        if mode == "1":
            assert len(native_words[1]) == (1 if chunks == "0" else len(st.stream.prepared[3])) and (chunks == "0" or len(st.stream.prepared[3]) > 1)
    for a, b in zip(got["1"], got["0"]):
        assert a.tobytes() == b.tobytes()


def test_prebuilt_command_buffers_give_the_same_bits(rt, monkeypatch):
    """With EMBER_WEBGPU_PREBUILD=1 a stream's replays (from the third) submit a command buffer
    the builder thread encoded and finished beforehand: the same bits as encoding inline, the
    copies in and out around it; a replaced constant drops the old stream's buffers; a builder
    that fails leaves the replays inline and correct."""
    from ember.webgpu import native, replay

    drv = rt.driver
    if not isinstance(drv, native.NativeDriver) or drv._c is None:
        pytest.skip("prebuilt command buffers are the native driver's (the page encodes in one JS call)")
    m, xs = _deep_mlp(20, 8, seed=4)
    got = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("EMBER_WEBGPU_PREBUILD", mode)
        n0 = drv.prebuilt_submits
        with ember.no_grad():
            f = ember.compile(m)
            got[mode] = _run_many(f, xs)
            assert isinstance(f.plan_for(xs[0]).fast, replay.StreamReplay)
        used = drv.prebuilt_submits - n0
        if mode == "1":
            assert used >= 3, used        # each replay's read lets the builder finish the next one
        else:
            assert used == 0
    for a, b in zip(got["1"], got["0"]):
        assert a.tobytes() == b.tobytes()
    monkeypatch.setenv("EMBER_WEBGPU_PREBUILD", "1")
    # a replaced constant: the stream is recorded again and the old one's buffers dropped
    w = ember.ones((3, 2), device="webgpu")
    g = ember.compile(lambda x: x @ w)
    x = ember.ones((1, 3), device="webgpu")
    for _ in range(5):
        assert g(x).tolist() == [[3.0, 3.0]]
    old = g.plan_for(x).fast.stream.prepared[5]
    w.copy_(ember.full((3, 2), 2.0, device="webgpu"))
    for _ in range(5):
        assert g(x).tolist() == [[6.0, 6.0]]
    assert old.closed and not old.cbs
    # a builder that fails: the replays stay inline, with the right results
    monkeypatch.setattr(native.NativeDriver, "_encode_stream", lambda self, p: 1 / 0)
    h = ember.compile(lambda x: x * 3.0 + 1.0)
    n0 = drv.prebuilt_submits
    outs = [h(ember.tensor([float(i)] * 4, device="webgpu")).tolist()[0] for i in range(6)]
    assert outs == [1.0, 4.0, 7.0, 10.0, 13.0, 16.0] and drv.prebuilt_submits == n0
    assert isinstance(h.plan_for(ember.ones((4,), device="webgpu")).fast.stream.prepared[5].error, ZeroDivisionError)


def test_llm_decode_with_prebuilt_command_buffers(rt, tmp_path, monkeypatch):
    """A decode loop that runs steps ahead (fed tokens, batched reads) takes a prebuilt command
    buffer per token and gives the tokens of the inline encoding."""
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_fixtures import write_tiny_gguf
    import ember.llm
    from ember.webgpu import native

    drv = rt.driver
    if not isinstance(drv, native.NativeDriver) or drv._c is None:
        pytest.skip("prebuilt command buffers are the native driver's (the page encodes in one JS call)")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    toks = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("EMBER_WEBGPU_PREBUILD", mode)
        m = ember.llm.load(str(path), device="webgpu")
        n0 = drv.prebuilt_submits
        toks[mode] = [m.generate([1, 5, 7], max_tokens=24) for _ in range(2)]
        if mode == "1":
            assert drv.prebuilt_submits - n0 >= 10, drv.prebuilt_submits - n0
    assert toks["1"] == toks["0"] and toks["0"][0] == toks["0"][1]
