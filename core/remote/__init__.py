"""Remote execution: run tensors on another process's device (a GPU server) over WebSocket.

Start a server (``ember serve --device numpy --token-file TOKEN``), then in the client::

    import ember, ember.remote
    dev = ember.remote.connect("ws://127.0.0.1:8765/", token=open("TOKEN").read().strip())
    x = ember.ones((2, 3), device=dev)          # "remote"
    y = (x * 2).sum(axis=1)                      # described, not run: nothing sent yet
    y.tolist()                                   # one round trip: the batch runs, the bytes come back

Work travels as data (registry op names and attributes; a plan captured by ``ember.compile`` is
sent once and replayed by its id), tensors as raw bytes with a small header, never pickle
(``ember.remote.protocol``). The server (``ember.remote.server``) runs only what the registry
declares, on its own device, with every size checked first.

>>> import ember.remote
>>> ember.remote.connected()
[]
"""
from __future__ import annotations

from .protocol import AuthError, ProtocolError, RemoteError

__all__ = ["connect", "connect_async", "flush_async", "disconnect", "connected", "RemoteError", "AuthError", "ProtocolError", "info"]

_CONNECTIONS: dict = {}


def connect(url: str, token: str | None = None, *, name: str | None = None, open_timeout: float = 15.0) -> str:
    """Open a connection to an ``ember serve`` process at ``url`` (``ws://`` or ``wss://``) and
    return its device name: ``"remote"``, or ``"remote:NAME"`` with ``name=`` (several servers
    at once). A wrong or missing token raises ``AuthError`` (an ``ember.errors.EmberError``);
    an unreachable server raises ``RemoteError``. Connecting a name again replaces the old
    connection (its tensors are gone). In the page this needs JSPI (code entered through
    ``runPythonAsync``); ``await connect_async(...)`` does not."""
    from .client import Connection

    dev = _name(name)
    return _register(dev, Connection.open(url, token or "", dev, open_timeout=open_timeout))


async def connect_async(url: str, token: str | None = None, *, name: str | None = None,
                        open_timeout: float = 15.0) -> str:
    """``connect`` that awaits the handshake: in a page's Worker without JSPI, ops on the device
    are queued and ``await t.data_async()`` (or ``await flush_async()``) sends them."""
    from .client import Connection

    dev = _name(name)
    return _register(dev, await Connection.open_async(url, token or "", dev, open_timeout=open_timeout))


async def flush_async(device: str = "remote") -> None:
    """Send the work queued for ``device`` now and await the server's answer."""
    from ..backends import get_backend

    await get_backend(device).conn.flush_async()


def _name(name) -> str:
    dev = "remote" if not name else f"remote:{name}"
    if dev in _CONNECTIONS:
        disconnect(dev)
    return dev


def _register(dev: str, conn) -> str:
    from ..backends import _INSTANCES, register_backend
    from ..dtypes import FULL_DEVICES
    from .client import RemoteBackend

    register_backend(dev, "ember.remote:_not_connected")
    _INSTANCES[dev] = RemoteBackend(dev, conn)
    if conn.info.get("wide_dtypes"):   # the server's device holds float64, int8... (numpy): so does this one
        FULL_DEVICES.add(dev)
    _CONNECTIONS[dev] = conn
    return dev


def disconnect(device: str = "remote") -> None:
    """Close the connection of ``device``; the server frees everything it held for it."""
    from ..backends import reset_backend
    from ..dtypes import FULL_DEVICES

    FULL_DEVICES.discard(device)
    conn = _CONNECTIONS.pop(device, None)
    if conn is not None:
        conn.close()
    reset_backend(device)


def connected() -> list:
    """The remote device names connected now."""
    return sorted(_CONNECTIONS)


def info(device: str = "remote") -> dict:
    """What the server said about itself (``device``, ``pid``, ``limits``) plus this
    connection's counters (``round_trips``, ``cmds``, ``bytes_sent``, ``bytes_received``)."""
    conn = _CONNECTIONS.get(device)
    if conn is None:
        raise RemoteError(f"{device!r} is not connected; call ember.remote.connect(url, token=...)")
    out = {k: v for k, v in conn.info.items() if k not in ("ops", "blobs")}
    out.update(conn.stats, url=conn.url, ops=len(conn.info.get("ops", [])))
    return out


def _not_connected():
    from ..errors import DeviceError

    raise DeviceError("the remote device is not connected; call ember.remote.connect(url, token=...)")
