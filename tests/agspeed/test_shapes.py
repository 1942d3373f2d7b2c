"""Dynamic shapes: a dimension that keeps changing is captured once with a symbolic size
and that graph serves every later size; marks and optimize(dynamic=...) decide up front;
results equal eager's (outputs and gradients) at every size; promotion replaces the
static entries and does not count toward the recompile limit; the logs name the
dimension and why; compiled guards agree with their Python reading; nothing leaks."""

import gc
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from test_checks import Counting, logged  # noqa: E402
from test_zoo import ZOO  # noqa: E402

pytestmark = pytest.mark.torch


def scale_shift(x, w):
    return (x @ w).relu() * 2 + x.shape[1]


def entries(fn):
    code = fn.__code__ if hasattr(fn, "__code__") else type(fn).forward.__code__
    return _C.code_cache(code)["entries"]


def check_sizes(fast, plain, make, sizes, **tol):
    """fast(*make(n)) equals plain(*make(n)), outputs and input gradients, per size."""
    for n in sizes:
        args = make(n)
        grads = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        ref = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        got, want = fast(*grads), plain(*ref)
        torch.testing.assert_close(got, want, **tol)
        got.float().sum().backward()
        want.float().sum().backward()
        for g, r in zip(grads, ref):
            if r.grad is not None:
                torch.testing.assert_close(g.grad, r.grad, **tol)


# -- automatic promotion ------------------------------------------------------------------


def test_a_dimension_that_keeps_changing_goes_dynamic_after_dynamic_after_sizes():
    backend = Counting()
    fast = agspeed.optimize(scale_shift, backend=backend)
    w = torch.randn(8, 4)
    check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), [5, 6])
    assert backend.graphs == 2 and all(e.signed for e in entries(scale_shift))
    check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), range(7, 40))
    assert backend.graphs == 3
    (entry,) = entries(scale_shift)   # the static entries of 5 and 6 were replaced
    assert entry.action == _C.ACTION_CALL and not entry.signed
    assert entry.hits == 40 - 8
    check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), [5, 6, 64])
    assert backend.graphs == 3


def test_dynamic_after_is_configurable_from_python_and_the_environment(monkeypatch):
    w = torch.randn(8, 4)
    with agspeed.config.override(dynamic_after=2):
        backend = Counting()
        fast = agspeed.optimize(scale_shift, backend=backend)
        check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), range(2, 12))
        assert backend.graphs == 2
    agspeed.reset()
    monkeypatch.setenv("AGSPEED_DYNAMIC_AFTER", "5")
    agspeed.config.reload()
    assert agspeed.config.dynamic_after == 5
    backend = Counting()
    fast = agspeed.optimize(scale_shift, backend=backend)
    check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), range(2, 12))
    assert backend.graphs == 5
    with pytest.raises(ValueError):
        agspeed.config.set(dynamic_after=0)


def test_sizes_zero_and_one_compile_apart_and_stay_correct():
    backend = Counting()
    fast = agspeed.optimize(scale_shift, backend=backend)
    w = torch.randn(8, 4)
    check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), [3, 4, 5, 9])
    assert backend.graphs == 3
    check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), [1, 0, 1, 0, 17])
    assert backend.graphs == 5   # size 1 and size 0, once each
    signed = sorted(e.signed for e in entries(scale_shift))
    assert signed == [False, True, True]


def test_a_branch_on_a_size_is_guarded_on_both_sides():
    def branchy(x):
        if x.shape[0] > 6:
            return x.sum(0) * 2
        return x.mean(0)

    backend = Counting()
    fast = agspeed.optimize(branchy, backend=backend)
    sizes = [3, 4, 5, 6, 2, 7, 8, 30, 5, 9]
    for n in sizes:
        x = torch.randn(n, 3)
        torch.testing.assert_close(fast(x), branchy(x))
    dynamic = [e for e in entries(branchy) if not e.signed]
    assert len(dynamic) == 2 and backend.graphs == 4
    lines = [line for e in dynamic for line in e.guard.lines() if line.startswith("size:")]
    assert "size: x.size(0) > 6" in lines and "size: x.size(0) <= 6" in lines


