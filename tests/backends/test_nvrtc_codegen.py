"""The fused kernels' code generation (backends/nvrtc/codegen.c), without a GPU.

Each kernel family is written as a description, its CUDA C is run on the CPU through the
host shim (_nvrtc_host.py) and compared with torch on random inputs, and NVRTC compiles
the same source to PTX and to a cubin for the GPUs it knows.  The row kernels' column
sums are in test_nvrtc_columns.py.
"""

import re

import pytest

from agspeed import _C
from agspeed.protocol import KernelKind as KK
from agspeed.protocol import KernelOp as K

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

import _nvrtc_host as host  # noqa: E402
from _nvrtc_descs import (BF16, BOOL, F16, F32, F64, I64, ROW_FUNCTIONS,  # noqa: E402
                          ROW_LENGTHS, WEIGHTS, _STORAGE, _rows_close, _rows_input,
                          _sums_close,
                          _weight_strides, add_relu_scale, bias_grad_desc,
                          column_sums_desc, layer_norm_desc, op, rms_norm_backward_desc,
                          rms_norm_desc, softmax_backward_desc, softmax_desc, strides_of)

@pytest.mark.parametrize("storage", [F32, F16, BF16])
def test_pointwise_with_a_broadcast_input_matches_torch(storage):
    dtype = _STORAGE[storage]
    x = torch.randn(5, 7).to(dtype)
    b = torch.randn(7).to(dtype)
    out = torch.empty(5, 7, dtype=dtype)
    host.run(add_relu_scale(storage), [x, b, out], [5, 7, *strides_of(b, (5, 7))])
    want = ((x.float() + b.float()).relu() * 0.1).to(dtype)
    torch.testing.assert_close(out, want, rtol=0, atol=0) if storage == F32 else \
        torch.testing.assert_close(out, want)


def test_a_strided_input_and_output_are_read_and_written_by_their_strides():
    desc = ("transpose_tanh", KK.POINTWISE, 2, 0, ((F32, 1),),
            (op(K.LOAD, F32, 0), op(K.TANH, F32, 0)), ((1, F32, 1),))
    x = torch.randn(6, 4).t()                    # (4, 6), strides (1, 4)
    out = torch.empty(6, 4).t()                  # written through strides too
    host.run(desc, [x, out], [4, 6, *x.stride(), *out.stride()])
    torch.testing.assert_close(out, x.tanh())


@pytest.mark.parametrize("storage", [F32, F16, BF16])
def test_softmax_rows_with_the_row_max_as_an_output(storage):
    dtype = _STORAGE[storage]
    x = (torch.randn(9, 37) * 4).to(dtype)
    out = torch.empty(9, 37, dtype=dtype)
    row_max = torch.empty(9, 1)
    host.run(softmax_desc(storage), [x, out, row_max], [9, 37])
    torch.testing.assert_close(out, torch.softmax(x.float(), -1).to(dtype))
    torch.testing.assert_close(row_max, x.float().amax(-1, keepdim=True))


def spread_desc(storage=F32):
    """A row's max and mean, each stored at every element of its row (place 0) and
    the mean once a row (place 3), beside x - max, an element value."""
    return ("spread_rows", KK.ROWS, 2, 1, ((storage, 0),),
            (op(K.LOAD, F32, 0), op(K.AMAX, F32, 0), op(K.SUM, F32, 0),
             op(K.CONST, F32, imm=0.5), op(K.MUL, F32, 2, 3), op(K.SUB, F32, 0, 1)),
            ((1, storage, 0), (4, F32, 0), (5, storage, 0), (4, F32, 3)))


