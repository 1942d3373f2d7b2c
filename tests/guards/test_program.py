"""Guard programs (guards/program.c): loads agree with agspeed._sources.resolve on every
kind of source and object, checks pass and fail as the Python checks do, nothing leaks.

The first part is torch-free (programs built by hand); the last tests compile real Guards
from captures and compare them with their Python evaluation under many changes."""

import contextvars
import gc
import sys
import types
import weakref

import pytest

from agspeed import _C
from agspeed._sources import MISSING, resolve, resolve_step
from agspeed.protocol import Check, GuardFlag, Load

LOCAL, ATTR, TYPE = Load.LOCAL, Load.ATTR, Load.TYPE
TENSOR, EQ, LEN, ID, ABSENT = Check.TENSOR, Check.EQ, Check.LEN, Check.ID, Check.ABSENT
OPS = Load.by_id


def program(sources, checks=(), aliases=(), probes=(), symbolic=None):
    """A program reading ``sources`` (read() returns them in order); ``symbolic`` as
    _set_program takes it (guards/symbolic.c)."""
    slots, loads = {}, []

    def slot(source):
        if source not in slots:
            kind = source[0]
            if kind in ("local", "global"):
                load = (OPS[kind], -1, source[1])
            elif kind == "gmod":
                load = (OPS[kind], -1, (source[1], source[2]))
            else:
                load = (OPS[kind], slot(source[1]), source[2] if len(source) > 2 else None)
            slots[source] = len(loads)
            loads.append(load)
        return slots[source]

    outputs = [slot(s) for s in sources]
    checks = [(slot(s), kind, a, b) for s, kind, a, b in checks]
    aliases = [(slot(a), slot(b)) for a, b in aliases]
    p = _C.GuardProgram()
    p._set_program(loads, checks, aliases, tuple(probes), resolve_step, MISSING, None, outputs,
                   0, symbolic)
    return p


class Plain:
    klass = 7

    def __init__(self):
        self.x = 1

    def method(self):
        return 1

    @property
    def prop(self):
        raise AssertionError("never run while guarding")

    @staticmethod
    def static():
        return 2


class Slotted:
    __slots__ = ("s",)

    def __init__(self):
        self.s = 5


class Dynamic:
    def __getattr__(self, name):
        raise AssertionError("never run while guarding")


class Shadow(Plain):
    def __init__(self):
        super().__init__()
        self.method = "instance wins over a function"


def closure_over(v):
    def inner():
        return v
    return inner


OBJECTS = {
    "plain": Plain(),
    "slotted": Slotted(),
    "dynamic": Dynamic(),
    "shadow": Shadow(),
    "module": types,
    "fn": closure_over(11),
    "tup": (1, (2, 3)),
    "lst": [4, 5],
    "dct": {"a": 1, 2: "b"},
    "cls": Plain,
    "sup": super(Shadow, Shadow()),
    "prop": Plain.__dict__["prop"],
    "cvar": contextvars.ContextVar("set_var", default=7),
    "cvar_unset": contextvars.ContextVar("unset_var"),
}
SOURCES = [
    ("attr", ("local", "plain"), "x"), ("attr", ("local", "plain"), "klass"),
    ("attr", ("local", "plain"), "method"), ("attr", ("local", "plain"), "prop"),
    ("attr", ("local", "plain"), "static"), ("attr", ("local", "plain"), "nothing"),
    ("attr", ("local", "slotted"), "s"), ("attr", ("local", "dynamic"), "anything"),
    ("attr", ("local", "shadow"), "method"), ("attr", ("local", "module"), "FunctionType"),
    ("attr", ("local", "module"), "nothing"), ("attr", ("local", "cls"), "klass"),
    ("attr", ("local", "sup"), "method"), ("attr", ("local", "absent"), "x"),
    ("item", ("local", "tup"), 0), ("item", ("item", ("local", "tup"), 1), -1),
    ("item", ("local", "tup"), 5), ("item", ("local", "lst"), -2),
    ("item", ("local", "dct"), "a"), ("item", ("local", "dct"), 2),
    ("item", ("local", "dct"), "zz"), ("item", ("local", "plain"), 0),
    ("cell", ("local", "fn"), 0), ("cell", ("local", "fn"), 3),
    ("type", ("local", "plain")), ("fget", ("local", "prop")),
    ("global", "Plain"), ("global", "len"), ("global", "no_such_name"),
    ("gmod", "types", "FunctionType"), ("gmod", "types", "len"),
    ("gmod", "no.such.module", "x"), ("local", "absent"),
    ("cvar", ("local", "cvar")), ("cvar", ("local", "cvar_unset")),
    ("cvar", ("local", "plain")),
    ("numpy", ("local", "plain")), ("numpy", ("local", "lst")),
    ("keys", ("local", "plain")), ("storage", ("local", "plain")),
    ("values", ("local", "plain")),
    ("state", ("attr", ("local", "plain"), "x")), ("state", ("local", "sup")),
    ("inference", ("local", "plain")),
]