def test_sizes_used_as_plain_ints_are_specialized_and_correct():
    def rows(x):
        out = x[0] * 0
        for i in range(x.shape[0]):      # a loop needs the size itself
            out = out + x[i] * i
        return out + len(x)

    fast = agspeed.optimize(rows, backend="eager")
    for n in [2, 3, 4, 5, 6, 3]:
        x = torch.randn(n, 4)
        torch.testing.assert_close(fast(x), rows(x))


def test_a_sizes_tuple_methods_fold_on_known_sizes(caplog):
    def where_is(x):
        made = torch.Size([2, 3, 4])
        return x * made.index(3) + x.shape.count(2) + x.size().index(x.shape[-1])

    fast = agspeed.optimize(where_is, backend="eager")
    for _ in range(2):
        x = torch.randn(2, 5)
        torch.testing.assert_close(fast(x), where_is(x))
    assert "internal error" not in caplog.text
    report = agspeed.explain(where_is, torch.randn(2, 5))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_size_arithmetic_views_and_slices_follow_the_size():
    def reshape(x, bias):
        b, t, c = x.shape
        h = x.view(b * t, c).relu().view(b, t, c)
        y = h[:, : t - 1] + bias[:, : t - 1]
        return y.reshape(b, -1).sum(1) + x.size(1) // 2, x.shape

    fast = agspeed.optimize(reshape, backend="eager")
    bias = torch.randn(1, 64, 4)
    for t in [3, 4, 5, 6, 9, 17, 5, 2]:
        x = torch.randn(2, t, 4)
        got, want = fast(x, bias), reshape(x, bias)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is torch.Size
    assert sum(not e.signed for e in entries(reshape)) == 1


def test_shapes_joined_sliced_and_padded_stay_symbolic():
    """A shape sliced and joined with a tuple (``x.size()[:-1] + (n,)``, transformers'
    Conv1D), ``tuple(x.shape)`` and ``F.pad`` (whose C++ body reads plain sizes) keep
    a dynamic dimension dynamic: one graph, and the shapes come back as torch.Size."""
    def head(x, w):
        y = (x.view(-1, x.size(-1)) @ w).view(x.size()[:-1] + (w.shape[1],))
        z = torch.nn.functional.pad(y, (0, 1), value=-1.0)
        parts = (-1,) + tuple(z.shape)[1:]
        return z.reshape(parts).relu(), y.size()[1:] + (2,)

    w = torch.randn(4, 3)
    fast = agspeed.optimize(head, backend="eager", dynamic=True)
    for t in [3, 5, 8, 2, 13]:
        x = torch.randn(2, t, 4)
        got, want = fast(x, w), head(x, w)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is torch.Size
    assert len(entries(head)) == 1 and not entries(head)[0].signed

    def containers(x):
        sizes = list(x.shape)
        sizes[0] = -1
        return x.reshape(sizes) * 2, tuple(x.shape), sizes, x.shape[1:] * 2, \
            [pair for pair in zip(x.shape, reversed(x.shape))]

    fast = agspeed.optimize(containers, backend="eager", dynamic=True)
    for n in [3, 5, 8]:
        x = torch.randn(n, n + 1)
        got, want = fast(x), containers(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] and [type(v) for v in got] == [type(v) for v in want]
    assert len(entries(containers)) == 1


def test_non_contiguous_inputs_check_their_strides_symbolically():
    def f(x):
        return x * 3 + 1

    fast = agspeed.optimize(f, backend="eager", dynamic=True)
    for n in [4, 5, 6]:
        base = torch.randn(n, 7)
        torch.testing.assert_close(fast(base), f(base))
        t = base.t()                       # strides (1, 7): another layout
        torch.testing.assert_close(fast(t), f(t))
        s = torch.randn(n, 14)[:, ::2]     # strides (14, 2)
        torch.testing.assert_close(fast(s), f(s))
    dynamic = [e for e in entries(f) if not e.signed]
    assert len(dynamic) == 3   # one per layout, each serving every size


