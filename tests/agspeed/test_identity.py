"""Objects of the program guarded by type or by identity (agspeed/_identity.py): a plain
instance made afresh for each call (a dataclass batch) is captured once and served from
the cache, while every use whose answer depends on which object it is keeps the
identity check, so results stay eager's."""

import contextvars
import dataclasses
import enum
import gc
import logging
import sys
import weakref

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

from test_dynamic_scalars import entries  # noqa: E402

pytestmark = pytest.mark.torch


@dataclasses.dataclass
class Batch:
    x: "torch.Tensor"
    y: "torch.Tensor"

    def error(self, out):
        return (out - self.y).pow(2).mean()

    @property
    def size(self):
        return self.x.shape[0]


class Holder:
    def __init__(self, t):
        self.t = t


def _batch():
    return Batch(torch.randn(3, 4), torch.randn(3, 4))


def _captures(fn, calls):
    """How many of ``calls`` (each a tuple of arguments) missed ``fn``'s cache and were
    captured, and the results."""
    agspeed.reset()
    fast = agspeed.optimize(fn, backend="eager")
    before = agspeed.counters()["cache_hits"]
    outs = [fast(*args) for args in calls]
    return len(calls) - (agspeed.counters()["cache_hits"] - before), outs


def test_a_fresh_batch_object_each_call_is_captured_once():
    lin = torch.nn.Linear(4, 4)

    def step(batch):
        return batch.error(lin(batch.x)) * batch.size

    batches = [_batch() for _ in range(6)]
    misses, outs = _captures(step, [(b,) for b in batches])
    assert misses == 1
    for b, out in zip(batches, outs):
        torch.testing.assert_close(out, step(b))
    text = str(agspeed.explain(step, batches[0]))
    assert "type(batch) is the same type" in text and "batch is the same" not in text


def test_the_entry_does_not_keep_the_batch_alive():
    def f(batch):
        return batch.x + batch.y

    agspeed.reset()
    fast = agspeed.optimize(f, backend="eager")
    b = _batch()
    ref = weakref.ref(b)
    fast(b)
    count = sys.getrefcount(b)
    fast(b)
    assert sys.getrefcount(b) == count
    del b
    gc.collect()
    assert ref() is None


def test_a_batch_of_another_class_is_captured_apart():
    @dataclasses.dataclass
    class Other:
        x: "torch.Tensor"
        y: "torch.Tensor"

        def error(self, out):
            return (out - self.y).abs().mean()

    def f(batch):
        return batch.error(batch.x * 2)

    b, o = _batch(), Other(torch.randn(3, 4), torch.randn(3, 4))
    misses, outs = _captures(f, [(b,), (o,), (_batch(),)])
    assert misses == 2
    torch.testing.assert_close(outs[1], f(o))


def test_a_changed_attribute_fails_its_own_check():
    def f(h):
        return h.t * 2

    misses, outs = _captures(f, [(Holder(torch.ones(2)),), (Holder(torch.ones(3)),),
                                 (Holder(3),)])
    assert misses == 3
    assert outs[2] == 6


def test_is_between_two_objects_keeps_identity():
    def f(x, a, b):
        return x + 1 if a is b else x - 1

    x = torch.zeros(2)
    one, two = Holder(None), Holder(None)
    _, outs = _captures(f, [(x, one, one), (x, one, two), (x, two, two), (x, one, two)])
    assert [o[0].item() for o in outs] == [1, -1, 1, -1]


def test_is_none_needs_no_identity():
    def f(x, a):
        return x + 1 if a is not None else x

    misses, _ = _captures(f, [(torch.zeros(2), Holder(None)) for _ in range(4)])
    assert misses == 1


def test_one_object_reached_by_two_names_stays_one_object():
    def f(a, b):
        a.t = a.t + 1
        return b.t * 2

    h = Holder(torch.zeros(2))
    g, k = Holder(torch.zeros(2)), Holder(torch.full((2,), 5.0))
    _, outs = _captures(f, [(h, h), (g, k)])
    assert outs[0].tolist() == [2.0, 2.0]
    assert outs[1].tolist() == [10.0, 10.0]
    assert g.t.tolist() == [1.0, 1.0]


