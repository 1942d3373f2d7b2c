"""Fused kernels as callables of a graph: compiled once (cached on disk), called per step.

``Fused`` is what the rewritten graph calls for a group: it takes the group's inputs,
allocates its outputs, works out the sizes and strides the kernel takes, and launches it
through a *launcher*, ``launcher(stream, *params)`` (``cuda_launcher`` loads the kernel
on the GPU; the tests' host launcher runs the same source on the CPU).  Column sums come
back from the kernel as one row of partial sums per row slot (kernel.h), which ``Fused``
adds up with aten: the slots are few next to the rows (``row_slots``).

``cuda_launcher(desc, device)`` compiles a description's source with NVRTC for the
device's architecture (a cubin where this libnvrtc knows the architecture, else PTX for
the newest it knows, which the driver compiles on) and keeps the image in the knowledge
base's ``nvrtc`` directory, keyed by the source, the architecture and NVRTC's version:
a second process compiles nothing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
import time
from typing import Any, Callable

from agspeed import _C
from agspeed.backends.nvrtc.partition import Plan
from agspeed.protocol import KernelType as T

__all__ = ["Fused", "cuda_launcher", "image_for", "compile_options", "compiled", "row_slots",
           "has_columns"]

# The seconds of NVRTC's compiles in this process (images found on disk not counted),
# summed over the threads that compile a graph's kernels together; and the wall-clock
# seconds each graph's kernels took to make, compiles and loads included, graph by graph
compiled = {"seconds": 0.0, "graph_seconds": []}
_compiled_lock = threading.Lock()   # compiles of one graph run on several threads


class Fused:
    """One group's kernel: ``fused(*inputs) -> tuple of outputs``."""

    def __init__(self, desc: tuple, plan: Plan, launch: Callable[..., Any]) -> None:
        import torch

        self.__name__ = desc[0]
        self.launch = launch
        group = plan.group
        self.ndim, self.nred = len(group.space), group.nred
        self.space = tuple(group.space) if all(isinstance(d, int) for d in group.space) \
            else None
        # flag 1: read through strides, passed at each call, and 4 through those of
        # the rows' dimensions (once a row); 0, 2 (a row, the same for every row) and 3
        # (one value a row) at their own index, contiguous
        outer = self.ndim - self.nred
        self.strided_in = [self.ndim if s == 1 else outer if s == 4 else None
                           for _, s in desc[4]]
        # the inputs that broadcast into the space (not those read once a row, whose
        # shape may be the rows' alone)
        self.in_space = [s != 3 for _, s in desc[4]]
        self.columns = has_columns(desc)
        self.outs = []
        for (node, place), (_, ktype, flag) in zip(plan.outputs, desc[6]):
            val = node.meta["val"]
            shape = tuple(val.shape) if self.space is not None else None
            strided = flag == 1
            stride = tuple(val.stride()) if strided and self.space is not None else None
            partial = (torch.float64 if ktype == int(T.F64) else torch.float32) \
                if flag == 2 else None
            self.outs.append((place, val.dtype, shape, stride, strided, partial))
        self._torch = torch

    def _space(self, inputs: tuple) -> tuple:
        if self.space is not None:
            return self.space
        return tuple(self._torch.broadcast_shapes(
            *(t.shape for t, b in zip(inputs, self.in_space) if b)))

    def _out_shape(self, place: str, space: tuple) -> tuple:
        outer = len(space) - self.nred
        if place == "element":
            return space
        if place == "row_kept":
            return space[:outer] + (1,) * self.nred
        if place == "columns":
            return space[outer:]
        if place == "columns_kept":
            return (1,) * outer + space[outer:]
        return space[:outer]

    def __call__(self, *inputs: Any) -> tuple:
        torch = self._torch
        space = self._space(inputs)
        device = inputs[0].device
        ints = list(space)
        args = []
        for t, strided in zip(inputs, self.strided_in):
            if strided is not None:
                ints += _broadcast_strides(t, space)[:strided]
            elif not t.is_contiguous():
                t = t.contiguous()
            args.append(t)
        outs = []
        slots = 0
        if self.columns:
            rows, cols = _split(space, self.nred)
            slots = row_slots(rows, cols, device)
        for place, dtype, shape, stride, strided, partial in self.outs:
            if partial is not None:
                out = torch.empty((slots, cols), dtype=partial, device=device)
            elif stride is not None:
                out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            else:
                out = torch.empty(shape if shape is not None else
                                  self._out_shape(place, space), dtype=dtype, device=device)
            if strided:
                ints += list(out.stride())
            outs.append(out)
        if self.columns:
            ints.append(slots)
        stream = _raw_stream(device.index if device.index is not None
                             else torch.cuda.current_device()) \
            if device.type == "cuda" else 0
        if not self.columns or slots:
            self.launch(stream, *args, *outs, *ints)
        for j, (place, dtype, shape, _, _, partial) in enumerate(self.outs):
            if partial is not None:
                total = outs[j].sum(0).reshape(shape if shape is not None else
                                               self._out_shape(place, space))
                outs[j] = total if total.dtype == dtype else total.to(dtype)
        return tuple(outs)


