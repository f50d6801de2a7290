"""The router device (``ember.router``, ``device="auto"``): every op case through a router of
numpy + python equals numpy's reference; compiled plans keep the routing of their capture;
modules, ONNX models and ``.to()`` work on it; costs persist; errors are typed. A tiny WebGPU
check runs where an adapter exists (lavapipe in CI)."""
import json

import numpy as np
import pytest

import ember
import ember.router as R
from ember import registry
from ember.backends import register_backend, reset_backend
from ember.errors import DeviceError, UnsupportedOp
from op_cases import all_cases, check_results, expected, run_case, run_case_compiled


@pytest.fixture(autouse=True)
def _memory_cache(monkeypatch):
    monkeypatch.setenv("EMBER_ROUTER_CACHE", "off")


def _fresh(*members):
    name = "router:" + "+".join(members)
    reset_backend(name)
    return ember.router(*members)


def test_op_cases_equal_numpy_and_both_members_work():
    dev = _fresh("numpy", "python")
    cases = [c for c in all_cases() if "numpy" not in c.skip and "python" not in c.skip]
    bad = []
    for k, case in enumerate(cases):
        want = expected(np, case)
        ok, msg = check_results(case, run_case(ember, case, dev), want)
        if not ok:
            bad.append(msg)
        if k % 32 == 0 and not case.raises:
            ok, msg = check_results(case, run_case_compiled(ember, case, dev), want)
            if not ok:
                bad.append(f"(compiled) {msg}")
    assert not bad, f"{len(bad)} of {len(cases)} cases differ:\n" + "\n".join(bad[:30])
    st = ember.router_stats(dev)
    used = {m for op in st["ops"].values() for m in op.get("calls", {})}
    assert {"numpy", "python"} <= used <= {"numpy", "python", "decomposed"}, used   # each member won some ops
    assert st["moves"], "no tensor ever crossed between the members"
    for op, entry in st["ops"].items():               # every decision is explained
        for shape, d in entry["shapes"].items():
            assert d["device"] in d["cost_us"] and set(d["cost_us"]) <= {"numpy", "python", "decomposed"}, (op, d)


def test_a_plan_replays_with_the_routing_of_its_capture():
    dev = _fresh("numpy", "python")
    r = ember.get_backend(dev)
    w = ember.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, device=dev)
    f = ember.compile(lambda x: ember.relu(x @ w - 0.5).sum(axis=-1))
    x = ember.tensor(np.ones((2, 3), np.float32), device=dev)
    first = f(x).tolist()
    plan = f.plan_for(x)
    pinned = {st.name: st.kernel.member for st in plan.steps}
    # the other member becomes far cheaper for everything: eager calls follow, the plan does not
    for costs in r.costs.values():
        for m in costs:
            costs[m] = 0.0 if m != pinned["matmul"] else 1.0
    r.decide.clear()
    r.reset_stats()
    x2 = ember.tensor(np.full((2, 3), 2.0, np.float32), device=dev)
    got = f(x2).tolist()
    assert f.stats()["replays"] == 1
    assert {m for m, *_ in plan.fast.segments} == set(pinned.values())   # one sub-plan per run of a member
    assert {op: set(c["calls"]) for op, c in ember.router_stats(dev)["ops"].items() if "calls" in c} == \
        {op: {m} for op, m in pinned.items()}
    ref = np.maximum(np.full((2, 3), 2.0) @ (np.arange(12).reshape(3, 4) / 10) - 0.5, 0).sum(-1)
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    assert first != got
    r.reset_stats()
    (x2 @ w).tolist()    # eager: routed afresh, to the now cheaper member
    assert set(ember.router_stats(dev)["ops"]["matmul"]["calls"]) != {pinned["matmul"]}


def test_modules_onnx_and_moves():
    pytest.importorskip("onnx")
    from onnx_helpers import node_model

    dev = _fresh("numpy", "python")
    ember.manual_seed(0)
    net = ember.nn.Sequential(ember.nn.Linear(8, 16), ember.nn.ReLU(), ember.nn.Linear(16, 4))
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    want = net(ember.tensor(x)).numpy()
    net.to(dev)
    got = net(ember.tensor(x, device=dev))
    assert got.device == dev
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert got.to("numpy").device == "numpy" and np.allclose(got.to("python").numpy(), want, atol=1e-6)

    a = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    model, feeds = node_model("Gemm", {"a": a, "b": b, "c": np.ones(3, np.float32)}, {"alpha": 0.5}, inits=("b", "c"))
    m = ember.onnx.load(model.SerializeToString(), device=dev)
    out = m.run({"a": ember.from_numpy(feeds["a"], device=dev)})
    np.testing.assert_allclose(out[m.output_names[0]].numpy(), 0.5 * a @ b + 1, rtol=1e-5, atol=1e-6)


