"""Guard programs (guards/program.c): loads agree with agspeed._sources.resolve on every
kind of source and object, checks pass and fail as the Python checks do, nothing leaks.

The first part is torch-free (programs built by hand); the last tests compile real Guards
from captures and compare them with their Python evaluation under many changes."""

import gc
import sys
import types
import weakref

import pytest

from agspeed import _C
from agspeed._sources import MISSING, resolve, resolve_step

LOCAL, GLOBAL, GMOD, ATTR, ITEM, CELL, TYPE, FGET = range(8)
TENSOR, EQ, LEN, ID, ABSENT = range(5)
OPS = {"local": LOCAL, "global": GLOBAL, "gmod": GMOD, "attr": ATTR, "item": ITEM,
       "cell": CELL, "type": TYPE, "fget": FGET}


def program(sources, checks=(), aliases=(), probes=()):
    """A program reading ``sources`` (read() returns them in order)."""
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
    p._set_program(loads, checks, aliases, tuple(probes), resolve_step, MISSING, None, outputs)
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


def test_bad_programs_and_calls_are_refused():
    p = _C.GuardProgram()
    with pytest.raises(RuntimeError, match="not compiled"):
        p({}, {}, {})
    with pytest.raises(TypeError, match="three dicts"):
        program([])({}, {})
    with pytest.raises(ValueError, match="bad guard load"):
        p._set_program([(ATTR, -1, "x")], [], [], (), resolve_step, MISSING, None, [])
    with pytest.raises(ValueError, match="bad guard check"):
        p._set_program([(LOCAL, -1, "x")], [(0, 9, None, None)], [], (), resolve_step,
                       MISSING, None, [])
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