@ROW_FUNCTIONS
@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("cols", [64, 37, 1500], ids=["vectors", "one-by-one", "long-rows"])
def test_row_values_stored_at_every_element_of_their_row(storage, cols, function):
    """An element output whose value is a row value holds it at every element of the
    row (a row statistic spread for a user outside the kernel), in vectors where the
    row allows, on both paths; the same value's row output is one per row."""
    dtype = _STORAGE[storage]
    x = (torch.randn(5, cols) * 3).to(dtype)
    row_max, half_sum = torch.empty(5, cols, dtype=dtype), torch.empty(5, cols)
    centred, per_row = torch.empty(5, cols, dtype=dtype), torch.empty(5, 1)
    host.run(spread_desc(storage), [x, row_max, half_sum, centred, per_row], [5, cols],
             function)
    xf = x.float()
    half = xf.sum(-1, keepdim=True) * 0.5
    torch.testing.assert_close(row_max, xf.amax(-1, keepdim=True).expand(5, cols).to(dtype))
    torch.testing.assert_close(half_sum, half.expand(5, cols), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(centred, (xf - xf.amax(-1, keepdim=True)).to(dtype))
    torch.testing.assert_close(per_row, half, rtol=1e-4, atol=1e-4)
    assert torch.equal(half_sum, per_row.expand(5, cols))   # the same value, both places


def _functions(source):
    """A kernel source's functions by name, each one's text up to the next."""
    head = r'(?:extern "C" __global__|static __device__ __noinline__) void '
    return {re.match(head + r"(\w+)\(", part).group(1): part
            for part in re.split(r"\n(?=" + head + ")", source)[1:]}


@pytest.mark.parametrize("told,cols", [(197, 197), (64, 64), (4096, 4096), (64, 1500),
                                       (197, 260), (4096, 37), (256, 258)],
                         ids=["odd", "short", "long", "longer-than-told",
                              "past-the-rounding", "shorter-than-told",
                              "not-a-multiple-of-4"])
def test_a_row_length_in_the_description_sizes_the_paths(told, cols):
    """A description may give its row's length (static sizes): the kernel is one
    function, whose warp path is made for that length rounded up to 128, a lane's
    arrays no longer, and left out past 1024; the launcher runs it for every length.
    Only the forms rows of that length can reach are made: the warp path's vector form
    alone where the length is a multiple of 4 (a misaligned row takes the block path's
    scalar form), its scalar form alone where it is not; past 1024, the block path's
    two. Rows of another length still run right: a row the warp path cannot hold takes
    the block path."""
    desc = softmax_desc(BF16) + (told,)
    source = _C.nvrtc_source(desc)
    assert list(_functions(source)) == ["softmax_rows"]
    if told > 1024:
        assert "/* the warp path" not in source and "ca0[" not in source
        assert source.count("/* its vector form */") == 1      # 4096: vectors of 8
    else:
        bound = (told + 127) // 128 * 128
        alone = ", its vector form alone" if told % 4 == 0 else ""
        assert f"#define AGS_WARP_ITEMS ({bound} / AGS_WARP_LANES)" in source
        assert re.search(rf"if \(cols <= {bound}\b.*\) {{ /\* the warp path{alone} \*/",
                         source)
        assert "/* its vector form */" not in source
        assert ("float4" in source or "ushort4" in source) == bool(alone)
    assert source.count("/* the block path */") == 1
    x = (torch.randn(6, cols) * 4).bfloat16()
    out, row_max = torch.empty(6, cols, dtype=torch.bfloat16), torch.empty(6, 1)
    host.run(desc, [x, out, row_max], [6, cols])
    torch.testing.assert_close(out, torch.softmax(x.float(), -1).bfloat16())
    torch.testing.assert_close(row_max, x.float().amax(-1, keepdim=True))
    # without the length: the warp path up to 1024, both forms, and two kernels
    plain = _C.nvrtc_source(softmax_desc(BF16))
    assert plain == _C.nvrtc_source(softmax_desc(BF16) + (0,))
    assert "if (cols <= 1024) { /* the warp path */" in plain
    assert list(_functions(plain)) == ["softmax_rows_block_path", "softmax_rows",
                                       "softmax_rows_block"]


def affine_pool_desc(storage=F32, told=0):
    """A batch norm's affine, a residual, relu and the mean over H and W of an
    (N, C, H, W) input: the per-channel weight and bias, (1, C, 1, 1) and (N, C, 1, 1),
    read once a row through the strides of N and C (flag 4), the relu stored at each
    element and the mean once a row."""
    desc = ("affine_pool", KK.ROWS, 4, 2,
            ((storage, 0), (F32, 4), (F32, 4), (storage, 1)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.MUL, F32, 0, 1),
             op(K.LOAD, F32, 2), op(K.ADD, F32, 2, 3), op(K.LOAD, F32, 3),
             op(K.ADD, F32, 4, 5), op(K.RELU, F32, 6), op(K.SUM, F32, 7),
             op(K.CONST, F32, imm=0.25), op(K.MUL, F32, 8, 9)),
            ((7, storage, 0), (10, F32, 3)))
    return desc + (told,) if told else desc


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("hw", [(4, 8), (37, 1), (30, 50)],
                         ids=["vectors", "one-by-one", "long-rows"])
@pytest.mark.parametrize("told,function", [(False, ""), (False, "_block"), (True, "")],
                         ids=["first", "block", "row-length-told"])
def test_an_input_the_same_along_the_reduced_dimensions_is_read_once_a_row(
        storage, hw, told, function):
    """Flag 4: an input that does not vary along the reduced dimensions is loaded once
    a row from the rows' indices and its strides over them (none are passed for the
    reduced ones), whatever its layout: a channel weight broadcast over the batch, a
    per-(N, C) bias that is a transposed view; the residual beside them is strided."""
    n, c = 3, 5
    dtype = _STORAGE[storage]
    desc = affine_pool_desc(storage, hw[0] * hw[1] if told else 0)
    source = _C.nvrtc_source(desc)
    assert "in1[(i0 * si1_0 + i1 * si1_1)]" in source
    assert "in2[(i0 * si2_0 + i1 * si2_1)]" in source and "si1_2" not in source
    # the columns' indices are 32-bit divisions on the warp path
    assert "unsigned int q_ = (unsigned int)c;" in source
    x = torch.randn(n, c, *hw).to(dtype)
    w = torch.randn(c, 3)[:, 1].view(1, c, 1, 1)           # stride 3 along C
    b = torch.randn(c, n).t()[:, :, None, None]            # a transposed view
    res = torch.randn(n, c, hw[1], hw[0]).to(dtype).transpose(2, 3)
    out, mean = torch.empty(n, c, *hw, dtype=dtype), torch.empty(n, c)
    space = (n, c, *hw)
    host.run(desc, [x, w, b, res, out, mean],
             [*space, *strides_of(w, space)[:2], *strides_of(b, space)[:2],
              *strides_of(res, space)], function)
    want = torch.relu(x.float() * w + b + res.float())
    _rows_close(out, want.to(dtype))
    # the mean of what the kernel computed in fp32 (the stored relu is rounded)
    _sums_close(mean, want.sum((2, 3)) * 0.25, hw[0] * hw[1])