def test_large_ops_are_not_timed_on_pure_python():
    dev = _fresh("numpy", "python")
    r = ember.get_backend(dev)
    x = ember.ones((256, 256), device=dev)
    assert (x @ x).tolist()[0][0] == 256.0          # python would take seconds: it is not run
    entry = ember.router_stats(dev)["ops"]["matmul"]
    (shape, d), = entry["shapes"].items()
    assert d["device"] == "numpy" and d["not_run"] == ["python"] and d["cost_us"]["python"] is None
    assert ("matmul", "python") not in r.sizes


def test_errors_are_typed():
    with pytest.raises(DeviceError, match="unknown member device 'cuda'"):
        ember.router("numpy", "cuda")
    with pytest.raises(DeviceError, match="at least two member devices"):
        ember.router("numpy")
    with pytest.raises(DeviceError, match="named twice"):
        ember.router("numpy", "numpy")
    register_backend("absent", "ember.remote:_not_connected")   # a device that cannot start here
    try:
        with pytest.raises(DeviceError, match="not available here: absent"):
            ember.router("numpy", "absent")
    finally:
        from ember.backends import _FACTORIES
        _FACTORIES.pop("absent", None)
        reset_backend("absent")
    dev = _fresh("numpy", "python")
    r = ember.get_backend(dev)
    with pytest.raises(UnsupportedOp, match="no member of 'router:numpy\\+python'"):
        r.choose("no_such_op", None, (), {})
    # an op no member has a kernel for; removed again so that the suites checking that every
    # registered primitive has a kernel (test_webgpu, test_wasm) never see it
    registry.op("router_test_nowhere", kind="other", shape=registry.same_shape, dtype=registry.same_dtype)
    try:
        with pytest.raises(UnsupportedOp, match="router_test_nowhere: no kernel on backend 'router:numpy\\+python'"):
            registry.apply("router_test_nowhere", ember.ones((2,), device=dev))
    finally:
        registry.OPS.pop("router_test_nowhere", None)
    with pytest.raises(DeviceError, match="not a router"):
        ember.router_stats("numpy")


def test_auto_and_the_cost_cache(tmp_path, monkeypatch):
    assert ember.router() == "auto"
    reset_backend("auto")
    members = ember.get_backend("auto").members
    assert len(members) == 2 and set(members) <= {"webgpu", "numpy", "python", "wasm"}
    gpu = ember.get_backend("webgpu") if "webgpu" in ember.devices() else None
    if gpu is not None and R._software_adapter(gpu):
        assert "webgpu" not in members      # lavapipe / SwiftShader are never picked

    path = tmp_path / "router.json"
    monkeypatch.setenv("EMBER_ROUTER_CACHE", str(path))
    dev = _fresh("numpy", "python")
    x = ember.ones((4, 4), device=dev)
    (x @ x).tolist()
    R._save(ember.get_backend(dev), force=True)
    saved = json.loads(path.read_text())
    assert any(k.startswith("matmul|") for k in saved["numpy+python"]["ops"])
    dev = _fresh("numpy", "python")    # a new router loads the costs: nothing is measured again
    r = ember.get_backend(dev)
    monkeypatch.setattr(r, "_measure", lambda *a: pytest.fail("measured again"))
    assert (ember.ones((4, 4), device=dev) @ ember.ones((4, 4), device=dev)).tolist()[0][0] == 4.0


def test_webgpu_member_tiny():
    if "webgpu" not in ember.devices():
        pytest.skip("no WebGPU adapter on this machine")
    dev = _fresh("webgpu", "numpy")
    a = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    x = ember.tensor(a, device=dev)
    y = ember.relu(x @ ember.tensor(a.T.copy(), device=dev) + 1.0)
    np.testing.assert_allclose(y.numpy(), np.maximum(a @ a.T + 1, 0), rtol=1e-4, atol=1e-4)
    costs = ember.router_stats(dev)["ops"]["matmul"]["shapes"]
    assert all(set(d["cost_us"]) == {"webgpu", "numpy"} for d in costs.values())


def test_docstring_examples():
    import doctest

    reset_backend("router:numpy+python")     # the examples count calls from a fresh router
    assert doctest.testmod(R).failed == 0
