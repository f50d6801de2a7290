"""Execution plans (ember.plan / ember.compile): every op case recorded and replayed on every
backend against numpy, and the plan machinery itself: signatures, data-dependent fallback,
constants, device moves, nesting, modules, output structures, the LRU bound."""
from __future__ import annotations

import numpy as np
import pytest

import ember
from helpers import _describe_inputs
from op_cases import all_cases, check_results, expected, run_case_compiled

CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_case_compiled(case, device):
    if device in case.skip:
        pytest.skip(f"{case.id} on {device}: {case.skip[device]}")
    got = run_case_compiled(ember, case, device)
    ok, msg = check_results(case, got, expected(np, case))
    if not ok:
        pytest.fail(f"[{device}, compiled] {msg}\ninputs:\n{_describe_inputs(case)}", pytrace=False)


def test_replay_skips_the_python_code(device):
    calls = []

    @ember.compile
    def f(x, w):
        calls.append(1)
        return ember.relu(x @ w + 1.0).sum(axis=-1)

    w = ember.tensor([[1.0, -1.0], [2.0, 0.5]], device=device)
    for i in range(4):
        x = ember.tensor([[float(i), 1.0]], device=device)
        want = np.maximum(np.array([[i, 1.0]]) @ np.array([[1, -1], [2, 0.5]]) + 1, 0).sum(-1)
        np.testing.assert_allclose(f(x, w).tolist(), want, rtol=1e-6)
    assert len(calls) == 1
    st = f.stats()
    assert (st["captures"], st["replays"], st["plans"]) == (1, 3, 1)
    plan = f.plan_for(x, w)
    assert len(plan) >= 3 and "matmul" in plan.kernels()


def test_new_signature_new_plan_and_lru_bound():
    f = ember.compile(lambda x: x * 2, max_plans=2)
    for n in (1, 2, 3, 2):
        assert f(ember.ones((n,))).tolist() == [2.0] * n
    st = f.stats()
    assert st["captures"] == 3 and st["replays"] == 1 and st["plans"] == 2


def test_non_tensor_arguments_are_part_of_the_signature():
    f = ember.compile(lambda x, k: x * k)
    x = ember.ones((2,))
    assert f(x, 2.0).tolist() == [2.0, 2.0]
    assert f(x, 3.0).tolist() == [3.0, 3.0]
    assert f.stats()["captures"] == 2


def test_tensor_only_calls_key_like_every_other_call():
    # calls with tensors only take a shorter path to their signature: it must be the key that
    # plan_for and the general path build, and still tell dtypes, shapes, devices, the default
    # device and grad mode apart
    f = ember.compile(lambda x, y: x * y + 1)
    x, y = ember.ones((2, 3)), ember.full((2, 3), 2.0)
    assert f(x, y).tolist() == [[3.0] * 3] * 2
    plan = f.plan_for(x, y)
    assert plan is not None and f(x, y).tolist() == [[3.0] * 3] * 2 and f.stats()["replays"] == 1
    assert f(x, y=y).tolist() == [[3.0] * 3] * 2 and f.stats()["captures"] == 2   # kwargs: another key
    f(x.astype("float16"), y.astype("float16"))
    f(ember.ones((3, 3)), ember.ones((3, 3)))
    assert f.stats()["captures"] == 4
    with ember.no_grad():
        f(x, y)
    from ember.backends import default_device, set_default_device
    old = default_device()
    set_default_device("numpy" if old != "numpy" else "python")
    try:
        f(x, y)
    finally:
        set_default_device(old)
    st = f.stats()
    assert st["captures"] == 6 and st["replays"] == 1 and f.plan_for(x, y) is plan
    assert f(x, y).tolist() == [[3.0] * 3] * 2 and f.stats()["replays"] == 2


def test_data_dependent_code_runs_eagerly_and_says_why(capsys):
    def f(x):
        if x.sum().item() > 0:   # Python branches on a value computed from the input
            return x * 2
        return x * -1

    g = ember.compile(f, explain=True)
    assert g(ember.tensor([1.0, 2.0])).tolist() == [2.0, 4.0]
    assert g(ember.tensor([-1.0, -2.0])).tolist() == [1.0, 2.0]   # right answer: eager, not a stale plan
    st = g.stats()
    assert st["plans"] == 0 and st["eager_calls"] == 1 and len(st["eager"]) == 1
    why = next(iter(st["eager"].values()))
    assert "depends on data" in why
    assert "runs eagerly" in capsys.readouterr().out


def test_reading_constants_is_fine():
    table = ember.tensor([3.0, 4.0])

    def f(x):
        n = int(table.sum().item())   # derived from a constant only: same every call
        return x * n

    g = ember.compile(f)
    g(ember.ones((2,)))
    assert g(ember.ones((2,))).tolist() == [7.0, 7.0]
    assert g.stats()["replays"] == 1