def has_columns(desc: tuple) -> bool:
    """Whether the kernel of ``desc`` has column sums (and so takes a row slot count)."""
    return any(flag == 2 for _, _, flag in desc[6])


def _split(space: tuple, nred: int) -> tuple[int, int]:
    rows = cols = 1
    for d, n in enumerate(space):
        if d < len(space) - nred:
            rows *= int(n)
        else:
            cols *= int(n)
    return rows, cols


def row_slots(rows: int, cols: int, device: Any) -> int:
    """How many row slots a kernel with column sums deals ``rows`` rows of ``cols`` to.
    On a GPU: 16 warps a multiprocessor for short rows (each slot a warp's, its sums in
    registers); for long ones (each slot a block's, its sums in its threads' registers)
    up to 4 blocks a multiprocessor, fewer for rows past 4096 (2 for rows of 8192, which
    hold twice the registers).  Every multiprocessor is busy while each
    slot takes many rows.  On the CPU (the host harness runs the slots one after the
    other) a few, so that sums across slots are checked too."""
    if rows <= 0:
        return 0
    if device.type != "cuda":
        return min(rows, 3)
    sms = _multiprocessors(device.index if device.index is not None else 0)
    per_sm = 16 if cols <= _C.NVRTC_WARP_COLS else max(1, min(4, 16384 // max(cols, 1)))
    return min(rows, sms * per_sm)


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return int(_C.cuda_device(index)[2])


def _raw_stream(index: int) -> int:
    """The handle of torch's current stream on CUDA device ``index``, without making a
    Stream object per launch (what inductor's generated code reads too)."""
    return _stream_reader()(index)


@functools.lru_cache(maxsize=None)
def _stream_reader() -> Callable[[int], int]:
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get if get is not None else lambda i: torch.cuda.current_stream(i).cuda_stream


def _broadcast_strides(t: Any, space: tuple) -> list:
    """``t``'s strides in ``space``, aligned at the right, 0 along broadcast dimensions."""
    shape, stride = t.shape, t.stride()
    lead = len(space) - len(shape)
    out = [0] * lead
    for d in range(len(shape)):
        out.append(0 if shape[d] == 1 and space[lead + d] != 1 else stride[d])
    return out


# ---- compiling for a GPU -----------------------------------------------------------------

def _arch(device_index: int) -> tuple[str, bool]:
    """The NVRTC architecture option for a device, and whether it makes a cubin."""
    from agspeed.backends.nvrtc import _libs

    major, minor, _ = _C.cuda_device(device_index)
    want = major * 10 + minor
    known = [a for a in _C.nvrtc_archs() if a <= want] if _libs.nvrtc()[0] else []
    if want in known:
        return f"--gpu-architecture=sm_{want}", True
    if not known:
        raise RuntimeError(f"libnvrtc compiles for no architecture at or below sm_{want}")
    return f"--gpu-architecture=compute_{max(known)}", False


def compile_options(arch: str) -> tuple:
    """NVRTC's options for a kernel: the architecture, and from NVRTC 12.4 on
    ``-minimal``, which leaves the CUDA runtime API's declarations (that the kernels do
    not use) out of the front end: about 10 ms less a compile, a tenth of a pointwise
    kernel's."""
    from agspeed.backends.nvrtc import _libs

    version = _libs.nvrtc()[0]
    return (arch, "-minimal") if version is not None and tuple(version) >= (12, 4) \
        else (arch,)


def image_for(source: str, name: str, arch: str, cubin: bool) -> bytes:
    """The compiled image of ``source``, from the knowledge base's ``nvrtc`` directory
    when an earlier compile left it there."""
    from agspeed.backends import knowledge
    from agspeed.backends.nvrtc import _libs

    version = _libs.nvrtc()[0]
    options = compile_options(arch)
    key = hashlib.sha256(f"{version}\0{options}\0{cubin}\0{source}".encode()).hexdigest()
    directory = knowledge.artifact_dir("nvrtc")
    path = os.path.join(directory, key[:32] + (".cubin" if cubin else ".ptx"))
    with _compiling(key):   # one compile of a source at a time in this process
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            pass
        start = time.perf_counter()
        image = _C.nvrtc_compile(source, name + ".cu", options, cubin)
        with _compiled_lock:
            compiled["seconds"] += time.perf_counter() - start
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(image)
        os.replace(tmp, path)
        return image


_keys: dict = {}     # a source's cache key: [its lock, the threads that want it]


@contextlib.contextmanager
def _compiling(key: str) -> Any:
    """Held while a thread finds or compiles the image of ``key``: a graph's groups
    that share a source wait for the first one's compile and then read its image."""
    with _compiled_lock:
        entry = _keys.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _compiled_lock:
            entry[1] -= 1
            if not entry[1]:
                del _keys[key]


def cuda_launcher(desc: tuple, device_index: int) -> Callable[..., Any]:
    """A launcher of ``desc``'s kernel on CUDA device ``device_index``."""
    arch, cubin = _arch(device_index)
    image = image_for(_C.nvrtc_source(desc), desc[0], arch, cubin)
    return _C.CudaKernel(image, desc[0], int(desc[1]), desc[2], desc[3], device_index,
                         slots=has_columns(desc))
