"""llm_decode_profile.py's breakdown inside the chat page's Worker (headless Chromium, the built
site, COOP/COEP): the model the page loaded (``app._models["cpu"]``, context 2048), bench llm's
prompt, 1 and 2 threads, the decode step's tables.

    python tests/bench/llm_page_profile.py [--threads=1,2] [--tokens=64] [--site=DIR] [--kernels]

Serves the site with tests/bench/bench_llm.py's server (read only: nothing of it changes).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv) -> int:
    from playwright.sync_api import sync_playwright

    bl = _load(HERE / "bench_llm.py", "bench_llm_for_profile")
    arg = lambda name, d: next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), d)  # noqa: E731
    site = arg("site", None)
    if site is None:
        build = _load(REPO / "build.py", "ember_build")
        build.ensure_pyodide()
        site = build.build_site()
    threads = [int(t) for t in arg("threads", "1,2").split(",")]
    srv, base = bl.serve({"/": Path(site)})
    source = (HERE / "llm_decode_profile.py").read_text().replace("from __future__ import annotations\n", "", 1)
    code = (source.replace('if __name__ == "__main__":', "if False:") + "\n"
            f"_PROMPT[0] = {bl.chatml_prompt()!r}\n"     # (what the host side passes as --prompt=)
            "import app, io, contextlib\n"
            "_buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(_buf):\n"
            f"    profile_model(app._models['cpu'], {threads!r}, {int(arg('tokens', '64'))}, "
            f"kernels={'--kernels' in argv})\n"
            "_buf.getvalue()\n")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=bl.chromium_args())
        page = browser.new_page()
        console = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        t0 = time.monotonic()
        page.goto(f"{base}/demos/chat/", timeout=60_000)
        page.wait_for_function("window.emberDemo && window.emberDemo.ready", timeout=60_000)
        info = page.evaluate("async () => { const i = await window.emberDemo.ready; return i; }")
        print(f"page ready in {time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.2f}")
        print(json.dumps({k: info.get(k) for k in ("devices", "loadMs", "warm", "readyMs")}, default=str))
        out = page.evaluate("async (code) => { try { return await window.emberDemo.worker.runPythonAsync(code); }"
                            " catch (e) { return 'ERROR ' + (e && (e.pythonMessage || e.message) || e); } }", code)
        print(out)
        if isinstance(out, str) and out.startswith("ERROR"):
            print("\n".join(console[-20:]))
        browser.close()
    srv.shutdown()
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
