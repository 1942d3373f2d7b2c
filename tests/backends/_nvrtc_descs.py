"""The nvrtc backend's kernel families as descriptions (rows of protocol.h's
``KernelOp`` / ``KernelType`` / ``KernelKind``), and what the tests compare them with
torch by: shared by test_nvrtc_codegen.py, test_nvrtc_columns.py and test_nvrtc_cuda.py.
"""

import pytest
import torch

from agspeed.protocol import KernelKind as KK
from agspeed.protocol import KernelOp as K
from agspeed.protocol import KernelType as T

F32, F16, BF16, F64, I64, BOOL = T.F32, T.F16, T.BF16, T.F64, T.I64, T.BOOL
_STORAGE = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16,
            T.F64: torch.float64, T.I64: torch.int64, T.BOOL: torch.bool}


def op(kop, ktype, *operands, imm=None):
    return (kop, ktype, tuple(operands), imm)


def strides_of(t, shape):
    """``t``'s strides in a space of ``shape`` (0 where it broadcasts)."""
    t = t.expand(shape)
    return list(t.stride())


# ---- descriptions of each family, with what torch computes for them ----------------

def add_relu_scale(storage=F32):
    """x + b (b broadcast over rows, strided), relu, * 0.1."""
    desc = ("add_relu_scale", KK.POINTWISE, 2, 0, ((storage, 0), (storage, 1)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.ADD, F32, 0, 1),
             op(K.RELU, F32, 2), op(K.CONST, F32, imm=0.1), op(K.MUL, F32, 3, 4)),
            ((5, storage, 0),))
    return desc


def softmax_desc(storage=F32):
    return ("softmax_rows", KK.ROWS, 2, 1, ((storage, 0),),
            (op(K.LOAD, F32, 0), op(K.AMAX, F32, 0), op(K.SUB, F32, 0, 1),
             op(K.EXP, F32, 2), op(K.SUM, F32, 3), op(K.DIV, F32, 3, 4)),
            ((5, storage, 0), (1, F32, 3)))


def layer_norm_desc(n, storage=F32, weights=1):
    """(x - mean) * rsqrt(var + eps) * w + b over the last dimension, with the row's
    mean and rstd as outputs (what a backward keeps); w and b read through strides
    (``weights`` 1) or as rows (2)."""
    return ("layer_norm_rows", KK.ROWS, 2, 1,
            ((storage, 0), (F32, weights), (F32, weights)),
            (op(K.LOAD, F32, 0),                      # 0 x
             op(K.SUM, F32, 0),                       # 1
             op(K.CONST, F32, imm=1.0 / n),           # 2
             op(K.MUL, F32, 1, 2),                    # 3 mean
             op(K.SUB, F32, 0, 3),                    # 4 x - mean
             op(K.MUL, F32, 4, 4),                    # 5
             op(K.SUM, F32, 5),                       # 6
             op(K.MUL, F32, 6, 2),                    # 7 var
             op(K.CONST, F32, imm=1e-5),              # 8
             op(K.ADD, F32, 7, 8),                    # 9
             op(K.RSQRT, F32, 9),                     # 10 rstd
             op(K.MUL, F32, 4, 10),                   # 11
             op(K.LOAD, F32, 1), op(K.MUL, F32, 11, 12),   # 12, 13
             op(K.LOAD, F32, 2), op(K.ADD, F32, 13, 14)),  # 14, 15
            ((15, storage, 0), (3, F32, 3), (10, F32, 3)))


def softmax_backward_desc(storage=F32):
    """grad_in = y * (g - sum(g * y)): two loads that two passes read."""
    return ("softmax_backward_rows", KK.ROWS, 2, 1, ((storage, 0), (storage, 0)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.MUL, F32, 0, 1),
             op(K.SUM, F32, 2), op(K.SUB, F32, 0, 3), op(K.MUL, F32, 1, 4)),
            ((5, storage, 0),))


def rms_norm_desc(n, storage=F32, weights=1):
    """x * rsqrt(mean(x * x) + eps) * w, w broadcast over the rows: read through its
    strides (``weights`` 1) or as a row (2)."""
    return ("rms_norm_rows", KK.ROWS, 2, 1, ((storage, 0), (storage, weights)),
            (op(K.LOAD, F32, 0), op(K.MUL, F32, 0, 0), op(K.SUM, F32, 1),
             op(K.CONST, F32, imm=1.0 / n), op(K.MUL, F32, 2, 3),
             op(K.CONST, F32, imm=1e-6), op(K.ADD, F32, 4, 5), op(K.RSQRT, F32, 6),
             op(K.MUL, F32, 0, 7), op(K.LOAD, F32, 1), op(K.MUL, F32, 8, 9)),
            ((10, storage, 0),))


