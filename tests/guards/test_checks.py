"""Each guard kind: change what it guards and see a second capture with the right result,
the first entry still serving the first input, and the recompile log naming the failing
guard with its old and new value.  Then each graph-break path: eager's result, callees
still captured, and a graph_breaks log line with file:line, instruction and reason."""

import contextlib

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import agspeed  # noqa: E402
from _logs import logged  # noqa: E402
from agspeed import _C  # noqa: E402

pytestmark = pytest.mark.torch

FLAG = 1  # a global the captured code branches on


class Counting:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def f_tensor(x):
    return torch.tanh(x) * 2


def f_constant(x, c):
    if c is None:
        return x + 1
    return x * c


def f_global(x):
    if FLAG == 1:
        return x + 1
    return x - 1


def make_closure(k):
    def f_closure(x):
        return x * k
    return f_closure


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        y = self.inner(x)
        if self.training:
            y = y * 2
        return y


@pytest.mark.parametrize("kind, second, old, new", [
    ("dtype", lambda x: x.double(), "float32", "float64"),
    ("shape", lambda x: torch.randn(5, 4), "[3, 4]", "[5, 4]"),
    ("strides", lambda x: torch.randn(4, 3).t(), "stride=[4, 1]", "stride=[1, 3]"),
    ("requires_grad", lambda x: x.detach().requires_grad_(), "requires_grad=False",
     "requires_grad=True"),
])
def test_tensor_guards(kind, second, old, new):
    backend = Counting()
    fast = agspeed.optimize(f_tensor, backend=backend)
    x = torch.randn(3, 4)
    with logged("recompiles", "guards") as messages:
        torch.testing.assert_close(fast(x), f_tensor(x))
        y = second(x)
        torch.testing.assert_close(fast(y), f_tensor(y))
        torch.testing.assert_close(fast(x), f_tensor(x))
        torch.testing.assert_close(fast(y), f_tensor(y))
    assert backend.graphs == 2
    recompile = [m for m in messages if "recompiling" in m]
    assert len(recompile) == 1
    assert "f_tensor" in recompile[0] and old in recompile[0] and new in recompile[0]
    guards = [m for m in messages if "guards:" in m]
    assert len(guards) == 2 and "x tensor Tensor(dtype=torch.float32" in guards[0]


@pytest.mark.parametrize("first, second", [
    (2, 3), (2.5, 0.5), (True, False), (None, 4), ("a", "b"),
])
def test_constant_argument_guards(first, second):
    def plain(x, c):
        return f_constant(x, c if not isinstance(c, str) else len(c))

    def f(x, c):
        return f_constant(x, c if not isinstance(c, str) else len(c))

    backend = Counting()
    fast = agspeed.optimize(f, backend=backend)
    x = torch.randn(3)
    with logged("recompiles") as messages:
        for c in (first, second, first, second):
            torch.testing.assert_close(fast(x, c), plain(x, c))
    assert backend.graphs == 2
    (line,) = [m for m in messages if "recompiling" in m]
    assert f"expected {first!r}" in line or f"== {first!r}" in line or repr(first) in line
    assert repr(second) in line


def test_global_guard(monkeypatch):
    backend = Counting()
    fast = agspeed.optimize(f_global, backend=backend)
    x = torch.randn(3)
    with logged("recompiles") as messages:
        torch.testing.assert_close(fast(x), x + 1)
        monkeypatch.setitem(globals(), "FLAG", 2)
        torch.testing.assert_close(fast(x), x - 1)
        monkeypatch.setitem(globals(), "FLAG", 1)
        torch.testing.assert_close(fast(x), x + 1)
    assert backend.graphs == 2
    (line,) = [m for m in messages if "recompiling" in m]
    assert "FLAG" in line and "1" in line and "2" in line


def test_closure_cell_guard():
    f = make_closure(2.0)
    backend = Counting()
    fast = agspeed.optimize(f, backend=backend)
    x = torch.randn(3)
    with logged("recompiles") as messages:
        torch.testing.assert_close(fast(x), x * 2)
        f.__closure__[0].cell_contents = 5.0
        torch.testing.assert_close(fast(x), x * 5)
        f.__closure__[0].cell_contents = 2.0
        torch.testing.assert_close(fast(x), x * 2)
    assert backend.graphs == 2
    (line,) = [m for m in messages if "recompiling" in m]
    assert "2.0" in line and "5.0" in line


