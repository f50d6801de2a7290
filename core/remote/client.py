"""The client side of ``ember.remote``: a backend whose kernels describe work instead of doing it.

``connect(url, token=...)`` opens a WebSocket to an ``ember serve`` process and registers a
device (``"remote"``, or ``"remote:NAME"``). Its backend has a kernel for every op the server
runs; a kernel call appends ``["op", name, inputs, outputs, attrs]`` to a pending batch and
returns at once a handle (a tensor id on the server). Nothing crosses the network until a value
is read (``tolist()``, ``numpy()``, ``item()``), the batch grows past a bound, or
``flush()`` is called: then the batch goes as one frame and one reply comes back. Errors the
server meets (an index out of range in a gather, a memory ceiling) are raised at that point,
as the same ``ember.errors`` class. A handle dropped by Python is freed on the server with the
next batch.

A plan captured by ``ember.compile`` on a remote device is sent once (``backend.compile_plan``,
the seam every backend's fast replay uses); each replay then sends only
``["run", plan id, input ids, output ids]``.
"""
from __future__ import annotations

import itertools
import threading
import weakref

from ..registry import Meta
from . import protocol as P

_FLUSH_CMDS = 2048          # pending commands that force a round trip
_FLUSH_BYTES = 16 << 20     # pending upload bytes that force a round trip


# ---- transports --------------------------------------------------------------------------------

class _NativeTransport:
    """The ``websockets`` package's synchronous client."""

    def __init__(self, url: str, max_message: int, open_timeout: float):
        try:
            from websockets.sync.client import connect
        except ImportError as e:   # pragma: no cover - an optional dependency
            raise P.RemoteError("ember.remote needs the 'websockets' package natively "
                                "(pip install websockets)") from e
        try:
            # (entered as a context manager: websockets 17 warns on a bare connect(); close() ends it)
            self.ws = connect(url, max_size=max_message + (1 << 20), compression=None, open_timeout=open_timeout,
                              close_timeout=2).__enter__()
        except Exception as e:   # noqa: BLE001 - refused, DNS, TLS, HTTP status...
            raise P.RemoteError(f"remote: cannot connect to {url}: {type(e).__name__}: {e}") from None

    def can_sync(self) -> bool:
        return True

    def opened(self) -> None:
        pass

    async def opened_async(self) -> None:
        pass

    def send(self, data: bytes) -> None:
        self.ws.send(data)

    async def recv_async(self) -> bytes:
        return self.recv()

    def recv(self) -> bytes:
        data = self.ws.recv()
        if isinstance(data, str):
            raise P.ProtocolError("the server sent a text frame")
        return data

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:   # noqa: BLE001 - closing a broken connection
            pass


_JS_SOCKET = """
(url) => {
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  const queue = [], waiters = [];
  let failure = null;
  const push = (item) => { const w = waiters.shift(); if (w) w(item); else queue.push(item); };
  ws.onmessage = (ev) => push(new Uint8Array(ev.data));
  ws.onclose = (ev) => { failure = "closed (code " + ev.code + ")"; while (waiters.length) waiters.shift()(null); };
  ws.onerror = () => { failure = failure || "connection error"; };
  const opened = new Promise((ok, bad) => { ws.onopen = () => ok(true); setTimeout(() => ok(false), 15000); });
  return {
    opened,
    send: (u8) => ws.send(u8),
    recv: () => queue.length ? Promise.resolve(queue.shift())
                             : (failure ? Promise.resolve(null) : new Promise((ok) => waiters.push(ok))),
    failure: () => failure,
    close: () => ws.close(),
  };
}
"""