def frame():
    return dict(OBJECTS), globals(), vars(__builtins__) if isinstance(
        __builtins__, types.ModuleType) else __builtins__


@pytest.mark.parametrize("source", SOURCES, ids=repr)
def test_loads_agree_with_resolve(source):
    f_locals, f_globals, f_builtins = frame()
    want = resolve(source, f_locals, f_globals, f_builtins, {})
    (got,) = program([source]).read(f_locals, f_globals, f_builtins)
    assert got is want


@pytest.mark.parametrize("name", ["dct", "tup", "lst"])
def test_a_state_load_is_the_snapshot_resolve_makes(name):
    """("state", base) reads a new snapshot on each call: equal, not the same object."""
    f_locals, f_globals, f_builtins = frame()
    source = ("state", ("local", name))
    (got,) = program([source]).read(f_locals, f_globals, f_builtins)
    assert got == resolve(source, f_locals, f_globals, f_builtins, {})
    assert got[0] == type(OBJECTS[name]).__name__


class _Loud:
    """Compares as a tensor of several values would: by raising (and counts the asks)."""

    asked = 0

    def __eq__(self, other):
        type(self).asked += 1
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")

    __hash__ = object.__hash__


@pytest.mark.parametrize("value,expected", [
    ((_Loud(), 2), (1, 2)), ([1, _Loud()], [1, 2]), ((1, (2, _Loud())), (1, (2, 3))),
    ((True, 2), (1, 2)),
], ids=["tuple", "list", "nested", "bool-for-int"])
def test_an_equality_check_never_asks_an_element_of_another_type(value, expected):
    """A tuple (the keys of a dict) expected to hold plain values, now holding an object
    of another type (a tensor key): the check fails, asks nothing of it, and leaves no
    error behind (a raising comparison once passed the check with an error set)."""
    _Loud.asked = 0
    p = program([], [(("local", "v"), EQ, type(expected), expected)])
    assert p({"v": value}, {}, {}) is False
    assert _Loud.asked == 0
    assert p({"v": expected}, {}, {}) is True


def test_checks_pass_and_fail_like_their_kind():
    f_locals, f_globals, f_builtins = frame()
    plain = ("local", "plain")
    ok = [
        (("attr", plain, "x"), EQ, int, 1),
        (("local", "lst"), LEN, list, 2),
        (plain, ID, weakref.ref(OBJECTS["plain"]), True),
        (("local", "module"), ID, types, False),
        (("attr", plain, "nothing"), ABSENT, None, None),
    ]
    p = program([], ok)
    assert p(f_locals, f_globals, f_builtins) is True
    for i, (source, kind, a, b) in enumerate(ok):
        bad = {EQ: (source, EQ, int, 2), LEN: (source, LEN, list, 3),
               ID: (source, ID, Plain(), False) if kind == ID else None,
               ABSENT: (("attr", plain, "x"), ABSENT, None, None)}[kind]
        assert program([], ok[:i] + [bad] + ok[i + 1:])(f_locals, f_globals,
                                                           f_builtins) is False
    # a type mismatch fails an equality (True == 1, but not the same check)
    assert program([], [(("attr", plain, "x"), EQ, bool, True)])(*frame()) is False