def test_module_identity_and_training_guards():
    torch.manual_seed(0)
    model = Holder()
    backend = Counting()
    fast = agspeed.optimize(model, backend=backend)
    x = torch.randn(2, 4)
    with logged("recompiles") as messages:
        torch.testing.assert_close(fast(x), model(x))
        model.eval()
        torch.testing.assert_close(fast(x), model(x))
        model.train()
        torch.testing.assert_close(fast(x), model(x))
        assert backend.graphs == 2
        old = model.inner
        model.inner = nn.Linear(4, 4)  # another module in the same slot
        torch.testing.assert_close(fast(x), model(x))
        assert backend.graphs == 3
        model.inner = old
        torch.testing.assert_close(fast(x), model(x))
        assert backend.graphs == 3
    lines = [m for m in messages if "recompiling" in m]
    assert any("training" in m and "True" in m and "False" in m for m in lines)
    assert any("self.inner" in m for m in lines)


@pytest.mark.parametrize("state", ["no_grad", "autocast", "default_dtype", "deterministic",
                                   "deterministic_warn_only"])
def test_global_state_guards(state):
    backend = Counting()
    fast = agspeed.optimize(f_tensor, backend=backend)
    x = torch.randn(3, 4)
    scopes = {
        "no_grad": torch.no_grad,
        "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        "default_dtype": _default_double,
        "deterministic": _deterministic,
        "deterministic_warn_only": lambda: _deterministic(warn_only=True),
    }
    words = {"no_grad": "grad=off", "autocast": "cpu:on bfloat16",
             "default_dtype": "default_dtype=float64", "deterministic": "deterministic=on",
             "deterministic_warn_only": "deterministic=warn_only"}
    with logged("recompiles", "guards") as messages:
        torch.testing.assert_close(fast(x), f_tensor(x))
        with scopes[state]():
            got, want = fast(x), f_tensor(x)
            torch.testing.assert_close(got, want)
            assert got.requires_grad == want.requires_grad and got.dtype == want.dtype
        torch.testing.assert_close(fast(x), f_tensor(x))
    assert backend.graphs == 2
    (line,) = [m for m in messages if "recompiling" in m]
    assert "global state" in line and words[state] in line
    assert any("global state ==" in m for m in messages if "guards:" in m)


@contextlib.contextmanager
def _deterministic(warn_only=False):
    old = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old[0], warn_only=old[1])


def test_deterministic_warn_only_is_guarded_apart_from_deterministic():
    backend = Counting()
    fast = agspeed.optimize(f_tensor, backend=backend)
    x = torch.randn(3, 4)
    with _deterministic():
        torch.testing.assert_close(fast(x), f_tensor(x))
    with _deterministic(warn_only=True):
        torch.testing.assert_close(fast(x), f_tensor(x))
    with _deterministic():
        torch.testing.assert_close(fast(x), f_tensor(x))
    assert backend.graphs == 2


@contextlib.contextmanager
def _default_double():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# -- graph-break paths --------------------------------------------------------------------


def callee(x):
    return torch.sigmoid(x) * 3


def b_data_dependent(x):
    if x.sum() > 0:
        return callee(x)
    return callee(-x)


def b_print(x):
    print("side")
    return callee(x)


def b_item(x):
    n = x.abs().max().item()
    if n > 100:
        return x
    return callee(x)


def b_try(x):
    try:
        raise ValueError
    except ValueError:
        y = x
    return callee(y)


def b_generator(x):
    yield callee(x)


class Stateful(nn.Module):
    """A counter written through a property setter: a write the capture does not replay
    (agspeed/_effects.py), so the frame breaks and runs eager."""

    def __init__(self):
        super().__init__()
        self._count = 0

    @property
    def count(self):
        return self._count

    @count.setter
    def count(self, value):
        self._count = value

    def forward(self, x):
        self.count += 1
        return callee(x)


