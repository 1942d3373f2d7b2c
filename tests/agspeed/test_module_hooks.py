"""Forward hooks and pre-hooks of submodules are captured into the graph (agspeed._hooks):
one graph where the hooked call used to break, eager's results, gradients and hook
order, and a recapture when a hook is added or removed.  Backward hooks, global hooks
and torch's own hooks still break at the call and run as eager runs them."""

import copy

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch
nn = torch.nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x, scale=1.0):
        return self.b(self.a(x).relu() * scale)


def _twins():
    torch.manual_seed(0)
    model = Net()
    return model, copy.deepcopy(model)


def _same_step(fast, model, ref, *args, **kwargs):
    """One forward and backward of each; outputs and every gradient equal."""
    got, want = fast(*args, **kwargs), ref(*args, **kwargs)
    torch.testing.assert_close(got, want)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
        p.grad = q.grad = None


def _graphs(model, *args):
    report = agspeed.explain(model, *args)
    return report.graph_count, [b.reason for b in report.break_reasons]


def _hook_both(model, ref, register):
    for m in (model, ref):
        register(m)


def test_pre_hooks_and_forward_hooks_are_one_graph_with_eagers_results():
    model, ref = _twins()
    order = []

    def pre(module, args):
        order.append("pre")
        return args[0] * 2          # a single value: taken as the one argument

    def post(module, args, out):
        order.append("post")
        return out + args[0].mean()

    def kw_pre(module, args, kwargs):
        return (args[0] * 0.5,), dict(kwargs)

    def kw_post(module, args, kwargs, out):
        return out * kwargs.get("scale", 3.0)

    _hook_both(model, ref, lambda m: (m.a.register_forward_pre_hook(pre),
                                      m.a.register_forward_hook(post),
                                      m.b.register_forward_pre_hook(kw_pre, with_kwargs=True),
                                      m.b.register_forward_hook(kw_post, with_kwargs=True)))
    x = torch.randn(5, 4)
    assert _graphs(model, x) == (1, [])
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(3):
        order.clear()
        _same_step(fast, model, ref, torch.randn(5, 4, requires_grad=True))
        assert order == ["pre", "post", "pre", "post"]     # eager's, then agspeed's


def test_hooks_run_in_registration_order_prepend_included():
    model, ref = _twins()
    for m in (model, ref):
        m.a.register_forward_hook(lambda mod, a, out: out * 2)
        m.a.register_forward_hook(lambda mod, a, out: out + 1)
        m.a.register_forward_hook(lambda mod, a, out: out - 5, prepend=True)
    fast = agspeed.optimize(model, backend="eager")
    _same_step(fast, model, ref, torch.randn(2, 4))
    assert _graphs(model, torch.randn(2, 4))[0] == 1


def test_adding_or_removing_a_hook_captures_again():
    model, ref = _twins()
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(3, 4)
    _same_step(fast, model, ref, x)
    handles = [m.a.register_forward_hook(lambda mod, a, out: out.sigmoid())
               for m in (model, ref)]
    _same_step(fast, model, ref, x)
    other = [m.b.register_forward_pre_hook(lambda mod, a: (a[0] * -1,))
             for m in (model, ref)]
    _same_step(fast, model, ref, x)
    for h in handles:
        h.remove()
    _same_step(fast, model, ref, x)
    for h in other:
        h.remove()
    _same_step(fast, model, ref, x)
    (record,) = agspeed.recompiles()
    # the last state (no hooks) is the first one's: its entry serves it again
    assert record.count == 3 and all("hooks" in r for r in record.reasons), record


def test_a_hook_that_marks_the_output_as_needing_grad_is_captured():
    """transformers' ``enable_input_require_grads``: with a frozen first layer the
    hook makes its output require grad, so the rest of the backward runs."""
    model, ref = _twins()
    for m in (model, ref):
        m.a.requires_grad_(False)
        m.a.register_forward_hook(lambda mod, a, out: out.requires_grad_(True))
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(3, 4)
    got, want = fast(x), ref(x)
    assert got.requires_grad and want.requires_grad
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(model.b.weight.grad, ref.b.weight.grad)
    assert _graphs(model, x) == (1, [])


