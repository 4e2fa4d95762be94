"""KV caches: buffers plus an absolute ``length``, and the :class:`KVCache` protocol the
runtime and the export checks hold them by.

Optimum's graphs take ``past`` [1, kv_heads, length, head_dim] and return ``present``
[1, kv_heads, length + n, head_dim] (the concatenation happens inside the graph). Both must be
contiguous, so a view ``[:, :, :length]`` of one [1, kv_heads, capacity, head_dim] buffer will
not do. :class:`PingPongKVCache` keeps, per layer and for K and V, two flat buffers of
kv_heads × capacity × head_dim elements: the first kv_heads × length × head_dim elements of the
current one, reshaped, are the past; ONNX Runtime writes the present into the other one through
IO binding; then the two swap. No copy happens outside the graph except when ``crop`` must
re-pack the heads after a rejection.

:class:`ReferenceKVCache` is the plain path's: a list of numpy arrays, replaced by each step's
``present`` outputs and cropped by slicing (a copy). The export checks run on it, and tests
hold the fast path to it.

:class:`SharedKVCache` is the in-place graphs' (``kv_sharing`` "shared"): one buffer per layer
that the graph reads as past and writes as present; rolling back is setting ``length``.
"""

from __future__ import annotations

import mmap
from typing import Protocol

import numpy as np


class KVCache(Protocol):
    """What every cache offers its holder; only the forward path that made it writes into it."""

    @property
    def length(self) -> int:
        """The tokens held: positions 0 .. length - 1."""
        ...

    @property
    def nbytes(self) -> int:
        """The memory the cache holds."""
        ...

    def crop(self, length: int) -> None:
        """Keeps the first ``length`` tokens (an absolute length, not a count to drop)."""
        ...

    def reset(self) -> None:
        """Empties the cache (keeping its buffers)."""
        ...


def mapped_zeros(count: int, shape: tuple[int, ...], dtype: np.dtype) -> list[np.ndarray]:
    """``count`` zeroed contiguous arrays of ``shape`` in one anonymous memory map: pages are
    taken when first written and given back to the OS when the arrays are freed. (Caches are
    made per generation; from np.zeros, glibc's adaptive mmap threshold soon serves buffers of
    this size from its heap, which keeps freed ones, so a long chat's memory kept growing.)"""
    per_array = int(np.prod(shape))
    if per_array * count == 0:
        return [np.zeros(shape, dtype=dtype) for _ in range(count)]
    memory = mmap.mmap(-1, per_array * count * np.dtype(dtype).itemsize)
    flat = np.frombuffer(memory, dtype=dtype)
    return [flat[i * per_array : (i + 1) * per_array].reshape(shape) for i in range(count)]


