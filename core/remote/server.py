"""The ``ember serve`` WebSocket server: runs registry ops and captured plans for its clients.

A Starlette app under uvicorn. Each WebSocket connection is one session with its own tensor
table (ids chosen by its client) and plans; nothing is shared between sessions, so a client
can only name its own tensors. The first frame must be HELLO with the token (compared with
``hmac.compare_digest``); then BATCH frames carry commands (see ``ember.remote.protocol``):

- ``["put", id, shape, dtype, blob]``: a tensor from raw bytes
- ``["op", name, [input ids], [output ids], attrs]``: ``ember.registry.apply(name, ...)`` on the
  server's device, so the registry's own shape and dtype rules check every request
- ``["plan", plan id, description]`` / ``["run", plan id, [input ids], [output ids]]`` /
  ``["unplan", plan id]``: a plan the client captured (``ember.compile``), replayed here as an
  ``ember.plan.Plan`` captured on this server at its first run
- ``["free", [ids]]``, ``["get", id]`` (the reply carries the bytes)

Safety: every size is checked before anything is allocated (message, metadata, blobs, each
output against the per-connection and total memory ceilings); work runs on one executor thread
(ember's capture and grad state are process-wide) behind a bounded queue (a full queue answers
"busy"); an idle connection is closed; a disconnect frees everything its session held. Any
failure is sent back to that client as an ERROR frame naming the ember error class.
"""
from __future__ import annotations

import asyncio
import hmac
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import prod

from ..errors import EmberError
from . import protocol as P


@dataclass
class Limits:
    """Ceilings of one server process (bytes, seconds, counts)."""

    max_message: int = P.MAX_MESSAGE
    max_connection_bytes: int = 2 << 30
    max_total_bytes: int = 8 << 30
    idle_seconds: float = 300.0
    hello_seconds: float = 10.0
    max_queue: int = 256
    max_tensors: int = 1 << 20
    max_plans: int = 256
    max_plan_steps: int = 1 << 16
    max_cmds: int = 1 << 16
    max_connections: int = 256       # open WebSockets (uvicorn answers 503 past it)


class Server:
    """Shared state of one ``ember serve`` process: its device, token, limits, memory in use."""

    def __init__(self, device: str, token: str, limits: Limits | None = None):
        import ember
        from .. import registry

        if not token:
            raise ValueError("ember serve: an empty token is not allowed")
        self.device = device
        self.backend = ember.get_backend(device)
        self.token = token.encode()
        self.limits = limits or Limits()
        self.total = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.waiting = 0
        self.sessions = 0
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-serve")
        self.ops = sorted(n for n, d in registry.OPS.items() if n in self.backend.kernels or d.decompose is not None)
        self.op_set = frozenset(self.ops)

    def reserve(self, session, n: int) -> None:
        lim = self.limits
        with self.lock:
            if session.held + n > lim.max_connection_bytes:
                raise P.RemoteError(f"remote: this connection would hold {session.held + n} bytes, over its "
                                    f"{lim.max_connection_bytes}-byte ceiling; free tensors (del) first")
            if self.total + n > lim.max_total_bytes:
                raise P.RemoteError(f"remote: the server would hold {self.total + n} bytes, over its "
                                    f"{lim.max_total_bytes}-byte total ceiling; retry later")
            session.held += n
            self.total += n
            self.peak = max(self.peak, self.total)

    def release(self, session, n: int) -> None:
        with self.lock:
            session.held -= n
            self.total -= n

    def welcome(self) -> dict:
        lim = self.limits
        from ..dtypes import FULL_DEVICES

        return {"device": self.device, "ops": self.ops, "pid": os.getpid(), "wide_dtypes": self.device in FULL_DEVICES,
                "limits": {"max_message": lim.max_message, "max_connection_bytes": lim.max_connection_bytes,
                           "max_cmds": lim.max_cmds}}


