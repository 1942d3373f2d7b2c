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
                                          "disable": False, "entries": []}
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
                                                    "skip": False, "disable": False,
                                                    "entries": []}


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


def test_guard_that_calls_agspeed_reset_does_not_crash():
    asked, guard_calls = [], []

    def resetting_guard(f_locals, *frame):
        guard_calls.append(f_locals["a"])
        agspeed.reset()
        return True

    def ctx(code, f_locals, *frame):
        asked.append(code.co_name)
        return _C.CacheEntry(RUN_EAGER, guard=resetting_guard)

    region = _C.Region(leaf, ctx)
    assert region(1, 2) == 3
    assert region(3, 4) == 7  # the guard empties every cache while it is being looked up
    assert region(5, 6) == 11
    # Each call after the first finds the entry the previous miss made, runs its guard
    # (which empties the cache under the lookup) and so misses: the context is asked.
    assert guard_calls == [3, 5]
    assert asked == ["leaf", "leaf", "leaf"]
    assert len(_C.code_cache(leaf.__code__)["entries"]) == 1


def test_clearing_one_context_keeps_other_entries_and_skip_marks():
    fn = make_function("def o(x):\n    return x\n", "o")
    skipped = make_function("def k(x):\n    return x\n", "k")
    mine, theirs = Token(), Token()
    _C.Region(fn, entry_ctx(context=mine))(1)
    _C.Region(fn, entry_ctx(context=theirs))(1)
    _C.Region(skipped, lambda code, f_locals, *frame: _C.CacheEntry(SKIP))(1)
    assert [e.context for e in _C.code_cache(fn.__code__)["entries"]] == [theirs, mine]
    mine_ref = weakref.ref(mine)
    del mine
    assert _C.clear_caches(mine_ref()) >= 2
    gc.collect()
    assert mine_ref() is None  # its entry was the last holder
    assert [e.context for e in _C.code_cache(fn.__code__)["entries"]] == [theirs]
    assert _C.code_cache(skipped.__code__)["skip"] is True
    _C.clear_caches(None)  # None: everything, as with no argument
    assert _C.code_cache(fn.__code__)["entries"] == []
    assert _C.code_cache(skipped.__code__)["skip"] is False
    try:
        _C.clear_caches(1, 2)
    except TypeError as exc:
        assert "at most 1 argument" in str(exc)
    else:
        raise AssertionError("clear_caches(1, 2) did not raise")


def test_reset_releases_the_context_an_entry_is_bound_to():
    fn = make_function("def b(x):\n    return x\n", "b")
    owner = Token()
    _C.Region(fn, entry_ctx(context=owner))(1)
    owner_ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert owner_ref() is not None
    agspeed.reset()
    gc.collect()
    assert owner_ref() is None
    assert _C.code_cache(fn.__code__)["entries"] == []


def test_keyword_calls_and_skipped_code_leak_no_references():
    a, b = Token(), Token()
    pair = _C.Region(lambda a, b: (a, b), entry_ctx())
    skipped = make_function("def sk(a, b):\n    return a\n", "sk")
    skip_region = _C.Region(skipped, lambda code, f_locals, *frame: _C.CacheEntry(SKIP))
    pair(a, b=b)
    skip_region(a, b=b)
    assert _C.code_cache(skipped.__code__)["skip"]
    before = [sys.getrefcount(o) for o in (a, b, skipped, pair, skip_region)]
    for _ in range(100):
        pair(b=b, a=a)
        skip_region(a, b=b)
        skip_region(b=b, a=a)
    assert [sys.getrefcount(o) for o in (a, b, skipped, pair, skip_region)] == before


def test_rejected_decisions_and_failing_guards_leak_no_references():
    arg = Token()
    wrong_answer = Token()

    def wrong_ctx(code, f_locals, *frame):
        return wrong_answer

    def bad_guard(f_locals, *frame):
        raise RuntimeError("guard")

    def identity(x):
        return x

    wrong_region = _C.Region(identity, wrong_ctx)
    guarded = _C.Region(leaf, entry_ctx(guard=bad_guard))
    try:  # makes the entry (for Token arguments: entries are kept per signature) ...
        guarded(Token(), Token())
    except TypeError:  # ... and runs leaf, which cannot add Tokens
        pass
    # later calls run the raising guard

    def call_all():
        try:
            wrong_region(arg)
        except TypeError:
            pass
        try:
            guarded(arg, arg)
        except RuntimeError:
            pass

    call_all()
    before = [sys.getrefcount(o) for o in (arg, wrong_answer, wrong_ctx, bad_guard)]
    for _ in range(100):
        call_all()
    assert [sys.getrefcount(o) for o in (arg, wrong_answer, wrong_ctx, bad_guard)] == before


def test_caches_changing_under_guards_in_other_threads_stay_consistent():
    # Guards run Python code, so other threads may insert entries (growing the entry
    # array) or empty every cache while a lookup is in the middle of its scan.  The
    # lookup must notice and treat it as a miss: no crash, no wrong result.
    import threading

    def slot(x):
        return x + 1

    checks = []

    def make_guard(residue):
        def guard(f_locals, *frame):
            checks.append(1)
            total = 0
            for i in range(20):  # a little Python work: room for a thread switch
                total += i
            if len(checks) % 97 == 0:
                _C.clear_caches()
            return f_locals["x"] % 5 == residue

        return guard

    def ctx(code, f_locals, *frame):
        guard = make_guard(f_locals["x"] % 5) if code is slot.__code__ else None
        return _C.CacheEntry(RUN_EAGER, guard=guard)

    def body(n):
        out = 0
        for i in range(n):
            out += slot(i)
        return out

    errors = []

    def worker():
        try:
            region = _C.Region(body, ctx)
            for _ in range(40):
                assert region(25) == sum(range(1, 26))
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert checks  # the guards did run
    assert _C.current_context() is None and _C._eval_frame_owner() == "default"


def test_signature_table_is_rebuilt_after_entries_go():
    fn = make_function("def t(x):\n    return x\n", "t")
    asked = []

    class Ctx:
        def __call__(self, code, f_locals, *frame):
            asked.append(code.co_name)
            return _C.CacheEntry(RUN_EAGER, guard=Guard(), context=self)

    mine, theirs = Ctx(), Ctx()
    in_mine, in_theirs = _C.Region(fn, mine), _C.Region(fn, theirs)
    for value in (1, "s", 2.0, 3):  # three signatures: int, str, float
        in_mine(value)
        in_theirs(value)
    entries = _C.code_cache(fn.__code__)["entries"]
    assert len(entries) == 6 and all(e.has_signature for e in entries)
    assert len(asked) == 6  # the second int hit the int entries
    mine_ref = weakref.ref(mine)
    del mine, in_mine, entries
    _C.clear_caches(mine_ref())  # the table still points at mine's entries until rebuilt
    gc.collect()
    assert mine_ref() is None
    for value in (1, "s", 2.0):
        in_theirs(value)  # hits through a rebuilt table
    assert len(asked) == 6
    assert sorted(e.hits for e in _C.code_cache(fn.__code__)["entries"]) == [1, 1, 2]