def test_index_divisions_are_32_bit_where_the_count_allows():
    """An element's indices (for a strided operand) come from 32-bit divisions where the
    count is below 2^32, 64-bit ones otherwise: in a pointwise kernel by its element
    count where the description tells it, else on a condition at run time; on a row
    kernel's warp path always (rows of 1024 at most), on its block path by the row's
    length, told or tested."""
    pointwise = _C.nvrtc_source(add_relu_scale(F32))
    assert "const bool narrow_ = total <= 0xffffffffLL;" in pointwise
    assert "if (narrow_) {\nunsigned int q_ = (unsigned int)i;" in pointwise
    assert "else {\nlong long q_ = (long long)i;" in pointwise
    told = _C.nvrtc_source(add_relu_scale(F32) + (35,))
    assert "narrow_" not in told and "(long long)i;" not in told
    assert "unsigned int q_ = (unsigned int)i;" in told
    huge = _C.nvrtc_source(add_relu_scale(F32) + (2 ** 33,))
    assert "narrow_" not in huge and "unsigned int q_" not in huge
    assert "long long q_ = (long long)i;" in huge
    x, b = torch.randn(5, 7), torch.randn(7)
    out = torch.empty(5, 7)
    host.run(add_relu_scale(F32) + (35,), [x, b, out], [5, 7, *strides_of(b, (5, 7))])
    torch.testing.assert_close(out, torch.relu(x + b) * 0.1)
    assert "narrow_" not in _C.nvrtc_source(softmax_desc())    # nothing strided
    untold = _C.nvrtc_source(layer_norm_desc(64))
    block = _functions(untold)["layer_norm_rows_block_path"]
    assert "if (cols <= 0xffffffffLL) {\nunsigned int q_ = (unsigned int)c;" in block
    warp = untold.split("/* the warp path */")[1].split("/* the block path */")[0]
    assert "unsigned int q_ = (unsigned int)c;" in warp and "(long long)c" not in warp
    told = _C.nvrtc_source(layer_norm_desc(64) + (64,))
    assert "unsigned int q_ = (unsigned int)c;" in told and "(long long)c" not in told


