"""with blocks and try blocks in captured code (agspeed/_ctx.py, csrc/interp_exc.c).

Each function captures as one graph with no break, no more graphs than
torch._dynamo.explain finds, and its results (values, dtypes, requires_grad, types) and
gradients equal eager's on fresh random inputs; the grad mode and autocast state after
the call are eager's too.
"""

import contextlib
import logging

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from _dynamo_ref import dynamo_graph_count  # noqa: E402

pytestmark = pytest.mark.torch

LOG = logging.getLogger("agspeed.tests.with")


class Scaled:
    """A context manager written in Python, made before the call."""

    def __init__(self, k):
        self.k = k

    def __enter__(self):
        return self.k

    def __exit__(self, kind, value, tb):
        return None


SCALED = Scaled(3.0)


def w_no_grad(x, w):
    y = x @ w
    with torch.no_grad():
        stat = y.abs().mean()
    return y * stat, stat


def w_nested(x, w):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = (x @ w).sin()
        c = b * 3
    return a + b, c


def w_set_grad_enabled(x, w):
    with torch.set_grad_enabled(False):
        frozen = x @ w
    with torch.set_grad_enabled(True):
        live = x @ w
    return frozen + live


def w_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = x @ w
        inner = torch.relu(low)
    return inner, low.float() + x.sum()


def w_amp_autocast(x, w):
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            full = x @ w
        low = full @ w
    return full, low


def w_null_context(x, w):
    with contextlib.nullcontext(2.0) as j:
        y = x @ w
    return y + j


def w_python_manager(x, w):
    with SCALED as k, contextlib.nullcontext(2.0) as j:
        y = x @ w * k
    return y + j


def w_manager_made_here(x, w):
    with Scaled(2.0) as k:   # made in the frame: an object the capture owns
        y = x @ w * k
    return y


def w_try_except_finally(x, w):
    y = x @ w
    try:
        y = y.relu()
    except (KeyError, AttributeError):
        y = y * 0
    finally:
        y = y + 1
    if LOG.isEnabledFor(logging.DEBUG):  # logging's own try/except KeyError
        y = y * 2
    return y


FRESH_NO_GRAD = torch.no_grad().clone   # what @torch.no_grad() calls for each call


def w_decorator_manager(x, w):
    y = x @ w
    with FRESH_NO_GRAD():
        z = y * 2
    return y + z, z


AMP = torch.autocast("cpu", dtype=torch.bfloat16)   # managers made once, used per call
FROZEN = torch.no_grad()
NOTHING = contextlib.nullcontext(0.5)


def w_premade_managers(x, w):
    with AMP:
        low = x @ w
    with FROZEN, NOTHING as half:
        stat = low.float().mean() * half
    return low, low.float() * stat


def no_grad_helper(x):
    with torch.no_grad():
        return x.exp()


def w_inlined_callee(x, w):
    y = x @ w
    return y * no_grad_helper(y) + torch.is_grad_enabled()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            scale = h.norm(dim=-1, keepdim=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.fc(h / scale)
        return out.float() + h


FUNCTIONS = {
    "no_grad": w_no_grad,
    "nested": w_nested,
    "set_grad_enabled": w_set_grad_enabled,
    "autocast": w_autocast,
    "amp_autocast": w_amp_autocast,
    "null_context": w_null_context,
    "manager_made_here": w_manager_made_here,
    "try_except_finally": w_try_except_finally,
    "inlined_callee": w_inlined_callee,
    "decorator_manager": w_decorator_manager,
    "premade_managers": w_premade_managers,
}


def _fresh():
    return (torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))


def _dynamo_graphs(fn, *args):
    try:
        return torch._dynamo.explain(fn)(*args).graph_count
    finally:
        torch._dynamo.reset()


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


def _assert_same(fast, ref_fn, make_inputs):
    for _ in range(2):   # the capture, then the cached entry
        inputs = make_inputs()
        ref_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        out, ref = fast(*inputs), ref_fn(*ref_inputs)
        assert type(out) is type(ref)
        assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
        for a, b in zip(_flat(out), _flat(ref), strict=True):
            assert (a.dtype, a.requires_grad) == (b.dtype, b.requires_grad)
            torch.testing.assert_close(a, b)
        sum(t.float().square().sum() for t in _flat(out) if t.requires_grad).backward()
        sum(t.float().square().sum() for t in _flat(ref) if t.requires_grad).backward()
        for a, b in zip(inputs, ref_inputs):
            torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_with_and_try_blocks_capture_as_one_graph_matching_eager(name):
    fn = FUNCTIONS[name]
    # logging answers from its cache once asked: a cold cache raises the KeyError its
    # handler fills it from, which runs the frame eager (see the test below)
    LOG.isEnabledFor(logging.DEBUG)
    explained = agspeed.explain(fn, *_fresh())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]
    assert explained.graph_count <= _dynamo_graphs(fn, *_fresh())
    _assert_same(agspeed.optimize(fn), fn, _fresh)


