"""aten ops as fused-kernel instructions: what can be fused, and how each op computes.

The graphs this sees come from AOTAutograd after inductor's decomposition table, so
composite ops (layer norm, softmax, GELU and their backwards) arrive as the primitive
pointwise ops and reductions below.  ``lowering`` gives, for each fusible aten overload, a
function that, given a ``Kernel`` under construction, the node and its operands
(``Value``s or Python scalars), emits the op's instructions and returns its ``Value``;
``reduction_of`` says whether a node is a reduction a ROWS kernel can do (over the
trailing dimensions of its input) and over how many; ``column_sum_of`` whether it is a
sum over the leading dimensions, which a ROWS kernel can add up as column sums.

Types follow torch: each node's result dtype is read from its fake value
(``meta["val"]``), operands are converted to the type the op computes in (float for
fp16/bf16/fp32, double for fp64), and a conversion to fp16 or bf16 rounds as eager's
tensor of that type would.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

from agspeed.protocol import KernelOp as K
from agspeed.protocol import KernelType as T

__all__ = ["Kernel", "Value", "lowering", "fusible", "reduction_of", "column_sum_of",
           "ktype_of", "rounded", "storage_of"]


class Value(NamedTuple):
    """An instruction's result in a kernel under construction: its index and the
    type it computes in."""

    index: int
    ktype: int


def storage_of(dtype: Any) -> int | None:
    """The kernel storage type of a torch dtype, or None when kernels cannot hold it."""
    import torch

    return {torch.float32: T.F32, torch.float16: T.F16, torch.bfloat16: T.BF16,
            torch.float64: T.F64, torch.int64: T.I64, torch.int32: T.I32,
            torch.int8: T.I8, torch.uint8: T.U8, torch.bool: T.BOOL}.get(dtype)


def ktype_of(dtype: Any) -> int:
    """The type values of ``dtype`` compute in."""
    st = storage_of(dtype)
    return T.F32 if st in (T.F16, T.BF16) else st


def _is_float(kt: int) -> bool:
    return kt in (T.F32, T.F64, T.F16, T.BF16)


class Kernel:
    """A kernel's instructions under construction (SSA: instruction i is value i)."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.inputs: list[tuple] = []      # (source, ktype storage, strided)
        self._loaded: dict = {}
        self._consts: dict = {}

    def emit(self, kop: int, kt: int, *operands: Value, imm: float | None = None) -> Value:
        self.ops.append((int(kop), int(kt), tuple(v.index for v in operands), imm))
        return Value(len(self.ops) - 1, kt)

    def load(self, source: Any, storage: int, strided: int) -> Value:
        """Input ``source`` (read once per element however often it is used), read as
        ``strided`` says (kernel.h: 0 contiguous, 1 through strides, 2 as a row, 3 once
        per row; one source read two ways is two inputs)."""
        key = (id(source), strided)
        if key not in self._loaded:
            self.inputs.append((source, storage, strided))
            kt = T.F32 if storage in (T.F16, T.BF16) else storage
            self.ops.append((int(K.LOAD), int(kt), (len(self.inputs) - 1,), None))
            self._loaded[key] = Value(len(self.ops) - 1, kt)
        return self._loaded[key]

    def const(self, x: float | int | bool, kt: int) -> Value:
        key = (repr(x), int(kt))
        if key not in self._consts:
            self._consts[key] = self.emit(K.CONST, kt, imm=float(x))
        return self._consts[key]

    def cast(self, v: Any, kt: int) -> Value:
        """``v`` (a Value or a scalar) as type ``kt``."""
        if not isinstance(v, Value):
            return self.const(v, kt)
        if v.ktype == kt:
            return v
        return self.emit(K.CAST, kt, v)


def _out_kt(node: Any) -> int:
    return ktype_of(node.meta["val"].dtype)


def _operand_kt(values: tuple) -> int:
    """The type a comparison's operands compute in: floating if either is."""
    kts = [v.ktype for v in values if isinstance(v, Value)]
    if any(kt == T.F64 for kt in kts):
        return T.F64
    if any(_is_float(kt) for kt in kts) or any(isinstance(v, float) for v in values):
        return T.F32
    if all(kt == T.BOOL for kt in kts) and all(isinstance(v, (Value, bool)) for v in values):
        return T.BOOL
    return T.I64


def _unary(kop: int) -> Callable:
    def lower(k: Kernel, node: Any, a: Value, *rest: Any) -> Value:
        kt = _out_kt(node)
        return k.emit(kop, kt, k.cast(a, kt))
    return lower


def _binary(kop: int) -> Callable:
    def lower(k: Kernel, node: Any, a: Any, b: Any, alpha: Any = 1) -> Value:
        kt = _out_kt(node)
        alpha = node.kwargs.get("alpha", alpha)
        b = k.cast(b, kt)
        if alpha != 1:
            b = k.emit(K.MUL, kt, b, k.const(alpha, kt))
        return k.emit(kop, kt, k.cast(a, kt), b)
    return lower