# graphs: how many the backend compiles; own: whether the callee gets its own entry.
# A frame that resumes after its break (agspeed._resume) compiles the graph before the
# break, if it does any work, and its resume function's, with the callee inlined there;
# one that cannot resume (under try) runs eager and the callee is captured on its own.
# The attribute write resumes, its callee inlined in the resume function's graph; the
# counter it reads changes on every call, so the part before the break is captured
# again (the break logged each time) until the counter is a symbol (dynamic_after=3),
# and that part's graph computes the new count.
@pytest.mark.parametrize("name, fn, instruction, reason, graphs, own", [
    ("data_dependent", b_data_dependent, "POP_JUMP", "data_dependent", 2, 0),
    ("print", b_print, "CALL", "unsupported_call", 1, 0),
    ("item", b_item, "CALL", "data_dependent", 2, 0),
    ("try", b_try, "RAISE_VARARGS", "raise", 1, 1),
    ("attribute_write", None, "STORE_ATTR", "side_effect", 2, 0),
])
def test_graph_break_paths(name, fn, instruction, reason, graphs, own, capsys):
    model = Stateful() if fn is None else None
    target = model if fn is None else fn
    backend = Counting()
    fast = agspeed.optimize(target, backend=backend)
    x = torch.randn(3)
    with logged("graph_breaks") as messages:
        for _ in range(3):
            torch.testing.assert_close(fast(x), target(x))
    if name == "print":
        assert capsys.readouterr().out == "side\n" * 6
    if model is not None:
        assert model.count == 6
    assert backend.graphs == graphs
    callee_entries = [e for e in _C.code_cache(callee.__code__)["entries"]
                      if e.action == _C.ACTION_CALL and e.context.backend is backend]
    assert len(callee_entries) == own
    # Logged once; the attribute counter's break is met at each of the three captures.
    assert len(messages) == (3 if name == "attribute_write" else 1)
    line = messages[0]
    code = (target.forward if fn is None else fn).__code__
    assert "test_checks.py:" in line
    assert f"{code.co_name} (" in line
    assert reason in line and instruction in line


def uses_generator(x):
    return sum(b_generator(x))


def boxes_generator(x):
    (gen,) = [b_generator(x)]   # a generator in a container cannot be a graph argument
    return sum(gen)


def test_generators_capture_where_consumed_and_run_eager_when_they_escape():
    backend = Counting()
    fast = agspeed.optimize(uses_generator, backend=backend)
    x = torch.randn(3)
    assert agspeed.explain(uses_generator, x).break_reasons == []
    for _ in range(2):
        torch.testing.assert_close(fast(x), callee(x))
    assert backend.graphs == 1  # the generator's work, in uses_generator's graph
    assert len(_C.code_cache(uses_generator.__code__)["entries"]) == 1
    assert _C.code_cache(b_generator.__code__)["entries"] == []  # generators: never decided
    backend = Counting()
    fast = agspeed.optimize(boxes_generator, backend=backend)
    explained = agspeed.explain(boxes_generator, x)
    (brk,) = explained.break_reasons
    assert brk.reason == "generator" and brk.function == "boxes_generator"
    for _ in range(2):
        torch.testing.assert_close(fast(x), callee(x))
    assert backend.graphs == 1  # callee, run from the eager generator's frame
    assert _C.code_cache(b_generator.__code__)["entries"] == []


# -- dispatch by signature -----------------------------------------------------------------


def scaled(x):
    return x * 2 + x.shape[0]


@pytest.mark.parametrize("bits", [64, 1])
def test_many_shapes_each_hit_their_own_entry_even_when_signatures_collide(bits):
    backend = Counting()
    fast = agspeed.optimize(scaled, backend=backend, dynamic=False)  # one entry per size
    sizes = list(range(1, 13))
    try:
        _C._set_signature_bits(bits)  # 1 bit: every entry in one of two buckets
        with agspeed.config.override(recompile_limit=64):
            for _ in range(2):
                for n in sizes + sizes[::-1]:
                    x = torch.randn(n, 2)
                    torch.testing.assert_close(fast(x), x * 2 + n)
    finally:
        _C._set_signature_bits(64)
    assert backend.graphs == len(sizes)
    entries = [e for e in _C.code_cache(scaled.__code__)["entries"]
               if e.action == _C.ACTION_CALL]
    assert len(entries) == len(sizes)
    assert all(e.has_signature for e in entries)
    assert sorted(e.hits for e in entries) == [3] * len(sizes)
    distinct = {e.signature for e in entries}
    assert len(distinct) == (len(sizes) if bits == 64 else len(distinct))
    assert bits == 64 or distinct <= {0, 1}