class _ServerPlan:
    """A client's plan description, checked; captured into an ``ember.plan.Plan`` at its first run."""

    __slots__ = ("n_slots", "n_inputs", "consts", "steps", "outs", "plan", "sig", "out_bytes", "pinned")

    def __init__(self, desc, session):
        srv = session.server
        if not isinstance(desc, dict):
            raise P.ProtocolError("plan: the description must be an object")
        n_slots, n_inputs = desc.get("n_slots"), desc.get("n_inputs")
        steps, consts, outs = desc.get("steps"), desc.get("consts"), desc.get("outs")
        if not (type(n_slots) is int and type(n_inputs) is int and 0 <= n_inputs <= n_slots <= 4 * srv.limits.max_plan_steps + 4096):
            raise P.ProtocolError(f"plan: bad slot counts n_slots={n_slots!r} n_inputs={n_inputs!r}")
        if not (isinstance(steps, list) and isinstance(consts, list) and isinstance(outs, list)):
            raise P.ProtocolError("plan: 'steps', 'consts' and 'outs' must be lists")
        if len(steps) > srv.limits.max_plan_steps:
            raise P.ProtocolError(f"plan: {len(steps)} steps, over the limit of {srv.limits.max_plan_steps}")

        def slot(s):
            if type(s) is not int or not 0 <= s < n_slots:
                raise P.ProtocolError(f"plan: slot {s!r} out of range [0, {n_slots})")
            return s
        defined = set(range(n_inputs))
        self.consts = []
        for c in consts:
            if not (isinstance(c, list) and len(c) == 2):
                raise P.ProtocolError("plan: a constant is [slot, tensor id]")
            s = slot(c[0])
            self.consts.append((s, session.tensor(c[1])))
            defined.add(s)
        self.steps = []
        for st in steps:
            if not (isinstance(st, list) and len(st) == 4 and isinstance(st[1], list) and isinstance(st[2], list)):
                raise P.ProtocolError("plan: a step is [op name, [input slots], [output slots], attrs]")
            name = session.op_name(st[0])
            ins = [slot(s) for s in st[1]]
            missing = [s for s in ins if s not in defined]
            if missing:
                raise P.ProtocolError(f"plan: step {name} reads slots {missing} before anything writes them")
            outs_ = [slot(s) for s in st[2]]
            if not outs_:
                raise P.ProtocolError(f"plan: step {name} has no output slot")
            defined.update(outs_)
            self.steps.append((name, ins, outs_, P.decode_attrs(st[3])))
        self.outs = [slot(s) for s in outs]
        if any(s not in defined for s in self.outs):
            raise P.ProtocolError("plan: an output slot is never written")
        self.n_slots, self.n_inputs = n_slots, n_inputs
        self.plan = None
        self.sig = None
        self.out_bytes = None
        self.pinned = 0

    def run(self, session, inputs):
        """The output tensors for ``inputs`` (the first run captures the plan)."""
        from ..plan import Capture, out_structure

        sig = [(t.shape, t.dtype) for t in inputs]
        if self.plan is not None:
            if sig != self.sig:
                raise P.RemoteError(f"run: inputs {_show(sig)} do not match the plan's signature {_show(self.sig)}")
            return self.plan.run(inputs)
        if len(inputs) != self.n_inputs:
            raise P.RemoteError(f"run: {len(inputs)} inputs for a plan of {self.n_inputs}")
        vals = [None] * self.n_slots
        vals[:self.n_inputs] = inputs
        for s, t in self.consts:
            vals[s] = t
        cap = Capture(inputs).start()
        try:
            for name, ins, outs, attrs in self.steps:
                res = session.apply(name, [vals[i] for i in ins], attrs)
                res = res if isinstance(res, tuple) else (res,)
                if len(res) != len(outs):
                    raise P.ProtocolError(f"plan: step {name} makes {len(res)} outputs, the plan names {len(outs)}")
                for s, t in zip(outs, res):
                    vals[s] = t
        finally:
            cap.stop()
        outs = [vals[s] for s in self.outs]
        if cap.reason is None:
            self.plan = cap.plan(outs, out_structure(outs))
            self.sig = sig
            self.consts = []   # the Plan holds what it needs
            self.steps = []
        return outs


# What a registry rule or kernel raises on attributes no public ember function would pass it
# (a missing keyword, an axis out of range that the public wrapper normalizes): the client's
# request is refused with a typed error, the server goes on.
_REJECTED = (TypeError, ValueError, IndexError, KeyError, AttributeError, OverflowError, ZeroDivisionError,
             RecursionError)


def _rejected(name, attrs, e) -> "P.RemoteError":
    return P.RemoteError(f"{name}: the server's registry refused the request (attributes {sorted(attrs)}): "
                         f"{type(e).__name__}: {str(e)[:300]}")


def _show(sig) -> str:
    return ", ".join(f"{d.name}{list(s)}" for s, d in sig) if sig else "()"