def _compare(kop: int) -> Callable:
    def lower(k: Kernel, node: Any, a: Any, b: Any) -> Value:
        kt = _operand_kt((a, b))
        return k.emit(kop, T.BOOL, k.cast(a, kt), k.cast(b, kt))
    return lower


def _div(k: Kernel, node: Any, a: Any, b: Any, **kw: Any) -> Value:
    kt = _out_kt(node)
    return k.emit(K.DIV, kt, k.cast(a, kt), k.cast(b, kt))


def _where(k: Kernel, node: Any, c: Any, a: Any, b: Any) -> Value:
    kt = _out_kt(node)
    return k.emit(K.WHERE, kt, k.cast(c, T.BOOL), k.cast(a, kt), k.cast(b, kt))


def _same(k: Kernel, node: Any, a: Any, *rest: Any, **kw: Any) -> Value:
    return k.cast(a, _out_kt(node))


def rounded(k: Kernel, v: Any, storage: int) -> Value:
    """``v`` rounded to fp16 or bf16 ``storage`` as a tensor of it holds it, computed on
    in fp32."""
    return k.emit(K.CAST, storage, k.cast(v, T.F32))


def _convert(k: Kernel, node: Any, a: Any, *rest: Any, **kw: Any) -> Value:
    dtype = node.meta["val"].dtype
    storage = storage_of(dtype)
    if storage in (T.F16, T.BF16):
        return rounded(k, a, storage)
    return k.cast(a, ktype_of(dtype))


def _fma(k: Kernel, node: Any, a: Any, b: Any, c: Any) -> Value:
    kt = _out_kt(node)
    return k.emit(K.ADD, kt, k.emit(K.MUL, kt, k.cast(a, kt), k.cast(b, kt)), k.cast(c, kt))


def _pow(k: Kernel, node: Any, a: Any, b: Any) -> Value:
    kt = _out_kt(node)
    if b == 2:
        a = k.cast(a, kt)
        return k.emit(K.MUL, kt, a, a)
    if b == 0.5:
        return k.emit(K.SQRT, kt, k.cast(a, kt))
    return k.emit(K.POW, kt, k.cast(a, kt), k.cast(b, kt))


def _clamp(lo_kop: int | None, hi_kop: int | None) -> Callable:
    def lower(k: Kernel, node: Any, a: Any, lo: Any = None, hi: Any = None) -> Value:
        kt = _out_kt(node)
        v = k.cast(a, kt)
        if lo_kop is None:   # clamp_max(a, hi)
            lo, hi = None, lo
        if lo is not None:
            v = k.emit(K.MAX, kt, v, k.cast(lo, kt))
        if hi is not None and hi_kop is not None:
            v = k.emit(K.MIN, kt, v, k.cast(hi, kt))
        return v
    return lower


def _table() -> dict:
    import torch

    aten, prims = torch.ops.aten, torch.ops.prims
    table = {
        aten.add.Tensor: _binary(K.ADD), aten.add.Scalar: _binary(K.ADD),
        aten.sub.Tensor: _binary(K.SUB), aten.sub.Scalar: _binary(K.SUB),
        aten.mul.Tensor: _binary(K.MUL), aten.mul.Scalar: _binary(K.MUL),
        aten.div.Tensor: _div, aten.div.Scalar: _div,
        aten.maximum.default: _binary(K.MAX), aten.minimum.default: _binary(K.MIN),
        aten.pow.Tensor_Scalar: _pow,
        aten.where.self: _where,
        aten.clamp_min.default: _clamp(K.MAX, None),
        aten.clamp_max.default: _clamp(None, K.MIN),
        aten.clamp.default: _clamp(K.MAX, K.MIN),
        aten.clone.default: _same,
        aten.alias.default: _same,
        aten.expand.default: _same,     # the kernel's operands broadcast into its space
        prims.convert_element_type.default: _convert,
        prims.fma.default: _fma,
    }
    unary = {aten.neg: K.NEG, aten.abs: K.ABS, aten.exp: K.EXP, aten.log: K.LOG,
             aten.log1p: K.LOG1P, aten.expm1: K.EXPM1, aten.sqrt: K.SQRT,
             aten.rsqrt: K.RSQRT, aten.reciprocal: K.RECIPROCAL, aten.tanh: K.TANH,
             aten.sigmoid: K.SIGMOID, aten.erf: K.ERF, aten.sin: K.SIN, aten.cos: K.COS,
             aten.floor: K.FLOOR, aten.ceil: K.CEIL, aten.trunc: K.TRUNC,
             aten.sign: K.SIGN, aten.relu: K.RELU}
    for op, kop in unary.items():
        table[op.default] = _unary(kop)
    for name, kop in (("eq", K.EQ), ("ne", K.NE), ("lt", K.LT), ("le", K.LE),
                      ("gt", K.GT), ("ge", K.GE)):
        packet = getattr(aten, name)
        table[packet.Tensor] = table[packet.Scalar] = _compare(kop)
    table[aten.isnan.default] = lambda k, node, a: k.emit(K.ISNAN, T.BOOL, a)
    table[aten.logical_not.default] = \
        lambda k, node, a: k.emit(K.NOT, T.BOOL, k.cast(a, T.BOOL))
    table[aten.logical_and.default] = lambda k, node, a, b: k.emit(
        K.AND, T.BOOL, k.cast(a, T.BOOL), k.cast(b, T.BOOL))
    table[aten.logical_or.default] = lambda k, node, a, b: k.emit(
        K.OR, T.BOOL, k.cast(a, T.BOOL), k.cast(b, T.BOOL))
    # on bool tensors (masks: all fusible lets through) the bitwise ops are the logical
    table[aten.bitwise_and.Tensor] = table[aten.logical_and.default]
    table[aten.bitwise_or.Tensor] = table[aten.logical_or.default]
    return table


