"""The PEP 523 hook: when it is active, what it skips, how it nests, how errors leave it.

These tests drive agspeed._C directly with small recording contexts, so they pin the C
hook's contract without the Python runtime in between.  Torch-free.
"""

import asyncio
import gc
import sys
import threading

import pytest

import agspeed
from agspeed import _C

RUN_EAGER = _C.ACTION_RUN_EAGER
SKIP = _C.ACTION_SKIP


class Recorder:
    """A capture context that runs every frame eager and records the codes of this file
    it is asked about (frames of the standard library are decided but not recorded)."""

    def __init__(self, action=RUN_EAGER, guard=None):
        self.asked = []
        self.locals = []
        self.action = action
        self.guard = guard

    def __call__(self, code, f_locals, *frame):
        if code.co_filename == __file__:
            self.asked.append(code.co_name)
            self.locals.append(dict(f_locals))
        return _C.CacheEntry(self.action, guard=self.guard)


def add(a, b):
    return a + b


def calls_add(n):
    out = []  # a loop, not a comprehension: 3.11 runs those in a frame of their own
    for i in range(n):
        out.append(add(i, 1))
    return out


def test_frames_outside_any_region_are_not_seen():
    ctx = Recorder()
    region = _C.Region(add, ctx)
    add(1, 2)
    assert ctx.asked == []
    assert region(1, 2) == 3
    assert ctx.asked == ["add"]


def test_context_and_hook_are_set_only_inside_the_call():
    ctx = Recorder()
    inside = {}

    def probe():
        inside["ctx"] = _C.current_context()
        inside["owner"] = _C._eval_frame_owner()
        inside["installed"] = _C.hook_installed()

    assert _C.current_context() is None
    assert _C._eval_frame_owner() == "default"
    _C.Region(probe, ctx)()
    assert inside == {"ctx": ctx, "owner": "agspeed", "installed": True}
    assert _C.current_context() is None
    assert _C._eval_frame_owner() == "default"
    assert not _C.hook_installed()


def test_other_threads_are_not_seen_while_one_thread_is_inside():
    ctx = Recorder()
    entered, release = threading.Event(), threading.Event()
    outside_view = {}

    def hold():
        entered.set()
        release.wait(10)

    def other_thread_work():
        outside_view["ctx"] = _C.current_context()
        outside_view["sum"] = sum(calls_add(5))

    holder = threading.Thread(target=_C.Region(hold, ctx))
    holder.start()
    assert entered.wait(10)
    try:
        assert _C.hook_installed()  # installed for the interpreter...
        worker = threading.Thread(target=other_thread_work)
        worker.start()
        worker.join(10)
    finally:
        release.set()
        holder.join(10)
    assert outside_view == {"ctx": None, "sum": 15}
    assert "calls_add" not in ctx.asked and "add" not in ctx.asked  # ...but not for them
    assert "other_thread_work" not in ctx.asked
    assert ctx.asked[0] == "hold"
    assert not _C.hook_installed()


