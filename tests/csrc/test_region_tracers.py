"""_C.set_tracers: where torch keeps whether one of its tracers runs (a dispatch mode, a
jit trace).  Under one, a Region calls its target untouched, frames below it included,
as a disabled region does (csrc/region.c).  Torch-free: the flags here are plain dicts,
the probes plain functions."""

import gc
import sys

import pytest

from agspeed import _C


class Recorder:
    """A capture context that runs every frame eager and records the names it is asked
    about in this file."""

    def __init__(self):
        self.asked = []

    def __call__(self, code, f_locals, *frame):
        if code.co_filename == __file__:
            self.asked.append(code.co_name)
        return _C.CacheEntry(_C.ACTION_RUN_EAGER)


def inner(x):
    return x + 1


def target(x):
    return inner(x), _C.current_context()


@pytest.fixture
def tracers():
    """Sets tracers for one test, then puts back the ones set before (the runtime's,
    where a torch test set them in this process)."""
    before = []

    def set_(flags=(), probes=()):
        got = _C.set_tracers(tuple(flags), tuple(probes))
        if not before:
            before.append(got)
        return got

    yield set_
    if before:
        _C.set_tracers(*before[0])


def test_a_flag_on_runs_the_target_untouched_and_off_captures_again(tracers):
    state = {"mode": False}
    tracers([(state, "mode")])
    ctx = Recorder()
    region = _C.Region(target, ctx)
    assert region(1) == (2, ctx)
    assert ctx.asked == ["target", "inner"]
    for on in (True, 1, "tracing", {}):   # anything but None and False (and missing)
        state["mode"] = on
        assert region(1) == (2, None)
    assert ctx.asked == ["target", "inner"]   # nothing asked under the tracer
    for off in (False, None):
        state["mode"] = off
        assert region(1) == (2, ctx)
    del state["mode"]
    assert region(1) == (2, ctx)
    assert _C.current_context() is None


def test_a_probe_answering_true_runs_the_target_untouched(tracers):
    answers = []
    tracers(probes=[lambda: answers[-1] if answers else None])
    ctx = Recorder()
    region = _C.Region(target, ctx)
    for answer, expected in ((None, ctx), (object(), None), (0, ctx), ([1], None)):
        answers.append(answer)
        assert region(5) == (6, expected)


def test_nested_regions_under_a_tracer_and_an_outer_one_after_it(tracers):
    state = {}
    tracers([(state, "on")])
    outer, inner_ctx = Recorder(), Recorder()
    inner_region = _C.Region(target, inner_ctx)

    def outer_fn():
        state["on"] = True        # a tracer entered inside the optimized call
        got = inner_region(0)
        state["on"] = False
        return got, _C.current_context()

    assert _C.Region(outer_fn, outer)() == ((1, None), outer)
    assert inner_ctx.asked == []


def test_a_probe_that_raises_raises_from_the_call(tracers):
    def broken():
        raise RuntimeError("probe failed")

    tracers(probes=[broken])
    with pytest.raises(RuntimeError, match="probe failed"):
        _C.Region(target, Recorder())(1)
    assert _C.current_context() is None
    # a disabled region looks for no tracer
    assert _C.Region(target, None)(1) == (2, None)


def test_set_tracers_returns_what_it_replaces_and_checks_its_arguments(tracers):
    flags, probes = ((({}, "k"),), (len,))
    tracers(flags, probes)
    assert _C.set_tracers((), ()) == (flags, probes)
    assert _C.set_tracers((), ()) == ((), ())
    for bad in [((1,), ()), (([], ()), ()), (((1, "k"),), ()), ((), (1,)), ([], ())]:
        with pytest.raises(TypeError):
            _C.set_tracers(*bad)
    with pytest.raises(TypeError):
        _C.set_tracers(())


def test_the_tracers_hold_their_dicts_and_nothing_more(tracers):
    state = {}
    before = sys.getrefcount(state)
    tracers([(state, "on")])
    assert sys.getrefcount(state) == before + 1
    region = _C.Region(target, Recorder())
    for _ in range(100):
        region(1)
    assert sys.getrefcount(state) == before + 1
    _C.set_tracers((), ())
    gc.collect()
    assert sys.getrefcount(state) == before