# ops a kernel computes only on bool tensors
_BOOL_ONLY = ("aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor")


@functools.lru_cache(maxsize=None)
def _lowerings() -> dict:
    return _table()


def lowering(target: Any) -> Callable | None:
    """How a kernel computes ``target`` (an aten overload), or None."""
    return _lowerings().get(target)


def _kwargs_ok(node: Any) -> bool:
    """Keyword arguments a lowering honours: none but alpha, and a clone's or copy's
    own (memory format, a dtype that stays on the device)."""
    import torch

    aten = torch.ops.aten
    if node.target is aten.div.Tensor or node.target is aten.div.Scalar:
        return node.kwargs.get("rounding_mode") is None
    allowed = {"alpha", "memory_format"}
    return set(node.kwargs) <= allowed


def fusible(node: Any) -> bool:
    """Whether ``node`` is a pointwise op a kernel computes."""
    if node.op != "call_function":
        return False
    if lowering(node.target) is None:
        return False
    val = node.meta.get("val")
    if val is None or not hasattr(val, "dtype"):
        return False
    if str(node.target) in _BOOL_ONLY and any(
            storage_of(v.dtype) != T.BOOL
            for v in (val, *(getattr(a, "meta", {}).get("val") for a in node.args))
            if hasattr(v, "dtype")):
        return False   # bitwise on integers: not a kernel op
    return storage_of(val.dtype) is not None and _kwargs_ok(node)


def reduction_of(node: Any) -> tuple[int, int, tuple] | None:
    """(kop, how many trailing dimensions, the node's input) of a reduction a ROWS kernel
    does; None for anything else.  A mean's kop is -2 and ``var_mean``'s -1 (each is a
    sum and a scaling, var_mean two of them)."""
    import torch

    aten = torch.ops.aten
    if node.op != "call_function":
        return None
    target = node.target
    x = node.args[0] if node.args else None
    val = getattr(x, "meta", {}).get("val")
    if val is None or storage_of(val.dtype) is None or not val.dtype.is_floating_point:
        return None
    ndim = val.dim()
    if target is aten.mean.default or (target is aten.sum.default and not node.kwargs):
        dims = list(range(ndim))
    elif target in (aten.sum.dim_IntList, aten.amax.default, aten.amin.default,
                    aten.mean.dim, aten.var_mean.correction):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dims is None:
            dims = list(range(ndim))
        dims = [d % max(ndim, 1) for d in ([dims] if isinstance(dims, int) else dims)]
    else:
        return None
    if ndim == 0 or sorted(dims) != list(range(ndim - len(dims), ndim)):
        return None
    if target in (aten.mean.default, aten.mean.dim, aten.var_mean.correction) \
            and not all(isinstance(val.shape[d], int) for d in dims):
        return None  # the count a mean divides by is a constant of the kernel
    if node.kwargs.get("dtype") is not None:
        return None
    kop = {aten.amax.default: K.AMAX, aten.amin.default: K.AMIN,
           aten.var_mean.correction: -1}.get(target, K.SUM)
    if target in (aten.mean.default, aten.mean.dim):
        kop = -2
    return kop, len(dims), x


def column_sum_of(node: Any) -> tuple[int, Any] | None:
    """(how many leading dimensions, the node's input) of a floating sum over the leading
    dimensions of a value of two dimensions or more, the trailing ones left (a weight or
    bias gradient: ``sum(g * x_hat, [0, 1])`` of a (B, T, C) value); None for anything
    else."""
    import torch

    if node.op != "call_function" or node.target is not torch.ops.aten.sum.dim_IntList:
        return None
    x = node.args[0] if node.args else None
    val = getattr(x, "meta", {}).get("val")
    out = node.meta.get("val")
    if val is None or out is None or storage_of(val.dtype) is None \
            or not val.dtype.is_floating_point or node.kwargs.get("dtype") is not None:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    ndim = val.dim()
    if dims is None or ndim < 2:
        return None
    dims = sorted({d % ndim for d in ([dims] if isinstance(dims, int) else dims)})
    if not dims or dims != list(range(len(dims))) or len(dims) >= ndim:
        return None
    return len(dims), x
