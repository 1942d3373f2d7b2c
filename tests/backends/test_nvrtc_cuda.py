"""The nvrtc backend on a GPU: every kernel family launched against torch in fp32, fp16
and bf16 (strided, broadcast, misaligned; rows on the warp path and on the block path,
more rows than a grid), models trained with ``backend="nvrtc"`` against eager, AMP
included, and the kernel cache.

These need a CUDA device and libnvrtc; where there is none (CI) they are skipped, and
they run on a GPU machine (scripts/gpu.sh's ``cuda`` stage).
"""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from agspeed import backends  # noqa: E402

_WHY = backends.capabilities_of(backends.get_backend("nvrtc")).unavailable() \
    if torch.cuda.is_available() else "needs a CUDA device"
pytestmark = [pytest.mark.torch, pytest.mark.skipif(_WHY is not None, reason=str(_WHY))]

from test_nvrtc_backend import Block, Norms, _twins  # noqa: E402
from _nvrtc_descs import (BF16, F16, F32, _STORAGE, add_relu_scale,  # noqa: E402
                          column_sums_desc, layer_norm_desc, rms_norm_desc,
                          softmax_backward_desc, softmax_desc, strides_of)

nn, F = torch.nn, torch.nn.functional
CUDA = torch.device("cuda")


def _launch(desc, tensors, ints):
    from agspeed.backends.nvrtc import kernels

    kernel = kernels.cuda_launcher(desc, torch.cuda.current_device())
    kernel(torch.cuda.current_stream().cuda_stream, *tensors, *ints)
    torch.cuda.synchronize()


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("shape", [(5, 7), (3000, 257)])
def test_pointwise_kernel_on_the_gpu(storage, shape):
    dtype = _STORAGE[storage]
    x = torch.randn(*shape, device=CUDA).to(dtype)
    b = torch.randn(shape[1], device=CUDA).to(dtype)
    out = torch.empty(*shape, dtype=dtype, device=CUDA)
    _launch(add_relu_scale(storage), [x, b, out], [*shape, *strides_of(b, shape)])
    torch.testing.assert_close(out, ((x.float() + b.float()).relu() * 0.1).to(dtype))


def _rows_input(shape, dtype, offset=0, scale=1.0):
    """A contiguous (rows, cols) tensor whose data starts ``offset`` elements past an
    allocation's start (misaligned for vector loads when offset is odd)."""
    flat = (torch.randn(shape[0] * shape[1] + offset, device=CUDA) * scale).to(dtype)
    return flat[offset:].view(shape)


