"""Graph breaks inside with blocks of torch's modes (agspeed/_resume.py and
_resume_code.py): the graph leaves the block at its end, the break instruction runs
inside the block entered anew, and the resume function enters it again around the
rest.  Results, gradients, types and the grad mode / autocast state inside and after
the block equal eager's; graph counts no higher than torch._dynamo.explain's; second
calls all cache hits."""

import gc
import os
import sys
import traceback

import pytest

import agspeed
from agspeed import _C

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

from _dynamo_ref import dynamo_graph_count

pytestmark = pytest.mark.torch

SEEN = []   # what the break instruction saw: the modes inside the block


def note(*_values):
    """Called at the break (a graph break: it prints); writes down the modes there."""
    SEEN.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
    print("at the break", len(SEEN))


def modes():
    return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")


def check(fn, make_args, graphs):
    """fn captured in ``graphs`` graphs (no more than torch._dynamo's) and resumed;
    optimized, it gives eager's values, gradients, types, and modes at the break and
    after the call, twice (the second call all cache hits)."""
    args = make_args()
    report = agspeed.explain(fn, *args)
    assert report.graph_count == graphs, report.break_reasons
    assert report.graph_break_count >= 1
    assert report.resume_functions
    assert graphs <= dynamo_graph_count(fn, *make_args())
    fast = agspeed.optimize(fn)
    for call in range(2):
        args = make_args()
        ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        SEEN.clear()
        if call:
            _C.reset_counters()
        out = fast(*args)
        if call:
            counters = _C.counters()
            assert counters["cache_misses"] == 0, counters
            assert counters["cache_hits"] >= 2, counters
        after = modes()
        seen, SEEN[:] = list(SEEN), []
        ref = fn(*ref_args)
        assert seen == SEEN and after == modes() == (True, False)
        assert type(out) is type(ref)
        for o, r in zip(out, ref) if isinstance(ref, tuple) else [(out, ref)]:
            if isinstance(r, torch.Tensor):
                torch.testing.assert_close(o, r)
            else:
                assert o == r
        loss, ref_loss = (out[0], ref[0]) if isinstance(out, tuple) else (out, ref)
        if ref_loss.requires_grad:
            loss.sum().backward()
            ref_loss.sum().backward()
            for a, r in zip(args, ref_args):
                torch.testing.assert_close(a.grad, r.grad)
    return report, seen


def vec():
    return (torch.randn(6, requires_grad=True),)


def in_no_grad(x):
    y = x.sin()
    with torch.no_grad():
        z = y * 2
        note(z)
        w = z + 1
    return w * y + x, w.requires_grad


def test_break_inside_no_grad():
    report, seen = check(in_no_grad, vec, 2)
    assert seen == [(False, False)]
    assert report.resumed_breaks


def in_set_grad_enabled(x):
    y = x * 3
    with torch.set_grad_enabled(False):
        z = y.exp()
        note(z)
        z = z - 1
    return y * z


def test_break_inside_set_grad_enabled():
    _report, seen = check(in_set_grad_enabled, vec, 2)
    assert seen == [(False, False)]


def nested(x):
    y = x.cos()
    with torch.no_grad():
        a = y * 2
        with torch.enable_grad():
            b = y * a
            note(b)
            b = b + x
        c = a + 1
    return b * c


def test_break_inside_nested_blocks():
    _report, seen = check(nested, vec, 2)
    assert seen == [(True, False)]


def in_autocast(x):
    y = x * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = y @ y.T
        note(z)
        w = z @ z
    return w.float() + y.sum(), w.dtype


def test_break_inside_autocast():
    _report, seen = check(in_autocast, lambda: (torch.randn(4, 4, requires_grad=True),), 2)
    assert seen == [(True, True)]


def branch_in_block(x):
    y = x * 2
    with torch.no_grad():
        z = y.sin()
        if z.sum() > 0:
            out = z + y
        else:
            out = z - y
    return out * x


def test_data_dependent_branch_inside_a_block():
    # (inputs on one side of the branch: the other side's resume function is captured
    # on its first call)
    check(branch_in_block, lambda: ((torch.rand(6) + 0.1).requires_grad_(),), 2)
    fast = agspeed.optimize(branch_in_block)
    for sign in (1.0, -1.0):
        x = torch.full((4,), sign * 0.5, requires_grad=True)
        torch.testing.assert_close(fast(x), branch_in_block(x))
        assert torch.is_grad_enabled()


def fails(_t):
    print("about to fail")
    raise ValueError("from the break")


def fails_in_block(x):
    y = x * 2
    with torch.no_grad():
        fails(y)
    return y