def test_a_dead_weak_reference_fails_identity():
    class Thing:
        pass

    thing = Thing()
    p = program([], [(("local", "t"), ID, weakref.ref(thing), True)])
    assert p({"t": thing}, {}, {}) is True
    ref = weakref.ref(thing)
    del thing
    gc.collect()
    assert ref() is None
    assert p({"t": Thing()}, {}, {}) is False


def test_aliases_and_probes():
    shared = object()
    p = program([], aliases=[(("local", "a"), ("local", "b"))])
    assert p({"a": shared, "b": shared}, {}, {}) is True
    assert p({"a": shared, "b": object()}, {}, {}) is False
    assert p({"a": shared}, {}, {}) is False  # missing never aliases
    flag = {"on": True}
    p = program([], probes=[(flag.get, ("on",), True)])
    assert p({}, {}, {}) is True
    flag["on"] = False
    assert p({}, {}, {}) is False


def test_why_names_the_first_failing_check_alias_or_probe():
    shared, other = object(), object()
    flag = {"on": True}
    p = program([], [(("local", "a"), EQ, int, 1), (("local", "b"), EQ, int, 2)],
                aliases=[(("local", "c"), ("local", "d"))],
                probes=[(flag.get, ("on",), True)])
    frame = {"a": 1, "b": 2, "c": shared, "d": shared}
    assert p.why(frame, {}, {}) is None
    assert p.why({**frame, "b": 3}, {}, {}) == ("check", 1)
    assert p.why({**frame, "a": 0, "b": 3}, {}, {}) == ("check", 0)
    assert p.why({**frame, "d": other}, {}, {}) == ("alias", 0)
    flag["on"] = False
    assert p.why(frame, {}, {}) == ("probe", 0)
    assert p(frame, {}, {}) is False
    with pytest.raises(TypeError, match="three dicts"):
        p.why(frame, {})


def test_bad_programs_and_calls_are_refused():
    p = _C.GuardProgram()
    with pytest.raises(RuntimeError, match="not compiled"):
        p({}, {}, {})
    with pytest.raises(TypeError, match="three dicts"):
        program([])({}, {})
    with pytest.raises(ValueError, match="bad guard load"):
        p._set_program([(ATTR, -1, "x")], [], [], (), resolve_step, MISSING, None, [])
    with pytest.raises(ValueError, match="bad guard check"):
        p._set_program([(LOCAL, -1, "x")], [(0, len(Check) + 3, None, None)], [], (),
                       resolve_step, MISSING, None, [])
    with pytest.raises(ValueError, match="bad guard output"):
        p._set_program([(LOCAL, -1, "x")], [], [], (), resolve_step, MISSING, None, [3])
    with pytest.raises(RuntimeError, match="not compiled"):
        p({}, {}, {})  # a failed compile leaves nothing half set


def test_reads_and_checks_leak_no_references():
    value = Plain()
    f_locals = {"v": value, "t": (value,)}
    p = program([("local", "v"), ("item", ("local", "t"), 0), ("attr", ("local", "v"), "x")],
                [(("local", "v"), ID, weakref.ref(value), True),
                 (("attr", ("local", "v"), "prop"), ID, Plain.__dict__["prop"], False)])
    for _ in range(5):
        p(f_locals, {}, {})
        p.read(f_locals, {}, {})
    before = sys.getrefcount(value)
    for _ in range(100):
        assert p(f_locals, {}, {}) is True
        got = p.read(f_locals, {}, {})
    del got
    assert sys.getrefcount(value) == before


def test_a_program_dies_with_its_last_reference():
    p = program([("local", "x")])
    ref = weakref.ref(p)
    del p
    gc.collect()
    assert ref() is None


# -- compiled from captures (torch) -------------------------------------------------------


def entry_guards(code):
    return [e.guard for e in _C.code_cache(code)["entries"] if e.action == _C.ACTION_CALL]