class Session:
    """One connection's tensors and plans."""

    reraise = False   # the fuzzer sets it: errors that are not EmberErrors propagate (findings)

    def __init__(self, server: Server):
        self.server = server
        self.tensors: dict = {}
        self.sizes: dict = {}
        self.plans: dict = {}
        self.held = 0

    # ---- lookups ---------------------------------------------------------------------------
    def tensor(self, i):
        t = self.tensors.get(i) if type(i) is int else None
        if t is None:
            raise P.RemoteError(f"remote: unknown tensor id {i!r} (freed, never made, or made by an op that failed)")
        return t

    def op_name(self, name):
        if not isinstance(name, str) or name not in self.server.op_set:
            raise P.RemoteError(f"remote: {str(name)[:80]!r} is not an op this server runs (registry ops on "
                                f"{self.server.device!r} only)")
        return name

    def _new_id(self, i):
        if type(i) is not int or i <= 0 or i >= 1 << 53:
            raise P.ProtocolError(f"remote: tensor id {i!r} must be an integer in [1, 2**53)")
        if i in self.tensors:
            raise P.RemoteError(f"remote: tensor id {i} is already in use")
        if len(self.tensors) >= self.server.limits.max_tensors:
            raise P.RemoteError(f"remote: more than {self.server.limits.max_tensors} live tensors on this connection")
        return i

    def _store(self, i, t, reserved: int = 0) -> None:
        n = t.nbytes
        if n > reserved:
            self.server.reserve(self, n - reserved)
        elif n < reserved:
            self.server.release(self, reserved - n)
        self.tensors[i] = t
        self.sizes[i] = n

    def free(self, ids) -> None:
        if not isinstance(ids, list):
            raise P.ProtocolError("free: expects a list of ids")
        for i in ids:
            if type(i) is int and self.tensors.pop(i, None) is not None:
                self.server.release(self, self.sizes.pop(i))

    def close(self) -> None:
        """Free everything this session holds (the connection ended)."""
        self.free(list(self.tensors))
        for pid in list(self.plans):
            self.unplan(pid)

    # ---- commands --------------------------------------------------------------------------
    def apply(self, name, inputs, attrs):
        from .. import registry

        attrs = dict(attrs)
        attrs.pop("device", None)
        if not inputs:
            attrs["device"] = self.server.device
        try:
            return registry.apply(name, *inputs, **attrs)
        except EmberError:
            raise
        except _REJECTED as e:
            raise _rejected(name, attrs, e) from e

    def _out_bytes(self, name, inputs, attrs) -> int:
        """Bytes of the outputs of ``name`` by the registry's rules (before running it)."""
        from .. import registry

        d = registry.OPS[name]
        attrs = {k: v for k, v in attrs.items() if k != "device"}
        try:
            shapes = d.shape(*[t.shape for t in inputs], **attrs)
            dts = d.dtype(*[t.dtype for t in inputs], **attrs)
        except EmberError:
            raise
        except _REJECTED as e:
            raise _rejected(name, attrs, e) from e
        from ..dtypes import DType
        from ..limits import check_shape

        if d.outputs == 1:
            shapes, dts = (shapes,), (dts,)
        total = 0
        for s, dt in zip(shapes, dts):
            check_shape(name, s)
            if not isinstance(dt, DType):
                raise P.RemoteError(f"{name}: the dtype rule gave {dt!r} for these attributes")
            total += prod(s) * dt.itemsize
        return total

    def cmd_put(self, cmd, blobs):
        from .. import dtypes
        from ..limits import check_shape

        if len(cmd) != 5:
            raise P.ProtocolError("put: [\"put\", id, shape, dtype, blob index]")
        _, i, shape, dt, b = cmd
        i = self._new_id(i)
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise P.ProtocolError(f"put: bad shape {shape!r}")
        if not isinstance(dt, str):
            raise P.ProtocolError("put: dtype must be a name")
        dt = dtypes.get(dt)
        dtypes.check_device(dt, self.server.device)
        if type(b) is not int or not 0 <= b < len(blobs):
            raise P.ProtocolError(f"put: blob index {b!r} out of range ({len(blobs)} blobs)")
        shape = tuple(shape)
        check_shape("put", shape)
        n = prod(shape) * dt.itemsize
        if len(blobs[b]) != n:
            raise P.ProtocolError(f"put: {len(blobs[b])} bytes for {dt.name}{list(shape)} ({n} bytes)")
        self.server.reserve(self, n)
        try:
            from ..tensor import Tensor

            t = Tensor._wrap(self.server.backend.from_bytes(blobs[b], shape, dt), shape, dt, self.server.device)
        except BaseException:
            self.server.release(self, n)
            raise
        self._store(i, t, n)

    def cmd_op(self, cmd):
        if len(cmd) != 5 or not isinstance(cmd[2], list) or not isinstance(cmd[3], list):
            raise P.ProtocolError("op: [\"op\", name, [input ids], [output ids], attrs]")
        _, name, ins, outs, attrs = cmd
        name = self.op_name(name)
        inputs = [self.tensor(i) for i in ins]
        for i in outs:
            self._new_id(i)
        if len(set(outs)) != len(outs):
            raise P.ProtocolError("op: repeated output id")
        attrs = P.decode_attrs(attrs)
        n = self._out_bytes(name, inputs, attrs)
        self.server.reserve(self, n)
        try:
            res = self.apply(name, inputs, attrs)
        except BaseException:
            self.server.release(self, n)
            raise
        self._keep(name, res, outs, n)

    def _keep(self, what, res, outs, reserved):
        res = res if isinstance(res, (tuple, list)) else (res,)
        if len(res) != len(outs):
            self.server.release(self, reserved)
            raise P.ProtocolError(f"{what}: makes {len(res)} outputs, the request names {len(outs)}")
        for k, (i, t) in enumerate(zip(outs, res)):
            self._store(i, t, reserved if k == 0 else 0)

    def cmd_plan(self, cmd):
        if len(cmd) != 3:
            raise P.ProtocolError("plan: [\"plan\", plan id, description]")
        pid = cmd[1]
        if type(pid) is not int or pid in self.plans:
            raise P.ProtocolError(f"plan: bad or repeated plan id {pid!r}")
        if len(self.plans) >= self.server.limits.max_plans:
            raise P.RemoteError(f"remote: more than {self.server.limits.max_plans} plans on this connection")
        plan = _ServerPlan(cmd[2], self)
        # The plan holds its constants even after the client frees their ids: count them
        # (again) until the plan goes, so that freeing cannot get around the ceilings.
        plan.pinned = sum({id(t): t.nbytes for _, t in plan.consts}.values())
        self.server.reserve(self, plan.pinned)
        self.plans[pid] = plan

    def unplan(self, pid) -> None:
        plan = self.plans.pop(pid, None) if type(pid) is int else None
        if plan is not None:
            self.server.release(self, plan.pinned)

    def cmd_run(self, cmd):
        if len(cmd) != 4 or not isinstance(cmd[2], list) or not isinstance(cmd[3], list):
            raise P.ProtocolError("run: [\"run\", plan id, [input ids], [output ids]]")
        _, pid, ins, outs = cmd
        plan = self.plans.get(pid) if type(pid) is int else None
        if plan is None:
            raise P.RemoteError(f"remote: unknown plan id {pid!r}")
        inputs = [self.tensor(i) for i in ins]
        for i in outs:
            self._new_id(i)
        if len(outs) != len(plan.outs):
            raise P.ProtocolError(f"run: {len(outs)} output ids for a plan of {len(plan.outs)} outputs")
        n = plan.out_bytes or 0
        self.server.reserve(self, n)
        try:
            res = plan.run(self, inputs)
        except BaseException:
            self.server.release(self, n)
            raise
        if plan.out_bytes is None:
            plan.out_bytes = sum(t.nbytes for t in res)
        self._keep("run", res, outs, n)

    def run_batch(self, meta: dict, blobs: list):
        """Run one BATCH; returns ``(REPLY meta, blobs)`` or ``(ERROR meta, None)``. Frees in a
        failed batch are still carried out (the client has let those tensors go)."""
        cmds = meta.get("cmds")
        if not isinstance(cmds, list) or len(cmds) > self.server.limits.max_cmds:
            return P.error_meta(P.ProtocolError(f"a batch needs 'cmds', a list of at most "
                                                f"{self.server.limits.max_cmds} commands")), None
        out = []
        sent = 0
        for k, cmd in enumerate(cmds):
            try:
                if not isinstance(cmd, list) or not cmd or not isinstance(cmd[0], str):
                    raise P.ProtocolError("a command is a list starting with its name")
                c = cmd[0]
                if c == "op":
                    self.cmd_op(cmd)
                elif c == "put":
                    self.cmd_put(cmd, blobs)
                elif c == "free":
                    self.free(cmd[1] if len(cmd) == 2 else None)
                elif c == "get":
                    t = self.tensor(cmd[1] if len(cmd) == 2 else None)
                    sent += t.nbytes
                    if sent > self.server.limits.max_message - (1 << 20):
                        raise P.RemoteError(f"remote: reading {sent} bytes in one reply is over the "
                                            f"{self.server.limits.max_message}-byte message limit; read "
                                            f"slices of the tensor")
                    out.append(bytes(self.server.backend.to_bytes(t._buf, t.shape, t.dtype)))
                elif c == "run":
                    self.cmd_run(cmd)
                elif c == "plan":
                    self.cmd_plan(cmd)
                elif c == "unplan":
                    self.unplan(cmd[1] if len(cmd) == 2 else None)
                else:
                    raise P.ProtocolError(f"unknown command {c[:40]!r}")
            except Exception as e:   # noqa: BLE001 - every failure goes back to this client, typed
                if self.reraise and not isinstance(e, EmberError):
                    raise
                for later in cmds[k + 1:]:
                    if isinstance(later, list) and len(later) == 2 and later[0] == "free":
                        self.free(later[1])
                what = cmd[1] if isinstance(cmd, list) and len(cmd) > 1 and isinstance(cmd[1], str) else None
                return P.error_meta(e, index=k, cmd=cmd[0] if isinstance(cmd, list) and cmd else None,
                                    op=what), None
        return {"held": self.held}, out


