"""Code caches: they die with their code objects, hold no stray references, and reset.

Torch-free.
"""

import gc
import sys
import types
import weakref

import agspeed
from agspeed import _C

RUN_EAGER = _C.ACTION_RUN_EAGER
SKIP = _C.ACTION_SKIP


class Guard:
    """A guard object whose lifetime a weakref can watch."""

    def __call__(self, f_locals, f_globals, f_builtins):
        return True


class Token:
    """Something held by a cache entry (as a compiled callable would be)."""


def make_function(source, name):
    namespace = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace[name]


def entry_ctx(guard=None, compiled=None, context=None):
    def ctx(code, f_locals, *frame):
        return _C.CacheEntry(RUN_EAGER, guard=guard, compiled=compiled, context=context)

    return ctx


def test_cache_dies_with_its_function_and_releases_what_entries_hold():
    fn = make_function("def twice(x):\n    return 2 * x\n", "twice")
    guard, token, bound = Guard(), Token(), Token()
    ctx = entry_ctx(guard=guard, compiled=token, context=None)
    assert _C.Region(fn, ctx)(4) == 8
    assert _C.Region(fn, ctx)(5) == 10
    info = _C.code_cache(fn.__code__)
    assert info["entries"][0].guard is guard and info["entries"][0].compiled is token
    code_ref, guard_ref, token_ref = weakref.ref(fn.__code__), weakref.ref(guard), weakref.ref(token)
    del fn, guard, token, info, ctx, bound
    gc.collect()
    assert code_ref() is None
    assert guard_ref() is None
    assert token_ref() is None


def test_skip_marked_code_dies_with_its_function():
    fn = make_function("def f(x):\n    return x\n", "f")
    _C.Region(fn, lambda code, f_locals, *frame: _C.CacheEntry(SKIP))(1)
    assert _C.code_cache(fn.__code__)["skip"]
    code_ref = weakref.ref(fn.__code__)
    del fn
    gc.collect()
    assert code_ref() is None


def test_cache_dies_with_its_module():
    module = types.ModuleType("generated_module")
    exec(compile("def g(x):\n    return x + 1\n\ndef h(x):\n    return g(x) * 2\n",
                 "<generated_module>", "exec"), module.__dict__)
    token = Token()
    assert _C.Region(module.h, entry_ctx(compiled=token))(1) == 4
    code_refs = [weakref.ref(module.g.__code__), weakref.ref(module.h.__code__)]
    token_ref = weakref.ref(token)
    del module, token
    gc.collect()
    assert [r() for r in code_refs] == [None, None]
    assert token_ref() is None


def test_entry_context_reference_is_released_with_the_code():
    fn = make_function("def k(x):\n    return x\n", "k")
    owner = Token()
    ctx = entry_ctx(context=owner)
    _C.Region(fn, ctx)(1)
    assert _C.code_cache(fn.__code__)["entries"][0].context is owner
    owner_ref = weakref.ref(owner)
    del fn, owner, ctx
    gc.collect()
    assert owner_ref() is None


def leaf(a, b):
    return a + b


def raises(a):
    raise ValueError(a)


def test_calls_leak_no_references():
    ctx = entry_ctx()
    region = _C.Region(leaf, ctx)
    a, b = Token(), Token()
    leaf_add = _C.Region(lambda x, y: (x, y), ctx)
    region(1, 2)
    leaf_add(a, b)
    before = [sys.getrefcount(o) for o in (ctx, leaf, region, a, b)]
    for _ in range(200):
        region(1, 2)
        leaf_add(a, b)
    assert [sys.getrefcount(o) for o in (ctx, leaf, region, a, b)] == before


def test_failing_calls_leak_no_references():
    arg = Token()

    def failing_ctx(code, f_locals, *frame):
        raise KeyError("no decision")

    region_err = _C.Region(raises, entry_ctx())
    region_ctx_err = _C.Region(leaf, failing_ctx)
    for region in (region_err, region_ctx_err):
        try:
            region(arg, arg) if region is region_ctx_err else region(arg)
        except (ValueError, KeyError):
            pass
    before = [sys.getrefcount(o) for o in (arg, failing_ctx, raises, leaf)]
    for _ in range(100):
        try:
            region_err(arg)
        except ValueError:
            pass
        try:
            region_ctx_err(arg, arg)
        except KeyError:
            pass
    assert [sys.getrefcount(o) for o in (arg, failing_ctx, raises, leaf)] == before