@pytest.mark.torch
def test_compiled_guards_agree_with_python_under_changes():
    torch = pytest.importorskip("torch")
    import agspeed

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_zoo import ZOO

    for name, (cls, make_inputs) in sorted(ZOO.items()):
        torch.manual_seed(0)
        model = cls()
        inputs = make_inputs()
        agspeed.optimize(model, backend="eager")(*inputs)
        (guard,) = entry_guards(type(model).forward.__code__)
        assert guard._program_size()["checks"] == len(guard.checks)
        assert guard._program_size()["outputs"] == len(guard.inputs)
        first = [p for p in model.parameters()][0]
        changes = [
            lambda: None,
            lambda: model.eval(),
            lambda: model.train(),
            lambda: setattr(model, "_forward_hooks", {1: print}),
            lambda: delattr(model, "_forward_hooks"),
            lambda: model.register_buffer("extra", torch.zeros(1)),
            lambda: first.requires_grad_(False),
            lambda: first.requires_grad_(True),
            lambda: torch.set_grad_enabled(False),
            lambda: torch.set_grad_enabled(True),
        ]
        view = {"self": model, **{f"a{i}": x for i, x in enumerate(inputs)}}
        code = type(model).forward.__code__
        names = code.co_varnames[:code.co_argcount]
        for change in changes:
            try:
                change()
            except Exception:
                continue
            f_locals = {n: view.get(n, view.get(f"a{i - 1}")) for i, n in enumerate(names)}
            args = (f_locals, type(model).forward.__globals__, vars(__builtins__)
                    if isinstance(__builtins__, types.ModuleType) else __builtins__)
            assert guard(*args) is guard.check_in_python(*args), (name, change)
            # what C found failing first is Python's first failure
            why = guard.why(*args)
            walk = guard._walk(*args)
            assert (why is None) == (not walk), (name, change)
            if why is not None:
                assert why[0] == walk[0][0] and (why[0] == "probe" or why[1] == walk[0][1])
                assert guard.first_failure(*args) == walk[0][2]
        torch.set_grad_enabled(True)
        agspeed.reset()


@pytest.mark.torch
def test_read_gives_the_graph_inputs_the_python_resolution_gives():
    torch = pytest.importorskip("torch")
    import agspeed

    lin = torch.nn.Linear(3, 3)

    def f(x, m):
        return m(x) + x

    x = torch.randn(2, 3)
    agspeed.optimize(f, backend="eager")(x, lin)
    (guard,) = entry_guards(f.__code__)
    frame = ({"x": x, "m": lin}, f.__globals__, {})
    got = guard.read(*frame)
    want = tuple(resolve(s, *frame, {}) for s in guard.inputs)
    assert len(got) == 3 and all(a is b for a, b in zip(got, want))
    assert guard(*frame) is True
    assert guard({"x": x.double(), "m": lin}, f.__globals__, {}) is False


# -- the structure memo, torch-free: a stand-in for nn.Module's layout ----------------

class FakeModule:
    """nn.Module's layout: three stores in the instance dict, a __getattr__ over them."""

    def __init__(self, **children):
        self.__dict__.update(_parameters={}, _buffers={}, _modules=dict(children),
                             _hooks={}, training=True)

    def __getattr__(self, name):
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[store]:
                return self.__dict__[store][name]
        raise AttributeError(name)


def memo_program(flags=0):
    """self.child.w (a store value), self.child.training, len(self.child._hooks),
    type(self.child), self.child.__getattr__ (a class function), self.nothing (absent),
    with the checks a capture would make; read() returns self.child.w."""
    loads = [(LOCAL, -1, "self"), (ATTR, 0, "child"), (ATTR, 1, "w"),
             (ATTR, 1, "training"), (ATTR, 1, "_hooks"), (TYPE, 1, None),
             (ATTR, 1, "__getattr__"), (ATTR, 0, "nothing")]
    root, child = FRAME_OBJECTS["self"], FRAME_OBJECTS["self"].child
    checks = [(0, ID, weakref.ref(root), True), (1, ID, weakref.ref(child), True),
              (2, EQ, int, 3), (3, EQ, bool, True), (4, LEN, dict, 0),
              (5, ID, FakeModule, False), (6, ID, FakeModule.__getattr__, False),
              (7, ABSENT, None, None)]
    p = _C.GuardProgram()
    p._set_program(loads, checks, [], (), resolve_step, MISSING, FakeModule, [2], flags)
    return p


FRAME_OBJECTS = {}


def memo_frame():
    return FRAME_OBJECTS, globals(), {}


@pytest.fixture
def fake_model():
    child = FakeModule()
    child._parameters["w"] = 3
    FRAME_OBJECTS["self"] = FakeModule(child=child)
    yield FRAME_OBJECTS["self"]
    FRAME_OBJECTS.clear()


