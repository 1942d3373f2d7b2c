"""The end of a training step inside optimized code: gradients read (``p.grad``),
``clip_grad_norm_(model.parameters())`` (a generator passed on through a decorator's
``*args``), an optimizer's ``step()`` (its per-parameter state in a defaultdict keyed by
the parameters, ``record_function``, foreach grouping), captured with eager's results and
no break; and where they cannot be, eager's results after a break."""

import collections
import copy
import functools
import gc
import types
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


def _decisions():
    return [r.decision for r in agspeed._runtime.frame_records()]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _backward(model, x):
    model.zero_grad()
    model(x).square().mean().backward()


# -- p.grad ---------------------------------------------------------------------------

def test_a_gradient_read_is_an_input_and_none_is_guarded():
    agspeed.reset()
    lin = torch.nn.Linear(4, 3)

    def fn(x):
        g = lin.weight.grad
        if g is None:
            return x * 2
        return x + g.sum()

    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), x * 2)
    lin(torch.randn(2, 4)).sum().backward()
    torch.testing.assert_close(fast(x), x + lin.weight.grad.sum())   # guard saw the grad
    lin.weight.grad = torch.ones(3, 4)           # another tensor, the same source
    torch.testing.assert_close(fast(x), x + 12)
    lin.weight.grad = None
    torch.testing.assert_close(fast(x), x * 2)


def test_a_gradient_changed_in_place_is_the_programs_gradient():
    agspeed.reset()
    model = _model()
    twin = copy.deepcopy(model)

    def halve(m):
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p.grad.mul_(0.5)

    fast = agspeed.optimize(halve, backend="eager", fullgraph=True)
    for step in range(3):
        x = torch.randn(4, 6)
        _backward(model, x)
        _backward(twin, x)
        grads = [p.grad for p in twin.parameters()]
        halve(model)
        fast(twin)
        for a, b, same in zip(model.parameters(), twin.parameters(), grads):
            assert b.grad is same   # changed in place, never replaced
            assert torch.equal(a.grad, b.grad)


def test_the_gradient_of_a_computed_tensor_breaks_with_eagers_result():
    agspeed.reset()
    w = torch.randn(3, requires_grad=True)

    def fn(x):
        y = w * 2
        return x + 1, y.grad

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # eager warns reading a non-leaf's .grad
        out, grad = agspeed.optimize(fn, backend="eager")(torch.ones(3))
        with pytest.raises(agspeed.GraphBreakError, match="Tensor.grad"):
            agspeed.optimize(fn, backend="eager", fullgraph=True)(torch.ones(3))
    assert grad is None
    torch.testing.assert_close(out, torch.full((3,), 2.0))


def test_a_gradient_read_keeps_nothing_alive():
    agspeed.reset()
    lin = torch.nn.Linear(3, 3)
    lin(torch.randn(2, 3)).sum().backward()
    fast = agspeed.optimize(lambda x: x * lin.weight.grad, backend="eager", fullgraph=True)
    fast(torch.ones(3, 3))
    fast(torch.ones(3, 3))
    grad = weakref.ref(lin.weight.grad)
    lin.weight.grad = None
    gc.collect()
    assert grad() is None


# -- generators passed on --------------------------------------------------------------