def test_layer_norm_rows_matches_torch_and_keeps_mean_and_rstd():
    n = 50
    x = torch.randn(8, n) * 3 + 1
    w, b = torch.randn(n), torch.randn(n)
    out, mean, rstd = torch.empty(8, n), torch.empty(8, 1), torch.empty(8, 1)
    host.run(layer_norm_desc(n), [x, w, b, out, mean, rstd],
             [8, n, *strides_of(w, (8, n)), *strides_of(b, (8, n))])
    want, want_mean, want_rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(mean, want_mean)
    torch.testing.assert_close(rstd, want_rstd)


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
@ROW_FUNCTIONS
def test_softmax_rows_on_every_path(storage, cols, offset, function):
    dtype = _STORAGE[storage]
    x = _rows_input((5, cols), dtype, offset, scale=4.0)
    out = _rows_input((5, cols), dtype, offset)
    row_max = torch.empty(5, 1)
    host.run(softmax_desc(storage), [x, out, row_max], [5, cols], function)
    _rows_close(out, torch.softmax(x.float(), -1).to(dtype))
    _rows_close(row_max, x.float().amax(-1, keepdim=True))


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
@ROW_FUNCTIONS
@WEIGHTS
def test_layer_norm_rows_on_every_path(storage, cols, offset, function, weights):
    dtype = _STORAGE[storage]
    x = _rows_input((4, cols), dtype, offset, scale=3.0, shift=1.0)
    w, b = torch.randn(cols), torch.randn(cols)
    out, mean, rstd = _rows_input((4, cols), dtype, offset), torch.empty(4, 1), torch.empty(4, 1)
    host.run(layer_norm_desc(cols, storage, weights), [x, w, b, out, mean, rstd],
             [4, cols, *_weight_strides(weights, w, (4, cols)),
              *_weight_strides(weights, b, (4, cols))], function)
    want, want_mean, want_rstd = torch.ops.aten.native_layer_norm(x.float(), [cols], w, b,
                                                                  1e-5)
    _rows_close(out, want.to(dtype))
    _rows_close(mean, want_mean)
    _rows_close(rstd, want_rstd)


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("cols", ROW_LENGTHS)
@ROW_FUNCTIONS
@WEIGHTS
def test_softmax_backward_and_rms_norm_rows_on_every_path(storage, cols, function, weights):
    dtype = _STORAGE[storage]
    y = torch.softmax(torch.randn(6, cols), -1).to(dtype)
    g = torch.randn(6, cols).to(dtype)
    out = torch.empty(6, cols, dtype=dtype)
    host.run(softmax_backward_desc(storage), [g, y, out], [6, cols], function)
    gf, yf = g.float(), y.float()
    _rows_close(out, (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(dtype))
    x, w = torch.randn(6, cols).to(dtype), torch.randn(cols).to(dtype)
    host.run(rms_norm_desc(cols, storage, weights), [x, w, out],
             [6, cols, *_weight_strides(weights, w, (6, cols))], function)
    xf = x.float()
    want = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * w.float()
    _rows_close(out, want.to(dtype))


def test_the_warp_path_keeps_the_values_later_passes_read_in_registers():
    """Softmax's backward reads g and y in two passes: on the warp path each is loaded
    once into a register array; softmax keeps x for its sum and then exp(x - max) for
    its division (one exp an element); a load one pass reads (the weight of an RMSNorm)
    is not kept, and the block path keeps nothing."""
    source = _C.nvrtc_source(softmax_backward_desc())
    warp = source.split("/* the warp path */")[1].split("/* the block path */")[0]
    block = _functions(source)["softmax_backward_rows_block_path"]
    vector, scalar = warp.split("/* its vector form */")[1].split("\nelse {\n", 1)
    for form in (vector, scalar):
        assert "ca0[AGS_WARP_ITEMS]" in form and "ca1[AGS_WARP_ITEMS]" in form
        assert "__syncthreads" not in form and "__shfl_xor_sync" in form
    assert scalar.count("in0[") == 1 and scalar.count("in1[") == 1
    assert vector.count("*)in0)[qw_]") == 1 and vector.count("*)in1)[qw_]") == 1
    assert "ca0[" not in block and "ca1[" not in block and "__syncthreads" in block
    def warp_of(desc):
        return _C.nvrtc_source(desc).split("/* the warp path */")[1].split(
            "/* the block path */")[0]

    softmax = warp_of(softmax_desc())
    scalar = softmax.split("/* its vector form */")[1].split("\nelse {\n", 1)[1]
    assert "ca0[AGS_WARP_ITEMS]" in scalar and "ca3[AGS_WARP_ITEMS]" in scalar
    assert scalar.count("expf(") == 1 and scalar.count("in0[") == 1
    rms = warp_of(rms_norm_desc(64))
    assert "ca0[" in rms and "ca9[" not in rms
    # x and the output as vectors, w (strided) one element at a time
    rms_vector = rms.split("/* its vector form */")[1].split("\nelse {\n", 1)[0]
    assert "*)in0)[qw_]" in rms_vector and "*)out0)[qw_] = o0" in rms_vector
    assert "in1[" in rms_vector and "*)in1)" not in rms_vector
    # read as a row, w is a vector too, at the columns' place in its one row
    rms_row = warp_of(rms_norm_desc(64, weights=2))
    rms_row_vector = rms_row.split("/* its vector form */")[1].split("\nelse {\n", 1)[0]
    assert "*)in1)[cw_]" in rms_row_vector and "in1[" not in rms_row_vector
    assert "si1_" not in _C.nvrtc_source(rms_norm_desc(64, weights=2))   # no strides
    ints = ("ints_rows", KK.ROWS, 2, 1, ((I64, 0),),
            (op(K.LOAD, I64, 0), op(K.SUM, I64, 0)), ((1, I64, 3),))
    assert "its vector form" not in _C.nvrtc_source(ints)   # no vector of 8-byte values


def test_a_row_kernels_block_path_is_one_function_both_kernels_call():
    """Without a row length, the block path is a device function of its own, compiled
    once: <name>_block (what the launcher runs for long rows, with registers of its
    own) calls it, and so does the first kernel for the rows its warp path does not
    take. For fp16 and bf16 rows the block path moves vectors of 8, the warp path
    vectors of 4."""
    functions = _functions(_C.nvrtc_source(softmax_backward_desc(BF16)))
    path = functions.pop("softmax_backward_rows_block_path")
    assert "/* the warp path" not in path and "ca0[" not in path
    assert "__syncthreads" in path and "const ags_u16x8 a0" in path
    first, block = functions.pop("softmax_backward_rows"), functions.pop(
        "softmax_backward_rows_block")
    assert not functions
    call = "softmax_backward_rows_block_path(in0, in1, out0, n0, n1);"
    assert first.count(call) == 1 and block.count(call) == 1 and "for (" not in block
    warp = first.split("/* the warp path */")[1]
    assert "const ushort4 a0" in warp and "ags_u16x8" not in warp
    assert "__syncthreads" not in first


def test_reducing_the_last_two_dimensions():
    desc = ("sum_last_two", KK.ROWS, 3, 2, ((F64, 0),),
            (op(K.LOAD, F64, 0), op(K.MUL, F64, 0, 0), op(K.SUM, F64, 1)),
            ((2, F64, 3),))
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    out = torch.empty(3, dtype=torch.float64)
    host.run(desc, [x, out], [3, 4, 5])
    torch.testing.assert_close(out, (x * x).sum((1, 2)))


def test_nan_and_infinity_behave_as_in_torch():
    # maximum and amax propagate NaN; relu keeps it; comparisons with inf constants
    desc = ("nan_rules", KK.ROWS, 2, 1, ((F32, 0), (F32, 0)),
            (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(K.MAX, F32, 0, 1),
             op(K.RELU, F32, 0), op(K.CONST, F32, imm=float("inf")),
             op(K.LT, BOOL, 0, 4), op(K.ISNAN, BOOL, 0), op(K.AMAX, F32, 0),
             op(K.CONST, F32, imm=float("-inf")), op(K.WHERE, F32, 6, 8, 2)),
            ((2, F32, 0), (3, F32, 0), (5, BOOL, 0), (7, F32, 3), (9, F32, 0)))
    x = torch.tensor([[1.0, float("nan"), -2.0, float("inf")], [0.5, -1.0, 3.0, -0.0]])
    y = torch.tensor([[float("nan"), 0.0, 5.0, 1.0], [2.0, -3.0, float("-inf"), 1.0]])
    outs = [torch.empty(2, 4), torch.empty(2, 4), torch.empty(2, 4, dtype=torch.bool),
            torch.empty(2, 1), torch.empty(2, 4)]
    host.run(desc, [x, y, *outs], [2, 4])
    torch.testing.assert_close(outs[0], torch.maximum(x, y), equal_nan=True)
    torch.testing.assert_close(outs[1], torch.relu(x), equal_nan=True)
    assert torch.equal(outs[2], x < float("inf"))
    torch.testing.assert_close(outs[3], x.amax(-1, keepdim=True), equal_nan=True)
    want = torch.where(x.isnan(), torch.tensor(float("-inf")), torch.maximum(x, y))
    torch.testing.assert_close(outs[4], want, equal_nan=True)


def test_integer_and_boolean_values():
    desc = ("ints", KK.POINTWISE, 1, 0, ((I64, 0), (BOOL, 0)),
            (op(K.LOAD, I64, 0), op(K.LOAD, BOOL, 1), op(K.CONST, I64, imm=3),
             op(K.MUL, I64, 0, 2), op(K.NEG, I64, 0), op(K.WHERE, I64, 1, 3, 4),
             op(K.CAST, F32, 5), op(K.CONST, F32, imm=0.5), op(K.MUL, F32, 6, 7),
             op(K.EQ, BOOL, 0, 2)),
            ((5, I64, 0), (8, F32, 0), (9, BOOL, 0)))
    a = torch.randint(-5, 6, (17,))
    m = torch.rand(17) > 0.5
    outs = [torch.empty(17, dtype=torch.int64), torch.empty(17),
            torch.empty(17, dtype=torch.bool)]
    host.run(desc, [a, m, *outs], [17])
    want = torch.where(m, a * 3, -a)
    assert torch.equal(outs[0], want)
    torch.testing.assert_close(outs[1], want.float() * 0.5)
    assert torch.equal(outs[2], a == 3)


def test_every_unary_float_instruction_matches_torch():
    unary = {K.NEG: torch.neg, K.ABS: torch.abs, K.EXP: torch.exp, K.LOG: torch.log,
             K.LOG1P: torch.log1p, K.EXPM1: torch.expm1, K.SQRT: torch.sqrt,
             K.RSQRT: torch.rsqrt, K.RECIPROCAL: torch.reciprocal, K.TANH: torch.tanh,
             K.SIGMOID: torch.sigmoid, K.ERF: torch.erf, K.SIN: torch.sin,
             K.COS: torch.cos, K.FLOOR: torch.floor, K.CEIL: torch.ceil,
             K.TRUNC: torch.trunc, K.SIGN: torch.sign, K.RELU: torch.relu}
    x = torch.randn(64) * 3
    x[:8] = x[:8].abs() + 0.1   # some positive values for log and sqrt
    for kop, fn in unary.items():
        desc = (f"u_{kop.id}", KK.POINTWISE, 1, 0, ((F32, 0),),
                (op(K.LOAD, F32, 0), op(kop, F32, 0)), ((1, F32, 0),))
        out = torch.empty(64)
        host.run(desc, [x, out], [64])
        torch.testing.assert_close(out, fn(x), equal_nan=True, msg=kop.id)


def test_every_binary_instruction_matches_torch():
    binary = {K.ADD: torch.add, K.SUB: torch.sub, K.MUL: torch.mul, K.DIV: torch.div,
              K.POW: torch.pow, K.MAX: torch.maximum, K.MIN: torch.minimum}
    a, b = torch.rand(40) + 0.5, torch.randn(40)
    for kop, fn in binary.items():
        desc = (f"b_{kop.id}", KK.POINTWISE, 1, 0, ((F32, 0), (F32, 0)),
                (op(K.LOAD, F32, 0), op(K.LOAD, F32, 1), op(kop, F32, 0, 1)),
                ((2, F32, 0),))
        out = torch.empty(40)
        host.run(desc, [a, b, out], [40])
        torch.testing.assert_close(out, fn(a, b), msg=kop.id)


def test_a_zero_dimensional_space_is_one_element():
    desc = ("scalar", KK.POINTWISE, 0, 0, ((F32, 0),),
            (op(K.LOAD, F32, 0), op(K.EXP, F32, 0)), ((1, F32, 0),))
    x, out = torch.tensor(0.5), torch.empty(())
    host.run(desc, [x, out], [])
    torch.testing.assert_close(out, x.exp())


@pytest.mark.parametrize("desc,error", [
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)),
      ((1, F32, 0),)), "in a POINTWISE kernel"),
    (("k", KK.POINTWISE, 1, 0, ((I64, 0),), (op(K.LOAD, I64, 0), op(K.EXP, I64, 0)),
      ((1, I64, 0),)), "not defined"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0), op(K.NEG, F32, 1)),
      ((1, F32, 0),)), "earlier value"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 3),), ((0, F32, 0),)),
     "input"),
    (("no-name", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0),),
      ((0, F32, 0),)), "identifier"),
    (("k", KK.ROWS, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 0),)),
     "reduces"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.CONST, F32, imm=1.0),),
      ((0, F32, 0),)), "constant"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.ADD, F32, 0),), ((0, F32, 0),)),
     "operand"),
    (("k", 7, 1, 0, (), (), ()), "kind"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 2),), (op(K.LOAD, F32, 0),), ((0, F32, 0),)),
     "kernel without rows"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 2),)),
     "column sums"),
    (("k", KK.ROWS, 2, 1, ((BF16, 0),), (op(K.LOAD, F32, 0),), ((0, BF16, 2),)),
     "column sums"),
    (("k", KK.ROWS, 2, 1, ((F32, 0),), (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)),
      ((1, F32, 2),)), "not an element value"),
    (("k", KK.ROWS, 2, 1, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 3),)),
     "varies along the row"),
    (("k", KK.ROWS, 2, 1, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 4),)),
     "output's place"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 3),)),
     "without rows"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 3),), (op(K.LOAD, F32, 0),), ((0, F32, 0),)),
     "kernel without rows"),
    (("k", KK.ROWS, 2, 1, ((F32, 5),), (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)),
      ((1, F32, 0),)), "strided flag"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 4),), (op(K.LOAD, F32, 0),), ((0, F32, 0),)),
     "kernel without rows"),
    (("k", KK.ROWS, 2, 1, ((F32, 0),), (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)),
      ((1, F32, 3),), -5), "static length .* must be 0 or positive"),
    (("k", KK.ROWS, 2, 1, ((F32, 0),), (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)),
      ((1, F32, 3),), 5.0), "static length .* must be an int"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 0),), -64),
     "static length"),
    (("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0),), ((0, F32, 0),), 0, 1),
     "7 items, or 8"),
])
def test_a_bad_description_is_refused_with_what_is_wrong(desc, error):
    with pytest.raises((ValueError, TypeError), match=error):
        _C.nvrtc_source(desc)


