"""python -m ember.web --site DIR [--host 127.0.0.1] [--port 8000]: serve an ember site.

Limits that keep one client (or a few hundred) from holding the server: a request's headers
must arrive within ``--header-timeout`` seconds of the connection opening (or of the previous
response, on a kept-alive connection), an idle kept-alive connection is closed after
``--keep-alive`` seconds, and past ``--max-connections`` open connections new requests get 503.
"""
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
    ap.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT,
                    help=f"seconds a client may take to send a request's headers (default {HEADER_TIMEOUT:g})")
    ap.add_argument("--keep-alive", type=int, default=KEEP_ALIVE,
                    help=f"seconds an idle kept-alive connection stays open (default {KEEP_ALIVE})")
    ap.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                    help=f"open connections past which requests get 503 (default {MAX_CONNECTIONS})")
    return ap.parse_args(argv)


HEADER_TIMEOUT = 10.0
KEEP_ALIVE = 5
MAX_CONNECTIONS = 512


def header_timeout_protocol(base, seconds: float):
    """``base`` (uvicorn's HTTP protocol class) with a deadline for each request's headers.

    uvicorn times out idle kept-alive connections but not a client that opens a connection and
    then sends nothing, or its headers a byte at a time: each such connection is held forever.
    The deadline starts when the connection opens and again when a new request starts on a
    kept-alive one; it is cancelled once the headers are in (a request cycle exists)."""

    class HeaderTimeoutProtocol(base):
        _deadline = None
        _waiting_since = None   # the request cycle that existed when the deadline was armed

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def _arm(self):
            self._disarm()
            self._waiting_since = getattr(self, "cycle", None)
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self):
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data):
            cycle = getattr(self, "cycle", None)
            if self._deadline is None and (cycle is None or cycle.response_complete):
                self._arm()     # the first bytes of a new request on a kept-alive connection
            super().data_received(data)
            cycle = getattr(self, "cycle", None)
            if self._deadline is not None and cycle is not None and cycle is not self._waiting_since:
                self._disarm()  # headers complete: the app has the request

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    HeaderTimeoutProtocol.__name__ = HeaderTimeoutProtocol.__qualname__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol


def server_config(app, a: argparse.Namespace):
    """The uvicorn Config ``main`` runs ``app`` with (timeouts and limits from ``a``)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(app, log_level=a.log_level, access_log=False,
                          http=header_timeout_protocol(AutoHTTPProtocol, a.header_timeout),
                          timeout_keep_alive=a.keep_alive, limit_concurrency=a.max_connections,
                          backlog=2048, h11_max_incomplete_event_size=16 << 10)


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
    server = uvicorn.Server(server_config(app, a))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
