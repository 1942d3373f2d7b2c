"""Running a cache entry: a CALL entry makes the frame return its compiled result.

The frame's own bytecode never runs; CPython returns the value and clears the frame as
for any return.  These pin that on every version, with exceptions, cells, tracing,
another PEP 523 function, and reference counts.  Torch-free.
"""

import gc
import sys
import weakref

import pytest

import agspeed
from agspeed import _C

CALL, RUN_EAGER = _C.ACTION_CALL, _C.ACTION_RUN_EAGER


class Token:
    pass


def call_ctx(compiled, only=None):
    """A context that answers CALL(compiled) for `only` (a code name) or every code."""
    asked = []

    def ctx(code, f_locals, *frame):
        asked.append(code.co_name)
        if only is None or code.co_name == only:
            return _C.CacheEntry(CALL, compiled=compiled)
        return _C.CacheEntry(RUN_EAGER)

    ctx.asked = asked
    return ctx


body_runs = []


def add(a, b):
    body_runs.append((a, b))
    return a + b


def test_frame_returns_the_compiled_result_without_running_its_body():
    body_runs.clear()
    ctx = call_ctx(lambda f_locals, *_: f_locals["a"] * 100 + f_locals["b"])
    region = _C.Region(add, ctx)
    agspeed.reset()
    assert [region(2, 3) for _ in range(4)] == [203] * 4
    assert body_runs == []
    assert ctx.asked == ["add"]
    assert _C.counters()["cache_hits"] == 3
    assert _C.code_cache(add.__code__)["entries"][0].action_name == "CALL"
    assert _C._eval_frame_owner() == "default" and _C.current_context() is None


def test_callee_frames_can_be_replaced_too():
    def caller(x):
        return add(x, 1) + add(x, 2)

    body_runs.clear()
    ctx = call_ctx(lambda f_locals, *_: -f_locals["b"], only="add")
    assert _C.Region(caller, ctx)(10) == -3
    assert body_runs == []


def test_compiled_exception_propagates_and_frame_is_cleared():
    arg = Token()
    arg_ref = weakref.ref(arg)

    def compiled(f_locals, f_globals=None, f_builtins=None):
        raise ValueError("compiled failed")

    def target(x):
        body_runs.append(x)
        return x

    body_runs.clear()
    region = _C.Region(target, call_ctx(compiled))
    with pytest.raises(ValueError, match="compiled failed") as info:
        region(arg)
    assert body_runs == []
    assert info.value.__traceback__ is not None
    del info, arg
    gc.collect()
    assert arg_ref() is None
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_results_and_arguments_keep_exact_reference_counts():
    result, arg = Token(), Token()
    region = _C.Region(lambda x: x, call_ctx(lambda f_locals, *_: result))
    region(arg)
    before = (sys.getrefcount(result), sys.getrefcount(arg))
    for _ in range(300):
        assert region(arg) is result
    assert (sys.getrefcount(result), sys.getrefcount(arg)) == before


def test_frames_with_cells_and_free_variables():
    def outer(x):
        y = x + 1

        def inner(z):
            return x + y + z

        return inner

    inner = outer(1)
    ctx = call_ctx(lambda f_locals, *_: ("replaced", f_locals), only="inner")

    def with_cell_argument(x):
        def reads():
            return x

        return reads()

    # free variables come from the function's closure (the frame has not copied them)
    assert _C.Region(inner, ctx)(5) == ("replaced", {"z": 5, "x": 1, "y": 2})
    assert _C.Region(with_cell_argument, call_ctx(lambda f, *_: f["x"] * 2))(21) == 42


def test_recursion_through_the_region_inside_compiled():
    def countdown(n):
        return n

    def compiled(f_locals, f_globals=None, f_builtins=None):
        n = f_locals["n"]
        return 0 if n == 0 else 1 + region(n - 1)

    region = _C.Region(countdown, call_ctx(compiled))
    # The compiled callable runs as runtime code: the nested call runs eagerly.
    assert region(3) == 1 + 2


def test_under_a_foreign_eval_function():
    _C._probe_install()
    try:
        before = _C._probe_count()
        assert _C.Region(add, call_ctx(lambda f, *_: "x"))(1, 2) == "x"
        assert _C._probe_count() > before
        assert _C._eval_frame_owner() == "probe"
    finally:
        _C._probe_remove()


@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer is active")
def test_under_settrace():
    events = []

    def tracer(frame, event, arg):
        events.append(event)
        return tracer

    sys.settrace(tracer)
    try:
        value = _C.Region(add, call_ctx(lambda f, *_: 7))(1, 2)
    finally:
        sys.settrace(None)
    assert value == 7


def no_stack():
    pass


def test_frame_without_a_stack_slot_runs_its_own_bytecode():
    # On 3.12+ `def f(): pass` needs no value stack, so it cannot be made to return a
    # value: the entry then runs the function as it is, never the compiled callable.
    called = []
    result = _C.Region(no_stack, call_ctx(lambda f, *_: called.append(1) or "compiled"))()
    if no_stack.__code__.co_stacksize == 0:
        assert result is None and called == []
    else:
        assert result == "compiled" and called == [1]


def test_return_code_dies_with_the_code():
    namespace = {}
    exec("def made(a):\n    return a\n", namespace)
    fn = namespace["made"]
    assert _C.Region(fn, call_ctx(lambda f, *_: 5))(1) == 5
    code_ref = weakref.ref(fn.__code__)
    del fn, namespace
    gc.collect()
    assert code_ref() is None


def test_generators_are_never_replaced():
    def gen(n):
        yield n

    assert list(_C.Region(gen, call_ctx(lambda f, *_: "nope"))(4)) == [4]
