"""The public API on plain functions: optimize, disable, reset, counters, backends.

Torch-free.
"""

import functools
import inspect
import pickle
import sys
import threading

import pytest

import agspeed
from agspeed import _C


def scale(x, factor=2):
    """Multiply x by factor."""
    return x * factor


@agspeed.optimize
def picklable_optimized(x):
    return x + 1


def test_optimize_returns_a_wrapped_callable_with_the_same_results():
    fast = agspeed.optimize(scale)
    assert fast(3) == 6 and fast(3, factor=5) == 15
    assert fast.__name__ == "scale" and fast.__doc__ == "Multiply x by factor."
    assert fast.__wrapped__ is scale
    assert inspect.signature(fast) == inspect.signature(scale)
    assert fast.__module__ == __name__


def test_optimize_as_decorator_with_and_without_arguments():
    @agspeed.optimize
    def a(x):
        return x - 1

    @agspeed.optimize(backend="eager", fullgraph=False)
    def b(x):
        return x - 2

    assert a(10) == 9 and b(10) == 8
    assert a.__name__ == "a" and b.__name__ == "b"


def test_optimized_function_runs_inside_the_runtime():
    seen = []

    def body():
        seen.append(_C.current_context())

    agspeed.optimize(body)()
    assert seen[0] is not None and seen[0].backend_name == "auto"


def test_optimize_decorates_methods():
    class Counter:
        def __init__(self):
            self.n = 0

        @agspeed.optimize
        def bump(self, k=1):
            self.n += k
            return self.n

    c = Counter()
    assert c.bump() == 1 and c.bump(k=3) == 4
    assert Counter.bump(c) == 5


def test_optimized_module_level_function_pickles_by_name():
    assert pickle.loads(pickle.dumps(picklable_optimized)) is picklable_optimized


fast_scale = agspeed.optimize(scale)


def test_optimized_function_under_another_name_refuses_to_pickle():
    # Its qualified name is the plain function's: unpickling must not silently give back
    # the unoptimized function.
    with pytest.raises(pickle.PicklingError, match="not the same object"):
        pickle.dumps(fast_scale)


def test_optimized_local_function_refuses_to_pickle():
    def local(x):
        return x

    with pytest.raises((TypeError, pickle.PicklingError, AttributeError)):
        pickle.dumps(agspeed.optimize(local))


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="not int") as info:
        agspeed.optimize(42)
    assert isinstance(info.value, agspeed.AgspeedError)
    with pytest.raises(ValueError, match="'nope'.*eager") as info:
        agspeed.optimize(scale, backend="nope")
    assert isinstance(info.value, agspeed.UnknownBackendError)
    with pytest.raises(TypeError, match="backend must be.*not int") as info:
        agspeed.optimize(scale, backend=3)
    assert isinstance(info.value, agspeed.AgspeedError)
    with pytest.raises(TypeError, match="'bogus'") as info:
        agspeed.optimize(scale, bogus=1)
    assert isinstance(info.value, agspeed.AgspeedError)
    with pytest.raises(TypeError, match="fullgraph.*bool.*str") as info:
        agspeed.optimize(scale, fullgraph="yes")
    assert isinstance(info.value, agspeed.AgspeedError)
    with pytest.raises(TypeError, match="dynamic"):
        agspeed.optimize(scale, dynamic=3)
    with pytest.raises(TypeError, match="'bogus'"):
        agspeed.optimize(bogus=1)  # the decorator form checks options up front


def test_optimize_disable_option_returns_the_object():
    assert agspeed.optimize(scale, disable=True) is scale


def test_disable_context_manager_is_reentrant():
    seen = []
    off = agspeed.disable()

    def body():
        with off:
            with off:
                seen.append(_C.current_context())
            seen.append(_C.current_context())
        seen.append(_C.current_context())

    agspeed.optimize(body)()
    assert seen[0] is None and seen[1] is None and seen[2] is not None


def test_disable_exit_without_enter_raises_a_clear_error():
    off = agspeed.disable()
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        off.__exit__(None, None, None)
    with off:
        with off:
            pass
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        off.__exit__(None, None, None)  # one exit too many
    assert _C.current_context() is None