# ---- NVRTC ---------------------------------------------------------------------------

ALL = [add_relu_scale(F32), add_relu_scale(BF16), softmax_desc(F16), layer_norm_desc(64),
       spread_desc(BF16), softmax_desc(BF16) + (197,), softmax_desc(BF16) + (4096,),
       softmax_desc(BF16), softmax_backward_desc(BF16), rms_norm_desc(64, F16),
       ("sum_last_two", KK.ROWS, 3, 2, ((F64, 0),),
        (op(K.LOAD, F64, 0), op(K.MUL, F64, 0, 0), op(K.SUM, F64, 1)), ((2, F64, 3),)),
       column_sums_desc(F32), column_sums_desc(BF16), bias_grad_desc(F16),
       rms_norm_backward_desc(64, BF16), affine_pool_desc(BF16), affine_pool_desc(F32, 1024)]


@pytest.mark.parametrize("desc", ALL, ids=[d[0] + str(i) for i, d in enumerate(ALL)])
def test_nvrtc_compiles_each_family_to_ptx_and_cubin(nvrtc, desc):
    """With the options the backend compiles with (-minimal from NVRTC 12.4 on)."""
    from agspeed.backends.nvrtc import kernels

    source = _C.nvrtc_source(desc)
    ptx = _C.nvrtc_compile(source, desc[0] + ".cu",
                           kernels.compile_options("--gpu-architecture=compute_80"), False)
    assert b".entry " + desc[0].encode() in ptx
    options = kernels.compile_options("--gpu-architecture=sm_90")
    assert ("-minimal" in options) == (tuple(nvrtc) >= (12, 4))
    cubin = _C.nvrtc_compile(source, desc[0] + ".cu", options, True)
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("ktype", [F32, F64])
def test_every_instruction_compiles_with_the_backends_options(nvrtc, ktype):
    """Each instruction, in fp32 and fp64, compiles with the options the backend uses
    (-minimal leaves part of CUDA's declarations out: none that a kernel uses)."""
    from agspeed.backends.nvrtc import kernels

    unary = [K.NEG, K.ABS, K.EXP, K.LOG, K.LOG1P, K.EXPM1, K.SQRT, K.RSQRT, K.RECIPROCAL,
             K.TANH, K.SIGMOID, K.ERF, K.SIN, K.COS, K.FLOOR, K.CEIL, K.TRUNC, K.SIGN,
             K.RELU]
    binary = [K.ADD, K.SUB, K.MUL, K.DIV, K.POW, K.MAX, K.MIN]
    ops = [op(K.LOAD, ktype, 0), op(K.LOAD, ktype, 1)]
    ops += [op(u, ktype, 0) for u in unary] + [op(b, ktype, 0, 1) for b in binary]
    ops += [op(c, BOOL, 0, 1) for c in (K.EQ, K.NE, K.LT, K.LE, K.GT, K.GE)]
    last = len(ops) - 1
    ops += [op(K.ISNAN, BOOL, 0), op(K.NOT, BOOL, last), op(K.AND, BOOL, last, last - 1),
            op(K.OR, BOOL, last, last - 1), op(K.WHERE, ktype, last, 0, 1),
            op(K.CAST, I64, 0)]
    outs = tuple((i, ops[i][1], 0) for i in range(2, len(ops)))
    rows = [op(K.LOAD, ktype, 0), op(K.AMIN, ktype, 0), op(K.AMAX, ktype, 0),
            op(K.SUM, ktype, 0), op(K.CONST, ktype, imm=0.5), op(K.MUL, ktype, 3, 4)]
    assert {o[0] for o in ops + rows} == set(K)
    for desc in [("every_op", KK.POINTWISE, 1, 0, ((ktype, 0), (ktype, 0)), tuple(ops),
                  outs),
                 ("every_reduction", KK.ROWS, 2, 1, ((ktype, 0),), tuple(rows),
                  ((1, ktype, 3), (2, ktype, 3), (5, ktype, 3)))]:
        cubin = _C.nvrtc_compile(_C.nvrtc_source(desc), desc[0] + ".cu",
                                 kernels.compile_options("--gpu-architecture=sm_90"), True)
        assert cubin[:4] == b"\x7fELF"