def test_a_graph_break_under_dynamic_shapes_serves_every_size():
    def breaks(x):
        y = x * 2
        if y.sum() > 0:     # the value of a tensor: a graph break
            return y
        return -y

    fast = agspeed.optimize(breaks, backend="eager", dynamic=True)
    for n in range(2, 12):
        x = torch.randn(n)
        torch.testing.assert_close(fast(x), breaks(x))
    # the frame resumes after the break: one CALL entry (the graph before it) serves
    # every size, and so does its resume function's
    (entry,) = entries(breaks)
    assert entry.action == _C.ACTION_CALL and not entry.signed
    assert entry.hits == 9


@pytest.mark.cxx_exceptions   # the fake nonzero throws inside libtorch
def test_data_dependent_ops_still_break_under_dynamic_shapes():
    def nz(x):
        return torch.nonzero(x > 0).float().sum()

    with logged("graph_breaks") as messages:
        fast = agspeed.optimize(nz, backend="eager", dynamic=True)
        for n in range(2, 6):
            x = torch.randn(n)
            torch.testing.assert_close(fast(x), nz(x))
    assert any("data_dependent" in m for m in messages)


# -- asked for up front ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["agspeed", "dynamo"])
def test_mark_dynamic_makes_the_first_graph_dynamic(how):
    backend = Counting()
    fast = agspeed.optimize(scale_shift, backend=backend)
    w = torch.randn(8, 4)
    with logged("recompiles") as messages:
        for n in range(2, 20):
            x = torch.randn(n, 8)
            if how == "agspeed":
                agspeed.mark_dynamic(x, 0)
            else:
                torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(fast(x, w), scale_shift(x, w))
    assert backend.graphs == 1
    assert any("x.size(0) is dynamic from now on (marked dynamic)" in m for m in messages)


def test_mark_static_keeps_a_dimension_static():
    backend = Counting()
    fast = agspeed.optimize(scale_shift, backend=backend)
    w = torch.randn(8, 4)
    with agspeed.config.override(recompile_limit=32):
        for n in range(2, 12):
            x = torch.randn(n, 8)
            agspeed.mark_static(x, 0)
            torch.testing.assert_close(fast(x, w), scale_shift(x, w))
    assert backend.graphs == 10 and all(e.signed for e in entries(scale_shift))


def test_marks_reject_what_eager_would():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError):
        agspeed.mark_dynamic(x, 2)
    with pytest.raises(IndexError):
        agspeed.mark_static(x, -3)
    with pytest.raises(TypeError):
        agspeed.mark_dynamic([1, 2], 0)
    with pytest.raises(TypeError):
        agspeed.mark_dynamic(x, "0")
    agspeed.mark_dynamic(x, [0, -1])
    agspeed.mark_static(x, 1)   # the later call wins for a dimension
    assert x._agspeed_dynamic_dims == {0} and x._agspeed_static_dims == {1}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x).tanh()


def test_optimize_dynamic_true_keeps_parameters_static_and_false_keeps_all_static():
    lin = Head()
    backend = Counting()
    fast = agspeed.optimize(lin, backend=backend, dynamic=True)
    for n in range(2, 10):
        x = torch.randn(n, 8)
        torch.testing.assert_close(fast(x), lin(x))
    assert backend.graphs == 1
    (entry,) = entries(lin)
    lines = entry.guard.lines()
    # x.size(1) was asked dynamic too, but the layer fixes it to 8: static
    assert any(line.startswith("x tensor") and "shape=[x.size(0), 8]" in line
               for line in lines)
    assert any(line.startswith("self.fc.weight tensor") and "shape=[3, 8]" in line
               for line in lines)
    agspeed.reset()
    backend = Counting()
    fast = agspeed.optimize(lin, backend=backend, dynamic=False)
    for n in range(2, 10):
        x = torch.randn(n, 8)
        torch.testing.assert_close(fast(x), lin(x))
    assert backend.graphs == 8


