"""ember.nn against PyTorch: a small model and a set of layer configurations written once
(tests/nn_models.py), built with torch.nn by tests/fixtures/make_fixtures.py and with ember.nn here, load PyTorch's state_dict
(from .safetensors and from .pt) with identical keys, and reproduce PyTorch's outputs on every
backend within |ember - torch| <= ATOL + RTOL * |torch|. Plus the Module mechanics."""
import json
import os

import pytest

import ember
from ember import nn
from ember.errors import WeightsError
from nn_models import define

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "nn")
ATOL, RTOL = 1e-4, 1e-4  # float32 end to end; different summation orders than PyTorch


def assert_close(got, ref, what):
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    g, r = _flat(got.tolist()), _flat(ref.tolist())
    worst = max((abs(a - b) - RTOL * abs(b) for a, b in zip(g, r)), default=0.0)
    assert worst <= ATOL, f"{what}: max |ember - torch| exceeds tolerance by {worst - ATOL:.3g}"


def _flat(v):
    if isinstance(v, list):
        return [x for item in v for x in _flat(item)]
    return [v]


Net, Layers = define(nn)   # the models of tests/nn_models.py, in ember.nn

LAYER_NAMES = list(Layers()._modules)


@pytest.fixture(scope="module")
def golden():
    return ember.load_safetensors(os.path.join(FIX, "io.safetensors"))


def _weights(kind, device):
    if kind == "safetensors":
        return ember.load_safetensors(os.path.join(FIX, "model.safetensors"), device=device)
    return ember.load_torch(os.path.join(FIX, "model.pt"), device=device)


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
def test_model_matches_pytorch(device, kind, golden):
    net = Net().to(device)
    net.load_state_dict(_weights(kind, device), strict=True)
    net.eval()
    assert all(t.device == device for t in net.state_dict().values())
    logits, probs = net(golden["x"].to(device), golden["ids"].to(device))
    assert logits.device == device
    assert_close(logits, golden["logits"], f"logits ({kind}, {device})")
    assert_close(probs, golden["probs"], f"probs ({kind}, {device})")


def test_state_dict_keys_identical_to_pytorch(golden):
    net = Net()
    assert list(net.state_dict()) == json.loads(golden.metadata["keys"])  # same names, same order
    st = ember.load_safetensors(os.path.join(FIX, "model.safetensors"))
    for k, t in net.state_dict().items():
        assert t.shape == st.shape(k), k
    nbt = net.state_dict()["features.1.num_batches_tracked"]
    assert (nbt.dtype, nbt.shape) == (ember.int64, ())
    net.load_state_dict(st)
    assert net.features[1].num_batches_tracked.item() == 12


def test_repr_identical_to_pytorch(golden):
    assert repr(Net()) == golden.metadata["repr"]
    assert repr(Layers()) == ember.load_safetensors(os.path.join(FIX, "layers.safetensors")).metadata["repr"]


@pytest.fixture(scope="module")
def layers_io():
    return ember.load_safetensors(os.path.join(FIX, "layers_io.safetensors"))


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_layer_options_match_pytorch(device, name, layers_io):
    net = Layers()
    net.load_state_dict(ember.load_safetensors(os.path.join(FIX, "layers.safetensors")), strict=True)
    net.to(device).eval()
    layer = getattr(net, name)
    x = layers_io["ids" if name == "emb" else "x"].to(device)
    assert_close(layer(x), layers_io[f"out.{name}"], f"{name} on {device}")


# ---- load_state_dict ------------------------------------------------------------------------------

def _sd():
    return dict(ember.load_safetensors(os.path.join(FIX, "model.safetensors")))


def test_load_state_dict_reports_everything_at_once():
    sd = _sd()
    del sd["head.0.bias"], sd["features.1.running_var"]
    sd["head.9.weight"] = ember.zeros((2, 2))
    sd["emb.weight"] = ember.zeros((11, 16))
    sd["norm.weight"] = [1.0] * 16
    net = Net()
    before = net.state_dict()
    with pytest.raises(WeightsError) as ei:
        net.load_state_dict(sd)
    msg = str(ei.value)
    assert "does not match Net" in msg
    assert "missing keys (2): features.1.running_var, head.0.bias" in msg
    assert "unexpected keys (1): head.9.weight" in msg
    assert "shape mismatches (2): emb.weight: model expects (10, 16), state_dict has (11, 16)" in msg
    assert "norm.weight: model expects (16,), not a tensor" in msg
    # nothing was loaded
    assert all(net.state_dict()[k] is t for k, t in before.items())


