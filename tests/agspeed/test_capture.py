"""Capture in the runtime: optimized functions run as guarded graphs, and stay correct.

Every call is compared with eager on fresh inputs; every guard kind is exercised by
changing what it guards and checking the recapture and the result.
"""

import logging

import pytest

import agspeed
from agspeed import _C

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = F = None

pytestmark = pytest.mark.torch

ACTIVATION = None  # rebound by a test: a global the captured code reads


def block(x, w, scale):
    h = F.linear(x, w)
    return torch.tanh(h) * scale + x.sum(dim=-1, keepdim=True)


def uses_global(x):
    return ACTIVATION(x) * 2


def prints(x):
    print("eager only")
    return x * 2


def entries(fn):
    return _C.code_cache(fn.__code__)["entries"]


def call_entries(fn):
    return [e for e in entries(fn) if e.action == _C.ACTION_CALL]


def test_captured_function_matches_eager_with_gradients():
    fast = agspeed.optimize(block)
    for _ in range(4):
        x = torch.randn(3, 5, requires_grad=True)
        w = torch.randn(5, 5, requires_grad=True)
        got = fast(x, w, 0.5)
        want = block(x, w, 0.5)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        gx, gw = x.grad.clone(), w.grad.clone()
        x.grad = w.grad = None
        want.sum().backward()
        torch.testing.assert_close(gx, x.grad)
        torch.testing.assert_close(gw, w.grad)
    assert len(call_entries(block)) == 1
    assert call_entries(block)[0].hits == 3
    records = [r for r in agspeed._runtime.frame_records() if r.name == "block"]
    assert records[0].decision == "captured"


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "constant",
                                    "transpose"])
def test_each_guard_recaptures_and_stays_correct(change):
    fast = agspeed.optimize(block)
    x, w = torch.randn(3, 5), torch.randn(5, 5)
    fast(x, w, 0.5)
    variants = {
        "shape": (torch.randn(7, 5), w, 0.5),
        "dtype": (x.double(), w.double(), 0.5),
        "requires_grad": (x.clone().requires_grad_(), w, 0.5),
        "constant": (x, w, 2.0),
        "transpose": (torch.randn(5, 3).t(), w, 0.5),  # same shape, other strides
    }
    args = variants[change]
    torch.testing.assert_close(fast(*args), block(*args))
    assert len(call_entries(block)) == 2
    torch.testing.assert_close(fast(x, w, 0.5), block(x, w, 0.5))  # the first still hits
    assert len(call_entries(block)) == 2


def test_global_state_is_guarded():
    fast = agspeed.optimize(block)
    x, w = torch.randn(2, 5), torch.randn(5, 5)
    fast(x, w, 1.0)
    with torch.no_grad():
        out = fast(x, w, 1.0)
        assert not out.requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fast(x, w, 1.0)
        torch.testing.assert_close(out, block(x, w, 1.0))  # dtypes included
        # A captured linear alone is bf16 under autocast: the cast happens in the graph.
        assert agspeed.optimize(lambda a, b: F.linear(a, b))(x, w).dtype == torch.bfloat16
    assert len(call_entries(block)) == 3


def test_global_rebinding_is_guarded(monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ACTIVATION", torch.relu)
    fast = agspeed.optimize(uses_global)
    x = torch.randn(6)
    torch.testing.assert_close(fast(x), torch.relu(x) * 2)
    monkeypatch.setattr(__import__(__name__), "ACTIVATION", torch.tanh)
    torch.testing.assert_close(fast(x), torch.tanh(x) * 2)
    assert len(call_entries(uses_global)) == 2


def test_graph_break_resumes_and_is_logged(capsys):
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("agspeed.graph_breaks")
    logger.addHandler(handler)
    try:
        with agspeed.config.override(log="graph_breaks"):
            out = agspeed.optimize(prints)(torch.ones(2))
    finally:
        logger.removeHandler(handler)
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    assert capsys.readouterr().out == "eager only\n"  # printed once, for real
    assert any("prints" in m and "CALL" in m and "unsupported_call" in m for m in records)
    # the frame resumes after the break (agspeed._resume): a CALL entry, not eager
    assert [e.action for e in entries(prints)] == [_C.ACTION_CALL]


def test_recompile_limit_falls_back_to_eager():
    fast = agspeed.optimize(block)
    w = torch.randn(5, 5)
    with agspeed.config.override(recompile_limit=2):
        for n in (1, 2, 3, 4):
            x = torch.randn(n, 5)
            torch.testing.assert_close(fast(x, w, 1.0), block(x, w, 1.0))
    assert len(call_entries(block)) == 2
    assert entries(block)[0].action == _C.ACTION_RUN_EAGER


def test_functions_without_tensor_work_run_eager():
    def plain(a, b):
        return a * b + 1

    fast = agspeed.optimize(plain)
    assert [fast(i, 2) for i in range(5)] == [i * 2 + 1 for i in range(5)]
    assert call_entries(plain) == []
    assert len(entries(plain)) == 1


def test_non_plain_arguments_are_not_guarded_by_equality():
    class Scale:
        def __eq__(self, other):
            raise AssertionError("guards must not run user __eq__")

    def use(x, s):
        return torch.relu(x)

    fast = agspeed.optimize(use)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x, Scale()), torch.relu(x))
    torch.testing.assert_close(fast(x, Scale()), torch.relu(x))
    # `s` is never read, so it is not guarded at all: one graph serves both calls
    assert len(call_entries(use)) == 1