def test_recompile_logs_closest_entry_and_verbose_lists_every_entry():
    fast = agspeed.optimize(f_tensor, backend=Counting(), dynamic=False)
    shapes = [(2, 4), (3, 4), (4, 4)]
    with logged("recompiles", "recompiles_verbose") as messages:
        for shape in shapes:
            fast(torch.randn(*shape))
        fast(torch.randn(3, 4, dtype=torch.float64))  # closest: the (3, 4) float32 one
    short = [m for m in messages if "closest failed" in m]
    verbose = [m for m in messages if "entry" in m and "of" in m and "closest" not in m]
    assert len(short) == 3
    assert "2 entries cached" in short[1] and "3 entries cached" in short[2]
    assert "float32" in short[2] and "float64" in short[2] and "[3, 4]" in short[2]
    assert len(verbose) == 1 + 2 + 3  # every entry on every recompile
    assert all("f_tensor (test_checks.py:" in m for m in short + verbose)


def test_recompiles_summary_counts_per_function():
    fast = agspeed.optimize(f_tensor, backend=Counting())
    for n in (1, 2, 3):
        fast(torch.randn(n))
    fast(torch.randn(1))  # a hit: not a recompile
    (row,) = [r for r in agspeed.recompiles() if r.function.startswith("f_tensor (")]
    assert row.count == 2
    assert len(row.reasons) == 2 and all("shape=" in r for r in row.reasons)
    agspeed.reset()
    assert agspeed.recompiles() == []


class ScaledBySum(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = [2.0]

    def forward(self, x):
        return x * sum(self.scales)


def test_a_list_changed_in_place_between_calls_fails_its_guard():
    # the expectation is a copy (not the list itself), and the structure memo does not
    # vouch for a list, whose contents change without any watched dict changing
    model = ScaledBySum()
    fast = agspeed.optimize(model, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(fast(x), x * 2)
    torch.testing.assert_close(fast(x), x * 2)
    model.scales.append(3.0)
    torch.testing.assert_close(fast(x), x * 5)
    model.scales[0] = 1.0
    torch.testing.assert_close(fast(x), x * 4)


# -- values read whole: index tuples with ... and slices, sets ------------------------------


def takes_an_index(a, ind):
    return a[ind]


@pytest.mark.parametrize("first, second", [
    ((0, ...), (1, ...)), ((..., 0), (..., 1)), ((0, slice(None)), (1, slice(None))),
    ((slice(0, 1),), (slice(1, 2),)), ([0, ...], [1, ...]), (slice(0, 1), slice(1, 2)),
])
def test_an_index_holding_ellipsis_or_slices_is_guarded_by_value(first, second):
    fast = agspeed.optimize(takes_an_index, backend="eager")
    t = torch.arange(6.0).reshape(2, 3)
    for ind in (first, second, first):
        torch.testing.assert_close(fast(t, ind), t[ind])


TAGS = {1, 2}


def counts_tags(x):
    return (x + 1 if 3 in TAGS else x - 1) * len(TAGS)


def test_a_set_of_the_program_is_guarded_by_its_contents():
    fast = agspeed.optimize(counts_tags, backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(fast(x), (x - 1) * 2)
    TAGS.add(3)
    try:
        torch.testing.assert_close(fast(x), (x + 1) * 3)
        TAGS.discard(1)
        torch.testing.assert_close(fast(x), (x + 1) * 2)
    finally:
        TAGS.clear()
        TAGS.update({1, 2})
    (record,) = agspeed.recompiles()
    assert "TAGS" in record.reasons[0]