def test_a_backend_without_dynamic_support_gets_static_graphs():
    class Static(Counting):
        supports_dynamic = False

    backend = Static()
    fast = agspeed.optimize(scale_shift, backend=backend, dynamic=True)
    w = torch.randn(8, 4)
    for n in range(2, 8):
        x = torch.randn(n, 8)
        torch.testing.assert_close(fast(x, w), scale_shift(x, w))
    assert backend.graphs == 6 and all(e.signed for e in entries(scale_shift))


def test_the_backend_sees_symbolic_sizes_in_the_placeholders():
    seen = []

    def backend(gm, example_inputs):
        seen.append(([n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"],
                     example_inputs))
        return gm.forward

    fast = agspeed.optimize(scale_shift, backend=backend, dynamic=True)
    x, w = torch.randn(5, 8), torch.randn(8, 4)
    fast(x, w)
    (fakes, real), = seen
    assert isinstance(fakes[0].shape[0], torch.SymInt) and fakes[1].shape == (8, 4)
    assert real[0] is x and real[1] is w


# -- the zoo ------------------------------------------------------------------------------

ZOO_SIZES = {   # per model: its inputs for a size n that varies a batch or sequence length
    "mlp": lambda n: (torch.randn(n, 16),),
    "resnet": lambda n: (torch.randn(n, 3, 4 + n, 4 + n),),
    "encoder": lambda n: (torch.randn(2, n, 32), (torch.rand(2, n) > 0.2).long()),
    "gpt": lambda n: (torch.randint(0, 50, (2, n)),),
    "loop": lambda n: (torch.randn(n, 12),),
}


@pytest.mark.parametrize("amp", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(ZOO_SIZES))
def test_zoo_models_serve_varying_sizes_matching_eager(name, amp):
    torch.manual_seed(0)
    model = ZOO[name][0]()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    optimized = agspeed.optimize(model, backend="eager")
    tol = {"equal_nan": True} if amp == "fp32" else {"atol": 3e-2, "rtol": 3e-2,
                                                      "equal_nan": True}
    sizes = [3, 4, 5, 6, 7, 9, 2, 11, 5, 14, 8]
    for n in sizes:
        inputs = ZOO_SIZES[name](n)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16")
        results = []
        for runner in (model, optimized):
            state = {k: v.clone() for k, v in model.state_dict().items()}
            with ctx:
                out = runner(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            sum(o.float().nansum() for o in outs).backward()
            grads = {k: p.grad.clone() for k, p in model.named_parameters()
                     if p.grad is not None}
            model.zero_grad(set_to_none=True)
            results.append((outs, grads))
            if runner is model:
                model.load_state_dict(state)   # BatchNorm's running stats: once per size
        (want, want_grads), (got, got_grads) = results
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tol)
        assert got_grads.keys() == want_grads.keys()
        for key in want_grads:
            torch.testing.assert_close(got_grads[key], want_grads[key], **tol,
                                       msg=lambda m: f"{name} n={n} {key}: {m}")
    captured = [r for r in agspeed._runtime.frame_records()
                if r.decision == "captured" and r.name == "forward"]
    breaks = [r for r in agspeed._runtime.frame_records() if "graph break" in r.decision]
    assert not breaks
    # two static sizes, the dynamic graph, and at most two sizes the code pins apart
    # (size 2 after promotion is served; ResNet's kernels branch on batch < 16 and
    # GPT's causal mask on the full context)
    assert len(captured) <= 5, [r.decision for r in captured]


# -- limits, logs, agreement, references -----------------------------------------------------


def test_promotion_replaces_static_entries_outside_the_recompile_limit():
    fast = agspeed.optimize(scale_shift, backend="eager")
    w = torch.randn(8, 4)
    with agspeed.config.override(recompile_limit=4):
        check_sizes(fast, scale_shift, lambda n: (torch.randn(n, 8), w), range(2, 40))
    decisions = [r.decision for r in agspeed._runtime.frame_records()
                 if r.name == "scale_shift"]
    assert decisions.count("captured") == 3
    assert not any("recompile limit" in d for d in decisions)
    assert len(entries(scale_shift)) == 1
    (row,) = [r for r in agspeed.recompiles() if r.function.startswith("scale_shift")]
    assert row.evictions == 0 and row.dynamic == ("x.size(0)",)


def _captured(name):
    return [r.decision for r in agspeed._runtime.frame_records()
            if r.name == name and r.decision == "captured"]


def test_a_dimension_made_dynamic_stays_dynamic_in_later_captures():
    # the dynamic graph served sizes 7 and 8 unrecorded; a later capture of the function
    # (the flag's other value) sees a size seen before and still makes it dynamic
    def flagged(x, up):
        return x * 2 if up else x - 1

    fast = agspeed.optimize(flagged, backend="eager")
    for up in (True, False):
        for n in (5, 6, 7, 8, 9, 10):
            x = torch.randn(n, 3)
            torch.testing.assert_close(fast(x, up), flagged(x, up))
    # True: 5, 6, then dynamic at 7; False: dynamic at once
    assert len(_captured("flagged")) == 4
    assert len(entries(flagged)) == 2


def test_a_graph_dynamic_in_more_dimensions_replaces_one_dynamic_in_fewer():
    # the batch goes dynamic after the length did: the new graph serves what the
    # length-dynamic graphs of batch 2 and 3 served (their symbols renamed to its own)
    def rows(ids, pos):
        return (ids * 3 + pos).sum(-1)

    fast = agspeed.optimize(rows, backend="eager")
    for b, n in [(2, 5), (2, 6), (2, 7), (3, 5), (3, 6), (4, 9), (3, 11), (2, 12), (5, 4)]:
        ids, pos = torch.randn(b, n), torch.randn(b, n)
        torch.testing.assert_close(fast(ids, pos), rows(ids, pos))
    assert len(entries(rows)) == 1, [e.guard.lines()[:2] for e in entries(rows)]
    (row,) = [r for r in agspeed.recompiles() if r.function.startswith("rows")]
    assert row.evictions == 0
    assert set(row.dynamic) == {"ids.size(0)", "ids.size(1)", "pos.size(0)", "pos.size(1)"}


def test_a_graph_that_ties_two_sizes_does_not_replace_one_that_keeps_them_apart():
    def pair(x, y):
        if x.shape[0] == y.shape[0]:
            return x.sum() + y.sum()
        return x.sum() - y.sum()

    fast = agspeed.optimize(pair, backend="eager")
    for a, b in [(2, 3), (4, 5), (6, 7), (3, 3), (5, 5), (8, 8), (7, 2)]:
        x, y = torch.randn(a, 2), torch.randn(b, 2)
        torch.testing.assert_close(fast(x, y), pair(x, y))
    for a, b in [(9, 10), (10, 10), (11, 4), (12, 12)]:
        x, y = torch.randn(a, 2), torch.randn(b, 2)
        torch.testing.assert_close(fast(x, y), pair(x, y))
    assert len(_captured("pair")) <= 6


def test_recompile_and_guard_logs_name_the_dimension_and_why():
    fast = agspeed.optimize(scale_shift, backend="eager")
    w = torch.randn(8, 4)
    with logged("recompiles", "guards") as messages:
        for n in (4, 5, 6, 7, 1):
            fast(torch.randn(n, 8), w)
    dynamic = [m for m in messages if "is dynamic from now on" in m]
    assert len(dynamic) == 1
    assert "scale_shift (test_shapes.py:" in dynamic[0]
    assert "x.size(0) is dynamic from now on (3 distinct sizes (4, 5, 6) reached " \
           "dynamic_after=3)" in dynamic[0]
    assert any("replaces 2 static entries" in m for m in messages)
    guards = [m for m in messages if m.startswith("scale_shift") and "guards:" in m]
    assert any("shape=[x.size(0), 8]" in g and "size: x.size(0) >= 2" in g for g in guards)
    miss = [m for m in messages if "recompiling" in m][-1]
    assert "size guard x.size(0) >= 2: false for x.size(0)=1" in miss


def test_compiled_dynamic_guards_agree_with_their_python_reading():
    def two(x, y):
        return (x[:, : y.shape[0]] * y).sum(1)

    fast = agspeed.optimize(two, backend="eager", dynamic=True)
    fast(torch.randn(5, 9), torch.randn(4))
    (entry,) = entries(two)
    guard = entry.guard
    candidates = [
        (torch.randn(5, 9), torch.randn(4)), (torch.randn(7, 30), torch.randn(12)),
        (torch.randn(1, 9), torch.randn(4)), (torch.randn(5, 3), torch.randn(4)),
        (torch.randn(5, 9).t(), torch.randn(4)), (torch.randn(5, 9, dtype=torch.float64),
                                                  torch.randn(4)),
        (torch.randn(5, 9), torch.randn(4, requires_grad=True)), (torch.randn(5, 9), 4),
        (torch.randn(5, 4), torch.randn(4)), (torch.randn(2, 2), torch.randn(2)),
    ]
    answers = []
    for x, y in candidates:
        frame = ({"x": x, "y": y}, globals(), vars(__builtins__) if not isinstance(
            __builtins__, dict) else __builtins__)
        got = guard(*frame)
        assert got == guard.check_in_python(*frame), (x.shape, getattr(y, "shape", y))
        assert got == (not guard.failures(*frame))
        walk = guard._walk(*frame)
        assert guard.why(*frame) == (None if got else walk[0][:2])
        assert guard.first_failure(*frame) == (None if got else walk[0][2])
        answers.append(got)
    # served: another size of both; refused: size 1, a slice past the end, another
    # layout, dtype, requires_grad, type
    assert answers[:8] == [True, True, False, False, False, False, False, False]
    for x, y in candidates[:2]:
        torch.testing.assert_close(fast(x, y), two(x, y))


def test_dynamic_entries_leak_nothing_and_die_with_the_cache():
    fast = agspeed.optimize(scale_shift, backend="eager", dynamic=True)
    w = torch.randn(8, 4)
    xs = [torch.randn(n, 8) for n in range(2, 12)]
    for x in xs:
        fast(x, w)
    (entry,) = entries(scale_shift)
    before = [sys.getrefcount(x) for x in xs] + [sys.getrefcount(w)]
    for _ in range(50):
        for x in xs:
            fast(x, w)
    assert [sys.getrefcount(x) for x in xs] + [sys.getrefcount(w)] == before
    refs = [weakref.ref(entry), weakref.ref(entry.guard),
            weakref.ref(entry.compiled.graph_module)]
    del entry
    agspeed.reset()
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, y):
        return torch.relu(self.a(x)) + self.b(y).sum(-1, keepdim=True)


def test_steady_calls_leave_no_allocations_behind():
    """Training-like use (a model whose batch size varies, so it goes dynamic, and a
    function with a float argument, on the steady-state path) allocates nothing that
    outlives the calls: Python's allocated block count stays put over many calls."""
    torch.manual_seed(0)
    model = TwoInputs()
    fast_model = agspeed.optimize(model, backend="eager")
    fast_fn = agspeed.optimize(lambda x, k: x * k + 1, backend="eager")
    xs = [torch.randn(n, 8) for n in range(1, 12)]

    def run(calls):
        for i in range(calls):
            x = xs[i % len(xs)]
            fast_model(x, x).sum().backward()
            fast_fn(x, 2.0)

    run(200)   # captures, promotion to dynamic, warm caches
    gc.collect()
    before = sys.getallocatedblocks()
    run(1500)
    gc.collect()
    assert sys.getallocatedblocks() - before < 50