class PingPongKVCache:
    """Ping-pong flat buffers per layer; ``length`` tokens are held."""

    def __init__(
        self, *, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: np.dtype
    ) -> None:
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.capacity = capacity
        size = kv_heads * capacity * head_dim
        # _buffers[side][kind][layer] is flat; kind 0 = key, 1 = value.
        flat = mapped_zeros(4 * layers, (size,), dtype)
        self._buffers = [
            [flat[(2 * side + kind) * layers : (2 * side + kind + 1) * layers] for kind in range(2)]
            for side in range(2)
        ]
        self._current = 0
        self.length = 0

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for side in self._buffers for kind in side for b in kind)

    def _view(self, side: int, kind: int, layer: int, length: int) -> np.ndarray:
        flat = self._buffers[side][kind][layer]
        used = self.kv_heads * length * self.head_dim
        return flat[:used].reshape(1, self.kv_heads, length, self.head_dim)

    def past(self, kind: int, layer: int) -> np.ndarray:
        """[1, kv_heads, length, head_dim] view of the held keys (kind 0) or values (kind 1)."""
        return self._view(self._current, kind, layer, self.length)

    def present(self, kind: int, layer: int, new_tokens: int) -> np.ndarray:
        """[1, kv_heads, length + new_tokens, head_dim] view the next step's output goes into."""
        return self._view(1 - self._current, kind, layer, self.length + new_tokens)

    def advance(self, new_tokens: int) -> None:
        """Makes the buffers just written by a step of ``new_tokens`` tokens the current ones."""
        self._current = 1 - self._current
        self.length += new_tokens

    def crop(self, length: int) -> None:
        """Keeps the first ``length`` tokens (an absolute length, not a count to drop)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if length == self.length:
            return
        if length > 0:
            stride_old = self.length * self.head_dim
            stride_new = length * self.head_dim
            for kind in (0, 1):
                for layer in range(self.layers):
                    flat = self._buffers[self._current][kind][layer]
                    # Head h moves from h*stride_old to h*stride_new; destinations never pass
                    # their sources, so moving heads in order is safe (numpy handles overlap).
                    for head in range(1, self.kv_heads):
                        flat[head * stride_new : head * stride_new + stride_new] = flat[
                            head * stride_old : head * stride_old + stride_new
                        ]
        self.length = length

    def reset(self) -> None:
        self.length = 0


class ReferenceKVCache:
    """The plain path: numpy arrays replaced by every step's outputs."""

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, dtype: np.dtype) -> None:
        empty = np.zeros((1, kv_heads, 0, head_dim), dtype=dtype)
        self._empty = empty
        self.layers = layers
        self.arrays: list[list[np.ndarray]] = [[empty] * layers, [empty] * layers]

    @property
    def length(self) -> int:
        return int(self.arrays[0][0].shape[2])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for kind in self.arrays for a in kind)

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self.arrays = [
            [np.ascontiguousarray(a[:, :, :length]) for a in kind] for kind in self.arrays
        ]

    def reset(self) -> None:
        self.arrays = [[self._empty] * self.layers, [self._empty] * self.layers]


class SharedKVCache:
    """One [1, kv_heads, capacity, head_dim] buffer per layer for K and for V, which a graph
    with ``kv_sharing`` "shared" reads as past and writes as present in place. ``length`` is
    the number of positions held; rolling back is setting it (no copy, O(1)): positions past
    ``length`` are overwritten by the next pass.

    ``device`` None keeps the buffers in host memory (numpy arrays over anonymous maps, which
    both paths can read); a device name ("cuda", or "cpu" for memory ONNX Runtime allocates)
    makes them ONNX Runtime values on that device: the bound path then never copies the cache
    to the host, only the logits it asks for.
    """

    def __init__(
        self,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: np.dtype,
        device: str | None = None,
        device_id: int = 0,
    ) -> None:
        self.layers = layers
        self.capacity = capacity
        self.device = device
        shape = (1, kv_heads, capacity, head_dim)
        self._nbytes = 2 * layers * int(np.prod(shape)) * np.dtype(dtype).itemsize
        #: buffers[kind][layer], kind 0 = key, 1 = value (host memory only).
        self.buffers: list[list[np.ndarray]] = []
        #: ONNX Runtime values over the buffers (or on the device), and the (session, IO
        #: binding) that binds them, made once by the bound path.
        self.ort_values: list[list[object]] | None = None
        if device is None:
            arrays = mapped_zeros(2 * layers, shape, dtype)
            self.buffers = [arrays[:layers], arrays[layers:]]
        else:
            import onnxruntime

            # Zeros, as host buffers are, not the allocator's uninitialised memory: a position
            # never written then reads as 0 to any kernel. (update_inplace copies; on "cpu",
            # ortvalue_from_numpy would share the one zeros array between every layer.)
            zeros = np.zeros(shape, dtype)

            def allocate() -> object:
                value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(
                    list(shape), np.dtype(dtype).type, device, device_id
                )
                value.update_inplace(zeros)
                return value

            self.ort_values = [[allocate() for _ in range(layers)] for _ in range(2)]
        self.binding: tuple[object, object] | None = None
        self.length = 0
        self._written = 0

    @property
    def nbytes(self) -> int:
        """The memory the cache holds: on a device, the whole buffers; in host memory, the
        positions ever written (the anonymous maps' pages are committed when first written
        and stay until the cache is freed)."""
        if self.device is not None:
            return self._nbytes
        return self._nbytes * min(self._written, self.capacity) // self.capacity

    def advance(self, new_tokens: int) -> None:
        self.length += new_tokens
        self._written = max(self._written, self.length)

    def crop(self, length: int) -> None:
        """Keeps the first ``length`` positions (an absolute length, not a count to drop)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0