def _passing_on(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@_passing_on
def _total(items, scale=1.0):
    assert isinstance(items, types.GeneratorType)
    return sum(t.sum() for t in items) * scale


def test_a_generator_rides_through_a_decorators_args_and_kwargs():
    agspeed.reset()
    model = _model()

    def positional(m):
        return _total(m.parameters(), 2.0)

    def keyword(m):
        return _total(items=(p * 2 for p in m.parameters()))

    for fn in (positional, keyword):
        got = agspeed.optimize(fn, backend="eager", fullgraph=True)(model)
        torch.testing.assert_close(got, fn(model))


def test_a_generator_in_args_that_goes_further_breaks_with_eagers_result():
    agspeed.reset()

    def keep(*args):
        return args

    def fn(x):
        held = keep(t * 2 for t in (x, x + 1))
        return x * 3, sum(held[0])

    x = torch.randn(3)
    out = agspeed.optimize(fn, backend="eager")(x)
    torch.testing.assert_close(out[0], x * 3)
    torch.testing.assert_close(out[1], x * 2 + (x + 1) * 2)
    with pytest.raises(agspeed.GraphBreakError, match="generator"):
        agspeed.optimize(fn, backend="eager", fullgraph=True)(x)


def test_isinstance_of_a_generator_against_plain_classes_and_tensor():
    agspeed.reset()

    def fn(x):
        gen = (t for t in (x,))
        found = (isinstance(gen, types.GeneratorType), isinstance(gen, torch.Tensor),
                 isinstance(gen, (int, types.GeneratorType)))
        return x + sum(gen), found

    x = torch.randn(2)
    out, found = agspeed.optimize(fn, backend="eager", fullgraph=True)(x)
    assert found == (True, False, True)
    torch.testing.assert_close(out, x * 2)


# -- clip_grad_norm_ ---------------------------------------------------------------------

@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_norm_of_a_models_parameters_is_one_graph(foreach):
    agspeed.reset()
    model = _model()
    twin = copy.deepcopy(model)

    def clip(m):
        return torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05, foreach=foreach)

    fast = agspeed.optimize(clip, backend="eager", fullgraph=True)
    for step in range(3):
        x = torch.randn(4, 6)
        _backward(model, x)
        _backward(twin, x)
        assert torch.equal(clip(model), fast(twin))
        for a, b in zip(model.parameters(), twin.parameters()):
            assert torch.equal(a.grad, b.grad)


def test_foreach_grouping_by_device_and_dtype_matches_torchs():
    agspeed.reset()
    group = torch.utils._foreach_utils._group_tensors_by_device_and_dtype

    def fn(xs, ys, with_indices):
        made = [x * 2 for x in xs]
        return group([made, [y + 1 if y is not None else None for y in ys]],
                     with_indices=with_indices)

    xs = [torch.randn(2), torch.randn(2, dtype=torch.float64), torch.randn(3),
          torch.ones(1, dtype=torch.int64)]
    ys = [torch.randn(2), None, torch.randn(3), torch.zeros(1, dtype=torch.int64)]
    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    for with_indices in (True, False):
        ref, got = fn(xs, ys, with_indices), fast(xs, ys, with_indices)
        assert type(got) is dict and list(got) == list(ref)
        for key, (lists, idx) in ref.items():
            assert type(got[key]) is tuple and got[key][1] == idx
            assert [[None if t is None else t.shape for t in each] for each in got[key][0]] \
                == [[None if t is None else t.shape for t in each] for each in lists]
            for each, other in zip(lists, got[key][0]):
                for t, u in zip(each, other):
                    assert t is None and u is None or torch.equal(t, u)


# -- optimizer steps -------------------------------------------------------------------

# (name, options, whether the parameters are eager's bit for bit): optimizers whose step
# computes its bias corrections from the step count take torch's compile path while
# captured (``torch.compiler.is_compiling()``), as under torch.compile: the count as a
# float32 tensor, where eager takes it as a Python float, so they differ in the last bits
_OPTIMIZERS = [
    ("SGD", {}, True),
    ("SGD", dict(momentum=0.9, nesterov=True, weight_decay=0.01), True),
    ("SGD", dict(momentum=0.9, foreach=False), True),
    ("Adam", {}, False),
    ("Adam", dict(foreach=False), False),
    ("AdamW", dict(amsgrad=True), False),
    ("RMSprop", dict(momentum=0.5, centered=True), True),
    ("Adagrad", {}, False),
    ("Adamax", {}, False),
    ("NAdam", {}, False),
    ("Adadelta", {}, True),
    ("Rprop", {}, True),
]


