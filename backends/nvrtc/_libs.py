"""Finding and opening libnvrtc and libcuda, once per process.

libnvrtc is looked for where a CUDA build of torch or the ``nvidia-cuda-nvrtc`` wheel
puts it (``site-packages/nvidia/cu13/lib``, ``nvidia/cuda_nvrtc/lib`` for CUDA 12), then
by name through the loader's own search (``LD_LIBRARY_PATH``, the system's libraries).
libcuda is the driver's and only ever found by name.  Each answer is kept: what could
not be opened says why, and that text is the backend's reason for being unavailable.
"""

from __future__ import annotations

import functools
import glob
import os
import sys

from agspeed import _C

__all__ = ["nvrtc", "cuda", "nvrtc_candidates"]

_NVRTC_NAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
_WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")


def nvrtc_candidates() -> list[str]:
    """Paths and names tried for libnvrtc, in order: the CUDA wheels on ``sys.path``
    first (newest major first), then plain names for the dynamic loader."""
    found = []
    for entry in sys.path:
        for sub in _WHEEL_DIRS:
            found += sorted(glob.glob(os.path.join(entry, sub, "libnvrtc.so.*[0-9]")),
                            reverse=True)
    return list(dict.fromkeys(found)) + list(_NVRTC_NAMES)


@functools.lru_cache(maxsize=None)
def nvrtc() -> tuple[tuple[int, int] | None, str | None]:
    """((major, minor), None) once libnvrtc is open, or (None, why it is not)."""
    errors = []
    for path in nvrtc_candidates():
        try:
            _builtins_beside(path)
            return tuple(_C.nvrtc_open(path)), None
        except OSError as exc:
            errors.append(str(exc))
    return None, ("libnvrtc not found (install the nvidia-cuda-nvrtc wheel or the CUDA "
                  "toolkit); tried: " + "; ".join(errors[:3]))


def _builtins_beside(path: str) -> None:
    """Loads the libnvrtc-builtins next to a libnvrtc found by path: libnvrtc opens it by
    name at its first compile, and a wheel's directory is not on the loader's path."""
    import ctypes

    if os.sep not in path:
        return
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path),
                                                  "libnvrtc-builtins.so.*"))):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)


@functools.lru_cache(maxsize=None)
def cuda() -> tuple[int | None, str | None]:
    """(the driver's CUDA version, None) once libcuda is open and initialized, or (None,
    why it is not)."""
    try:
        return _C.cuda_open("libcuda.so.1"), None
    except (OSError, RuntimeError) as exc:
        return None, f"no CUDA driver ({exc})"