class _BrowserTransport:
    """The browser's WebSocket from Pyodide. Synchronous reads wait for the reply with JSPI
    (``pyodide.ffi.run_sync``), as the WebGPU driver's synchronous readback does, in code
    entered through ``runPythonAsync``; elsewhere ``await t.data_async()`` (and
    ``connect_async``) need no JSPI."""

    def __init__(self, url: str, max_message: int, open_timeout: float):
        from pyodide.code import run_js

        self.url = url
        self.js = run_js(_JS_SOCKET)(url)

    def can_sync(self) -> bool:
        from pyodide.ffi import can_run_sync

        return bool(can_run_sync())

    def _sync(self, promise):
        from pyodide.ffi import run_sync

        if not self.can_sync():
            raise P.RemoteError("remote: a synchronous read needs JSPI here (code entered through "
                                "pyodide.runPythonAsync); use 'await t.data_async()' and "
                                "'await ember.remote.connect_async(...)' instead")
        return run_sync(promise)

    def opened(self) -> None:
        if not self._sync(self.js.opened):
            raise P.RemoteError(f"remote: cannot connect to {self.url}: {self.js.failure() or 'timed out'}")

    async def opened_async(self) -> None:
        if not await self.js.opened:
            raise P.RemoteError(f"remote: cannot connect to {self.url}: {self.js.failure() or 'timed out'}")

    def send(self, data: bytes) -> None:
        from pyodide.ffi import to_js

        self.js.send(to_js(memoryview(data)))

    def _got(self, got) -> bytes:
        if got is None:
            raise P.RemoteError(f"remote: connection {self.js.failure()}")
        return got.to_bytes()

    def recv(self) -> bytes:
        return self._got(self._sync(self.js.recv()))

    async def recv_async(self) -> bytes:
        return self._got(await self.js.recv())

    def close(self) -> None:
        self.js.close()


def _in_pyodide() -> bool:
    import sys

    return sys.platform == "emscripten"


# ---- handles -----------------------------------------------------------------------------------

class RemoteBuf:
    """A tensor's buffer on a remote device: the id of a tensor held by the server. When Python
    drops it, the id is queued to be freed with the next batch."""

    __slots__ = ("conn", "id", "__weakref__")

    def __init__(self, conn, i):
        self.conn = conn
        self.id = i

    def __del__(self):
        c = self.conn
        if c is not None and not c.closed:
            c.freed.append(self.id)

    def __repr__(self) -> str:
        return f"RemoteBuf({self.id} on {self.conn.device!r})"