def test_two_threads_each_see_only_their_own_frames():
    barrier = threading.Barrier(2)

    def leaf_one(x):
        return x

    def leaf_two(x):
        return -x

    def f_one():
        barrier.wait(10)
        return leaf_one(1)

    def f_two():
        barrier.wait(10)
        return [leaf_two(i) for i in range(3)]

    one, two = Recorder(), Recorder()
    threads = [threading.Thread(target=_C.Region(f_one, one)),
               threading.Thread(target=_C.Region(f_two, two))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert one.asked == ["f_one", "leaf_one"]
    assert [n for n in two.asked if n != "<listcomp>"] == ["f_two", "leaf_two"]
    assert _C._eval_frame_owner() == "default"


def test_nested_regions_use_the_innermost_context_and_restore_the_outer():
    outer, inner = Recorder(), Recorder()
    seen = []

    def inner_fn():
        seen.append(_C.current_context())
        return add(2, 3)

    inner_region = _C.Region(inner_fn, inner)

    def outer_fn():
        seen.append(_C.current_context())
        r = inner_region()
        seen.append(_C.current_context())
        return r + calls_add(1)[0]

    assert _C.Region(outer_fn, outer)() == 6
    assert seen == [outer, inner, outer]
    assert inner.asked == ["inner_fn", "add"]
    # add's entry, made while the inner context was current, is valid in every context.
    assert outer.asked == ["outer_fn", "calls_add"]
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_reentrant_recursion_through_the_same_region():
    ctx = Recorder()

    def count_down(n):
        return 0 if n == 0 else 1 + region(n - 1)

    region = _C.Region(count_down, ctx)
    assert region(20) == 20
    assert ctx.asked == ["count_down"]  # decided once, then cached
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_disable_scope_and_decorator_hide_frames_inside_an_optimized_call():
    ctx = Recorder()

    @agspeed.disable
    def hidden_by_decorator():
        return add(1, 2)

    def body():
        with agspeed.disable():
            assert _C.current_context() is None
            calls_add(2)
        assert _C.current_context() is ctx
        result = hidden_by_decorator()
        assert _C.current_context() is ctx
        return result + add(0, 0)

    assert _C.Region(body, ctx)() == 3
    assert ctx.asked == ["body", "add"]  # add seen only after the disabled parts
    assert _C.current_context() is None


def test_function_raising_restores_context_and_hook():
    ctx = Recorder()

    def boom(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad 7"):
        _C.Region(boom, ctx)(7)
    assert _C.current_context() is None
    assert _C._eval_frame_owner() == "default"
    assert _C.Region(add, ctx)(1, 1) == 2


def test_context_that_raises_propagates_without_running_the_frame():
    ran = []

    def side_effect(x):
        ran.append(x)
        return x

    def failing_ctx(code, f_locals, *frame):
        raise KeyError("decision failed")

    before = _C.counters()["callback_errors"]
    with pytest.raises(KeyError, match="decision failed") as info:
        _C.Region(side_effect, failing_ctx)(1)
    assert ran == []
    assert info.value.__traceback__ is not None
    assert "failing_ctx" in [entry.name for entry in info.traceback]  # where it was raised
    assert _C.counters()["callback_errors"] == before + 1
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    # The code was not marked: a working context is asked again and it runs.
    ctx = Recorder()
    assert _C.Region(side_effect, ctx)(2) == 2
    assert ran == [2] and ctx.asked == ["side_effect"]


def test_context_raising_for_a_callee_propagates_through_the_caller():
    def caller():
        try:
            return add(1, 2)
        except KeyError:
            return "caught"

    def ctx(code, f_locals, *frame):
        if code.co_name == "add":
            raise KeyError("no")
        return _C.CacheEntry(RUN_EAGER)

    assert _C.Region(caller, ctx)() == "caught"


def test_context_returning_something_else_is_a_type_error():
    with pytest.raises(TypeError, match="returned str .*expected an agspeed._C.CacheEntry"):
        _C.Region(add, lambda code, f_locals, *frame: "run it")(1, 2)
    assert _C._eval_frame_owner() == "default"


def test_guard_that_raises_propagates():
    def bad_guard(f_locals, *frame):
        raise RuntimeError("guard failed loudly")

    ctx = Recorder(guard=bad_guard)
    region = _C.Region(add, ctx)
    assert region(1, 2) == 3  # first call: decided, no guard checked yet
    with pytest.raises(RuntimeError, match="guard failed loudly"):
        region(1, 2)
    assert _C.current_context() is None


def test_previous_eval_function_keeps_working_and_is_restored():
    _C._probe_install()
    try:
        assert _C._eval_frame_owner() == "probe"
        ctx = Recorder()
        before = _C._probe_count()
        owner_inside = []

        def body():
            owner_inside.append(_C._eval_frame_owner())
            return calls_add(10)

        assert _C.Region(body, ctx)() == list(range(1, 11))
        # body, calls_add and ten add frames were forwarded to the probe.
        assert _C._probe_count() - before >= 12
        assert owner_inside == ["agspeed"]
        assert _C._eval_frame_owner() == "probe"
    finally:
        _C._probe_remove()
    assert _C._eval_frame_owner() == "default"


def test_error_in_decision_under_a_foreign_eval_function_is_clean():
    _C._probe_install()
    try:
        with pytest.raises(KeyError):
            _C.Region(add, lambda c, l, *frame: (_ for _ in ()).throw(KeyError("x")))(1, 2)
        assert _C._eval_frame_owner() == "probe"
    finally:
        _C._probe_remove()


def gen_numbers(n):
    for i in range(n):
        yield add(i, 0)


async def coro_value(x):
    return add(x, 1)


async def agen_numbers(n):
    for i in range(n):
        yield i


def run_generators():
    total = sum(gen_numbers(4))
    try:
        coro_value(1).send(None)
    except StopIteration as stop:
        total += stop.value
    total += asyncio.run(_collect(agen_numbers(3)))
    return total


async def _collect(agen):
    return sum([x async for x in agen])


def test_generators_coroutines_and_async_generators_are_skipped_but_run():
    ctx = Recorder()
    expected = run_generators()
    assert _C.Region(run_generators, ctx)() == expected
    for skipped in ("gen_numbers", "coro_value", "agen_numbers", "_collect"):
        assert skipped not in ctx.asked
    assert "add" in ctx.asked  # callees of a generator are still seen


def test_code_marked_skip_by_the_context_is_asked_about_once():
    ctx = Recorder(action=SKIP)
    region = _C.Region(calls_add, ctx)
    for _ in range(3):
        assert region(2) == [1, 2]
    assert ctx.asked == ["calls_add", "add"]
    assert _C.code_cache(add.__code__)["skip"] is True
    assert _C.code_cache(add.__code__)["entries"] == []


class Disabler(Recorder):
    """Answers DISABLE for ``wrapper`` and RUN_EAGER for everything else."""

    def __call__(self, code, f_locals, *frame):
        entry = super().__call__(code, f_locals, *frame)
        if code.co_name == "wrapper":
            return _C.CacheEntry(_C.ACTION_DISABLE)
        return entry


def wrapper(fn, *args):
    return fn(*args)


def calls_through_wrapper(n):
    return [add(n, 1), wrapper(calls_add, n), add(n, 2)]


def test_code_marked_disable_runs_with_everything_it_calls_unseen():
    ctx = Disabler()
    region = _C.Region(calls_through_wrapper, ctx)
    for _ in range(3):
        assert region(2) == [3, [1, 2], 4]
    # the wrapper is asked about once; nothing under it, in any call, is asked about
    assert ctx.asked == ["calls_through_wrapper", "add", "wrapper"]
    state = _C.code_cache(wrapper.__code__)
    assert state["disable"] is True and state["skip"] is False and state["entries"] == []
    # once its call returns the context is back: a later region still sees calls_add
    assert _C.Region(calls_add, ctx)(1) == [1]
    assert ctx.asked == ["calls_through_wrapper", "add", "wrapper", "calls_add"]
    agspeed.reset()  # forgets the mark with the rest
    assert _C.code_cache(wrapper.__code__)["disable"] is False


def test_a_disabled_frame_that_raises_leaves_the_context_stack_as_it_was():
    def boom(n):
        raise KeyError(n)

    ctx = Disabler()
    region = _C.Region(calls_through_wrapper, ctx)
    with pytest.raises(KeyError):
        _C.Region(wrapper, ctx)(boom, 3)
    assert region(1) == [2, [1], 3]
    assert _C.code_cache(boom.__code__)["has_cache"] is False


def test_mark_skip_from_python():
    def lonely(x):
        return x

    _C.mark_skip(lonely.__code__)
    ctx = Recorder()
    assert _C.Region(lonely, ctx)(5) == 5
    assert ctx.asked == []
    with pytest.raises(TypeError, match="not function"):
        _C.mark_skip(lonely)


def test_frames_started_while_the_context_runs_are_not_seen():
    asked = []

    def helper_used_by_ctx():
        return 1

    def ctx(code, f_locals, *frame):
        asked.append(code.co_name)
        helper_used_by_ctx()  # would recurse into ctx if the hook did not pass it
        return _C.CacheEntry(RUN_EAGER)

    assert _C.Region(add, ctx)(1, 2) == 3
    assert asked == ["add"]
    assert _C.code_cache(helper_used_by_ctx.__code__)["has_cache"] is False


def test_runtime_context_skips_agspeed_own_code():
    import os

    pkg_dir = os.path.dirname(agspeed.__file__)
    agspeed.optimize(calls_add)(3)
    records = agspeed._runtime.frame_records()
    assert [r.name for r in records] == ["calls_add", "add"]
    assert not any(r.filename.startswith(pkg_dir) for r in records)


def test_decision_is_cached_and_counted():
    ctx = Recorder()
    region = _C.Region(calls_add, ctx)
    agspeed.reset()
    region(100)
    assert ctx.asked == ["calls_add", "add"]
    counters = _C.counters()
    assert counters["cache_misses"] == 2
    assert counters["cache_hits"] == 99
    assert _C.code_cache(add.__code__)["entries"][0].hits == 99
    region(100)
    assert ctx.asked == ["calls_add", "add"]
    assert _C.counters()["cache_hits"] == 99 + 101


def test_guard_failure_asks_again_and_keeps_both_entries():
    def needs_one(f_locals, *frame):
        return f_locals["b"] == 1

    ctx = Recorder(guard=needs_one)
    region = _C.Region(add, ctx)
    region(0, 1)
    region(0, 1)
    assert len(ctx.asked) == 1
    ctx.guard = lambda f_locals, *frame: f_locals["b"] == 2
    region(0, 2)
    assert len(ctx.asked) == 2
    region(0, 1)
    region(0, 2)
    assert len(ctx.asked) == 2
    assert len(_C.code_cache(add.__code__)["entries"]) == 2


def test_entry_bound_to_another_context_is_not_used():
    mine, other = Recorder(), Recorder()

    def ctx_bound(code, f_locals, *frame):
        mine.asked.append(code.co_name)
        return _C.CacheEntry(RUN_EAGER, context=ctx_bound)

    def leaf(x):
        return x

    _C.Region(leaf, ctx_bound)(1)
    _C.Region(leaf, ctx_bound)(1)
    _C.Region(leaf, other)(1)
    assert mine.asked == ["leaf"]
    assert other.asked == ["leaf"]


def test_context_receives_arguments_by_name():
    ctx = Recorder()

    def many(a, b=2, *rest, c, d=4, **extra):
        return a

    _C.Region(many, ctx)(1, 5, 6, 7, c=3, e=9)
    assert ctx.locals[0] == {"a": 1, "b": 5, "rest": (6, 7), "c": 3, "d": 4,
                             "extra": {"e": 9}}


def test_deep_recursion_works_and_unbounded_recursion_raises_cleanly():
    ctx = Recorder()

    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)

    assert _C.Region(depth, ctx)(400) == 400

    def forever(n):
        return forever(n + 1)

    with pytest.raises(RecursionError):
        _C.Region(forever, ctx)(0)
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    assert _C.Region(depth, ctx)(10) == 10


class Shapes:
    factor = 3

    def __init__(self, base):
        self.base = base

    def scaled(self, x, *, extra=0):
        return self.base * x + extra

    @classmethod
    def make(cls, x):
        return cls(x).scaled(cls.factor)

    @staticmethod
    def plain(x, y=10):
        return x - y


def closure_maker(k):
    def inner(x):
        return x * k

    return inner


def cell_argument(x):
    def reads_x():
        return x + 1

    x = x * 2
    return reads_x()


def everything():
    s = Shapes(2)
    return (
        s.scaled(4, extra=1), Shapes.make(5), Shapes.plain(3), Shapes.plain(3, y=1),
        closure_maker(6)(7), cell_argument(10), [closure_maker(i)(2) for i in range(3)],
    )


def test_results_are_unchanged_for_methods_closures_and_cells():
    expected = everything()
    ctx = Recorder()
    assert _C.Region(everything, ctx)() == expected
    assert _C.Region(everything, ctx)() == expected  # cached decisions
    assert {"scaled", "make", "plain", "inner", "cell_argument", "reads_x"} <= set(ctx.asked)


def test_exceptions_inside_keep_their_traceback():
    def deep_error():
        return {}["missing"]

    def outer():
        return deep_error()

    with pytest.raises(KeyError) as info:
        _C.Region(outer, Recorder())()
    names = [entry.name for entry in info.traceback]
    assert "outer" in names and "deep_error" in names


def test_region_binds_as_a_method():
    ctx = Recorder()

    class Holder:
        value = 5
        get = _C.Region(lambda self, x: self.value + x, ctx)

    assert Holder().get(1) == 6
    assert Holder.get(Holder(), 2) == 7


def test_region_rejects_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable, not int"):
        _C.Region(42, None)
    with pytest.raises(TypeError, match="ctx must be None or callable, not int"):
        _C.Region(add, 42)
    with pytest.raises(TypeError, match="not float"):
        _C.Scope(4.2)
    with pytest.raises(TypeError, match="guard must be None or callable, not int"):
        _C.CacheEntry(RUN_EAGER, guard=1)
    with pytest.raises(ValueError, match="unknown action"):
        _C.CacheEntry(99)


def test_scope_cannot_be_entered_twice_or_exited_unentered():
    scope = _C.Scope(None)
    with pytest.raises(RuntimeError):
        scope.__exit__(None, None, None)
    with scope:
        with pytest.raises(RuntimeError):
            scope.__enter__()
    assert _C.current_context() is None


def test_scope_with_a_context_hooks_frames_inside():
    ctx = Recorder()
    with _C.Scope(ctx):
        assert _C.current_context() is ctx
        assert _C._eval_frame_owner() == "agspeed"
        add(1, 2)
    assert ctx.asked == ["add"]
    assert _C._eval_frame_owner() == "default"


def test_disabled_runtime_calls_through_without_context():
    ctx = Recorder()
    _C.set_enabled(False)
    try:
        assert _C.Region(calls_add, ctx)(2) == [1, 2]
        assert ctx.asked == []
        assert not _C.is_enabled()
    finally:
        _C.set_enabled(True)
    assert _C.is_enabled()


@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer is active")
def test_settrace_debuggers_still_see_frames_inside():
    seen = []

    def tracer(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)
        return None

    sys.settrace(tracer)
    try:
        _C.Region(calls_add, Recorder())(2)
    finally:
        sys.settrace(None)
    assert seen.count("add") == 2 and "calls_add" in seen


class HalfBuilt:
    """Like an object mid-__init__ whose __getattr__ reads an attribute not set yet."""

    attribute_calls = 0

    def __init__(self, value):
        self.value = value

    def __getattr__(self, name):
        HalfBuilt.attribute_calls += 1
        return getattr(self.not_set_yet, name)  # recurses until RecursionError


def use_half_built(obj):
    return obj.value


def test_deciding_runs_no_code_of_the_arguments():
    # Regression: describing a frame's locals used getattr(value, "shape"), which ran
    # this __getattr__ (eager never does) and, on a half-built object, recursed with no
    # end in sight.  Deciding must not touch arguments beyond their type.
    HalfBuilt.attribute_calls = 0
    obj = HalfBuilt(3)
    assert agspeed.optimize(use_half_built)(obj) == 3
    assert HalfBuilt.attribute_calls == 0
    records = [r for r in agspeed._runtime.frame_records() if r.name == "use_half_built"]
    assert records and records[0].locals == (("obj", "HalfBuilt"),)


def test_module_and_class_bodies_are_not_decided_about():
    ctx = Recorder()
    source = "class Made:\n    x = 1\n\ndef made_fn():\n    return Made.x\n"
    namespace = {}

    def run_module_code():
        exec(compile(source, __file__, "exec"), namespace)
        return namespace["made_fn"]()

    assert _C.Region(run_module_code, ctx)() == 1
    assert ctx.asked == ["run_module_code", "made_fn"]


def test_hook_replaced_inside_a_region_is_left_in_place_and_heals():
    # Another tool installs its evaluation function while we are inside: on leaving we
    # must not remove theirs.  It chains to ours and restores ours when it goes; the
    # next region's exit then puts CPython's default back.
    def installs_probe():
        _C._probe_install()
        return add(1, 2)

    before = _C.counters()["hook_displaced"]
    try:
        assert _C.Region(installs_probe, Recorder())() == 3
        assert _C._eval_frame_owner() == "probe"
        assert _C.counters()["hook_displaced"] == before + 1
    finally:
        _C._probe_remove()
    assert _C._eval_frame_owner() == "agspeed"  # restored by the probe; harmless: no context
    assert add(2, 2) == 4
    assert _C.Region(add, Recorder())(1, 1) == 2
    assert _C._eval_frame_owner() == "default"


def test_context_is_called_with_code_locals_globals_and_builtins():
    calls = []

    def ctx(code, f_locals, f_globals, f_builtins):
        calls.append((code, f_locals, f_globals, f_builtins))
        return _C.CacheEntry(RUN_EAGER)

    assert _C.Region(add, ctx)(1, 2) == 3
    [(code, f_locals, f_globals, f_builtins)] = calls
    assert code is add.__code__
    assert f_locals == {"a": 1, "b": 2}
    assert f_globals is add.__globals__
    assert f_builtins["len"] is len


def test_guard_is_called_with_locals_globals_and_builtins():
    calls = []

    def guard(f_locals, f_globals, f_builtins):
        calls.append((dict(f_locals), f_globals, f_builtins))
        return True

    region = _C.Region(add, Recorder(guard=guard))
    region(1, 2)
    assert calls == []  # the entry was just made: its guard is not asked on that frame
    region(3, 4)
    [(f_locals, f_globals, f_builtins)] = calls
    assert f_locals == {"a": 3, "b": 4}
    assert f_globals is add.__globals__ and f_builtins["len"] is len


def test_context_mutating_its_locals_dict_does_not_change_the_arguments():
    def ctx(code, f_locals, *frame):
        f_locals["a"] = 100
        return _C.CacheEntry(RUN_EAGER)

    def guard(f_locals, *frame):
        f_locals["b"] = 100
        return True

    assert _C.Region(add, ctx)(1, 2) == 3
    agspeed.reset()
    region = _C.Region(add, lambda code, f_locals, *frame: _C.CacheEntry(RUN_EAGER,
                                                                         guard=guard))
    assert region(1, 2) == 3
    assert region(1, 2) == 3  # the guard ran on this one


def test_cell_argument_is_passed_to_the_context_as_its_value():
    ctx = Recorder()
    assert _C.Region(cell_argument, ctx)(10) == cell_argument(10)
    assert ctx.asked[0] == "cell_argument"
    assert ctx.locals[0] == {"x": 10}  # the raw value, not a cell: MAKE_CELL has not run


def test_guard_that_raises_counts_as_a_callback_error_and_restores_state():
    def bad_guard(f_locals, *frame):
        raise RuntimeError("guard failed loudly")

    ran = []

    def body(x):
        ran.append(x)
        return x

    ctx = Recorder(guard=bad_guard)
    region = _C.Region(body, ctx)
    assert region(1) == 1  # decided: the entry with the guard is made
    before = _C.counters()["callback_errors"]
    with pytest.raises(RuntimeError, match="guard failed loudly"):
        region(2)
    assert ran == [1]  # the body did not run for 2
    assert _C.counters()["callback_errors"] == before + 1
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_context_error_inside_a_nested_region_restores_the_outer_context():
    outer = Recorder()
    seen = []

    def failing_ctx(code, f_locals, *frame):
        raise LookupError("inner decision failed")

    inner_region = _C.Region(add, failing_ctx)

    def outer_fn():
        try:
            inner_region(1, 2)
        except LookupError as exc:
            seen.append(str(exc))
        seen.append(_C.current_context())
        seen.append(_C._eval_frame_owner())
        return add(2, 2)

    assert _C.Region(outer_fn, outer)() == 4
    assert seen == ["inner decision failed", outer, "agspeed"]
    assert outer.asked == ["outer_fn", "add"]  # add was never cached by the failed decision
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_exception_through_nested_regions_restores_each_level():
    outer, inner = Recorder(), Recorder()
    seen = []

    def inner_fn():
        raise ValueError("from inside")

    inner_region = _C.Region(inner_fn, inner)

    def outer_fn():
        try:
            inner_region()
        except ValueError:
            seen.append(_C.current_context())
        raise IndexError("from outside")

    with pytest.raises(IndexError, match="from outside"):
        _C.Region(outer_fn, outer)()
    assert seen == [outer]
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, StopIteration,
                                      GeneratorExit])