def test_disable_block_left_on_another_thread_changes_nothing_there():
    # A generator suspended in the block and collected (closed) on another thread: leaving
    # there is quiet and changes no context; the entering thread's push is dropped when the
    # optimized call it was made in returns.
    def suspended():
        with agspeed.disable():
            yield

    seen, unraisable = {}, []

    def enter_in_a_call():
        gen = suspended()
        next(gen)
        seen["inside"] = _C.current_context()
        return gen

    def entering_thread():
        seen["gen"] = agspeed.optimize(enter_in_a_call)()
        seen["after"] = _C.current_context()

    worker = threading.Thread(target=entering_thread)
    worker.start()
    worker.join(10)
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        del seen["gen"]  # closed here, on the main thread
    finally:
        sys.unraisablehook = old_hook
    assert unraisable == []
    assert seen == {"inside": None, "after": None}
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_disable_as_decorator_with_and_without_parentheses():
    seen = []

    @agspeed.disable
    def one():
        seen.append(_C.current_context())

    @agspeed.disable()
    def two():
        seen.append(_C.current_context())

    agspeed.optimize(lambda: (one(), two()))()
    assert seen == [None, None]
    assert one.__name__ == "one" and two.__name__ == "two"
    with pytest.raises(TypeError, match="callable"):
        agspeed.disable(5)


def test_reset_zeroes_counters_and_clears_records():
    agspeed.optimize(scale)(1)
    assert agspeed.counters()["frames_seen"] > 0
    assert agspeed._runtime.frame_records()
    agspeed.reset()
    assert set(agspeed.counters().values()) == {0}
    assert agspeed._runtime.frame_records() == []


def test_counters_are_documented():
    assert set(agspeed.counters()) == set(_C.COUNTER_DOCS)
    assert all(isinstance(doc, str) and doc for doc in _C.COUNTER_DOCS.values())


def test_contexts_are_shared_per_backend_and_options():
    seen = []

    def body():
        seen.append(_C.current_context())

    agspeed.optimize(body, backend="eager")()
    agspeed.optimize(body, backend="eager")()
    agspeed.optimize(body, backend="eager", dynamic=False)()
    assert seen[0] is seen[1] and seen[0] is not seen[2]


def test_user_backends_register_by_name():
    from agspeed import backends

    def mine(gm, example_inputs):
        return gm.forward

    try:
        agspeed.register_backend("test_mine", mine)
        assert "test_mine" in agspeed.list_backends()
        assert backends.get_backend("test_mine") is mine
        assert agspeed.optimize(scale, backend="test_mine")(2) == 4
        with pytest.raises(ValueError, match="exists"):
            agspeed.register_backend("test_mine", mine)
        agspeed.register_backend("test_mine", lambda gm, ex: gm, override=True)
        with pytest.raises(ValueError, match="exists"):
            agspeed.register_backend("eager", mine)
        with pytest.raises(TypeError):
            agspeed.register_backend("test_bad", 5)
        with pytest.raises(TypeError):
            agspeed.register_backend("auto", mine)

        @agspeed.register_backend("test_decorated")
        def decorated(gm, example_inputs):
            return gm

        assert backends.get_backend("test_decorated") is decorated
    finally:
        backends._registered.pop("test_mine", None)
        backends._registered.pop("test_decorated", None)
    assert "test_mine" not in agspeed.list_backends()


def test_a_backend_callable_is_accepted_without_registering():
    def custom(gm, example_inputs):
        return gm.forward

    assert agspeed.backends.resolve(custom) == ("custom", custom)
    assert agspeed.optimize(scale, backend=custom)(4) == 8


def test_builtin_backends_are_found_by_file_name():
    names = agspeed.list_backends()
    assert {"eager", "inductor", "jit", "cudagraphs", "auto"} <= set(names)
    # the tools beside the backends are not backends
    assert "autotune" not in names and "knowledge" not in names
    from agspeed.backends.autotune import autotuner

    assert agspeed.backends.get_backend("auto") is autotuner


def test_public_names():
    for name in agspeed.__all__:
        assert hasattr(agspeed, name), name
    assert functools.partial  # the decorator form returns a partial of optimize


def test_reset_makes_the_runtime_decide_again():
    def seen_names():
        return [r.name for r in agspeed._runtime.frame_records()]

    fast = agspeed.optimize(scale)
    fast(1)
    fast(2)
    assert seen_names() == ["scale"]  # the second call hit the cache
    agspeed.reset()
    fast(3)
    assert seen_names() == ["scale"]  # asked again after reset
    assert agspeed.counters()["cache_misses"] == 1