class Connection:
    """One WebSocket to a server: the pending batch, ids and the request/reply exchange. Made
    by ``open`` (or ``await open_async``), which sends the token and reads the server's WELCOME."""

    def __init__(self, url: str, device: str, *, open_timeout: float = 15.0, max_message: int = P.MAX_MESSAGE):
        self.url = url
        self.device = device
        self.closed = False
        self.lock = threading.RLock()
        self.cmds: list = []
        self.blobs: list = []
        self.pending_bytes = 0
        self.freed: list = []       # ids Python dropped (appended by finalizers, drained by flush)
        self.unplans: list = []     # plan ids likewise
        self.ids = itertools.count(1)
        self.rids = itertools.count(1)
        self.plans = itertools.count(1)
        self.stats = {"round_trips": 0, "cmds": 0, "bytes_sent": 0, "bytes_received": 0}
        self.max_message = max_message
        self.info: dict = {}
        T = _BrowserTransport if _in_pyodide() else _NativeTransport
        self.t = T(url, max_message, open_timeout)

    @classmethod
    def open(cls, url: str, token: str, device: str, **kw) -> "Connection":
        c = cls(url, device, **kw)
        c.t.opened()
        c._welcome(c._exchange(c._hello(token)))
        return c

    @classmethod
    async def open_async(cls, url: str, token: str, device: str, **kw) -> "Connection":
        c = cls(url, device, **kw)
        await c.t.opened_async()
        c._welcome(await c._exchange_async(c._hello(token)))
        return c

    def _hello(self, token):
        return P.encode_frame(P.HELLO, 0, {"token": token or "", "version": P.VERSION})

    def _welcome(self, reply) -> None:
        kind, _, meta, _ = reply
        if kind != P.WELCOME:
            raise P.ProtocolError(f"remote: expected WELCOME from {self.url}, got {P.TYPES.get(kind, kind)}")
        self.info = meta
        self.max_message = int(meta.get("limits", {}).get("max_message", self.max_message))

    def _exchange(self, frame: bytes):
        try:
            self.t.send(frame)
            data = self.t.recv()
        except Exception as e:   # noqa: BLE001 - the transport's own connection errors
            raise self._lost(e) from None
        return self._reply(frame, data)

    async def _exchange_async(self, frame: bytes):
        try:
            self.t.send(frame)
            data = await self.t.recv_async()
        except Exception as e:   # noqa: BLE001
            raise self._lost(e) from None
        return self._reply(frame, data)

    def _lost(self, e) -> P.RemoteError:
        self.closed = True
        self.t.close()
        if isinstance(e, P.RemoteError):
            return e
        return P.RemoteError(f"remote: connection to {self.url} lost: {type(e).__name__}: {e}")

    def _reply(self, frame, data):
        self.stats["round_trips"] += 1
        self.stats["bytes_sent"] += len(frame)
        self.stats["bytes_received"] += len(data)
        kind, rid, meta, blobs = P.decode_frame(data, max_message=self.max_message + (1 << 20))
        if kind == P.ERROR:
            raise P.error_from_meta(meta)
        return kind, rid, meta, blobs

    def new_id(self) -> RemoteBuf:
        return RemoteBuf(self, next(self.ids))

    def push(self, cmd, blob=None) -> None:
        """Queue a command (``blob``: raw bytes it refers to); round-trip when the batch is full
        (where a synchronous round trip is possible: in a page without JSPI the batch grows until
        the next ``await``ed read or ``flush_async``, up to the message limit)."""
        if self.closed:
            raise P.RemoteError(f"remote: the connection to {self.url} is closed")
        with self.lock:
            if blob is not None:
                if self.pending_bytes + len(blob) > self.max_message - (1 << 20):
                    if not self.cmds or not self.t.can_sync():
                        raise P.RemoteError(f"remote: {self.pending_bytes + len(blob)} bytes pending, over the "
                                            f"server's {self.max_message}-byte message limit"
                                            + ("" if not self.cmds else "; await ember.remote.flush_async() first"))
                    self.flush()
                elif self.pending_bytes + len(blob) > _FLUSH_BYTES and self.cmds and self.t.can_sync():
                    self.flush()
                cmd[-1] = len(self.blobs)
                self.blobs.append(blob)
                self.pending_bytes += len(blob)
            self.cmds.append(cmd)
            if (len(self.cmds) >= _FLUSH_CMDS or len(self.freed) >= _FLUSH_CMDS) and self.t.can_sync():
                self.flush()

    def _batch(self, gets):
        """The pending commands as one BATCH frame (None when there is nothing to send)."""
        cmds, blobs = self.cmds, self.blobs
        self.cmds, self.blobs, self.pending_bytes = [], [], 0
        if self.freed:
            freed, self.freed = self.freed, []
            cmds.append(["free", freed])
        while self.unplans:
            cmds.append(["unplan", self.unplans.pop()])
        cmds.extend(["get", i] for i in gets)
        if not cmds:
            return None
        if self.closed:
            raise P.RemoteError(f"remote: the connection to {self.url} is closed")
        self.stats["cmds"] += len(cmds)
        return P.encode_frame(P.BATCH, next(self.rids), {"cmds": cmds}, blobs)

    @staticmethod
    def _gets(reply, gets) -> list:
        got = reply[3]
        if len(got) != len(gets):
            raise P.ProtocolError(f"remote: asked for {len(gets)} tensors, the reply holds {len(got)}")
        return [bytes(b) for b in got]

    def flush(self, gets=()) -> list:
        """Send the pending batch (plus ``["get", id]`` for each id in ``gets``) and wait for
        the reply; returns the bytes of the tensors asked for."""
        with self.lock:
            frame = self._batch(gets)
            return [] if frame is None else self._gets(self._exchange(frame), gets)

    async def flush_async(self, gets=()) -> list:
        """``flush`` that awaits the reply (no JSPI needed in the page)."""
        with self.lock:
            frame = self._batch(gets)
            return [] if frame is None else self._gets(await self._exchange_async(frame), gets)

    def close(self) -> None:
        if not self.closed:
            try:
                with self.lock:
                    self.cmds, self.blobs = [], []
            finally:
                self.closed = True
                self.t.close()


# ---- the backend -------------------------------------------------------------------------------