INLINE = [os.environ.get("EMBER_SERVE_INLINE", "1") != "0"]


def _small(meta: dict, nbytes: int) -> bool:
    """A batch cheap enough to run on the event loop: few commands, no plan to capture."""
    cmds = meta.get("cmds")
    return (isinstance(cmds, list) and len(cmds) <= 16 and nbytes <= 1 << 20
            and not any(isinstance(c, list) and c and c[0] == "plan" for c in cmds))


def create_app(device: str, token: str, limits: Limits | None = None):
    """The Starlette app of ``ember serve`` (WebSocket at ``/``, ``/health`` for load balancers).

    >>> app = create_app("python", "secret")
    >>> sorted(r.path for r in app.routes)
    ['/', '/health']
    """
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocketDisconnect

    server = Server(device, token, limits)
    lim = server.limits

    async def receive(ws, timeout):
        msg = await asyncio.wait_for(ws.receive(), timeout)
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        data = msg.get("bytes")
        if data is None:
            raise P.ProtocolError("text frames are not part of the protocol; send binary frames")
        return data

    async def send_error(ws, rid, exc_meta):
        await ws.send_bytes(P.encode_frame(P.ERROR, rid, exc_meta))

    async def endpoint(ws):
        await ws.accept()
        session = None
        loop = asyncio.get_running_loop()
        try:
            try:
                kind, rid, meta, _ = P.decode_frame(await receive(ws, lim.hello_seconds), max_message=1 << 16)
            except asyncio.TimeoutError:
                await ws.close(code=1008)
                return
            tok = meta.get("token") if kind == P.HELLO else None
            if not isinstance(tok, str) or not hmac.compare_digest(tok.encode(), server.token):
                await send_error(ws, rid, P.error_meta(P.AuthError(
                    "remote: the server refused the token (wrong or missing)")))
                await ws.close(code=4401)
                return
            session = Session(server)
            server.sessions += 1
            await ws.send_bytes(P.encode_frame(P.WELCOME, rid, server.welcome()))
            while True:
                try:
                    data = await receive(ws, lim.idle_seconds)
                except asyncio.TimeoutError:
                    await ws.close(code=1001, reason="idle")
                    return
                rid = 0
                try:
                    kind, rid, meta, blobs = P.decode_frame(data, max_message=lim.max_message)
                    if kind != P.BATCH:
                        raise P.ProtocolError(f"expected a BATCH frame, got {P.TYPES[kind]}")
                except P.ProtocolError as e:
                    await send_error(ws, rid, P.error_meta(e))
                    continue
                if server.waiting >= lim.max_queue:
                    await send_error(ws, rid, P.error_meta(P.RemoteError(
                        f"remote: the server is busy ({server.waiting} requests queued); retry later")))
                    continue
                if server.waiting == 0 and _small(meta, len(data)) and INLINE[0]:
                    # nothing queued, so the executor is idle: a small batch (a replay, a read) runs
                    # here, on the event loop's thread, saving two thread switches per round trip
                    rmeta, rblobs = session.run_batch(meta, blobs)
                else:
                    server.waiting += 1
                    try:
                        rmeta, rblobs = await loop.run_in_executor(server.executor, session.run_batch, meta, blobs)
                    finally:
                        server.waiting -= 1
                del data, blobs
                if rblobs is None:
                    await send_error(ws, rid, rmeta)
                else:
                    await ws.send_bytes(P.encode_frame(P.REPLY, rid, rmeta, rblobs))
        except WebSocketDisconnect:
            pass
        except P.ProtocolError as e:   # a malformed first frame
            try:
                await send_error(ws, 0, P.error_meta(e))
                await ws.close(code=1002)
            except Exception:   # noqa: BLE001 - the peer is gone already
                pass
        finally:
            if session is not None:
                server.sessions -= 1
                await loop.run_in_executor(server.executor, session.close)

    async def health(request):
        return PlainTextResponse(f"ok {server.device} sessions={server.sessions} bytes={server.total}\n")

    app = Starlette(routes=[WebSocketRoute("/", endpoint), Route("/health", health)])
    app.state.ember = server
    return app