def test_outputs_inputs_and_structures():
    @ember.compile
    def f(x, pair):
        a, b = pair
        return {"same": x, "sum": a + b, "both": (a * 2, [b - 1])}

    for v in (1.0, 5.0):
        x = ember.tensor([v])
        out = f(x, (ember.tensor([v]), ember.tensor([2 * v])))
        assert out["same"] is x
        assert out["sum"].tolist() == [3 * v]
        assert out["both"][0].tolist() == [2 * v] and out["both"][1][0].tolist() == [2 * v - 1]
    assert f.stats()["replays"] == 1


def test_device_moves_are_plan_steps():
    if "numpy" not in ember.devices():
        pytest.skip("numpy backend unavailable on this machine: numpy is not installed")

    @ember.compile
    def f(x):
        return (x.to("numpy") * 3).to("python") + 1

    for v in (1.0, 2.0):
        assert f(ember.tensor([v])).tolist() == [3 * v + 1]
    assert f.stats()["replays"] == 1
    assert "to" in f.plan_for(ember.tensor([1.0])).kernels()


def test_nested_compiled_functions_record_into_the_outer_plan():
    inner = ember.compile(lambda x: x + 1)
    outer = ember.compile(lambda x: inner(x) * 2)
    for v in (1.0, 4.0):
        assert outer(ember.tensor([v])).tolist() == [(v + 1) * 2]
    assert outer.stats()["replays"] == 1
    assert inner.stats()["replays"] == 0   # ran inside the outer capture, then never again


def test_a_module_compiles(device):
    from ember import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return ember.softmax(self.fc(x), axis=-1)

    net = Net().to(device) if hasattr(Net(), "to") else Net()
    net = net.eval()
    f = ember.compile(net)
    x = ember.tensor([[0.5, -1.0, 2.0]], device=device)
    want = net(x).tolist()
    with ember.no_grad():   # nn.Linear's parameters require grad: inference runs under no_grad
        f(x)
        np.testing.assert_allclose(f(x).tolist(), want, rtol=1e-6)
    assert f.stats()["replays"] == 1


def test_errors_inside_the_captured_function_propagate_and_record_nothing():
    f = ember.compile(lambda x: x @ x)
    with pytest.raises(ember.errors.ShapeError):
        f(ember.ones((2, 3)))
    assert f.stats()["plans"] == 0
    assert ember.plan.active() is None


def test_gradients_are_never_silently_dropped():
    from ember import nn

    lin = nn.Linear(3, 2)   # default parameters require grad
    f = ember.compile(lin)
    x = ember.ones((1, 3))
    for _ in range(2):      # grad mode on: eager every time, outputs carry the graph
        y = f(x)
        assert y.requires_grad
    st = f.stats()
    assert st["plans"] == 0 and "requires grad" in next(iter(st["eager"].values()))
    with ember.no_grad():   # inference: a plan, replayed
        want = f(x).tolist()
        assert f(x).tolist() == want
    assert f.stats()["replays"] == 1


def test_capturing_holds_no_more_memory_than_running():
    import tracemalloc

    def chain(x):
        for _ in range(40):
            x = x * 1.5 + 1.0   # every intermediate is dropped at once by eager code
        return x

    # 1 MB per intermediate. On numpy (its buffers are traced too): the capture logic is the same
    # on every device, and on the pure-Python one tracemalloc made this test take 140 s.
    x = ember.zeros((250_000,), device="numpy")
    tracemalloc.start()
    chain(x)
    eager_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    f = ember.compile(chain)
    f(x)
    capture_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    f(x)
    replay_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert f.stats()["replays"] == 1
    assert capture_peak < 2 * eager_peak + (1 << 20), (capture_peak, eager_peak)
    assert replay_peak < 2 * eager_peak + (1 << 20), (replay_peak, eager_peak)


def test_random_numbers_are_never_frozen_into_a_plan():
    from ember import nn

    drop = nn.Dropout(0.5).train()

    def g(x):
        return drop(x) + ember.rand(16) + ember.randn(16)
    f = ember.compile(g)
    x = ember.ones((16,))
    runs = []
    for fn in (f, g):       # replays draw new values, the same ones eager code draws
        ember.manual_seed(3)
        with ember.no_grad():
            runs.append([fn(x).tolist() for _ in range(3)])
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1] != runs[0][2]
    st = f.stats()
    assert st["plans"] == 1 and st["replays"] == 2
    # randint/randperm still make a capture eager (their values are not replayed)
    h = ember.compile(lambda x: x + ember.randint(0, 5, (16,)).astype("float32"))
    h(x)
    h(x)
    assert h.stats()["plans"] == 0 and "random" in next(iter(h.stats()["eager"].values()))


def test_replayed_outputs_are_freed_by_reference_counting():
    """A replay's outputs are not held in a reference cycle: dropping them frees them at once
    (a cycle kept every output, GPU buffers included, until the next gc: new buffers per step)."""
    import gc
    import weakref

    f = ember.compile(lambda x: (x * 2.0, {"b": [x + 1.0]}))
    x = ember.tensor([1.0, 2.0])
    for _ in range(3):
        a, d = f(x)
    assert f.stats()["replays"] == 2
    assert a.tolist() == [2.0, 4.0] and d["b"][0].tolist() == [2.0, 3.0]
    refs = [weakref.ref(a), weakref.ref(d["b"][0])]
    gc.disable()
    try:
        del a, d
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()