@pytest.mark.cxx_exceptions
def test_bad_input_raises_the_eager_error():
    fast = agspeed.optimize(block)
    x, w = torch.randn(3, 5), torch.randn(5, 5)
    fast(x, w, 1.0)
    bad = torch.randn(3, 4)
    with pytest.raises(RuntimeError) as eager:
        block(bad, w, 1.0)
    with pytest.raises(RuntimeError) as optimized:
        fast(bad, w, 1.0)
    assert str(optimized.value) == str(eager.value)


def test_autocast_state_is_read_on_torch_before_2_4():
    import types

    from agspeed.guards.state import _autocast_state

    old_api = types.SimpleNamespace(  # before 2.4 these took no device argument
        is_autocast_enabled=lambda: False,
        get_autocast_dtype=lambda: torch.float16,
        is_autocast_cpu_enabled=lambda: True,
        get_autocast_cpu_dtype=lambda: torch.bfloat16,
        get_autocast_gpu_dtype=lambda: torch.float16,
    )
    # an off device's dtype changes nothing: None
    assert _autocast_state(old_api) == ((True, torch.bfloat16), (False, None))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _autocast_state(torch)[0] == (True, torch.bfloat16)


# -- getattr/hasattr, namedtuples, dtype facts, attribute writes ------------------------

Pair = __import__("collections").namedtuple("Pair", "out aux")


