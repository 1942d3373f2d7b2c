"""CUDA: the zoo on the GPU under fp16 and bf16 autocast, device changes, and AMP training
with a GradScaler, each compared with eager.

These need a CUDA device; where there is none (CI) they are skipped, and they run on a
GPU machine with `python -m pytest tests/backends/test_cuda.py`.
"""

import copy
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from test_zoo import ZOO, _outputs  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _captured(name="forward"):
    return [r for r in agspeed._runtime.frame_records()
            if r.decision == "captured" and r.name == name]


def _breaks():
    return [r for r in agspeed._runtime.frame_records() if "graph break" in r.decision]


def _step(model, inputs, ctx):
    with ctx:
        outs = _outputs(model(*inputs))
        loss = sum(o.float().sum() for o in outs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return outs, grads


def _train_like_eager(name, amp, backend="eager", tol=None, **options):
    """Three training steps of a zoo model through ``backend`` against eager's, from the
    same state, under CUDA autocast ``amp``: outputs and gradients compared."""
    cls, make_inputs = ZOO[name]
    torch.manual_seed(0)
    model = cls().cuda().train()
    for m in model.modules():  # the same result with or without a random stream
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    optimized = agspeed.optimize(model, backend=backend, **options)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    if tol is None:
        tol = {} if dtype is None else {"atol": 3e-2, "rtol": 3e-2}
    for _ in range(3):
        inputs = [t.cuda() for t in make_inputs()]
        ctx = torch.autocast("cuda", dtype=dtype) if dtype else torch.autocast("cuda", enabled=False)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if dtype is not None and tol:
            exact_model = copy.deepcopy(model).double()
            _, exact_grads = _step(exact_model, [t.double() if t.is_floating_point() else t
                                                 for t in inputs],
                                   torch.autocast("cuda", enabled=False))
            twin = copy.deepcopy(model)
            _, compiled_grads = _step(torch.compile(twin), inputs, ctx)
            compiled_grads = {k.removeprefix("_orig_mod."): g for k, g in compiled_grads.items()}
            torch._dynamo.reset()
        want, want_grads = _step(model, inputs, ctx)
        model.load_state_dict(state)
        got, got_grads = _step(optimized, inputs, ctx)
        for g, w in zip(got, want):
            assert g.device == w.device and g.dtype == w.dtype
            torch.testing.assert_close(g, w, **tol)
        assert got_grads.keys() == want_grads.keys()
        for key in want_grads:
            if dtype is None or not tol:
                torch.testing.assert_close(got_grads[key], want_grads[key], **tol)
            else:
                # A compiled kernel rounds fp16 elsewhere, and through BatchNorm over a
                # small batch the roundings can differ by more than any fixed
                # tolerance: it must be about as close to the float64 gradient as
                # eager or torch.compile (the same compiler on Dynamo's graph) is.
                exact = exact_grads[key]
                bound = max((ref[key].double() - exact).norm()
                            for ref in (want_grads, compiled_grads))
                err = (got_grads[key].double() - exact).norm()
                # (a bias before BatchNorm has a float64 gradient of zero: its fp16 one
                # is rounding alone, hence the absolute term)
                assert err <= 2 * bound + 1e-3 * exact.norm() + 1e-3, key
    assert len(_captured()) == 1, _captured()
    assert not _breaks()


@pytest.mark.parametrize("amp", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_on_cuda_matches_eager(name, amp):
    _train_like_eager(name, amp)


_COMPILED_TOL = {"fp32": {"atol": 5e-3, "rtol": 5e-3}, "fp16": {"atol": 5e-2, "rtol": 5e-2}}


@pytest.mark.parametrize("backend,amp", [("inductor", "fp32"), ("inductor", "fp16"),
                                         ("jit", "fp16"), ("cudagraphs", "fp16"),
                                         ("cudagraphs", "fp32"), ("nvrtc", "fp32"),
                                         ("nvrtc", "fp16"), ("nvrtc_cudagraphs", "fp16")])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_trains_on_each_cuda_backend_like_eager(name, backend, amp):
    _train_like_eager(name, amp, backend, _COMPILED_TOL[amp])


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_trains_through_the_autotuner_on_cuda(name):
    from agspeed.backends import autotune

    _train_like_eager(name, "bf16", "auto", {"atol": 5e-2, "rtol": 5e-2},
                      candidates=autotune.default_candidates({"cuda"}))
    (decision,) = autotune.decisions()
    assert decision.choice in autotune.default_candidates({"cuda"})


def test_cudagraphs_declares_itself_available_here():
    from agspeed import backends

    assert backends.capabilities_of(backends.get_backend("cudagraphs")).unavailable() is None


def test_device_change_makes_a_second_entry_and_both_are_reused():
    def f(x, y):
        return torch.relu(x @ y) + 1

    g = agspeed.optimize(f, backend="eager")
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(g(a, b), f(a, b))
    torch.testing.assert_close(g(a.cuda(), b.cuda()), f(a.cuda(), b.cuda()))
    assert len(_captured("f")) == 2
    for _ in range(3):
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        torch.testing.assert_close(g(x, y), f(x, y))
        torch.testing.assert_close(g(x.cuda(), y.cuda()), f(x.cuda(), y.cuda()))
    assert len(_captured("f")) == 2
    assert agspeed.counters()["cache_hits"] >= 6


def test_signature_tells_devices_apart():
    def f(x):
        return x

    code = f.__code__
    cpu = _C.frame_signature(code, {"x": torch.randn(3)})
    gpu = _C.frame_signature(code, {"x": torch.randn(3, device="cuda")})
    gpu2 = _C.frame_signature(code, {"x": torch.randn(3, device="cuda")})
    assert cpu != gpu
    assert gpu == gpu2


@pytest.mark.cxx_exceptions
def test_mixed_device_error_is_eager_error():
    def f(x, y):
        return x + y

    g = agspeed.optimize(f, backend="eager")
    x, y = torch.randn(4, 4, device="cuda"), torch.randn(2, 4, 4)
    with pytest.raises(RuntimeError) as want:
        f(x, y)
    with pytest.raises(RuntimeError) as got:
        g(x, y)
    assert str(got.value) == str(want.value)


def test_amp_training_with_grad_scaler_matches_eager():
    cls, make_inputs = ZOO["mlp"]
    torch.manual_seed(0)
    ref = cls().cuda()
    model = cls().cuda()
    model.load_state_dict(ref.state_dict())
    optimized = agspeed.optimize(model, backend="eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, model)]
    scalers = [torch.amp.GradScaler("cuda") for _ in range(2)]
    losses = ([], [])
    for _ in range(8):
        x = make_inputs()[0].cuda()
        target = torch.randn(x.shape[0], 8, device="cuda")
        for i, (m, opt, scaler) in enumerate(zip((ref, optimized), opts, scalers)):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(m(x).float(), target)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses[i].append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-3, abs=1e-4)
    for (k, w), (_, g) in zip(ref.state_dict().items(), model.state_dict().items()):
        torch.testing.assert_close(g, w, atol=1e-3, rtol=1e-3, msg=k)
    assert len(_captured()) == 1


@pytest.mark.parametrize("backend", ["cudagraphs", "nvrtc_cudagraphs"])
def test_replays_read_the_optimizers_updates_in_place(backend):
    """The replays read each parameter at its own address: six SGD steps with momentum,
    the weights compared with eager's after each, one weight given new storage midway
    (a new recording) and again later (from then on copied into the replay)."""
    from agspeed.backends import cudagraphs

    made = []

    def replay(graph):
        made.append(cudagraphs._Replay(graph))
        return made[-1]

    cls, make_inputs = ZOO["mlp"]
    torch.manual_seed(0)
    ref = cls().cuda()
    model = copy.deepcopy(ref)
    old = cudagraphs.replay
    cudagraphs.replay = replay
    try:
        optimized = agspeed.optimize(model, backend=backend)
        opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, model)]
        first = next(model.parameters())
        for step in range(6):
            if step in (2, 4):
                first.data = first.data.clone()
            x = make_inputs()[0].cuda()
            for m, opt in zip((ref, optimized), opts):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = m(x).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            for (k, w), g in zip(ref.state_dict().items(), model.state_dict().values()):
                torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3, msg=f"{step} {k}")
    finally:
        cudagraphs.replay = old
    fw = made[0]
    assert fw.records == 3 and fw.cuda_graph is not None
    assert any(p is not None for p in fw.places)
    assert first.data_ptr() not in {p[0] for p in fw.places if p is not None}
