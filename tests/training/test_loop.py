"""The rest of a training loop through an optimized model, against the same loop in
eager: optimizers and LR schedulers, ``zero_grad`` both ways, gradient clipping and
accumulation, checkpoints (``state_dict`` round trips with eager's, training resumed from
one), ``train()``/``eval()`` switches, ``no_grad`` and ``inference_mode`` evaluation, and
activation checkpointing inside the model."""

import io

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import agspeed  # noqa: E402
from _train import Block, Net, batches, max_diff, optimizer_diff, twins  # noqa: E402

pytestmark = pytest.mark.torch

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-2),
}
SCHEDULERS = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=20,
                                                               cycle_momentum=False),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
}


def train(model, opt, data, sched=None, set_to_none=True, clip=None, accumulate=1):
    losses = []
    for i, (x, y) in enumerate(data):
        if i % accumulate == 0:
            opt.zero_grad(set_to_none=set_to_none)
        loss = model(x, y) / accumulate
        loss.backward()
        losses.append(float(loss.detach()))
        if (i + 1) % accumulate == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            if sched is not None:
                sched.step()
    return losses


@pytest.mark.parametrize("sched", [None, *SCHEDULERS])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_and_schedulers_train_as_in_eager(name, sched):
    ref, mine = twins(Net)
    model = agspeed.optimize(mine)
    runs = []
    for m in (ref, model):
        opt = OPTIMIZERS[name](m.parameters())
        runs.append((opt, train(m, opt, batches(5), sched and SCHEDULERS[sched](opt))))
    (o1, l1), (o2, l2) = runs
    assert l1 == l2
    assert max_diff(ref.state_dict(), mine.state_dict()) == 0.0
    assert optimizer_diff(o1, o2) == 0.0
    assert o1.param_groups[0]["lr"] == o2.param_groups[0]["lr"]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_both_ways_clipping_and_accumulation(set_to_none):
    ref, mine = twins(Net)
    model = agspeed.optimize(mine)
    data = batches(8)
    o1 = torch.optim.SGD(ref.parameters(), lr=0.1)
    o2 = torch.optim.SGD(model.parameters(), lr=0.1)
    l1 = train(ref, o1, data, set_to_none=set_to_none, clip=0.5, accumulate=4)
    l2 = train(model, o2, data, set_to_none=set_to_none, clip=0.5, accumulate=4)
    assert l1 == l2
    assert max_diff(ref.state_dict(), mine.state_dict()) == 0.0
    for p, q in zip(ref.parameters(), mine.parameters()):
        assert (p.grad is None) == (q.grad is None)
        assert torch.equal(p.grad, q.grad)


def test_state_dict_keys_and_round_trips_with_eager_checkpoints():
    ref, mine = twins(Net)
    model = agspeed.optimize(mine)
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), batches(2))
    sd = model.state_dict()
    assert list(sd) == list(ref.state_dict())  # no wrapper prefix
    # an optimized model's checkpoint loads into an eager one and back
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    eager = Net()
    assert not eager.load_state_dict(torch.load(buf)).missing_keys
    assert max_diff(eager.state_dict(), sd) == 0.0
    fresh = agspeed.optimize(Net())
    fresh.load_state_dict(eager.state_dict())
    assert max_diff(fresh.state_dict(), sd) == 0.0
    x, _ = batches(1, seed=5)[0]
    eager.eval(), fresh.eval()
    assert torch.equal(fresh(x), eager(x))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_training_resumed_from_a_checkpoint_continues_identically(backend, tmp_path):
    data = batches(8)
    ref, mine = twins(Net)
    o1 = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    s1 = SCHEDULERS["step"](o1)
    uninterrupted = train(ref, o1, data, s1)

    model = agspeed.optimize(mine, backend=backend)
    o2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    s2 = SCHEDULERS["step"](o2)
    first = train(model, o2, data[:4], s2)
    torch.save({"model": model.state_dict(), "opt": o2.state_dict(),
                "sched": s2.state_dict()}, tmp_path / "ckpt.pt")
    del model, o2, s2, mine

    ckpt = torch.load(tmp_path / "ckpt.pt")
    resumed = Net()
    resumed.load_state_dict(ckpt["model"])
    resumed = agspeed.optimize(resumed, backend=backend)
    o3 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    o3.load_state_dict(ckpt["opt"])
    s3 = SCHEDULERS["step"](o3)
    s3.load_state_dict(ckpt["sched"])
    rest = train(resumed, o3, data[4:], s3)
    tol = 0.0 if backend == "eager" else 1e-5
    assert max(abs(a - b) for a, b in zip(first + rest, uninterrupted)) <= tol
    assert max_diff(resumed.state_dict(), ref.state_dict()) <= tol
    assert optimizer_diff(o3, o1) <= tol