def test_backward_and_torchs_own_hooks_still_break_and_run_as_in_eager():
    model, ref = _twins()
    grads = {"fast": [], "ref": []}
    for m, key in ((model, "fast"), (ref, "ref")):
        m.b.register_full_backward_hook(
            lambda mod, gin, gout, key=key: grads[key].append(gout[0].clone()))
    fast = agspeed.optimize(model, backend="eager")
    _same_step(fast, model, ref, torch.randn(3, 4))
    torch.testing.assert_close(grads["fast"][0], grads["ref"][0])
    count, reasons = _graphs(model, torch.randn(3, 4))
    assert reasons and all(r == "hooks" for r in reasons), reasons

    model, ref = _twins()
    for m in (model, ref):      # a hook of torch's (spectral norm's pre-hook object)
        torch.manual_seed(1)    # its random start vector, the same for both
        nn.utils.spectral_norm(m.b)
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(fast(x), ref(x))
    assert "hooks" in _graphs(model, x)[1]


def test_a_hook_returning_a_bad_value_raises_eagers_error():
    model, ref = _twins()
    for m in (model, ref):
        m.a.register_forward_pre_hook(lambda mod, a, kw: 5, with_kwargs=True)
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError) as want:
        ref(x)
    with pytest.raises(RuntimeError) as got:
        fast(x)
    assert str(got.value) == str(want.value)


def test_a_hooked_model_and_its_hooks_are_freed_with_it():
    import gc
    import weakref

    model, _ = _twins()

    def post(module, args, out):
        return out * 2

    model.a.register_forward_hook(post)
    fast = agspeed.optimize(model, backend="eager")
    fast(torch.randn(2, 4)).sum().backward()
    refs = [weakref.ref(o) for o in (model, model.a, post, model.a.weight)]
    del model, fast, post
    gc.collect()
    assert [r() for r in refs] == [None] * 4


def _scaled_by(box):
    """A decorator whose wrapper is a closure (as transformers' kwarg shims are)."""
    def decorate(fn):
        def wrapper(self, *args, **kwargs):
            return fn(self, *args, **kwargs) * box[0]
        return wrapper
    return decorate


def test_a_hooked_module_whose_forward_is_a_closure_is_one_graph_guarded_on_its_cells():
    """The hooked call reads ``module.forward``, a bound method of a decorator's wrapper:
    its cells are read (and guarded) through the method's source, so a changed cell or a
    replaced forward captures again with eager's results."""
    box = [2.0]

    class Scaled(nn.Linear):
        forward = _scaled_by(box)(nn.Linear.forward)

    torch.manual_seed(0)
    model = nn.Sequential(Scaled(4, 4), nn.Linear(4, 2))
    seen = []
    model[0].register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    x = torch.randn(3, 4)
    assert _graphs(model, x) == (1, [])
    fast = agspeed.optimize(model, backend="eager")
    captures = []
    for change in (None, None, "cell", "forward"):
        if change == "cell":
            box[0] = -1.5
        elif change == "forward":
            Scaled.forward = _scaled_by([0.25])(nn.Linear.forward)
        seen.clear()
        torch.testing.assert_close(fast(x), model(x))
        assert len(seen) == 2
        torch.testing.assert_close(seen[0], seen[1])
        captures.append(sum(r.decision == "captured"
                            for r in agspeed._runtime.frame_records()))
    first = captures[0]   # (explain's capture came before)
    assert captures == [first, first, first + 1, first + 2], captures


def test_a_hook_registered_and_removed_inside_the_frame_runs_as_eager(caplog):
    """``handle.remove()`` calls a weak reference to the hook dict (unhashable): a clean
    break, never an internal error, and the hook is gone afterwards."""
    model, ref = _twins()

    def post(module, args, out):
        return out * 2

    def step(m, x):
        handle = m.a.register_forward_hook(post)
        y = m(x)
        handle.remove()
        return y + m(x)

    fast = agspeed.optimize(step, backend="eager")
    for _ in range(2):
        x = torch.randn(3, 4)
        with caplog.at_level("WARNING", logger="agspeed"):
            torch.testing.assert_close(fast(model, x), step(ref, x))
        assert not model.a._forward_hooks and not ref.a._forward_hooks
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
