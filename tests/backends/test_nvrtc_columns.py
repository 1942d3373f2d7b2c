"""A row kernel's column sums (backends/nvrtc/codegen_columns.c), without a GPU: an
element value summed over the rows (a norm's weight and bias gradients) beside the
row's own reductions, dealt to row slots, on the warp path and the block path, their
sums in registers or in the slot's row of memory; run on the CPU through the host shim
against torch, and compiled by NVRTC.
"""

import pytest

from agspeed import _C
from agspeed.protocol import KernelKind as KK
from agspeed.protocol import KernelOp as K

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

import _nvrtc_host as host  # noqa: E402
from _nvrtc_descs import (BF16, F16, F32, ROW_FUNCTIONS, ROW_LENGTHS,  # noqa: E402
                          _STORAGE, _rows_close, _rows_input, _sums_close, bias_grad_desc,
                          column_sums_desc, op, rms_norm_backward_desc, strides_of)


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("slots", [1, 3, 7])
@ROW_FUNCTIONS
def test_column_sums_on_every_path(storage, cols, offset, slots, function):
    """Each row slot (a block of the host's grid) adds its rows into its own row of the
    partial sums; the slots' rows add up to torch's sums over the rows, next to the
    element and row outputs of the same kernel."""
    dtype, rows = _STORAGE[storage], 7
    g = _rows_input((rows, cols), dtype, offset)
    x = _rows_input((rows, cols), dtype, offset, 2.0, 1.0)
    mean, rstd = torch.randn(rows, 1), torch.rand(rows, 1) + 0.5
    out, row_sum = torch.empty(rows, cols, dtype=dtype), torch.empty(rows)
    gw, gb = torch.full((slots, cols), float("nan")), torch.full((slots, cols), float("nan"))
    host.run(column_sums_desc(storage), [g, x, mean, rstd, out, gw, gb, row_sum],
             [rows, cols, *strides_of(mean, (rows, cols)), *strides_of(rstd, (rows, cols)),
              slots], function)
    gf = g.float()
    _rows_close(out, (gf * rstd).to(dtype))
    _sums_close(row_sum, gf.sum(-1), cols)
    _sums_close(gw.sum(0), (gf * (x.float() - mean) * rstd).sum(0), rows)
    _sums_close(gb.sum(0), gf.sum(0), rows)


@pytest.mark.parametrize("told,function,offset", [(0, "_block", 0), (64, "", 1)],
                         ids=["block-function", "told-length-misaligned"])
@pytest.mark.parametrize("blocks", [1, 2])
def test_a_grid_smaller_than_the_slots_leaves_none_out_on_the_block_path(
        told, function, offset, blocks):
    """On the block path a block takes slot after slot: the grid the launcher shapes
    for the warp path (a block for 8 slots) still sums every slot's rows where they
    fall to the block path, as a misaligned row does where the row's length is told
    (the warp path is then its vector form alone)."""
    rows, cols, slots = 7, 64, 5
    desc = column_sums_desc(BF16) + ((told,) if told else ())
    assert ("its vector form alone" in _C.nvrtc_source(desc)) == bool(told)
    g = _rows_input((rows, cols), torch.bfloat16, offset)
    x = _rows_input((rows, cols), torch.bfloat16, offset, 2.0, 1.0)
    mean, rstd = torch.randn(rows, 1), torch.rand(rows, 1) + 0.5
    out, row_sum = torch.empty(rows, cols, dtype=torch.bfloat16), torch.empty(rows)
    gw, gb = torch.full((slots, cols), float("nan")), torch.full((slots, cols), float("nan"))
    host.run(desc, [g, x, mean, rstd, out, gw, gb, row_sum],
             [rows, cols, *strides_of(mean, (rows, cols)), *strides_of(rstd, (rows, cols)),
              slots], function, blocks=blocks)
    gf = g.float()
    _rows_close(out, (gf * rstd).bfloat16())
    _sums_close(row_sum, gf.sum(-1), cols)
    _sums_close(gw.sum(0), (gf * (x.float() - mean) * rstd).sum(0), rows)
    _sums_close(gb.sum(0), gf.sum(0), rows)


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("told,offset", [(1026, 0), (3000, 0), (3000, 1), (4096, 0),
                                         (4096, 1), (4100, 0), (8191, 0)])