def test_an_object_kept_by_the_program_is_this_calls():
    seen = []

    def f(x, h):
        seen.append(h)
        return x * 2

    calls = [(torch.ones(2), Holder(i)) for i in range(3)]
    _captures(f, calls)
    assert [s.t for s in seen] == [0, 1, 2]


def test_an_object_written_to_another_is_this_calls():
    class State:
        last = None

    state = State()

    def f(x, h):
        state.last = h
        return x + 1

    calls = [(torch.ones(2), Holder(i)) for i in range(3)]
    agspeed.reset()
    fast = agspeed.optimize(f, backend="eager")
    for args in calls:
        fast(*args)
        assert state.last is args[1]


def test_a_logging_call_gets_this_calls_object(caplog):
    log = logging.getLogger("agspeed.tests.identity")

    def f(x, h):
        log.warning("holder %s", h.t, extra={"holder": h})
        return x + 1

    fast = agspeed.optimize(f, backend="eager")
    holders = [Holder(i) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="agspeed.tests.identity"):
        for h in holders:
            fast(torch.ones(2), h)
    records = [r for r in caplog.records if r.name == "agspeed.tests.identity"]
    assert [r.holder for r in records] == holders


def test_a_dict_keyed_by_the_object_answers_for_this_call():
    def f(x, a, b):
        table = {a: 1.0}
        return x + table.get(b, -1.0)

    one, two = Holder(0), Holder(0)
    _, outs = _captures(f, [(torch.zeros(1), one, one), (torch.zeros(1), one, two)])
    assert [o.item() for o in outs] == [1.0, -1.0]


def test_an_f_string_of_the_object_names_this_call():
    def f(x, h):
        return x + 1, f"{h}"

    holders = [Holder(i) for i in range(3)]
    _, outs = _captures(f, [(torch.zeros(1), h) for h in holders])
    assert [o[1] for o in outs] == [repr(h) for h in holders]


def test_enum_members_stay_guarded_by_identity():
    class Mode(enum.Enum):
        A = 1
        B = 2

    def f(x, mode):
        return x + 1 if mode is Mode.A else x - 1

    x = torch.zeros(1)
    _, outs = _captures(f, [(x, Mode.A), (x, Mode.B), (x, Mode.A)])
    assert [o.item() for o in outs] == [1.0, -1.0, 1.0]


def test_a_module_argument_stays_guarded_by_identity():
    def f(m, x):
        return m(x)

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    x = torch.randn(1, 2)
    _, outs = _captures(f, [(a, x), (b, x)])
    torch.testing.assert_close(outs[1], b(x))


def test_a_resume_function_reads_this_calls_object():
    def f(x, boxes):
        box = boxes[0]
        y = x * 2
        torch._dynamo.graph_break()
        return y + box.t

    agspeed.reset()
    fast = agspeed.optimize(f, backend="eager")
    for i in range(4):
        boxes = (Holder(torch.full((2,), float(i))),)
        out = fast(torch.ones(2), boxes)
        assert out.tolist() == [2.0 + i, 2.0 + i]
    assert agspeed.counters()["cache_hits"] >= 3


def in_place_then_identity(x):
    y = x.add_(1)
    z = torch.Tensor.mul_(y, 2)
    c = z.contiguous()       # already contiguous: eager answers z itself
    return y is x, len({x, y, z, c}), y in {x}, c is x, c * 1


def in_place_on_one_of_two(p, q):
    y = p.add_(1)
    return y in {q}, q in {y}