# (the step-count corrections go through torch's tensor-scalar path, which raises in
# torch's C++ while capturing: cxx_exceptions, off under AddressSanitizer)
def _steps_side_by_side(model, opt, twin, opt2, steps):
    """``steps`` training steps of ``model`` with ``opt`` eager and of ``twin`` with
    ``opt2.step`` optimized (its wrapper breaks at torch's own ``graph_break()`` and runs
    eager; the step itself is one graph), on the same batches."""
    step = agspeed.optimize(opt2.step, backend="eager")
    for _ in range(steps):
        x = torch.randn(4, 6)
        _backward(model, x)
        _backward(twin, x)
        opt.step()
        step()


@pytest.mark.parametrize("name,options,exact", [
    pytest.param(n, o, e, id=f"{n}-{'-'.join(o) or 'default'}",
                 marks=() if e else pytest.mark.cxx_exceptions)
    for n, o, e in _OPTIMIZERS])
def test_an_optimizer_step_is_one_graph_with_eagers_parameters_and_state(name, options,
                                                                         exact):
    agspeed.reset()
    model = _model()
    twin = copy.deepcopy(model)
    opt = getattr(torch.optim, name)(model.parameters(), lr=0.01, **options)
    opt2 = getattr(torch.optim, name)(twin.parameters(), lr=0.01, **options)
    _steps_side_by_side(model, opt, twin, opt2, 4)
    for a, b in zip(model.parameters(), twin.parameters()):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ref, got = opt.state_dict(), opt2.state_dict()
    assert ref["param_groups"] == got["param_groups"]
    assert ref["state"].keys() == got["state"].keys()
    for k, entry in ref["state"].items():
        assert entry.keys() == got["state"][k].keys()
        for field, value in entry.items():
            other = got["state"][k][field]
            assert type(other) is type(value)
            if isinstance(value, torch.Tensor):
                assert (other.dtype, other.shape) == (value.dtype, value.shape)
                torch.testing.assert_close(other, value, rtol=1e-5, atol=1e-6)
    # the state is keyed by the very parameters, and a state tensor is the program's
    assert [id(p) for p in opt2.state] == \
        [id(q) for p, q in zip(model.parameters(), twin.parameters()) if p in opt.state]
    steps = [r.decision for r in agspeed._runtime.frame_records() if r.name == "step"]
    assert steps and set(steps) == {"captured"}


def test_an_optimizer_step_after_a_backward_break_is_captured():
    """A training function: the backward breaks, the resumed code calls ``opt.step()``,
    whose wrapper breaks at torch's own ``graph_break()``; the step itself (torch.optim's
    code, run eager from there) is captured."""
    agspeed.reset()
    model, twin = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt2 = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)

    def train(m, o, x):
        o.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()
        return loss

    fast = agspeed.optimize(train, backend="eager")
    for _ in range(4):
        x = torch.randn(4, 6)
        assert torch.equal(train(model, opt, x), fast(twin, opt2, x))
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    steps = [r for r in agspeed._runtime.frame_records() if r.name == "step"]
    assert steps and all(r.decision == "captured" for r in steps)


def test_an_optimizer_step_keeps_no_parameter_alive():
    agspeed.reset()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = agspeed.optimize(opt.step, backend="eager")
    for _ in range(3):
        _backward(model, torch.randn(2, 6))
        step()
    first = weakref.ref(model[0].weight)
    del model, opt, step
    gc.collect()
    assert first() is None


# -- a defaultdict keyed by parameters, record_function --------------------------------

def test_a_missing_parameter_key_of_a_program_defaultdict_is_added():
    agspeed.reset()
    state = collections.defaultdict(dict)
    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]

    def fn(x):
        for p in params:
            entry = state[p]
            if "buf" not in entry:
                entry["buf"] = torch.zeros_like(p)
            entry["buf"].add_(x)
        return x * 2

    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    x = torch.ones(3)
    fast(x)
    assert list(state) == params and all(list(state)[k] is params[k] for k in range(2))
    fast(x)
    for p in params:
        torch.testing.assert_close(state[p]["buf"], torch.full((3,), 2.0))