def column_sums_desc(storage=F32):
    """A layer norm's backward in small: g * rstd at each element, the row's sum of g,
    and the weight and bias gradients as column sums, g * (x - mean) * rstd and g summed
    over the rows (mean and rstd one per row, read through strides)."""
    return ("column_sums", KK.ROWS, 2, 1,
            ((storage, 0), (storage, 0), (F32, 1), (F32, 1)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.LOAD, F32, 2),
             op(K.LOAD, F32, 3), op(K.SUB, F32, 1, 2), op(K.MUL, F32, 4, 3),
             op(K.MUL, F32, 0, 5), op(K.MUL, F32, 0, 3), op(K.SUM, F32, 0)),
            ((7, storage, 0), (6, F32, 2), (0, F32, 2), (8, F32, 3)))


def rms_norm_backward_desc(n, storage=F32):
    """RMSNorm's backward from the forward's saved rstd r, read once a row (flag 3):
    dx = r g w - x r^3 sum(g w x) / n, with r^3 a row output (from the per-row input
    alone) and the weight gradient, g x r summed over the rows, as column sums."""
    return ("rms_norm_backward", KK.ROWS, 2, 1,
            ((storage, 0), (storage, 0), (storage, 2), (F32, 3)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.LOAD, F32, 2),
             op(K.LOAD, F32, 3), op(K.MUL, F32, 0, 2), op(K.MUL, F32, 4, 1),
             op(K.SUM, F32, 5), op(K.MUL, F32, 3, 3), op(K.MUL, F32, 7, 3),
             op(K.MUL, F32, 6, 8), op(K.CONST, F32, imm=1.0 / n), op(K.MUL, F32, 9, 10),
             op(K.MUL, F32, 1, 11), op(K.MUL, F32, 4, 3), op(K.SUB, F32, 13, 12),
             op(K.MUL, F32, 0, 1), op(K.MUL, F32, 15, 3)),
            ((14, storage, 0), (16, F32, 2), (8, F32, 3)))


def bias_grad_desc(storage=F32):
    """A pointwise backward over (B, T, C) with its bias gradient: g * w stored (w a row)
    and g summed over B and T, with no reduction of rows at all."""
    return ("bias_grad", KK.ROWS, 3, 1, ((storage, 0), (storage, 2)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.MUL, F32, 0, 1)),
            ((2, storage, 0), (0, F32, 2)))


# Row lengths on both sides of the bound between the paths (codegen_rows.c): the warp
# path (one warp a row) up to 1024 columns, in its vector form where the length is a
# multiple of 4 (100, 1024) and the pointers are aligned, the block path beyond (whose
# vectors are of 8 for fp16 and bf16 rows: 5000 and 9000 take them, 4100 is a multiple
# of 4 alone).
ROW_LENGTHS = [1, 7, 100, 1024, 1025, 4100, 5000, 9000]
# Each row kernel's functions: the first (warp and block paths) and <name>_block (the
# block path alone); each is right at every length, whichever the launcher picks.
ROW_FUNCTIONS = pytest.mark.parametrize("function", ["", "_block"], ids=["first", "block"])
# A norm's weight read through its strides (0 along the rows), or as a row (its index
# within the row, as vectors on the vector forms): both give the same values.
WEIGHTS = pytest.mark.parametrize("weights", [1, 2], ids=["strided-weights", "row-weights"])


def _weight_strides(weights, w, shape):
    return list(strides_of(w, shape)) if weights == 1 else []


def _rows_close(got, want):
    """assert_close for a row kernel on the host, whose one thread sums a row of up to
    9000 fp32 values in order: fp32 results within 1e-4 (relative) of torch's, whose
    sums go in another order; fp16 and bf16 ones within their usual tolerance."""
    tol = {"rtol": 1e-4, "atol": 1e-5} if got.dtype == torch.float32 else {}
    torch.testing.assert_close(got, want, **tol)


def _sums_close(got, want, n):
    """Sums of ``n`` values of about 1 in another order than torch's: within 1e-4 of
    torch's, relative to the sum or to the sqrt(n) its terms cancel down from."""
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(1.0, n ** 0.5))


def _rows_input(shape, dtype, offset=0, scale=1.0, shift=0.0):
    """A contiguous tensor of ``shape`` whose data starts ``offset`` elements into its
    allocation: misaligned for the vector loads when offset is odd."""
    n = shape[0] * shape[1]
    return (torch.randn(n + offset) * scale + shift).to(dtype)[offset:].view(shape)