def test_a_python_context_manager_is_inlined_into_the_graph():
    explained = agspeed.explain(w_python_manager, *_fresh())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]
    # torch._dynamo (2.13) captures no graph for a frame with this block and runs it
    # eager: one graph for the whole function is the bound
    assert explained.graph_count <= max(1, _dynamo_graphs(w_python_manager, *_fresh()))
    _assert_same(agspeed.optimize(w_python_manager), w_python_manager, _fresh)


def test_grad_mode_and_autocast_are_graph_nodes():
    def calls(fn, target):
        graph = agspeed.explain(fn, *_fresh()).graphs[0].graph
        return [n.args for n in graph.nodes if n.target is target]

    assert calls(w_no_grad, torch._C._set_grad_enabled) == [(False,), (True,)]
    entered = calls(w_autocast, torch.amp._enter_autocast)
    assert entered == [("cpu", torch.bfloat16, True, None)]
    assert len(calls(w_autocast, torch.amp._exit_autocast)) == 1


def test_a_module_with_blocks_is_one_graph_matching_eager():
    model = Block()
    ref = Block()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    explained = agspeed.explain(model, x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]
    assert explained.graph_count <= _dynamo_graphs(ref, x)
    fast = agspeed.optimize(model)
    for _ in range(2):
        x = torch.randn(2, 4, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, expected = fast(x), ref(x_ref)
        assert (out.dtype, out.requires_grad) == (expected.dtype, expected.requires_grad)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


def w_handler_runs(x, y):
    try:
        return x @ y   # fails for these shapes: eager runs the handler
    except RuntimeError:
        return x + 1


def w_raises_through_with(x):
    with torch.no_grad():
        return x @ x   # fails for a non-square x: the exception leaves the block


@pytest.mark.cxx_exceptions   # the failing matmul throws inside libtorch
def test_a_body_that_raises_runs_eager_with_its_handler():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    explained = agspeed.explain(w_handler_runs, x, y)
    assert (explained.graph_count, explained.graph_break_count) == (0, 1)
    # torch._dynamo stops with an error on this function, so there is no count to match
    fast = agspeed.optimize(w_handler_runs)
    for _ in range(2):
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        torch.testing.assert_close(fast(x, y), w_handler_runs(x, y))
    fast = agspeed.optimize(w_raises_through_with)
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError) as expected:
        w_raises_through_with(x)
    with pytest.raises(RuntimeError) as got:
        fast(x)
    assert str(got.value) == str(expected.value)
    assert torch.is_grad_enabled()   # the block was left as eager leaves it


def w_gathers(x, idx):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        picked = x[idx] @ x.t()   # an index out of range fails only when the graph runs
    return picked.float() + x.sum()


@pytest.mark.cxx_exceptions   # the bad index throws inside libtorch
def test_a_graph_that_raises_midway_leaves_the_modes_as_eager_does():
    x, good = torch.randn(4, 4), torch.tensor([0, 3])
    explained = agspeed.explain(w_gathers, x, good)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    assert explained.graph_count <= _dynamo_graphs(w_gathers, x, good)
    fast = agspeed.optimize(w_gathers)
    torch.testing.assert_close(fast(x, good), w_gathers(x, good))
    bad = torch.tensor([0, 9])   # same type, shape and dtype: the cached graph runs
    with pytest.raises(IndexError) as expected:
        w_gathers(x, bad)
    with pytest.raises(IndexError) as got:
        fast(x, bad)
    assert str(got.value) == str(expected.value)
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.float16):   # an outer block's state survives
        with pytest.raises(IndexError):
            fast(x, bad)
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") is torch.float16
    torch.testing.assert_close(fast(x, good), w_gathers(x, good))


def test_a_premade_managers_fields_are_guarded():
    fast = agspeed.optimize(w_premade_managers)
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    assert fast(x, w)[0].dtype is torch.bfloat16
    saved = AMP.fast_dtype
    try:
        AMP.fast_dtype = torch.float16   # what its __enter__ reads: the entry must not serve
        out, ref = fast(x, w), w_premade_managers(x, w)
        assert out[0].dtype is ref[0].dtype is torch.float16
        torch.testing.assert_close(out, ref)
    finally:
        AMP.fast_dtype = saved


def _inference_block(x):
    with torch.inference_mode():
        y = x * 2
    return y + 1, y.is_inference(), torch.is_grad_enabled()