def test_an_exception_at_the_break_leaves_the_block():
    fast = agspeed.optimize(fails_in_block)
    for _ in range(2):
        with pytest.raises(ValueError, match="from the break") as info:
            fast(torch.randn(3, requires_grad=True))
        assert torch.is_grad_enabled()
    frames = traceback.extract_tb(info.value.__traceback__)
    here = os.path.abspath(__file__)
    line = fails_in_block.__code__.co_firstlineno + 3
    assert any(f.filename == here and f.lineno == line for f in frames)


def caught_around_block(x):
    y = x * 2
    try:
        with torch.no_grad():
            fails(y)
    except ValueError:
        y = y + torch.is_grad_enabled()
    return y


def test_an_exception_at_the_break_reaches_an_outer_handler():
    fast = agspeed.optimize(caught_around_block)
    for _ in range(2):
        x = torch.randn(3, requires_grad=True)
        torch.testing.assert_close(fast(x), caught_around_block(x))
        assert torch.is_grad_enabled()


def in_try(x):
    y = x * 2
    try:
        note(y)
    finally:
        y = y + 1
    return y.cos()


def test_a_break_under_try_runs_eager_as_dynamo():
    x = torch.randn(3)
    report = agspeed.explain(in_try, x)
    assert report.graph_count == 0 == dynamo_graph_count(in_try, x)
    assert not report.resume_functions
    torch.testing.assert_close(agspeed.optimize(in_try)(x), in_try(x))


def test_managers_made_per_call_are_not_kept():
    from agspeed import _resume_code

    fast = agspeed.optimize(in_no_grad)
    x = torch.randn(6)
    fast(x)
    fn, resumes, _g = next(iter(_resume_code._CACHE[in_no_grad.__code__].values()))
    counts = (sys.getrefcount(fn), [sys.getrefcount(r) for r in resumes])
    gc.collect()
    managers = sum(type(o) is torch.no_grad for o in gc.get_objects())
    for _ in range(5):
        fast(x)
    gc.collect()
    assert (sys.getrefcount(fn), [sys.getrefcount(r) for r in resumes]) == counts
    assert sum(type(o) is torch.no_grad for o in gc.get_objects()) <= managers


class Token:
    """A plain object passed through a failing break: nothing may keep it alive."""


def fails_with_token(x, token):
    y = x * 2
    with torch.no_grad():
        fails(token)
    return y


def test_frames_of_a_failed_break_let_their_values_go():
    import weakref

    fast = agspeed.optimize(fails_with_token)
    for _ in range(2):    # the capture, then a cache hit
        token = Token()
        alive = weakref.ref(token)
        with pytest.raises(ValueError):
            fast(torch.randn(3), token)
        del token
        gc.collect()
        assert alive() is None
        assert torch.is_grad_enabled()


def raises_after_the_break(x):
    y = x * 2
    with torch.no_grad():
        note(y)
        if torch.is_grad_enabled() is False:
            raise KeyError("after the break")
    return y


def test_an_exception_after_the_break_leaves_the_block_entered_again():
    fast = agspeed.optimize(raises_after_the_break)
    for _ in range(2):
        with pytest.raises(KeyError) as info:
            fast(torch.randn(3, requires_grad=True))
        assert torch.is_grad_enabled()
    frames = traceback.extract_tb(info.value.__traceback__)
    line = raises_after_the_break.__code__.co_firstlineno + 5
    assert (os.path.abspath(__file__), line) in [(f.filename, f.lineno) for f in frames]
    assert any(f.name.startswith("resume_in_raises_after_the_break") and f.lineno == line
               for f in frames)


def two_breaks_in_block(x):
    y = x.sin()
    with torch.no_grad():
        a = y * 2
        note(a)
        b = a + 1
        note(b)
        c = b * y
    return c + y


def test_a_second_break_in_the_block_of_a_resume_function():
    report, seen = check(two_breaks_in_block, vec, 3)
    assert seen == [(False, False), (False, False)]
    # the second break, in the first's resume function, resumes where the user's
    # code would: in a resume function of two_breaks_in_block itself
    assert len(set(report.resume_functions)) >= 2
    assert all(name.startswith("resume_in_two_breaks_in_block_at_")
               for name in report.resume_functions)


def in_inference_mode(x):
    y = x.sin()
    with torch.inference_mode():
        a = y * 2
        note(a)
        inside = torch.is_inference_mode_enabled()
        b = a + 1
    return b * 3, (b.is_inference(), inside, torch.is_inference_mode_enabled())


def test_break_inside_inference_mode():
    x = torch.randn(4)
    report = agspeed.explain(in_inference_mode, x)
    assert report.graph_count == 2 <= dynamo_graph_count(in_inference_mode, x)
    fast = agspeed.optimize(in_inference_mode)
    for _ in range(2):
        x = torch.randn(4)
        (out, flags), (ref, ref_flags) = fast(x), in_inference_mode(x)
        torch.testing.assert_close(out, ref)
        assert flags == ref_flags == (True, True, False)
        assert not torch.is_inference_mode_enabled()
