"""Many ``ember serve`` processes behind HAProxy (Debian's ``haproxy`` package).

Why HAProxy: every client is one long-lived WebSocket and a session's state (its tensors and
plans) lives in the one server process that accepted it, so a connection must stay on its
replica for its whole life -- which a TCP-level tunnel does by itself: HAProxy in ``mode http``
forwards the upgrade and then pins that connection to the replica it chose. ``balance
leastconn`` suits long-lived connections (round robin would pile them up unevenly);
``option httpchk GET /health`` takes a dead replica out of the rotation; ``maxconn`` per
replica queues extra connections at the proxy instead of overloading a GPU; TLS can end at the
proxy. It is one small, packaged, well-known binary that also spans hosts (uvicorn's own
``--workers`` shares one socket on one host, with no health checks or per-replica limits).

>>> print(haproxy_config(8765, [("127.0.0.1", 8801), ("127.0.0.1", 8802)]).splitlines()[-2])
    server r1 127.0.0.1:8801 check inter 1s fall 1 rise 1 maxconn 64
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


def haproxy_config(port: int, replicas, *, host: str = "127.0.0.1", maxconn: int = 64,
                   idle_seconds: int = 330) -> str:
    """An HAProxy configuration listening on ``host:port`` in front of ``replicas`` (a list of
    ``(host, port)`` of ``ember serve`` processes)."""
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        f"    timeout client {idle_seconds}s",
        f"    timeout server {idle_seconds}s",
        f"    timeout tunnel {idle_seconds}s",   # an upgraded WebSocket: idle limit of the tunnel
        "    timeout queue 30s",
        "frontend ember",
        f"    bind {host}:{port}",
        "    default_backend replicas",
        "backend replicas",
        "    balance leastconn",
        "    option httpchk GET /health",
    ]
    for k, (h, p) in enumerate(replicas, 1):
        lines.append(f"    server r{k} {h}:{p} check inter 1s fall 1 rise 1 maxconn {maxconn}")
    return "\n".join(lines) + "\n"


def find_haproxy() -> str | None:
    """The haproxy binary (PATH, then Debian's /usr/sbin), or None."""
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)


def run_haproxy(port: int, replicas, **kw) -> subprocess.Popen:
    """Start HAProxy in the foreground (``-db``) with ``haproxy_config``; stop it with
    ``terminate()``. Raises FileNotFoundError without the binary (``apt-get install haproxy``)."""
    exe = find_haproxy()
    if exe is None:
        raise FileNotFoundError("haproxy is not installed (apt-get install haproxy; build.py setup does it)")
    fd, path = tempfile.mkstemp(prefix="ember-haproxy-", suffix=".cfg")
    with os.fdopen(fd, "w") as f:
        f.write(haproxy_config(port, replicas, **kw))
    check = subprocess.run([exe, "-c", "-q", "-f", path], capture_output=True, text=True)
    if check.returncode:
        raise RuntimeError(f"haproxy refused the configuration {path}: {check.stderr[-1000:]}")
    return subprocess.Popen([exe, "-db", "-f", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
