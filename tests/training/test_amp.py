"""The ordinary AMP training loop through agspeed, on every CPU backend: forward under
``torch.autocast`` (cache_enabled True and False), ``torch.amp.GradScaler`` scaling, the
backward, unscale, gradient clipping, the optimizer step through the scaler and its update,
compared step by step with the same loop in eager.  Autocast regions inside the model (a
part kept in float32, a submodule in another dtype) are captured in the graph, and a step
whose gradients are not finite is skipped as eager skips it."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import agspeed  # noqa: E402
from _train import Block, max_diff, twins  # noqa: E402

pytestmark = pytest.mark.torch

BACKENDS = ["eager", "jit", "inductor", "auto"]


class AmpNet(nn.Module):
    """Blocks under the caller's autocast, a float16 submodule, a LayerNorm and softmax
    kept in float32, and the loss."""

    def __init__(self, width=32, inner=torch.float16):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        self.mixed = Mixed(width, inner)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 5)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        h = self.mixed(h)
        with torch.autocast(h.device.type, enabled=False):
            h = self.norm(h.float())
            gate = torch.softmax(h, dim=-1)
        logits = self.head(h * gate)
        return nn.functional.cross_entropy(logits, y)


class Mixed(nn.Module):
    """A submodule under autocast to its own dtype."""

    def __init__(self, width, dtype):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.dtype = dtype

    def forward(self, h):
        with torch.autocast(h.device.type, dtype=self.dtype):
            return h + self.proj(h)


def amp_batches(n, poison=(), device="cpu"):
    """Batches; those at the steps in ``poison`` hold a value that overflows in the
    forward, so the loss and every gradient come out non-finite."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(8, 16, generator=g)
        if i in poison:
            x[0, 0] = 3e38
        out.append((x.to(device), torch.randint(0, 5, (8,), generator=g).to(device)))
    return out


def amp_step(model, opt, scaler, x, y, cache_enabled, dtype=torch.bfloat16):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype, cache_enabled=cache_enabled):
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    return loss.detach()


def run(model, data, cache_enabled, dtype=torch.bfloat16):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(data[0][0].device.type, init_scale=2.0 ** 10,
                                  growth_interval=2)
    losses, scales, params = [], [], []
    for x, y in data:
        losses.append(amp_step(model, opt, scaler, x, y, cache_enabled, dtype))
        scales.append(scaler.get_scale())
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, scales, params


def tolerance(backend):
    # the eager backend runs eager's own kernels; a compiled one rounds bf16 elsewhere
    return 0.0 if backend == "eager" else 3e-2


@pytest.mark.parametrize("cache_enabled", [True, False], ids=["cache", "nocache"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_amp_loop_with_grad_scaler_matches_eager(backend, cache_enabled, monkeypatch):
    monkeypatch.setenv("AGSPEED_AUTOTUNE_CANDIDATES", "eager,inductor,jit")
    agspeed.config.reload()
    check_amp_loop(backend, cache_enabled, "cpu", torch.bfloat16, torch.float16)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["eager", "inductor", "cudagraphs", "nvrtc",
                                     "nvrtc_cudagraphs", "auto"])
def test_amp_loop_on_cuda_matches_eager(backend, dtype, monkeypatch):
    monkeypatch.setenv("AGSPEED_AUTOTUNE_CANDIDATES",
                       "eager,inductor,cudagraphs,nvrtc,nvrtc_cudagraphs,jit")
    agspeed.config.reload()
    inner = torch.bfloat16 if dtype == torch.float16 else torch.float16
    check_amp_loop(backend, True, "cuda", dtype, inner)


def check_amp_loop(backend, cache_enabled, device, dtype, inner):
    """The loop in eager and through agspeed, the fourth step's batch overflowing."""
    ref, mine = (m.to(device) for m in twins(AmpNet, inner=inner))
    data = amp_batches(6, poison={3}, device=device)
    e_losses, e_scales, e_params = run(ref, data, cache_enabled, dtype)
    a_losses, a_scales, a_params = run(agspeed.optimize(mine, backend=backend), data,
                                       cache_enabled, dtype)
    tol = tolerance(backend)
    # the scaler saw the same overflow at the same step and no other
    assert a_scales == e_scales
    assert e_scales[3] == e_scales[2] / 2 and e_scales[4] == e_scales[3]
    assert not torch.isfinite(a_losses[3])
    # the overflowing step changed no parameter, in either run
    assert max_diff(a_params[3], a_params[2]) == 0.0
    assert max_diff(e_params[3], e_params[2]) == 0.0
    for i in (0, 1, 2, 4, 5):
        assert a_losses[i].dtype == e_losses[i].dtype == torch.float32
        assert abs(float(a_losses[i]) - float(e_losses[i])) <= tol * max(1.0, float(e_losses[i]))
        assert max_diff(a_params[i], e_params[i]) <= tol
    assert agspeed.counters()["graph_calls"] == len(data)


def grads_of(model, x, y, amp):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        model(x, y).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_gradients_are_computed_in_eager_amps_precision(backend):
    """The captured forward and backward run in bf16 where eager AMP does: the
    gradients are AMP's, not float32's, however close the two are."""
    ref, mine = twins(AmpNet)
    x, y = amp_batches(1)[0]
    amp = grads_of(ref, x, y, True)
    fp32 = grads_of(ref, x, y, False)
    got = grads_of(agspeed.optimize(mine, backend=backend), x, y, True)
    for g in got:
        assert g.dtype == torch.float32  # gradients take the parameters' dtype
    to_amp, to_fp32 = max_diff(got, amp), max_diff(got, fp32)
    amp_vs_fp32 = max_diff(amp, fp32)
    assert amp_vs_fp32 > 1e-4  # bf16 makes a visible difference in this model
    assert to_fp32 > 0.75 * amp_vs_fp32
    if backend == "eager":
        assert to_amp == 0.0
    else:
        # Inductor keeps a fused kernel's intermediates in float32 and rounds its
        # outputs to bf16: nearer AMP than float32, and exactly torch.compile's AMP
        assert to_amp < 0.6 * amp_vs_fp32
        _, other = twins(AmpNet)
        assert max_diff(got, grads_of(torch.compile(other), x, y, True)) <= 1e-6


def test_autocast_regions_in_the_model_are_one_graph():
    _, model = twins(AmpNet)
    x, y = amp_batches(1)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = agspeed.explain(model, x, y)
    assert report.graph_count == 1 and report.graph_break_count == 0
    targets = [n.target for n in report.graphs[0].graph.nodes]
    entered = [n.args for n in report.graphs[0].graph.nodes
               if n.target is torch.amp._enter_autocast]
    # the float16 submodule and the float32 part are both regions of the graph
    assert ("cpu", torch.float16, True, None) in [tuple(a) for a in entered]
    assert any(a[0] == "cpu" and a[2] is False for a in entered)
    assert targets.count(torch.amp._exit_autocast) == len(entered)


def test_a_changed_autocast_dtype_or_cache_flag_is_guarded():
    ref, mine = twins(AmpNet)
    model = agspeed.optimize(mine)
    x, y = amp_batches(1)[0]
    for dtype, cache in ((torch.bfloat16, True), (torch.float16, True),
                         (torch.bfloat16, False), (torch.bfloat16, True)):
        with torch.autocast("cpu", dtype=dtype, cache_enabled=cache):
            got = model(x, y)
            want = ref(x, y)
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert agspeed.counters()["graph_calls"] == 4