ROWS_KERNELS = [softmax_desc(F32), softmax_desc(BF16), softmax_backward_desc(F16),
                layer_norm_desc(64, BF16), rms_norm_desc(64, F32)]


@pytest.mark.parametrize("desc", ROWS_KERNELS, ids=lambda d: d[0])
def test_nvrtc_keeps_the_warp_paths_rows_in_registers(nvrtc, desc):
    """The warp path's loops have a constant count, unrolled, so its register arrays
    are registers: no local memory in the PTX; its reductions are shuffles."""
    ptx = _C.nvrtc_compile(_C.nvrtc_source(desc), desc[0] + ".cu",
                           ("--gpu-architecture=compute_90",), False).decode()
    assert "__local_depot" not in ptx and ".local" not in ptx
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx   # both paths are there


def test_bf16_rounds_in_one_instruction_from_sm_80_and_in_arithmetic_before(nvrtc):
    source = _C.nvrtc_source(add_relu_scale(BF16))
    new, old = (_C.nvrtc_compile(source, "k.cu", (f"--gpu-architecture=compute_{a}",),
                                 False).decode() for a in (90, 75))
    assert "cvt.rn.bf16.f32" in new and "cvt.rn.bf16.f32" not in old


def test_a_source_that_does_not_compile_raises_with_nvrtcs_log(nvrtc):
    with pytest.raises(RuntimeError, match="could not compile bad.cu"):
        _C.nvrtc_compile("this is not CUDA", "bad.cu", (), False)