def test_an_in_place_result_is_the_tensor_it_changed():
    got = agspeed.optimize(in_place_then_identity, backend="eager")(torch.zeros(3))
    want = in_place_then_identity(torch.zeros(3))
    assert got[:4] == want[:4] == (True, 1, True, True)
    torch.testing.assert_close(got[4], want[4])
    report = agspeed.explain(in_place_then_identity, torch.zeros(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_an_in_place_result_on_one_tensor_passed_twice():
    fast = agspeed.optimize(in_place_on_one_of_two, backend="eager")
    p, q = torch.zeros(2), torch.zeros(2)
    assert fast(p, p) == (True, True)
    assert fast(p, q) == (False, False)
    assert fast(q, q) == (True, True)


def picks(x, y):
    return x * 2 if x is y else x + y


def test_is_between_two_tensors_is_decided_and_guarded():
    backend_graphs = []
    fast = agspeed.optimize(picks, backend=lambda gm, ex: backend_graphs.append(gm) or gm)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(fast(a, b), a + b)
    torch.testing.assert_close(fast(b, a), a + b)
    torch.testing.assert_close(fast(a, a), a * 2)   # one tensor twice: captured again
    torch.testing.assert_close(fast(b, torch.ones(3)), b + 1)
    assert len(backend_graphs) == 2
    report = agspeed.explain(picks, a, b)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


# -- builtin objects that show only their class and attributes (a ContextVar's Token) --

_VAR = contextvars.ContextVar("test_identity_var", default=None)


class _Setter:
    """Sets and resets ``_VAR`` in calls the capture cannot follow (ContextVar.set and
    reset are builtin methods): they run eager, and the Token crosses the frame."""

    def set(self, value):
        return _VAR.set(value)

    def reset(self, token):
        _VAR.reset(token)


_SETTER = _Setter()


def reset_through(x, token):
    try:
        y = x.sin() * 2
    finally:
        _SETTER.reset(token)
    return y


def set_then_reset(x):
    token = _SETTER.set("inside")
    try:
        y = x.cos() + 1
    finally:
        _SETTER.reset(token)
    return y


def test_a_token_made_per_call_and_passed_in_is_captured_once():
    agspeed.reset()
    fast = agspeed.optimize(reset_through, backend="eager")
    for i in range(10):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x, _VAR.set(i)), x.sin() * 2)
        assert _VAR.get() is None      # this call's reset ran, with its own token
    # one capture serves every call (a token was identity-guarded before: a capture
    # on every call)
    assert len(entries(reset_through)) == 1
    assert agspeed.recompiles() == []


def test_a_token_on_a_resume_functions_stack_is_captured_once():
    agspeed.reset()
    fast = agspeed.optimize(set_then_reset, backend="eager")
    for _ in range(12):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), x.cos() + 1)
        assert _VAR.get() is None
    # the frame and the resume function after its break, once each (a token was
    # identity-guarded before: a capture on every call)
    assert len(entries(set_then_reset)) == 1
    assert agspeed.recompiles() == []


def test_the_entry_does_not_keep_a_token_alive():
    agspeed.reset()
    fast = agspeed.optimize(reset_through, backend="eager")
    token = _VAR.set(1)
    before = sys.getrefcount(token)
    fast(torch.randn(2), token)
    fast(torch.randn(2), _VAR.set(2))
    gc.collect()     # (the capture's own records, a cycle, go with it)
    assert sys.getrefcount(token) == before
    assert _VAR.get() is None


def tokens_compared(x, a, b):
    return x + 1 if a is b else x - 1


def test_is_between_two_tokens_keeps_identity():
    t1, t2 = _VAR.set(1), _VAR.set(2)
    x = torch.zeros(2)
    _, outs = _captures(tokens_compared, [(x, t1, t1), (x, t1, t2), (x, t2, t2)])
    assert [o.tolist() for o in outs] == [[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]]
    _VAR.reset(t2)
    _VAR.reset(t1)


def old_value_of(x, token):
    return x * 2 if token.old_value is None else x * 3


def test_a_tokens_attribute_is_checked_on_its_own():
    x = torch.ones(2)
    t0 = _VAR.set(None)
    t1 = _VAR.set("a")     # old value None
    t2 = _VAR.set("b")     # old value "a"
    _, outs = _captures(old_value_of, [(x, t1), (x, t2), (x, t1)])
    assert [o.tolist() for o in outs] == [[2.0, 2.0], [3.0, 3.0], [2.0, 2.0]]
    for token in (t2, t1, t0):
        _VAR.reset(token)


def to_dtype(x, dtype):
    return x.to(dtype) * 2


def test_torch_dtypes_stay_guarded_by_identity():
    x = torch.ones(2)
    _, outs = _captures(to_dtype, [(x, torch.float64), (x, torch.float16), (x, torch.float64)])
    assert [o.dtype for o in outs] == [torch.float64, torch.float16, torch.float64]