def test_base_exceptions_from_the_context_propagate_and_restore_state(exc_type):
    ran = []

    def body():
        ran.append(1)

    def ctx(code, f_locals, *frame):
        raise exc_type("stop here")

    with pytest.raises(exc_type):
        _C.Region(body, ctx)()
    assert ran == []
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_context_reaching_the_recursion_limit_while_deciding_raises_cleanly():
    # Each level calls a function never decided about, so the context is asked at every
    # depth, including the ones where the context itself has no stack left.
    def ctx(code, f_locals, *frame):
        return _C.CacheEntry(RUN_EAGER)

    def descend(n):
        def fresh(k):
            return k

        return fresh(n) + descend(n + 1)

    region = _C.Region(descend, ctx)
    with pytest.raises(RecursionError):
        region(0)
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    assert _C.Region(add, ctx)(1, 2) == 3


def test_recursion_500_deep_through_a_region():
    ctx = Recorder()

    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)

    assert _C.Region(depth, ctx)(500) == 500
    assert ctx.asked == ["depth"]


def test_entries_are_kept_most_recently_used_first():
    def guard_for(b):
        def guard(f_locals, *frame):
            return f_locals["b"] == b

        guard.b = b
        return guard

    def ctx(code, f_locals, *frame):
        return _C.CacheEntry(RUN_EAGER, guard=guard_for(f_locals["b"]))

    region = _C.Region(add, ctx)
    for b in (1, 2, 3):
        region(0, b)
    order = [e.guard.b for e in _C.code_cache(add.__code__)["entries"]]
    assert order == [3, 2, 1]  # newest first
    region(0, 1)
    entries = _C.code_cache(add.__code__)["entries"]
    # Guarded entries carry the frame's signature (int arguments: all alike) and are
    # found through the signature table, most recent first, each guard in turn; a hit
    # does not reorder them (order matters only among one signature's entries).
    assert all(e.has_signature for e in entries)
    assert len({e.signature for e in entries}) == 1
    assert [e.guard.b for e in entries] == [3, 2, 1]
    assert [e.hits for e in entries] == [0, 0, 1]