def test_load_state_dict_non_strict():
    sd = _sd()
    del sd["head.0.bias"]
    sd["extra"] = ember.zeros((1,))
    net = Net()
    old_bias = net.head[0].bias
    res = net.load_state_dict(sd, strict=False)
    assert res == nn.IncompatibleKeys(missing_keys=["head.0.bias"], unexpected_keys=["extra"])
    assert res.missing_keys == ["head.0.bias"]
    assert net.head[0].bias is old_bias
    assert net.head[0].weight.tolist() == sd["head.0.weight"].tolist()
    # shape mismatches raise even when not strict (as in PyTorch)
    sd["head.0.weight"] = ember.zeros((3, 3))
    with pytest.raises(WeightsError, match=r"head.0.weight: model expects \(12, 16\), state_dict has \(3, 3\)"):
        Net().load_state_dict(sd, strict=False)


def test_strict_error_suggests_non_strict_and_truncates_long_lists():
    net = nn.Sequential(*[nn.Linear(1, 1) for _ in range(30)])
    with pytest.raises(WeightsError, match=r"missing keys \(60\): 0.weight, 0.bias, .*and 20 more\n.*strict=False"):
        net.load_state_dict({})


def test_load_casts_to_parameter_dtype_and_device(device):
    sd = _sd()  # float32 on the python backend
    net = Net().to(device, ember.float16)
    net.load_state_dict(sd)
    w = net.features[0].weight
    assert (w.dtype, w.device) == (ember.float16, device)
    assert net.features[1].num_batches_tracked.dtype == ember.int64
    ref = sd["features.0.weight"].astype(ember.float16).tolist()
    assert w.tolist() == ref
    # assign=True keeps the loaded tensors as they are
    net2 = Net().to(device, ember.float16)
    net2.load_state_dict(sd, assign=True)
    assert net2.features[0].weight is sd["features.0.weight"]


def test_float16_model_runs(golden):
    net = Net()
    net.load_state_dict(_weights("safetensors", "python"))
    net.to(ember.float16).eval()
    logits, probs = net(golden["x"].astype(ember.float16), golden["ids"])
    assert logits.dtype == ember.float16
    ref = _flat(golden["probs"].tolist())
    assert max(abs(a - b) for a, b in zip(_flat(probs.tolist()), ref)) < 2e-2  # half precision


# ---- Module mechanics -------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.act = nn.ReLU()
        self.scale = nn.Parameter(ember.ones((2,)))
        self.register_buffer("stat", ember.zeros((2,)))
        self.register_buffer("cache", ember.zeros((1,)), persistent=False)
        self.name = "block"

    def forward(self, x):
        return self.act(self.fc(x)) * self.scale + self.stat