def _inference_off(x):
    with torch.inference_mode(False):
        y = x.sin()
    return y * 2


@torch.inference_mode()
def _inference_decorated(x):
    return x.cos() * 2


_PREMADE_INFERENCE = torch.inference_mode()


def _inference_premade(x):
    with _PREMADE_INFERENCE:
        return x.exp()


@pytest.mark.parametrize("fn", [_inference_block, _inference_off, _inference_decorated,
                                _inference_premade])
def test_inference_mode_is_a_graph_block(fn):
    x = torch.randn(4, requires_grad=True)
    report = agspeed.explain(fn, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    # (Dynamo makes none for a manager made before the call: it runs that frame eager)
    assert report.graph_count <= max(1, dynamo_graph_count(fn, x))
    fast = agspeed.optimize(fn, backend="eager")
    x = torch.randn(4, requires_grad=True)
    got, want = fast(x), fn(x)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for a, b in zip(got, want):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
            assert (a.is_inference(), a.requires_grad) == (b.is_inference(), b.requires_grad)
        else:
            assert a == b
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()


@contextlib.contextmanager
def _scaled(k):
    try:
        yield k * 2
    finally:
        pass


@contextlib.contextmanager
def _no_grad_block():
    with torch.no_grad():
        yield


def _generator_managers(x):
    with _scaled(3) as s:
        y = x * s
    with _no_grad_block():
        z = y * 2
    return y + 1, z, z.requires_grad


class _UsesAMethodManager(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    @contextlib.contextmanager
    def layer(self):
        yield self.fc

    def forward(self, x):
        with self.layer() as fc:
            return fc(x)


def test_contextmanager_generators_enter_and_leave_in_the_graph():
    for fn, make in ((_generator_managers, lambda: torch.randn(3, requires_grad=True)),
                     (_UsesAMethodManager(), lambda: torch.randn(2, 3))):
        report = agspeed.explain(fn, make())
        assert (report.graph_count, report.graph_break_count) == (1, 0), \
            report.break_reasons
        assert report.graph_count <= max(1, dynamo_graph_count(fn, make()))
        fast = agspeed.optimize(fn, backend="eager")
        x = make()
        _assert_same_results(fast(x), fn(x))
        assert torch.is_grad_enabled()


def _assert_same_results(got, want):
    """Equal values (tensors: and requires_grad), a tuple compared item by item."""
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
            assert a.requires_grad == b.requires_grad
        else:
            assert a == b


@contextlib.contextmanager
def _never_yields():
    if False:
        yield


def _enters_a_manager_that_never_yields(x):
    with _never_yields():
        return x + 1


def test_a_generator_that_does_not_yield_raises_as_eager():
    fast = agspeed.optimize(_enters_a_manager_that_never_yields, backend="eager")
    with pytest.raises(RuntimeError, match="generator didn't yield"):
        fast(torch.randn(2))


def _decorates_a_function_in_the_frame(x):
    @torch.no_grad()
    def augment(t):
        return (t + 1) * 2

    @torch.inference_mode()
    def frozen(t):
        return t.sin()

    out = augment(x)
    return out, out.requires_grad, frozen(x).is_inference(), x * 3


def test_a_manager_made_in_the_frame_decorates_a_function():
    x = torch.randn(4, requires_grad=True)
    report = agspeed.explain(_decorates_a_function_in_the_frame, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    assert report.graph_count <= max(1, dynamo_graph_count(_decorates_a_function_in_the_frame, x))
    fast = agspeed.optimize(_decorates_a_function_in_the_frame, backend="eager")
    x = torch.randn(4, requires_grad=True)
    got, want = fast(x), _decorates_a_function_in_the_frame(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:3] == want[1:3]
    torch.testing.assert_close(got[3], want[3])
    got[3].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


class _GradSwitch:
    """A user's manager switching grad mode with torch's bare C switch."""

    def __init__(self, mode):
        self.prev, self.mode = torch.is_grad_enabled(), mode

    def __enter__(self):
        torch._C._set_grad_enabled(self.mode)

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)


def _switched(x):
    with _GradSwitch(False):
        y = x * 2
        inside = torch.is_grad_enabled()
    return y + x, inside


def _bare_decorator(x):
    @torch.no_grad
    def inner(v):
        return v.sin()
    return inner(x) + x


def _set_grad_enabled_decorator(x):
    @torch.set_grad_enabled(False)
    def inner(v):
        return v.cos()
    return inner(x) * x, torch.is_grad_enabled()


@pytest.mark.parametrize("fn", [_switched, _bare_decorator, _set_grad_enabled_decorator])
@pytest.mark.parametrize("grad", [True, False])
def test_grad_mode_switched_by_torchs_c_switch_and_decorators_without_a_with(fn, grad):
    agspeed.reset()
    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    with torch.set_grad_enabled(grad):
        for _ in range(2):
            x = torch.randn(3, requires_grad=True)
            ref, got = fn(x), fast(x)
            assert torch.is_grad_enabled() is grad
            _assert_same_results(got, ref)


_EVENTS = []


@contextlib.contextmanager
def _traced(tag, scale=1):
    _EVENTS.append(("enter", tag))
    with torch.no_grad() if tag == "frozen" else contextlib.nullcontext():
        yield scale
    _EVENTS.append(("exit", tag))


@_traced("inner", scale=3)
def _decorated(x):
    return x.sin() + 1


@_traced("frozen")
def _decorated_no_grad(x):
    return x * 2, torch.is_grad_enabled()


class _DecoratedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    @_traced("forward")
    def forward(self, x):
        return _decorated(self.fc(x)) * 2


def test_a_contextmanager_object_used_as_a_decorator_enters_and_exits_in_the_graph():
    """``@cm(...)`` on a function (contextlib.ContextDecorator): each call enters a
    fresh manager; the manager's own effects (a list appended to, grad mode) are eager's."""
    model = _DecoratedForward()

    def step(x):
        y, grad_inside = _decorated_no_grad(x)
        return model(x) + y, grad_inside

    x = torch.randn(2, 4, requires_grad=True)
    report = agspeed.explain(step, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    fast = agspeed.optimize(step, backend="eager", fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 4, requires_grad=True)
        _EVENTS.clear()
        want = step(x)
        want_events = list(_EVENTS)
        _EVENTS.clear()
        got = fast(x)
        assert _EVENTS == want_events == [
            ("enter", "frozen"), ("exit", "frozen"), ("enter", "forward"),
            ("enter", "inner"), ("exit", "inner"), ("exit", "forward")]
        _assert_same_results(got, want)
        (g,) = torch.autograd.grad(got[0].sum(), x)
        (w,) = torch.autograd.grad(want[0].sum(), x)
        torch.testing.assert_close(g, w)
    assert torch.is_grad_enabled()


def _attention_flags():
    return (tuple(torch._C._get_sdp_priority_order()), torch._C._get_math_sdp_enabled(),
            torch._C._get_flash_sdp_enabled(), torch._C._get_mem_efficient_sdp_enabled())


def _selects_attention(q):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = q * 2
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        z = torch.nn.functional.scaled_dot_product_attention(y, q, q)
    return z.sin()


def _asks_inside_attention_block(q):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        inside = torch.backends.cuda.flash_sdp_enabled()
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    return y + 1, inside


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_sdpa_kernel_blocks_are_captured_with_the_graphs_own_switches(backend):
    """``sdpa_kernel`` inside the graph: one graph, eager's values and gradients, the
    process's attention flags (and priority order) as they were after each call."""
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    report = agspeed.explain(_selects_attention, q)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    code = report.graphs[0].code
    assert code.count("enter_sdpa_kernel(") == 2 and code.count("exit_sdpa_kernel(") == 2
    before = _attention_flags()
    fast = agspeed.optimize(_selects_attention, backend=backend)
    for _ in range(2):
        q = torch.randn(1, 2, 8, 16, requires_grad=True)
        got, want = fast(q), _selects_attention(q)
        torch.testing.assert_close(got, want)
        (g,) = torch.autograd.grad(got.sum(), q)
        (w,) = torch.autograd.grad(want.sum(), q)
        # (inductor's fused backward sums in another order: float32 rounding apart)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert _attention_flags() == before


def test_a_query_of_the_attention_flags_inside_sdpa_kernel_sees_the_block():
    """Read inside the block, a flag is the block's (the capture breaks there and the
    resume function enters the same backends again around the eager call)."""
    fast = agspeed.optimize(_asks_inside_attention_block, backend="eager")
    before = _attention_flags()
    for _ in range(2):
        q = torch.randn(1, 2, 4, 8)
        (got, inside), (want, eager_inside) = fast(q), _asks_inside_attention_block(q)
        torch.testing.assert_close(got, want)
        assert inside is eager_inside is False
        assert _attention_flags() == before


def test_sdpa_kernel_with_bad_backends_raises_eagers_error():
    from torch.nn.attention import sdpa_kernel

    def bad(x):
        with sdpa_kernel("math"):
            return x + 1

    with pytest.raises(AssertionError, match="Backend must be an instance of SDPBackend"):
        agspeed.optimize(bad, backend="eager")(torch.randn(2))