def read_token(path: str) -> str:
    """The token in ``path`` (surrounding whitespace stripped); ValueError if empty."""
    with open(path, encoding="utf-8") as f:
        tok = f.read().strip()
    if not tok:
        raise ValueError(f"{path}: the token file is empty")
    return tok


def serve(device: str = "numpy", host: str = "127.0.0.1", port: int = 8765, token_file: str | None = None, *,
          token: str | None = None, limits: Limits | None = None, ssl_certfile: str | None = None,
          ssl_keyfile: str | None = None, log_level: str = "warning") -> None:
    """Serve ``device`` over WebSocket until interrupted (``ember serve``). ``port=0`` picks a
    free port; the line ``ember serve: ... ws://HOST:PORT/`` on stdout says which."""
    import socket

    import uvicorn

    if token is None:
        if not token_file:
            raise ValueError("ember serve: --token-file FILE is required (a client must know the token)")
        token = read_token(token_file)
    app = create_app(device, token, limits)
    lim = app.state.ember.limits
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)   # before the line below: a client reading it may connect at once
    port = sock.getsockname()[1]
    # ws_max_queue: frames a connection may have read ahead while one runs (each up to the
    # message limit): a client pipelining many big frames cannot pile them up in memory.
    cfg = uvicorn.Config(app, log_level=log_level, ws_max_size=lim.max_message + (1 << 20), ws_max_queue=2,
                         ws_per_message_deflate=False, ws_ping_interval=None, lifespan="off",
                         limit_concurrency=lim.max_connections, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)
    scheme = "wss" if ssl_certfile else "ws"
    if host not in ("127.0.0.1", "::1", "localhost") and not ssl_certfile:
        print(f"ember serve: WARNING: listening on {host} without TLS: the token and tensors cross the network "
              f"in clear; pass --ssl-certfile/--ssl-keyfile", file=sys.stderr)
    print(f"ember serve: device {device} on {scheme}://{host}:{port}/ (pid {os.getpid()})", flush=True)
    uvicorn.Server(cfg).run(sockets=[sock])