def test_registration_and_traversal():
    b = Block()
    assert list(b.state_dict()) == ["scale", "stat", "fc.weight", "fc.bias"]
    assert [n for n, _ in b.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
    assert [n for n, _ in b.named_buffers()] == ["stat", "cache"]
    assert [n for n, _ in b.named_modules()] == ["", "fc", "act"]
    assert [type(m).__name__ for m in b.children()] == ["Linear", "ReLU"]
    assert len(list(b.parameters())) == 3 and len(list(b.buffers())) == 2
    assert b.name == "block" and "fc" in dir(b)
    # a buffer stays a buffer when reassigned; None keeps the slot but drops it from the state_dict
    b.stat = ember.ones((2,))
    assert [n for n, _ in b.named_buffers()] == ["stat", "cache"]
    b.fc.bias = None
    assert list(b.state_dict()) == ["scale", "stat", "fc.weight"] and b.fc.bias is None
    assert b(ember.ones((1, 3))).shape == (1, 2)
    with pytest.raises(TypeError, match="registered tensor/module"):
        b.fc.weight = [1.0]
    del b.act
    assert [n for n, _ in b.named_modules()] == ["", "fc"]
    with pytest.raises(AttributeError, match="no attribute 'act'"):
        b.act


def test_shared_modules_and_parameters():
    fc = nn.Linear(2, 2)
    seq = nn.Sequential(fc, nn.ReLU(), fc)
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # as in PyTorch
    assert len(list(seq.parameters())) == 2  # each tensor once
    assert [n for n, _ in seq.named_modules()] == ["", "0", "1"]


def test_missing_super_init_is_explained():
    class Bad(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(1, 1)
    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) first"):
        Bad()


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear) and isinstance(seq[1], nn.ReLU)
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and list(sub.state_dict()) == ["2.weight", "2.bias"]
    with pytest.raises(IndexError, match="Sequential: index 3 is out of range for 3 modules"):
        seq[3]
    seq[1] = nn.Tanh()
    assert isinstance(seq[1], nn.Tanh)
    seq.append(nn.Sigmoid())
    assert seq(ember.ones((4, 2))).shape == (4, 1)
    from collections import OrderedDict
    named = nn.Sequential(OrderedDict([("conv", nn.Conv2d(1, 1, 1)), ("act", nn.ReLU())]))
    assert list(named.state_dict()) == ["conv.weight", "conv.bias"]
    ml = nn.ModuleList([nn.Linear(1, 1)])
    ml.append(nn.ReLU()).extend([nn.Tanh()])
    ml.insert(0, nn.Sigmoid())
    assert [type(m).__name__ for m in ml] == ["Sigmoid", "Linear", "ReLU", "Tanh"]
    assert list(ml.state_dict()) == ["1.weight", "1.bias"]
    assert isinstance(ml[1:], nn.ModuleList) and len(ml[1:]) == 3
    with pytest.raises(NotImplementedError, match="ModuleList has no forward"):
        ml(ember.ones((1,)))


def test_train_eval_and_dropout_identity():
    net = Net()
    assert net.training and net.head[2].training
    assert net.eval() is net and not net.training and not net.head[2].training
    net.train()
    x = ember.tensor([1.0, -2.0])
    assert nn.Dropout(0.9).eval()(x) is x  # eval mode: the identity (train mode drops: test_nn_train.py)


def test_to_moves_everything(device):
    net = Net().to(device)
    assert {t.device for t in net.state_dict().values()} == {device}
    net.to(ember.float16)
    dts = {k: t.dtype for k, t in net.state_dict().items()}
    assert dts["features.1.num_batches_tracked"] == ember.int64
    assert {d for k, d in dts.items() if "num_batches" not in k} == {ember.float16}


def test_constructors_match_pytorch_shapes_and_options():
    assert nn.Conv2d(4, 6, (3, 5), groups=2).weight.shape == (6, 2, 3, 5)
    assert nn.ConvTranspose2d(4, 6, 3, groups=2).weight.shape == (4, 3, 3, 3)
    assert nn.ConvTranspose2d(4, 6, 3, groups=2).bias.shape == (6,)
    assert nn.Linear(3, 4, bias=False).bias is None
    assert nn.BatchNorm2d(3, affine=False).weight is None
    assert nn.Embedding(5, 2, dtype=ember.float16).weight.dtype == ember.float16
    # default init lies in PyTorch's ranges and is deterministic under manual_seed
    nn.manual_seed(7)
    w = nn.Linear(16, 8).weight.tolist()
    assert max(abs(v) for row in w for v in row) <= 0.25 and len({v for row in w for v in row}) == 128
    nn.manual_seed(7)
    assert nn.Linear(16, 8).weight.tolist() == w
    for bad in (lambda: nn.Conv2d(3, 4, 3, groups=2), lambda: nn.Conv2d(2, 2, 3, padding_mode="mirror"),
                lambda: nn.Conv2d(2, 2, 3, stride=2, padding="same"), lambda: nn.GELU("fast"),
                lambda: nn.Dropout(1.5), lambda: nn.Embedding(3, 2, padding_idx=5)):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ember.errors.UnsupportedOp):
        nn.MaxPool2d(2, return_indices=True)
    with pytest.raises(ember.errors.ShapeError, match="BatchNorm2d: expected a 4-D"):
        nn.BatchNorm2d(2)(ember.ones((2, 2)))


@pytest.mark.parametrize("module", ["ember.nn", "ember.nn.module", "ember.nn.layers"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