def test_entries_without_a_signature_move_to_the_front_on_a_hit():
    class Ctx:
        def __call__(self, code, f_locals, *frame):
            return _C.CacheEntry(RUN_EAGER, context=self)  # no guard: no signature

    a, b = Ctx(), Ctx()
    in_a, in_b = _C.Region(add, a), _C.Region(add, b)
    in_a(0, 1)
    in_b(0, 1)
    entries = _C.code_cache(add.__code__)["entries"]
    assert [e.context for e in entries] == [b, a]
    assert [e.has_signature for e in entries] == [0, 0]
    in_a(0, 1)
    entries = _C.code_cache(add.__code__)["entries"]
    assert [e.context for e in entries] == [a, b]  # the hit moved to the front
    assert [e.hits for e in entries] == [1, 0]


def test_skip_marked_code_is_counted_as_skipped_frames():
    def lonely(x):
        return x

    _C.mark_skip(lonely.__code__)
    region = _C.Region(lambda: [lonely(i) for i in range(5)], Recorder())
    assert region() == list(range(5))
    assert _C.counters()["frames_skipped"] >= 5
    assert _C.counters()["cache_misses"] <= 2  # the lambda (and 3.11's listcomp) only


def test_region_exposes_its_function_and_context():
    ctx = Recorder()
    region = _C.Region(add, ctx)
    assert region.__agspeed_fn__ is add and region.__agspeed_ctx__ is ctx
    assert _C.Region(add, None).__agspeed_ctx__ is None
    assert "add" in repr(region)