class Reflective(torch.nn.Module if torch else object):
    """Reads its own attributes by name, as configurable models do."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.act = "tanh"

    def scale(self, h):
        return h * 0.5

    def forward(self, x):
        h = getattr(torch, self.act)(getattr(self, "proj")(x))
        if hasattr(self, "extra"):
            h = self.extra(h)
        if getattr(self, "norm", None) is not None:
            h = self.norm(h)
        step = getattr(self, "scale")  # a bound method as a value
        return step(h)


def graphs_of(fn, *args):
    out = agspeed.explain(fn, *args)
    return out.graph_count, out.graph_break_count


def test_getattr_and_hasattr_on_modules_capture_and_guard_absence():
    model = Reflective()
    fast = agspeed.optimize(model)
    x = torch.randn(3, 4)
    assert graphs_of(model, x) == (1, 0)
    torch.testing.assert_close(fast(x), model(x))
    code = Reflective.forward.__code__
    assert len(call_entries_of(code)) == 1
    # The attributes were guarded absent: adding one recaptures, with the new layer used.
    model.extra = torch.nn.Linear(4, 4)
    torch.testing.assert_close(fast(x), model(x))
    model.norm = torch.nn.LayerNorm(4)
    torch.testing.assert_close(fast(x), model(x))
    assert len(call_entries_of(code)) == 3
    model.act = "relu"  # the name read through getattr(torch, ...) is a guarded constant
    torch.testing.assert_close(fast(x), model(x))
    assert len(call_entries_of(code)) == 4


def partial_reflection(x, fn):
    # hasattr of methods of a builtin type (the partial's own, object's, a classmethod)
    found = [hasattr(fn, name) for name in ("__call__", "__eq__", "__reduce__",
                                             "__init_subclass__", "__setattr__")]
    return fn(x) if all(found) and not hasattr(fn, "nothing_here") else x - 1


def test_hasattr_of_a_builtin_types_methods_is_answered():
    import functools

    fn = functools.partial(torch.mul, other=2.0)
    x = torch.randn(3)
    assert graphs_of(partial_reflection, x, fn) == (1, 0)
    fast = agspeed.optimize(partial_reflection)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x, fn), partial_reflection(x, fn))


def call_entries_of(code):
    return [e for e in _C.code_cache(code)["entries"] if e.action == _C.ACTION_CALL]


def returns_pair(x):
    return Pair(torch.sigmoid(x), x.shape[0])


def reads_pair(p):
    out, aux = p
    return Pair(p.out * 2 + p[1], aux.sum())


def test_namedtuples_are_built_returned_and_read():
    fast = agspeed.optimize(returns_pair)
    x = torch.randn(5, requires_grad=True)
    got = fast(x)
    assert type(got) is Pair and got.aux == 5
    torch.testing.assert_close(got.out, torch.sigmoid(x))
    got.out.sum().backward()
    torch.testing.assert_close(x.grad, torch.sigmoid(x) * (1 - torch.sigmoid(x)))
    assert len(call_entries(returns_pair)) == 1
    p = Pair(torch.randn(3), torch.randn(3))
    got = agspeed.optimize(reads_pair)(p)
    assert type(got) is Pair
    torch.testing.assert_close(got.out, p.out * 2 + p.aux)
    torch.testing.assert_close(got.aux, p.aux.sum())
    assert len(call_entries(reads_pair)) == 1
    assert graphs_of(reads_pair, p) == (1, 0)


def clamps_to_eps(x):
    return x.clamp(min=torch.finfo(x.dtype).eps) * torch.iinfo(torch.int8).max


def test_finfo_and_iinfo_are_constants_guarded_through_the_dtype():
    fast = agspeed.optimize(clamps_to_eps)
    for dtype in (torch.float32, torch.float64, torch.float32):
        x = torch.rand(4, dtype=dtype) * 1e-7
        torch.testing.assert_close(fast(x), clamps_to_eps(x))
    assert len(call_entries(clamps_to_eps)) == 2
    assert graphs_of(clamps_to_eps, torch.rand(2)) == (1, 0)


class Counting(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2


def test_attribute_writes_are_replayed_once_per_call():
    model = Counting()
    fast = agspeed.optimize(model)
    for _ in range(3):
        torch.testing.assert_close(fast(torch.ones(2)), torch.full((2,), 2.0))
    assert model.calls == 3
    out = agspeed.explain(model, torch.ones(2))
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    assert model.calls == 4


def test_namedtuple_construction_in_an_eager_frame_is_not_a_second_break(capsys):
    def builds_in_eager(x):
        print("eager")
        return Pair(x + 1, 1)

    out = agspeed.explain(builds_in_eager, torch.ones(2))
    assert out.graph_break_count == 1  # the print; not the namedtuple's generated __new__
    assert out.break_reasons[0].function == "builds_in_eager"
    assert type(out.result) is Pair


def views_by_a_method_value(x, w):
    shape = (*x.shape[:-1], 2, -1)
    y = (x @ w).view(*shape).transpose(1, 2)  # LOAD_ATTR view, then CALL_FUNCTION_EX
    total = x.sum
    return y, total(dim=0)


def test_a_tensor_method_taken_as_a_value_is_called_in_the_graph():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4)
    report = agspeed.explain(views_by_a_method_value, x, w)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    fast = agspeed.optimize(views_by_a_method_value, backend="eager")
    for _ in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        got, expected = fast(x, w), views_by_a_method_value(x, w)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        ga = torch.autograd.grad(sum(t.sum() for t in got), x)
        gb = torch.autograd.grad(sum(t.sum() for t in expected), x)
        torch.testing.assert_close(ga[0], gb[0])


def _eager_scales(x, factors):
    try:
        big = x.sum().item() > 100   # a break under try: this frame runs eager
    except RuntimeError:
        big = False
    # its comprehension (a frame of its own before Python 3.12) then reaches the frame
    # hook with this frame's iterator as its only argument
    return [x * f for f in factors] if not big else []


def scales_through_eager_code(x):
    return sum(_eager_scales(x, [1.0, 2.0, 3.0])) + 1


def test_a_comprehension_run_by_eager_code_is_not_captured_again_on_each_call():
    agspeed.reset()
    fast = agspeed.optimize(scales_through_eager_code, backend="eager")
    for _ in range(12):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), x * 6 + 1)
    names = [r.name for r in agspeed._runtime.frame_records()]
    assert "<listcomp>" not in names
    assert not [r for r in agspeed.recompiles() if "listcomp" in r.function]


def _drops_the_optimizers_state():
    # an optimizer's step captured through a closure, as a training script writes it;
    # the weak reference says whether the capture left the optimizer in a reference
    # cycle, its state alive until the next collection
    import gc
    import weakref

    model = torch.nn.Linear(8, 8, bias=False)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=0.01)

    def opt_step():
        optimizer.step()

    step = agspeed.optimize(opt_step, backend="eager")
    model(torch.ones(8)).sum().backward()
    step()
    state = weakref.ref(optimizer.state[model.weight]["square_avg"])
    was = gc.isenabled()
    gc.disable()
    try:
        optimizer = None
        return state() is None
    finally:
        if was:
            gc.enable()


def test_a_capture_leaves_the_programs_objects_in_no_reference_cycle():
    # (the builder and the frame's locals were held by helpers that call themselves
    # through their closures' cells: the optimizer's state outlived the optimizer)
    import gc

    gc.collect()
    assert [_drops_the_optimizers_state() for _ in range(3)] == [True] * 3
