"""A clone named ``ember`` must not break ``import ember`` for scripts run from the folder above
it (it used to become an empty namespace package that shadowed the installed ember)."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_from_the_folder_above_a_clone_named_ember(tmp_path):
    os.symlink(REPO, tmp_path / "ember")
    code = ("import ember, ember.wasm, ember.web, ember.nn\n"
            "x = ember.tensor([[1.0, 2.0]])\n"
            "print((x @ x.T).tolist(), ember.nn.Linear(2, 3).weight.shape)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[[5.0]]", "(3,", "2)"]