def test_disable_object_shared_by_threads_keeps_each_threads_context():
    # One `agspeed.disable()` object used as `with` by two threads at once, one of them
    # inside an optimized call: each thread must get its own context back.  Both run in
    # worker threads so that a wrong context cannot outlive this test.
    off = agspeed.disable()
    ctx = Recorder()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    after = {}

    def leaf_after_with():
        return 1

    def thread_a_body():
        with off:
            a_in.set()
            b_in.wait(10)
        after["a"] = _C.current_context()
        leaf_after_with()
        a_out.set()

    def thread_b_body():
        a_in.wait(10)
        with off:
            b_in.set()
            a_out.wait(10)
        after["b"] = _C.current_context()

    threads = [threading.Thread(target=_C.Region(thread_a_body, ctx)),
               threading.Thread(target=thread_b_body)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert after == {"a": ctx, "b": None}
    assert "leaf_after_with" in ctx.asked


def _disabled_generator():
    with agspeed.disable():
        yield 1
        yield 2


def test_generator_suspended_in_disable_leaves_no_context_once_it_finishes():
    # docs/architecture.md: a generator suspended inside `with agspeed.disable():` leaves
    # the thread disabled until it leaves the block or the optimized call it entered it in
    # returns.  Once it has left, outside every optimized call, the thread must be outside
    # every context again (or its frames reach that context whenever another thread is
    # inside an optimized call).
    # Run in a worker thread so that a wrong context cannot outlive this test.
    ctx = Recorder()
    after = {}

    def body():
        gen = _disabled_generator()
        next(gen)
        return gen

    def scenario():
        gen = _C.Region(body, ctx)()
        after["rest"] = list(gen)  # resumes and leaves the `with` outside the region
        after["ctx"] = _C.current_context()

    worker = threading.Thread(target=scenario)
    worker.start()
    worker.join(10)
    assert after == {"rest": [2], "ctx": None}


def test_generator_left_disabled_inside_another_call_keeps_that_calls_context():
    # Entered inside one optimized call, left inside another: leaving must not bring back
    # the first call's context, nor take away the second's.
    first, second = Recorder(), Recorder()
    seen = {}

    def start():
        gen = _disabled_generator()
        next(gen)
        seen["inside first"] = _C.current_context()
        return gen

    def finish(gen):
        seen["rest"] = list(gen)
        seen["inside second"] = _C.current_context()

    def scenario():
        gen = _C.Region(start, first)()
        seen["between"] = _C.current_context()
        _C.Region(finish, second)(gen)
        seen["after"] = _C.current_context()

    worker = threading.Thread(target=scenario)
    worker.start()
    worker.join(10)
    assert seen == {"inside first": None, "between": None, "rest": [2],
                    "inside second": second, "after": None}
    assert _C._eval_frame_owner() == "default"


def test_scopes_left_out_of_order_bring_back_no_context():
    # Two generators' `with` blocks, the older left first: when the newer one leaves, the
    # older one's context must not reappear.  Contexts are held only while their slot is.
    ctx = Recorder()
    before = sys.getrefcount(ctx)
    older, newer = _C.Scope(ctx), _C.Scope(None)
    older.__enter__()
    newer.__enter__()
    older.__exit__(None, None, None)
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    assert sys.getrefcount(ctx) == before + 1  # the Scope's own reference only
    newer.__exit__(None, None, None)
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    add(1, 2)
    assert ctx.asked == []
    with older:  # a Scope left out of order can be entered again
        assert _C.current_context() is ctx
    del older
    assert sys.getrefcount(ctx) == before


def test_scope_destroyed_while_entered_takes_its_context_with_it():
    ctx = Recorder()
    before = sys.getrefcount(ctx)
    scope = _C.Scope(ctx)
    scope.__enter__()
    assert _C.current_context() is ctx and _C._eval_frame_owner() == "agspeed"
    del scope
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    assert sys.getrefcount(ctx) == before


def test_scope_left_on_another_thread_changes_no_context_there_or_here():
    # The other thread cannot reach this thread's stack: leaving there changes nothing on
    # either thread, and the Region the Scope was entered in takes its push away on return.
    ctx = Recorder()
    seen = {}

    def leave(scope):
        scope.__exit__(None, None, None)
        seen["leaver"] = _C.current_context()

    def body():
        scope = _C.Scope(None)
        scope.__enter__()
        worker = threading.Thread(target=leave, args=(scope,))
        worker.start()
        worker.join(10)
        seen["entering, inside"] = _C.current_context()

    def scenario():
        _C.Region(body, ctx)()
        seen["entering, after"] = _C.current_context()

    worker = threading.Thread(target=scenario)
    worker.start()
    worker.join(10)
    assert seen == {"leaver": None, "entering, inside": None, "entering, after": None}
    assert _C._eval_frame_owner() == "default"


def test_deep_stack_survives_a_scope_left_from_its_bottom():
    # Deeper than the slots kept without allocation, with the bottom push (a generator's
    # disable block) removed from under twenty optimized calls.
    ctx = Recorder()
    before = sys.getrefcount(ctx)
    gen = _disabled_generator()
    assert next(gen) == 1
    seen = []

    def count_down(n):
        if n == 0:
            seen.append(list(gen))
        result = 0 if n == 0 else 1 + region(n - 1)
        seen.append(_C.current_context() is ctx)
        return result

    region = _C.Region(count_down, ctx)
    assert region(20) == 20
    assert seen == [[2]] + [True] * 21
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"
    # The recorder keeps each frame's locals, which include count_down's free variable
    # `region` (itself holding ctx): drop them before counting.
    ctx.locals.clear()
    del region, count_down
    gc.collect()
    assert sys.getrefcount(ctx) == before