def test_record_function_records_nothing_and_binds_the_manager():
    agspeed.reset()

    def fn(x):
        with torch.profiler.record_function("scaled") as rf:
            y = x * 2
        return y + 1, type(rf).__name__

    x = torch.randn(3)
    out, kind = agspeed.optimize(fn, backend="eager", fullgraph=True)(x)
    assert kind == "record_function"
    torch.testing.assert_close(out, x * 2 + 1)


@pytest.mark.cxx_exceptions
def test_an_optimizer_step_is_captured_after_torch_compile_ran_in_the_process():
    """torch.compile's first use wraps every optimizer's ``_init_group`` in its own
    disable wrapper (it models that call itself): the capture calls the original."""
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    assert "_torchdynamo_disable" in vars(torch.optim.Adam.__dict__["_init_group"])
    agspeed.reset()
    model, twin = _model(), _model()
    opt, opt2 = torch.optim.Adam(model.parameters()), torch.optim.Adam(twin.parameters())
    _steps_side_by_side(model, opt, twin, opt2, 3)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    steps = [r.decision for r in agspeed._runtime.frame_records() if r.name == "step"]
    assert steps and set(steps) == {"captured"}


_SCHEDULERS = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5),
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=20),
    "plateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=1),
}


@pytest.mark.parametrize("tensor_lr", [
    False, pytest.param(True, marks=pytest.mark.cxx_exceptions)])   # (as Adam's, above)
@pytest.mark.parametrize("kind", sorted(_SCHEDULERS))
def test_a_training_function_with_an_lr_scheduler_steps_as_eager(kind, tensor_lr):
    """The scheduler's step (torch.optim's code too) after the optimizer's: the same
    learning rates, of the same type, and the same parameters as eager's."""
    agspeed.reset()
    model, twin = _model(), _model()
    made = []
    for m in (model, twin):
        lr = torch.tensor(0.05) if tensor_lr else 0.05
        opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
        made.append((opt, _SCHEDULERS[kind](opt)))

    def train(m, opt, sched, x):
        opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        sched.step(loss) if kind == "plateau" else sched.step()
        return loss

    fast = agspeed.optimize(train, backend="eager")
    for _ in range(6):
        x = torch.randn(4, 6)
        assert torch.equal(train(model, *made[0], x), fast(twin, *made[1], x))
        lrs = [o.param_groups[0]["lr"] for o, _ in made]
        assert type(lrs[0]) is type(lrs[1]) and float(lrs[0]) == float(lrs[1])
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


@pytest.mark.cxx_exceptions   # (Adam's step-count corrections, as above)
def test_adam_under_one_cycle_momentum_does_not_recapture_every_step():
    """OneCycleLR cycles Adam's ``betas[0]`` and ``lr`` every step: after three values
    both are symbols of one graph (not a capture per step up to the recompile limit),
    with eager's parameters and ``betas``."""
    agspeed.reset()
    model, twin = _model(), _model()
    opt, opt2 = torch.optim.Adam(model.parameters()), torch.optim.Adam(twin.parameters())
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=20)
              for o in (opt, opt2)]
    step = agspeed.optimize(opt2.step, backend="eager")
    for _ in range(10):
        x = torch.randn(4, 6)
        _backward(model, x)
        _backward(twin, x)
        opt.step()
        step()
        for s in scheds:
            s.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert opt.param_groups[0]["betas"] == opt2.param_groups[0]["betas"]
    (record,) = [r for r in agspeed.recompiles() if r.function.startswith("step")]
    assert record.count <= 3
    assert set(record.dynamic) == {"self.param_groups[0]['betas'][0]",
                                   "self.param_groups[0]['lr']"}
    steps = [r.decision for r in agspeed._runtime.frame_records() if r.name == "step"]
    assert set(steps) == {"captured"} and len(steps) <= 4