def _kernel(backend, name):
    def kernel(out, *inputs, **attrs):
        conn = backend.conn
        if isinstance(out, Meta):
            bufs = conn.new_id()
            outs = [bufs.id]
        else:   # a tuple of Metas (ops with several outputs)
            bufs = tuple(conn.new_id() for _ in out)
            outs = [b.id for b in bufs]
        try:
            enc = P.encode_attrs(attrs)
        except TypeError as e:
            from ..errors import UnsupportedOp
            raise UnsupportedOp(f"{name}: {e}") from None
        conn.push(["op", name, [t._buf.id for t in inputs], outs, enc])
        return bufs
    kernel.remote_backend = backend
    kernel.__name__ = f"remote_{name}"
    return kernel


class RemoteBackend:
    """``device="remote"``: tensors live on an ``ember serve`` process (see the module doc)."""

    def __init__(self, name: str, conn: Connection):
        self.name = name
        self.conn = conn
        self.kernels = {op: _kernel(self, op) for op in conn.info.get("ops", [])}

    @staticmethod
    def available():
        return True, "connected"

    @property
    def server_device(self) -> str:
        return self.conn.info.get("device", "?")

    def from_bytes(self, data, shape, dtype):
        buf = self.conn.new_id()
        self.conn.push(["put", buf.id, list(shape), dtype.name, None], bytes(data))
        return buf

    def to_bytes(self, buf, shape, dtype):
        return self.conn.flush([buf.id])[0]

    async def to_bytes_async(self, buf, shape, dtype):
        return (await self.conn.flush_async([buf.id]))[0]

    def flush(self) -> None:
        """Send the pending work now and raise what the server reports."""
        self.conn.flush()

    def compile_plan(self, plan):
        """A replay that sends the plan once and afterwards only ``["run", id, inputs, outputs]``;
        None (step-by-step replay) when a step is not one of this device's kernels (a host step,
        a device move) or a constant lives elsewhere."""
        from ..plan import HOST

        steps, metas = [], {}
        for st in plan.steps:
            if st.multi == HOST or getattr(st.kernel, "remote_backend", None) is not self:
                return None
            try:
                attrs = P.encode_attrs(st.attrs)
            except TypeError:
                return None
            steps.append([st.name, list(st.ins), list(st.outs), attrs])
            for s, m in zip(st.outs, st.meta if st.multi else (st.meta,)):
                metas[s] = m
        consts = []
        for s, t in plan.consts:
            if t.device != self.name:
                return None
            consts.append([s, t._buf.id])
            metas[s] = (t.shape, t.dtype)
        desc = {"n_slots": plan.n_slots, "n_inputs": plan.n_inputs, "consts": consts, "steps": steps,
                "outs": list(plan.out_slots)}
        return _RemoteReplay(self, plan, desc, metas)


class _RemoteReplay:
    """``Plan.run`` for a remote plan: defines it on the server with its first run."""

    def __init__(self, backend, plan, desc, metas):
        self.backend = backend
        self.desc = desc
        self.metas = metas
        self.out_slots = plan.out_slots
        self.out_tree = plan.out_tree
        self.consts = [t for _, t in plan.consts]   # keep the server-side ids alive
        self.pid = None
        self.n_inputs = plan.n_inputs

    def __call__(self, inputs):
        from ..plan import unflatten
        from ..tensor import Tensor

        b = self.backend
        conn = b.conn
        if self.pid is None:
            self.pid = next(conn.plans)
            conn.push(["plan", self.pid, self.desc])
            weakref.finalize(self, _unplan, conn, self.pid)
        outs = []
        for k, s in enumerate(self.out_slots):
            m = self.metas.get(s)
            if m is None:   # an input returned as it is
                t = inputs[s]
                m = (t.shape, t.dtype)
            outs.append(Tensor._wrap(conn.new_id(), m[0], m[1], b.name))
        conn.push(["run", self.pid, [t._buf.id for t in inputs], [t._buf.id for t in outs]])
        return unflatten(self.out_tree, outs)


def _unplan(conn, pid):
    if not conn.closed:
        conn.unplans.append(pid)
