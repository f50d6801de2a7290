"""The GPU buffer pool.

Allocating and destroying GPU buffers is slow (and in the browser, each crosses the JS bridge),
so freed buffers go back to a free list keyed by size class and the next allocation of that class
reuses one. Tensors own a ``Storage``; when the last tensor (or view, or lazy expression) holding
it goes away, a weakref callback hands the buffer back here (at once under reference counting).
The pool, not the Storage, holds the driver buffer: had the Storage held it, a Storage collected
inside a reference cycle (an exception traceback, say) would take the buffer object with it
into the garbage and hand back a dead buffer.

Size classes: sizes round up to 4 steps per power of two (1, 1.25, 1.5, 1.75 x 2^k), so a reused
buffer wastes at most 25%. The pool keeps at most ``max_pooled`` bytes of free buffers (default
1/4 of maxBufferSize, at most 1 GiB) and destroys the oldest beyond that.

An allocation takes the free buffer of its class that was *created first* (each class's free
list is a heap by creation number), not the last one freed: which buffer a tensor gets then
depends only on which buffers are free, not on the order they came back in. A training step or
a model run repeated gets the same buffers each time (or cycles through two), so the driver's
cached bind groups hit instead of being rebuilt for every dispatch (84 of 89 dispatches of an
encoder training step built a new bind group when the free lists were stacks).
"""
from __future__ import annotations

import heapq
import weakref
from collections import OrderedDict



def size_class(nbytes: int) -> int:
    """The allocation size a request of ``nbytes`` is rounded to."""
    n = max(int(nbytes), 4)
    if n <= 256:
        return (n + 15) // 16 * 16
    k = n.bit_length() - 1          # 2^k <= n < 2^(k+1)
    step = 1 << (k - 2)             # four classes per power of two
    return (n + step - 1) // step * step


class Storage:
    """One GPU buffer owned by tensors; its buffer returns to the pool when it is garbage."""

    __slots__ = ("buf", "nbytes", "owner", "half", "__weakref__")

    def __init__(self, buf, nbytes: int):
        self.buf = buf
        self.nbytes = nbytes
        self.owner = None   # id of the optimizer state that updates it in place (webgpu.optim)
        # True: the elements are 2-byte ``f16`` (a float16 tensor's half storage, ``Runtime.half``);
        # False: 4-byte elements (f32 / i32 / u32). Offsets and strides count elements either way.
        self.half = False


class BufferPool:
    """Free lists of driver buffers by size class; counts into ``stats``."""

    def __init__(self, driver, stats: dict, max_pooled: int | None = None, limits: dict | None = None):
        self.driver = driver
        self.stats = stats
        self.free_lists: dict = {}
        self.order: OrderedDict = OrderedDict()   # (id(buf)) -> (cls, buf), oldest first
        self.pooled_bytes = 0
        lim = driver.limits["max_buffer_size"]
        self.max_pooled = max_pooled if max_pooled is not None else min(lim // 4, 1 << 30)
        self.set_limits(driver.limits["max_storage_buffer_binding_size"], lim)
        self.live: dict = {}   # id(weakref) -> (weakref, buffer, size class)
        self.serial: dict = {}  # id(buffer) -> creation number (free lists are heaps of (number, id, buffer))
        self._made = 0

    def set_limits(self, max_binding: int, max_buffer: int) -> None:
        self.max_binding = int(max_binding)
        self.max_buffer = int(max_buffer)

    def acquire(self, nbytes: int, what: str = "tensor") -> Storage:
        """A Storage of at least ``nbytes`` bytes (DeviceLimitError past maxBufferSize). A
        request that fits one binding never gets a size class that does not (it would no longer
        bind whole); larger ones are for the kernels that run in chunks."""
        if nbytes > self.max_buffer:
            from ..errors import DeviceLimitError

            raise DeviceLimitError(f"webgpu: {what} needs {nbytes} bytes, more than this GPU's "
                                   f"maxBufferSize ({self.max_buffer} bytes); split the work into smaller "
                                   f"tensors or use device='numpy'", op=what, nbytes=nbytes,
                                   limit=self.max_buffer, limit_name="maxBufferSize")
        cls = size_class(nbytes)
        if cls > self.max_binding >= nbytes or cls > self.max_buffer:
            cls = (max(int(nbytes), 16) + 15) // 16 * 16
        lst = self.free_lists.get(cls)
        st = self.stats
        if lst:
            buf = heapq.heappop(lst)[2]
            self.order.pop(id(buf), None)
            self.pooled_bytes -= cls
            st["pool_hits"] += 1
        else:
            buf = self.driver.alloc(cls)
            self._made += 1
            self.serial[id(buf)] = self._made
            st["pool_misses"] += 1
            st["bytes_allocated"] += cls
            st["peak_bytes_allocated"] = max(st["peak_bytes_allocated"], st["bytes_allocated"])
        st["bytes_in_use"] += cls
        storage = Storage(buf, cls)
        ref = weakref.ref(storage, self._collected)
        self.live[id(ref)] = (ref, buf, cls)
        return storage

    def _collected(self, ref) -> None:
        entry = self.live.pop(id(ref), None)
        if entry is not None:
            try:
                self.release(entry[1], entry[2])
            except Exception:  # interpreter shutdown: the driver may be gone already
                pass

    def release(self, buf, cls: int) -> None:
        self.stats["bytes_in_use"] -= cls
        heapq.heappush(self.free_lists.setdefault(cls, []), (self.serial.get(id(buf), 0), id(buf), buf))
        self.order[id(buf)] = (cls, buf)
        self.pooled_bytes += cls
        while self.pooled_bytes > self.max_pooled and self.order:
            _, (c, b) = self.order.popitem(last=False)
            lst = self.free_lists[c]
            lst[:] = [e for e in lst if e[2] is not b]
            heapq.heapify(lst)
            self.pooled_bytes -= c
            self.stats["bytes_allocated"] -= c
            self.serial.pop(id(b), None)
            self.driver.free(b)

    def claim(self, buf):
        """Take the free buffer ``buf`` out of the pool (a replayed plan's own buffer from now
        on, handed back with ``release(buf, cls)``); returns its size class, or None when
        ``buf`` is not free here."""
        ent = self.order.pop(id(buf), None)
        if ent is None:
            return None
        cls = ent[0]
        lst = self.free_lists[cls]
        lst[:] = [e for e in lst if e[2] is not buf]
        heapq.heapify(lst)
        self.pooled_bytes -= cls
        self.stats["bytes_in_use"] += cls
        return cls

    def clear(self) -> None:
        """Destroy every pooled (free) buffer."""
        for c, b in list(self.order.values()):
            self.stats["bytes_allocated"] -= c
            self.serial.pop(id(b), None)
            self.driver.free(b)
        self.free_lists.clear()
        self.order.clear()
        self.pooled_bytes = 0