def _restore(model):
    child = FakeModule()
    child._parameters["w"] = 3
    model._modules["child"] = child


MUTATIONS = {
    "store value": lambda m: m.child._parameters.__setitem__("w", 4),
    "store entry moved": lambda m: m.child._buffers.__setitem__(
        "w", m.child._parameters.pop("w")) or m.child._buffers.__setitem__("w", 5),
    "instance attribute": lambda m: m.child.__dict__.__setitem__("training", False),
    "hook added": lambda m: m.child._hooks.__setitem__(1, print),
    "child replaced": lambda m: m._modules.__setitem__("child", FakeModule()),
    "class swapped": lambda m: setattr(m.child, "__class__", type("Other", (FakeModule,), {})),
    "class attribute": lambda m: setattr(FakeModule, "nothing", 1),
    "instance dict replaced": lambda m: setattr(m.child, "__dict__", dict(
        m.child.__dict__, training=False)),
    # self.nothing was searched for in all three stores, self.child in all up to _modules
    "absent found in a store": lambda m: m._buffers.__setitem__("nothing", 1),
    "store shadowing a later one": lambda m: m._parameters.__setitem__("child", FakeModule()),
}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=str)
def test_the_memo_sees_every_change_that_would_fail_a_check(fake_model, mutation):
    p = memo_program()
    for _ in range(3):
        assert p.run(*memo_frame()) == (3,)
    memo = p._memo()
    assert memo["valid"] and memo["fast"] == 2 and memo["full"] == 1
    assert memo["skipped_checks"] == 8
    assert memo["watched"] == (sys.version_info >= (3, 12))
    try:
        MUTATIONS[mutation](fake_model)
        assert p.run(*memo_frame()) is None
        assert p(*memo_frame()) is False
    finally:
        if "nothing" in FakeModule.__dict__:
            del FakeModule.nothing


def test_the_memo_does_not_watch_stores_after_the_one_that_answered(fake_model):
    """self.child.w was found in _parameters: the child's _buffers and _modules cannot
    change that answer, and the memo neither reads nor watches them."""
    p = memo_program()
    for _ in range(2):
        assert p.run(*memo_frame()) == (3,)
    fake_model.child._buffers["w"] = 5      # behind _parameters: same answer
    fake_model.child._modules["x"] = FakeModule()
    assert p.run(*memo_frame()) == (3,)
    memo = p._memo()
    assert memo["fast"] == 2 and memo["full"] == 1
    assert p(*memo_frame()) is True


def test_the_memo_comes_back_after_a_change_is_undone(fake_model):
    p = memo_program()
    for _ in range(2):
        assert p.run(*memo_frame()) == (3,)
    fake_model.child._parameters["w"] = 4
    assert p.run(*memo_frame()) is None
    fake_model.child._parameters["w"] = 3
    for _ in range(3):
        assert p.run(*memo_frame()) == (3,)
    assert p._memo()["valid"] and p._memo()["fast"] >= 3


def test_the_memo_holds_no_reference_and_survives_its_root():
    child = FakeModule()
    child._parameters["w"] = 3
    root = FRAME_OBJECTS["self"] = FakeModule(child=child)
    p = memo_program()
    counts = sys.getrefcount(root), sys.getrefcount(child)
    for _ in range(5):
        assert p.run(*memo_frame()) == (3,)
    assert (sys.getrefcount(root), sys.getrefcount(child)) == counts
    ref = weakref.ref(root)
    del root, child
    FRAME_OBJECTS["self"] = FakeModule(child=FakeModule())
    gc.collect()
    assert ref() is None
    assert p.run(*memo_frame()) is None   # a new root: the identity check fails
    FRAME_OBJECTS.clear()


def test_no_memo_without_a_module_root_or_with_the_flag(fake_model):
    assert not memo_program(flags=GuardFlag.NO_MEMO)._memo()["valid"]
    p = memo_program(flags=GuardFlag.NO_MEMO)
    for _ in range(3):
        assert p.run(*memo_frame()) == (3,)
    assert not p._memo()["valid"] and p._memo()["full"] == 3