# (rows, cols): the warp path (one warp a row, up to 1024 columns) with rows short and
# long, fewer rows than a block's warps, more rows than the grid; the block path beyond
# (fp16 and bf16 rows on vectors of 8 where the length allows, one at a time at 4100)
ROW_SHAPES = [(9, 7), (9, 37), (70000, 64), (300, 100), (3, 1024), (4097, 1024),
              (64, 1025), (33, 4100), (4, 5000), (5, 8192), (3, 8193), (2, 16384)]


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax_rows_on_the_gpu(storage, shape):
    dtype = _STORAGE[storage]
    for offset in (0, 1):
        x = _rows_input(shape, dtype, offset, scale=4.0)
        out = _rows_input(shape, dtype, offset)
        row_max = torch.empty(shape[0], 1, device=CUDA)
        _launch(softmax_desc(storage), [x, out, row_max], list(shape))
        torch.testing.assert_close(out, torch.softmax(x.float(), -1).to(dtype))
        torch.testing.assert_close(row_max, x.float().amax(-1, keepdim=True))


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax_backward_and_rms_norm_rows_on_the_gpu(storage, shape):
    dtype = _STORAGE[storage]
    y = torch.softmax(torch.randn(*shape, device=CUDA), -1).to(dtype)
    g = torch.randn(*shape, device=CUDA).to(dtype)
    out = torch.empty(*shape, dtype=dtype, device=CUDA)
    _launch(softmax_backward_desc(storage), [g, y, out], list(shape))
    gf, yf = g.float(), y.float()
    torch.testing.assert_close(out, (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(dtype))
    x = torch.randn(*shape, device=CUDA).to(dtype)
    w = torch.randn(shape[1], device=CUDA).to(dtype)
    _launch(rms_norm_desc(shape[1], storage), [x, w, out], [*shape, *strides_of(w, shape)])
    xf = x.float()
    want = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(out, want.to(dtype))


@pytest.mark.parametrize("storage", [F32, F16, BF16])
@pytest.mark.parametrize("shape", [(50, 7), (50, 100), (4097, 1024), (50, 3000), (3, 5000)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_layer_norm_rows_on_the_gpu(storage, shape):
    dtype = _STORAGE[storage]
    rows, n = shape
    x = (torch.randn(rows, n, device=CUDA) * 3 + 1).to(dtype)
    w, b = torch.randn(n, device=CUDA), torch.randn(n, device=CUDA)
    out = torch.empty(rows, n, dtype=dtype, device=CUDA)
    mean, rstd = torch.empty(rows, 1, device=CUDA), torch.empty(rows, 1, device=CUDA)
    _launch(layer_norm_desc(n, storage), [x, w, b, out, mean, rstd],
            [rows, n, *strides_of(w, shape), *strides_of(b, shape)])
    want, want_mean, want_rstd = torch.ops.aten.native_layer_norm(x.float(), [n], w, b,
                                                                  1e-5)
    torch.testing.assert_close(out, want.to(dtype))
    torch.testing.assert_close(mean, want_mean)
    torch.testing.assert_close(rstd, want_rstd)


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("shape", [(50, 7), (50, 100), (20000, 1024), (50, 3000), (3000, 5000),
                                   (700, 8192)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("told", [False, True], ids=["length-untold", "length-told"])
def test_column_sums_on_the_gpu(storage, shape, told):
    """The weight and bias gradients of a layer norm as column sums, dealt to as many
    row slots as the backend picks for the device (fewer than the rows for the large
    shapes, so each slot adds many rows), and to one slot.  With the row's length told
    (as the partition tells it), rows past 1024 keep their sums in registers."""
    desc = column_sums_desc(storage) + ((shape[1],) if told else ())
    _column_sums_match(lambda tensors, ints: _launch(desc, tensors, ints), storage, shape)


def _column_sums_match(launch, storage, shape, offset=0):
    """A column sums kernel's outputs equal torch's, dealt to as many row slots as the
    backend picks for the device and to one slot."""
    from agspeed.backends.nvrtc import kernels

    dtype = _STORAGE[storage]
    rows, cols = shape
    g, x = _rows_input(shape, dtype, offset), _rows_input(shape, dtype, offset, scale=2.0)
    mean = torch.randn(rows, 1, device=CUDA)
    rstd = torch.rand(rows, 1, device=CUDA) + 0.5
    gf = g.float()
    for slots in (kernels.row_slots(rows, cols, CUDA), 1):
        out = torch.empty(shape, dtype=dtype, device=CUDA)
        row_sum = torch.empty(rows, device=CUDA)
        gw = torch.full((slots, cols), float("nan"), device=CUDA)
        gb = torch.full((slots, cols), float("nan"), device=CUDA)
        launch([g, x, mean, rstd, out, gw, gb, row_sum],
               [rows, cols, *strides_of(mean, shape), *strides_of(rstd, shape), slots])
        torch.testing.assert_close(out, (gf * rstd).to(dtype))
        torch.testing.assert_close(row_sum, gf.sum(-1), rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(gw.sum(0), (gf * (x.float() - mean) * rstd).sum(0),
                                   rtol=1e-4, atol=1e-2)
        torch.testing.assert_close(gb.sum(0), gf.sum(0), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("storage", [F32, BF16])
@pytest.mark.parametrize("cols,offset,block", [(3000, 1, None), (4100, 0, None),
                                               (8191, 0, None), (5000, 0, 1024)],
                         ids=["misaligned", "4100", "8191", "in-steps"])
def test_column_sums_in_registers_take_every_form_on_the_gpu(storage, cols, offset, block):
    """The block path's other forms with a told length: misaligned rows (the scalar form
    beside the vector form, its sums in memory), lengths not a multiple of the vectors'
    width (the scalar form, its sums in registers, a step's last places past the row's
    end), and registers sized for blocks of 1024 where the driver launches 256 (each
    block takes the row in four steps, adding each into the slot's row)."""
    from agspeed import _C
    from agspeed.backends.nvrtc import kernels

    desc = column_sums_desc(storage) + (cols,)
    source = _C.nvrtc_source(desc)
    if block:
        source = f"#define AGS_COLUMN_BLOCK {block}\n" + source
    device = torch.cuda.current_device()
    arch, cubin = kernels._arch(device)
    kernel = _C.CudaKernel(kernels.image_for(source, desc[0], arch, cubin), desc[0],
                           int(desc[1]), desc[2], desc[3], device, slots=True)

    def launch(tensors, ints):
        kernel(torch.cuda.current_stream().cuda_stream, *tensors, *ints)
        torch.cuda.synchronize()

    _column_sums_match(launch, storage, (900, cols), offset)


class NormBias(nn.Module):
    """A layer norm then a bias and GELU: both backwards add up their weights'
    gradients over the rows as column sums, on the warp path (768) or the block path
    (3000)."""

    def __init__(self, width):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.b = nn.Parameter(torch.randn(width))

    def forward(self, x):
        return F.gelu(self.ln(x) + self.b)


@pytest.mark.parametrize("width", [768, 3000])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_weight_gradients_over_many_rows_train_like_eager(width, autocast):
    """Sums over 4400 rows, added in another order than eager's: fp32 gradients within
    1e-4 (relative) of eager's."""
    _train(lambda: NormBias(width), lambda: torch.randn(4, 1100, width, device=CUDA),
           autocast, tol={"rtol": 1e-4, "atol": 1e-3} if autocast is None else None)


def _train(cls, make_input, autocast=None, steps=2, dynamic=None, backend="nvrtc",
           tol=None):
    eager, model = _twins(cls)
    eager, model = eager.to(CUDA), model.to(CUDA)
    optimized = agspeed.optimize(model, backend=backend, dynamic=dynamic)
    if tol is None:
        tol = {} if autocast is None else {"rtol": 2e-2, "atol": 2e-2}
    for _ in range(steps):
        x = make_input()
        outs = []
        for m in (eager, optimized):
            with torch.autocast("cuda", dtype=autocast or torch.float16,
                                enabled=autocast is not None):
                out = m(x)
            out.float().square().mean().backward()
            outs.append(out)
        torch.testing.assert_close(outs[1], outs[0], **tol)
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name, **tol)


@pytest.mark.parametrize("autocast", [None, torch.float16, torch.bfloat16])
def test_models_train_like_eager_with_nvrtc(autocast):
    _train(Block, lambda: torch.randn(64, 16, device=CUDA), autocast)
    _train(Norms, lambda: torch.randn(8, 33, 24, device=CUDA), autocast)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_models_train_like_eager_with_nvrtc_kernels_replayed(autocast, monkeypatch):
    """nvrtc_cudagraphs: the same kernels recorded once and replayed; steps past the
    recording use fresh inputs, so a replay that read stale buffers would differ."""
    from agspeed.backends import cudagraphs

    made = []

    def replay(graph):
        made.append(cudagraphs._Replay(graph))
        return made[-1]

    monkeypatch.setattr(cudagraphs, "replay", replay)
    _train(Block, lambda: torch.randn(64, 16, device=CUDA), autocast, steps=4,
           backend="nvrtc_cudagraphs")
    _train(Norms, lambda: torch.randn(8, 33, 24, device=CUDA), autocast, steps=4,
           backend="nvrtc_cudagraphs")
    assert len(made) == 4   # a forward and a backward per model
    assert all(r.cuda_graph is not None for r in made)


def test_one_kernel_set_serves_every_size():
    _train(Norms, lambda: torch.randn(torch.randint(2, 90, ()).item(), 24, device=CUDA),
           steps=4, dynamic=True)


def test_a_second_process_compiles_nothing(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import torch, agspeed, os\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(),"
        " torch.nn.LayerNorm(8)).cuda()\n"
        "f = agspeed.optimize(m, backend='nvrtc')\n"
        "f(torch.randn(4, 8, device='cuda')).sum().backward()\n"
        "d = os.path.join(os.environ['AGSPEED_CACHE_DIR'], 'nvrtc')\n"
        "print(sorted((n, os.stat(os.path.join(d, n)).st_mtime_ns) for n in os.listdir(d)))\n")
    env = dict(os.environ, AGSPEED_CACHE_DIR=str(tmp_path / "kb"))
    runs = [subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    files = [r.stdout.strip().splitlines()[-1] for r in runs]
    assert files[0].count(".cubin") + files[0].count(".ptx") >= 2
    assert files[1] == files[0]   # the same images, none written again
