"""``ember import`` end to end, as a user runs it: a subprocess writes the module and weights,
the module is imported and reproduces onnxruntime; errors give a message and exit code 1."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np

import ember
from onnx_helpers import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "onnx")


def _run(*args):
    return subprocess.run([sys.executable, "-m", "ember", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_cli_import_end_to_end(tmp_path, device):
    model = os.path.join(FIX, "mnist_cnn.onnx")
    r = _run("import", model, "-o", str(tmp_path / "out"), "--name", "Digits")
    assert r.returncode == 0, r.stderr
    assert "digits.py" in r.stdout and (tmp_path / "out" / "digits.safetensors").exists()
    spec = importlib.util.spec_from_file_location("cli_digits", tmp_path / "out" / "digits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = np.random.default_rng(5).standard_normal((2, 1, 28, 28)).astype(np.float32)
    with open(model, "rb") as f:
        want = reference(f.read(), {"image": x})[0]
    y = mod.load(device=device)(ember.from_numpy(x, device=device))
    assert y.device == device
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)


def test_cli_shape_option_and_console_script(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "ember")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "ember"]
    r = subprocess.run(cmd + ["import", os.path.join(FIX, "encoder_block.onnx"), "-o", str(tmp_path),
                              "--shape", "tokens=1,3,32", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    src = (tmp_path / "model.py").read_text()
    assert "tokens=(1, 3, 32)" in src and "onnxf.shape" not in src


def test_cli_default_names_match_readme(tmp_path):
    """The README promises ``ember import model.onnx -o out/`` writes out/model.py and
    out/model.safetensors; the class keeps the model's name, with the right article."""
    r = _run("import", os.path.join(FIX, "encoder_block.onnx"), "-o", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["model.py", "model.safetensors"]
    src = (out / "model.py").read_text()
    assert "class EncoderBlock(" in src
    assert '"""An EncoderBlock with its weights (default: model.safetensors' in src
    assert '"""A EncoderBlock' not in src
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "ember import model.onnx -o out/" in readme and "`out/model.py`" in readme
    assert "`out/model.safetensors`" in readme


def test_cli_errors(tmp_path):
    r = _run("import", str(tmp_path / "missing.onnx"), "-o", str(tmp_path))
    assert r.returncode == 1 and "does not exist" in r.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x3a\x10abc")
    r = _run("import", str(bad), "-o", str(tmp_path))
    assert r.returncode == 1 and "OnnxError" in r.stderr and "byte" in r.stderr
    r = _run("import", str(bad))
    assert r.returncode == 2 and "-o" in r.stderr
    r = _run("import", str(bad), "-o", str(tmp_path), "--shape", "x=a,b")
    assert r.returncode == 2 and "integers" in r.stderr


def test_progress_bar_for_large_models(tmp_path, capsys):
    """Models with more than 8 MiB of weights report progress on stderr while importing."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((1024, 2304)).astype(np.float32)     # 9 MiB
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2304])],
                          [numpy_helper.from_array(w, "w")])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    path = tmp_path / "big.onnx"
    path.write_bytes(raw)
    import ember.onnx
    r = ember.onnx.import_model(str(path), str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert "[ember import]" in err and "100%" in err
    assert os.path.getsize(r["weights"]) > w.nbytes