@pytest.mark.parametrize("block", [None, 64], ids=["one-step", "steps"])
def test_column_sums_in_registers_on_the_block_path(storage, told, offset, block):
    """Where the row's length is told (as it is wherever column sums join a kernel), the
    block path keeps each thread's column sums in registers over the slot's rows and
    stores them once: sized for the block the driver launches, one step of kc_ places
    covers the row (the harness's default).  A smaller block (``steps``: registers
    sized for 64 threads, the harness running one) takes the row in several steps, each
    adding its sums into the slot's row.  Rows of a told length up to 1024 take the
    warp path (the block path only misaligned, its sums in memory); longer rows take
    the block path always, in its vector form where aligned (``offset``) and the
    length a multiple of the vectors' width (4 floats, 8 bf16: 4100 and 8191 take the
    scalar form, its sums in registers, a step's last places past the row's end)."""
    dtype, rows, slots = _STORAGE[storage], 7, 3
    desc = column_sums_desc(storage) + (told,)
    source = _C.nvrtc_source(desc)
    block_path = source.split("/* the block path */")[1]
    vector = "/* its vector form */" in block_path
    assert vector == (told % (4 if storage == F32 else 8) == 0)
    # the scalar form beside a vector form (misaligned rows) sums in memory
    assert "cs1[kc_ * " in block_path
    assert ("out1[slot_ * cols + c] += (" in block_path) == vector
    # the driver's block for such rows: about 4 elements a thread, 32 to 256 threads
    launched = min(256, max(32, 1 << (-(-told // 4) - 1).bit_length()))
    assert f"#define AGS_COLUMN_BLOCK {launched}" in source
    g = _rows_input((rows, told), dtype, offset)
    x = _rows_input((rows, told), dtype, offset, 2.0, 1.0)
    mean, rstd = torch.randn(rows, 1), torch.rand(rows, 1) + 0.5
    out, row_sum = torch.empty(rows, told, dtype=dtype), torch.empty(rows)
    gw, gb = torch.full((slots, told), float("nan")), torch.full((slots, told), float("nan"))
    host.run(desc, [g, x, mean, rstd, out, gw, gb, row_sum],
             [rows, told, *strides_of(mean, (rows, told)), *strides_of(rstd, (rows, told)),
              slots], defines=f"#define AGS_COLUMN_BLOCK {block}\n" if block else "")
    gf = g.float()
    _rows_close(out, (gf * rstd).to(dtype))
    _sums_close(row_sum, gf.sum(-1), told)
    _sums_close(gw.sum(0), (gf * (x.float() - mean) * rstd).sum(0), rows)
    _sums_close(gb.sum(0), gf.sum(0), rows)


@pytest.mark.parametrize("told", [64, 1000, 1026, 3000, 4096, 4100, 8191, 8192])
def test_column_sums_in_registers_compile(nvrtc, told):
    """NVRTC compiles the register form for every length column sums join at (up to
    NVRTC_COLUMN_COLS; the warp path's up to 1024), in its vector and scalar forms,
    with the backend's options, and the sums stay registers: no array of the kernel
    is indexed at run time (which would put it in local memory, a ``.local`` depot in
    the PTX)."""
    from agspeed.backends.nvrtc import kernels

    assert told <= _C.NVRTC_COLUMN_COLS
    for storage in (F32, BF16):
        desc = column_sums_desc(storage) + (told,)
        source = _C.nvrtc_source(desc)
        assert ("enum { kc_ =" in source) == (told > 1024)
        ptx = _C.nvrtc_compile(source, desc[0] + ".cu",
                               kernels.compile_options("--gpu-architecture=compute_90"),
                               False).decode()
        assert ".entry" in ptx and ".local" not in ptx
        cubin = _C.nvrtc_compile(source, desc[0] + ".cu",
                                 kernels.compile_options("--gpu-architecture=sm_90"), True)
        assert len(cubin) > 1000


def test_column_sums_past_the_longest_row_stay_in_memory():
    """A told length past NVRTC_COLUMN_COLS (which the partition never makes) gets no
    register form: its places would be more registers than a thread has."""
    longest = _C.NVRTC_COLUMN_COLS
    assert "enum { kc_ =" in _C.nvrtc_source(column_sums_desc(F32) + (longest,))
    source = _C.nvrtc_source(column_sums_desc(F32) + (longest + 4,))
    assert "enum { kc_ =" not in source and "out1[slot_ * cols + c] += (" in source


@pytest.mark.parametrize("told", [0, 64, 1024])
def test_a_block_path_behind_the_warp_path_sums_in_memory(told):
    """Without a told length (no description the partition makes has column sums
    then), or behind a warp path (rows up to 1024, misaligned), the block path's sums
    stay in the slot's row of memory."""
    desc = column_sums_desc(F32) + ((told,) if told else ())
    block_path = _C.nvrtc_source(desc).split("/* the block path */")[1]
    assert "kc_" not in block_path and "out1[slot_ * cols + c] += (" in block_path


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("cols", ROW_LENGTHS)
@ROW_FUNCTIONS
def test_a_saved_row_statistic_is_read_once_a_row(storage, cols, function):
    """RMSNorm's backward in one kernel: the forward's rstd, one value a row, is a row
    value (r^3 computed before the row's reduction, stored as a row output)."""
    dtype, rows = _STORAGE[storage], 5
    g, x = _rows_input((rows, cols), dtype), _rows_input((rows, cols), dtype, 0, 2.0)
    w = torch.randn(cols).to(dtype)
    r = torch.rand(rows, 1) + 0.5
    dx, gw, r3 = torch.empty(rows, cols, dtype=dtype), torch.empty(2, cols), torch.empty(rows)
    host.run(rms_norm_backward_desc(cols, storage), [g, x, w, r, dx, gw, r3],
             [rows, cols, 2], function)
    gf, xf, wf = g.float(), x.float(), w.float()
    want = r * gf * wf - xf * r ** 3 * (gf * wf * xf).sum(-1, keepdim=True) / cols
    _rows_close(dx, want.to(dtype))
    _sums_close(gw.sum(0), (gf * xf * r).sum(0), rows)
    torch.testing.assert_close(r3, (r ** 3).squeeze(1))


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("cols", [8, 100, 3000])
def test_column_sums_of_a_kernel_without_row_reductions(storage, cols):
    dtype = _STORAGE[storage]
    g, w = torch.randn(2, 3, cols).to(dtype), torch.randn(cols).to(dtype)
    out, gb = torch.empty(2, 3, cols, dtype=dtype), torch.empty(4, cols)
    host.run(bias_grad_desc(storage), [g, w, out, gb], [2, 3, cols, 4])
    torch.testing.assert_close(out, (g.float() * w.float()).to(dtype))
    _sums_close(gb.sum(0), g.float().sum((0, 1)), 6)
    # column sums alone: the pass over the elements is made for them too
    alone = ("bias_grad_alone", KK.ROWS, 3, 1, ((storage, 0),), (op(K.LOAD, F32, 0),),
             ((0, F32, 2),))
    gb.fill_(float("nan"))
    host.run(alone, [g, gb], [2, 3, cols, 4])
    _sums_close(gb.sum(0), g.float().sum((0, 1)), 6)
