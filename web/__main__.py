"""python -m ember.web --site DIR [--host 127.0.0.1] [--port 8000]: serve an ember site."""
from __future__ import annotations

import argparse
import errno
import socket
import sys


def free_port(host: str, start: int, tries: int = 50):
    """The first port from ``start`` that can be bound on ``host`` right now, or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or SystemExit with a message that says what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            free = free_port(host, port + 1)
            hint = f"--port {free} is free" if free else "--port 0 picks a free one"
            raise SystemExit(f"ember.web: port {port} on {host} is already in use (another server?); "
                             f"stop it or pick another port: {hint}") from None
        if e.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(e, socket.gaierror):
            raise SystemExit(f"ember.web: cannot listen on {host!r}: {e.strerror or e}") from None
        raise SystemExit(f"ember.web: cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m ember.web", description=__doc__.split(":")[1].strip())
    ap.add_argument("--site", required=True, help="the folder built by 'python -m ember.web.site'")
    ap.add_argument("--host", default="127.0.0.1",
                    help="interface to listen on (default 127.0.0.1: this machine only; "
                         "0.0.0.0 exposes the server to the network)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    ap.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as e:
        raise SystemExit(f"ember.web needs starlette and uvicorn: pip install 'ember[web]' ({e})")
    try:
        app = create_app(a.site)
    except FileNotFoundError as e:
        raise SystemExit(str(e))
    sock = bind(a.host, a.port)
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):   # every interface: show an address a browser can open
        url = f"http://127.0.0.1:{port}/  (listening on all interfaces: reachable from the network)"
    else:
        url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    print(f"ember: serving {a.site} at {url}  (Ctrl+C to stop)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=a.log_level, access_log=False))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