def test_train_eval_switches_leave_no_stale_graph():
    ref, mine = twins(Net, dropout=0.3)
    model = agspeed.optimize(mine)
    o1 = torch.optim.SGD(ref.parameters(), lr=0.1)
    o2 = torch.optim.SGD(model.parameters(), lr=0.1)
    x, _ = batches(1, seed=3)[0]
    for epoch in range(3):
        for m, o in ((ref, o1), (model, o2)):
            torch.manual_seed(epoch)
            m.train()
            train(m, o, batches(2, seed=epoch))
        for m in (ref, model):
            m.eval()
        with torch.no_grad():
            want, got = ref(x), model(x)
        assert not got.requires_grad
        assert torch.equal(got, want)  # BatchNorm's running stats, no dropout
        assert max_diff(ref.state_dict(), mine.state_dict()) == 0.0
    assert model.training is False and all(not m.training for m in mine.modules())
    model.train()
    assert all(m.training for m in mine.modules())


def test_inference_mode_evaluation():
    ref, mine = twins(Net)
    model = agspeed.optimize(mine).eval()
    ref.eval()
    for x, y in batches(3, seed=7):
        with torch.inference_mode():
            got, want = model(x), ref(x)
            loss = model(x, y)
        assert got.is_inference() and loss.is_inference()
        assert torch.equal(got, want)
    # training again after inference_mode: gradients flow, nothing stale
    model.train(), ref.train()
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1), batches(2))
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), batches(2))
    assert max_diff(ref.state_dict(), mine.state_dict()) == 0.0


class Checkpointed(nn.Module):
    """Blocks run through ``torch.utils.checkpoint`` when training, as models that trade
    compute for memory do."""

    def __init__(self, reentrant):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(Block(32, dropout=0.2) for _ in range(3))
        self.head = nn.Linear(32, 5)
        self.reentrant = reentrant

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            if self.training:
                h = checkpoint(block, h, use_reentrant=self.reentrant)
            else:
                h = block(h)
        return nn.functional.cross_entropy(self.head(h), y)


@pytest.mark.cxx_exceptions  # the recomputation stops early by raising through libtorch
@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_inside_the_model(reentrant):
    ref, mine = twins(Checkpointed, reentrant=reentrant)
    model = agspeed.optimize(mine)
    o1 = torch.optim.SGD(ref.parameters(), lr=0.1)
    o2 = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, batch in enumerate(batches(4)):
        for m, o in ((ref, o1), (model, o2)):
            torch.manual_seed(step)  # dropout inside the checkpointed blocks
            train(m, o, [batch])
    assert max_diff(ref.state_dict(), mine.state_dict()) == 0.0
    for p, q in zip(ref.parameters(), mine.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_code_under_torch_compiler_disable_is_never_captured():
    seen = []

    @torch.compiler.disable
    def kept_eager(h):
        seen.append(torch.compiler.is_compiling())
        return inner(h)

    def inner(h):
        return h * 2

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(kept_eager(self.lin(x)))

    m = M()
    model = agspeed.optimize(m)
    x = torch.randn(2, 4)
    for _ in range(2):
        assert torch.equal(model(x), m.lin(m.lin(x) * 2))
    assert agspeed._C.code_cache(inner.__code__)["has_cache"] is False


def test_saved_tensors_hooks_see_only_what_the_program_saves():
    """A hook of the program (offloading, checkpointing) sees the tensors eager saves:
    none from the capture's own fake run, on the first call as on later ones."""
    ref, mine = twins(Net)
    model = agspeed.optimize(mine)
    packed = {}

    def run(m, key):
        packed[key] = 0

        def pack(t):
            packed[key] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = m(*batches(1)[0])
        loss.backward()

    for call in range(2):
        run(ref, ("eager", call))
        run(model, ("agspeed", call))
        assert packed[("agspeed", call)] == packed[("eager", call)] > 0
    assert max_diff([p.grad for p in ref.parameters()],
                    [p.grad for p in mine.parameters()]) == 0.0