def test_deciding_holds_no_reference_to_arguments_while_the_frame_runs():
    # The locals dict built for the context must be released before the frame runs, or
    # an argument deleted inside the function (a big tensor) would stay alive.  The
    # reference: the same call under a do-nothing PEP 523 function (any such function
    # stops CPython from inlining the call, so the caller's stack keeps its reference).
    def count_refs(x):
        return sys.getrefcount(x)

    def call_once():
        return count_refs(Token())

    _C._probe_install()
    try:
        floor = call_once()
    finally:
        _C._probe_remove()
    asked = []

    def ctx(code, f_locals, *frame):
        asked.append(code.co_name)
        return _C.CacheEntry(RUN_EAGER)

    agspeed.reset()
    on_miss = _C.Region(call_once, ctx)()
    on_hit = _C.Region(call_once, ctx)()
    assert asked == ["call_once", "count_refs"]
    assert on_miss == floor
    assert on_hit == floor


def test_reset_empties_caches_and_releases_entries():
    fn = make_function("def r(x):\n    return x\n", "r")
    skipped = make_function("def s(x):\n    return x\n", "s")
    token = Token()
    _C.Region(fn, entry_ctx(compiled=token))(1)
    _C.Region(skipped, lambda code, f_locals, *frame: _C.CacheEntry(SKIP))(1)
    token_ref = weakref.ref(token)
    del token
    gc.collect()
    assert token_ref() is not None  # held by the entry
    agspeed.reset()
    gc.collect()
    assert token_ref() is None
    assert _C.code_cache(fn.__code__) == {"has_cache": True, "flags": 0, "skip": False,
                                          "entries": []}
    assert _C.code_cache(skipped.__code__)["skip"] is False
    asked = []

    def ctx(code, f_locals, *frame):
        asked.append(code.co_name)
        return _C.CacheEntry(RUN_EAGER)

    _C.Region(fn, ctx)(1)
    _C.Region(skipped, ctx)(1)
    assert asked == ["r", "s"]


def test_clear_caches_reports_how_many_codes_had_one():
    fn = make_function("def c(x):\n    return x\n", "c")
    agspeed.reset()
    _C.Region(fn, entry_ctx())(1)
    assert _C.clear_caches() >= 1


def test_guard_that_resets_the_cache_does_not_crash():
    calls = []

    def resetting_guard(f_locals, *frame):
        calls.append(1)
        _C.clear_caches()
        return True

    region = _C.Region(leaf, entry_ctx(guard=resetting_guard))
    assert region(1, 2) == 3
    assert region(3, 4) == 7  # guard runs, empties the cache under the lookup
    assert region(5, 6) == 11
    assert calls


def test_objects_in_cycles_are_collected():
    class Box:
        pass

    box = Box()
    region = _C.Region(lambda: box, None)
    box.region = region
    entry = _C.CacheEntry(RUN_EAGER, compiled=box)
    box.entry = entry
    scope = _C.Scope(box.__init__)
    box.scope = scope
    refs = [weakref.ref(region), weakref.ref(entry), weakref.ref(box)]
    del box, region, entry, scope
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_code_cache_of_an_unseen_code():
    def never_called():
        pass

    assert _C.code_cache(never_called.__code__) == {"has_cache": False, "flags": 0,
                                                    "skip": False, "entries": []}


def test_cache_hits_leak_no_reference_to_the_entry():
    # Regression: a hit took a reference to its entry twice and released it once.
    region = _C.Region(leaf, entry_ctx(guard=Guard()))
    region(1, 2)
    entry = _C.code_cache(leaf.__code__)["entries"][0]
    before = sys.getrefcount(entry)
    for _ in range(50):
        region(1, 2)
    assert sys.getrefcount(entry) == before
    assert entry.hits >= 50