def test_without_a_driver_the_reason_is_said():
    from agspeed.backends.nvrtc import _libs

    version, why = _libs.cuda()
    if version is None:
        assert "no CUDA driver" in why
    else:
        assert why is None and version >= 11000


def test_generating_keeps_no_reference_to_the_description():
    import sys

    desc = softmax_desc()
    bad = ("k", KK.POINTWISE, 1, 0, ((F32, 0),), (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)),
           ((1, F32, 0),))
    before = sys.getrefcount(desc), sys.getrefcount(bad)
    for _ in range(200):
        _C.nvrtc_source(desc)
        with pytest.raises(ValueError):
            _C.nvrtc_source(bad)
    assert (sys.getrefcount(desc), sys.getrefcount(bad)) == before


def test_without_a_gpu_the_backend_says_why_and_the_graph_runs_eager(caplog):
    import logging

    import agspeed
    from agspeed import backends

    caps = backends.capabilities_of(backends.get_backend("nvrtc"))
    why = caps.unavailable()
    assert why and caps.devices == {"cuda"}
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        f = agspeed.optimize(lambda x: x.sin() + 1, backend="nvrtc")
        x = torch.randn(5)
        torch.testing.assert_close(f(x), x.sin() + 1)
    assert why in caplog.text and "runs eagerly" in caplog.text