def spawn(device: str = "numpy", *, token: str, host: str = "127.0.0.1", port: int = 0, args=(), env=None,
          timeout: float = 60.0):
    """Start ``ember serve`` in a child process (tests, benchmarks, ``build.py demo --remote``);
    returns ``(process, url)`` once it listens. The token goes through a private temporary file
    (removed when the server has read it). Stop it with ``process.terminate()``."""
    import subprocess
    import tempfile
    import time

    fd, path = tempfile.mkstemp(prefix="ember-token-")
    with os.fdopen(fd, "w") as f:
        f.write(token)
    cmd = [sys.executable, "-m", "ember", "serve", "--device", device, "--host", host, "--port", str(port),
           "--token-file", path, *args]
    err = tempfile.TemporaryFile()   # never a pipe nobody reads: a full one would block the server
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                            env=env if env is not None else dict(os.environ))
    deadline = time.monotonic() + timeout
    try:
        while True:
            line = proc.stdout.readline()
            if "ember serve:" in line and "://" in line:
                return proc, line.split(" on ", 1)[1].split()[0]
            if not line or time.monotonic() > deadline:
                proc.kill()
                err.seek(0)
                raise RuntimeError(f"ember serve did not start: {err.read()[-2000:].decode(errors='replace')}")
    finally:
        os.unlink(path)