@pytest.mark.parametrize("storage,dtype", [(F16, torch.float16), (BF16, torch.bfloat16)])
def test_a_cast_to_a_narrow_float_rounds_as_eager(storage, dtype):
    desc = ("round_trip", KK.POINTWISE, 1, 0, ((F32, 0),),
            (op(K.LOAD, F32, 0), op(K.CAST, storage, 0), op(K.MUL, F32, 1, 1)),
            ((2, F32, 0),))
    x = torch.randn(100) * 10
    out = torch.empty(100)
    host.run(desc, [x, out], [100])
    r = x.to(dtype).float()
    torch.testing.assert_close(out, r * r, rtol=0, atol=0)


def test_a_sum_over_empty_rows_is_zero_and_a_kernel_without_driver_says_so():
    desc = ("sum_rows", KK.ROWS, 2, 1, ((F32, 0),),
            (op(K.LOAD, F32, 0), op(K.SUM, F32, 0)), ((1, F32, 3),))
    x = torch.empty(3, 0)
    out = torch.full((3, 1), 7.0)
    host.run(desc, [x, out], [3, 0])
    assert torch.equal(out, torch.zeros(3, 1))
    from agspeed.backends.nvrtc import _libs

    if _libs.cuda()[0] is None:
        with pytest.raises(RuntimeError, match="libcuda is not open"):
            _C.CudaKernel(b"", "sum_rows", int(KK.ROWS), 2, 1, 0)
        with pytest.raises(RuntimeError, match="libcuda is not open"):
            _C.cuda_device(0)


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("n,offset", [(4096, 0), (4094, 0), (4100, 0), (4096, 1), (4096, 4)],
                         ids=["vectors", "count-not-a-multiple-of-4",
                              "count-not-a-multiple-of-8", "misaligned", "aligned-to-8-bytes"])
def test_the_vector_path_and_its_fallbacks_agree_with_torch(storage, n, offset):
    """Contiguous pointwise kernels load and store a vector at once (4 values, 8 where
    every operand is fp16, bf16 or bytes) when the count and every pointer allow it,
    one at a time otherwise."""
    dtype = _STORAGE[storage]
    desc = ("vec_gelu_mask", KK.POINTWISE, 1, 0, ((storage, 0), (BOOL, 0)),
            (op(K.LOAD, F32, 0), op(K.LOAD, BOOL, 1),
             op(K.CONST, F32, imm=0.7071067811865476),
             op(K.MUL, F32, 0, 2), op(K.ERF, F32, 3), op(K.CONST, F32, imm=1.0),
             op(K.ADD, F32, 4, 5), op(K.MUL, F32, 0, 6), op(K.CONST, F32, imm=0.5),
             op(K.MUL, F32, 7, 8), op(K.CONST, F32, imm=0.0), op(K.WHERE, F32, 1, 9, 10),
             op(K.GT, BOOL, 0, 10)),
            ((11, storage, 0), (12, BOOL, 0)))
    x = torch.randn(n + offset).to(dtype)[offset:]
    m = (torch.rand(n + offset) > 0.3)[offset:]
    out = torch.empty(n + offset, dtype=dtype)[offset:]
    pos = torch.empty(n + offset, dtype=torch.bool)[offset:]
    host.run(desc, [x, m, out, pos], [n])
    want = torch.where(m, torch.nn.functional.gelu(x.float()), torch.tensor(0.0)).to(dtype)
    torch.testing.assert_close(out, want)
    assert torch.equal(pos, x.float() > 0)
    assert ("float4" in _C.nvrtc_source(desc)) == (storage == F32)


def _vec_where(other):
    return ("vec_where", KK.POINTWISE, 1, 0, ((F16, 0), (other, 0)),
            (op(K.LOAD, F32, 0), op(K.LOAD, other, 1), op(K.CONST, F32, imm=0.0),
             op(K.WHERE, F32, 1, 0, 2)), ((3, F16, 0), (1, other, 0)))


def _global_accesses(desc):
    ptx = _C.nvrtc_compile(_C.nvrtc_source(desc), "vec_where.cu",
                           ("--gpu-architecture=compute_80",), False).decode()
    return set(re.findall(r"(?:ld|st)\.global\S*", ptx))


def test_nvrtc_turns_the_vector_path_into_vector_loads_and_stores(nvrtc):
    """fp16 beside fp32 moves as vectors of 4 (8 bytes of fp16, 16 of fp32); fp16 beside
    bytes alone as vectors of 8, so that its loads and stores are 16 bytes wide too."""
    mixed = _global_accesses(_vec_where(F32))
    assert {"ld.global.nc.v4.u16", "ld.global.nc.v4.f32", "st.global.v4.u16",
            "st.global.v4.f32"} <= mixed
    narrow = _global_accesses(_vec_where(BOOL))
    # 8 halves (16 bytes) as four 32-bit words, 8 bools (8 bytes) as four 16-bit ones
    assert {"ld.global.nc.v4.u32", "st.global.v4.u32", "ld.global.nc.v4.u16",
            "st.global.v4.u16"} <= narrow
    assert "const ags_u16x8 a0" in _C.nvrtc_source(_vec_where(BOOL))
    assert "const ags_u16x8 a0" not in _C.nvrtc_source(_vec_where(F32))
