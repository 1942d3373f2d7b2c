"""The guard system's tables (csrc/protocol.h: AGS_LOAD_LIST, AGS_CHECK_LIST,
AGS_GFLAG_LIST, AGS_PART_LIST): every C row is exported and has its behaviour, every
Python user names kinds through agspeed.protocol, and a kind C does not know is refused
loudly.  Also: a refused program keeps no reference it did not take."""

import ast
import glob
import os
import re
import sys
import weakref

import pytest

from agspeed import _C
from agspeed._sources import MISSING, resolve_step
from agspeed.guards.checks import KINDS, NO_SYMBOLS, CheckKind, Symbols, holder
from agspeed.protocol import Check, GuardFlag, Load, Part, SizeOp
from test_program import SOURCES, FakeModule, frame
from test_symbolic import F32, CPU, FakeTensor, contiguous

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_program(loads, checks=(), flags=0, symbolic=None, module_type=None,
                    aliases=(), probes=(), outputs=(), distinct=None):
    p = _C.GuardProgram()
    p._set_program(list(loads), list(checks), list(aliases), tuple(probes), resolve_step,
                   MISSING, module_type, list(outputs), flags, symbolic, distinct)
    return p


@pytest.mark.parametrize("table, enum", [("load", Load), ("check", Check),
                                         ("guard_flag", GuardFlag), ("part", Part)])
def test_every_c_row_is_exported(table, enum):
    rows = _C.PROTOCOL[table]
    assert [(m.name, int(m)) for m in enum] == [(r[0], r[1]) for r in rows]
    assert all(m.doc and m.id == m.name.lower() for m in enum)


# -- Load -------------------------------------------------------------------------------


def test_every_load_op_reads_its_source():
    """test_guard_program's sources (each read as resolve reads it) use every op."""
    assert {Load.by_id[s[0]] for s in SOURCES} == set(Load)


def test_the_python_step_is_asked_by_load_id():
    asked = []

    def step(kind, base, key):
        asked.append(kind)
        return resolve_step(kind, base, key)

    p = _C.GuardProgram()
    loads = [(Load.LOCAL, -1, "dynamic"), (Load.ATTR, 0, "x"), (Load.LOCAL, -1, "prop"),
             (Load.FGET, 2, None), (Load.LOCAL, -1, "plain"), (Load.ITEM, 4, 0)]
    p._set_program(loads, [], [], (), step, MISSING, None, [1, 3, 5])
    p.read(*frame())
    assert asked == [Load.ATTR.id, Load.FGET.id, Load.ITEM.id]


@pytest.mark.parametrize("op", [len(Load), 99, -1])
def test_an_unknown_load_op_is_refused_naming_the_table(op):
    with pytest.raises(ValueError, match=r"bad guard load 0: .*unknown load kind") as info:
        compile_program([(op, -1, "x")])
    assert "unknown load kind" in str(info.value.__cause__)


@pytest.mark.parametrize("load, needs", [
    ((Load.ATTR, -1, "x"), "a parent load"),
    ((Load.GLOBAL, 0, "x"), "no parent load"),
    ((Load.GMOD, -1, "torch"), r"\(module name, name\)"),
    ((Load.CELL, 0, "x"), "an int"),
    ((Load.CELL, 0, 2 ** 80), "fits"),
    ((Load.GLOBAL, -1, "x", 0), "no argument slot"),
    ((Load.ITEM, 1, 0), "a parent load before it"),
])
def test_each_load_ops_row_refuses_what_it_cannot_read(load, needs):
    with pytest.raises(ValueError, match=f"bad guard load 1 \\({Load(load[0]).id}\\): "
                                         f"needs .*{needs}"):
        compile_program([(Load.LOCAL, -1, "x"), load])


# -- Check ------------------------------------------------------------------------------


def test_the_check_classes_cover_exactly_the_check_kinds():
    assert set(KINDS) == set(Check)
    assert all(type(k) is Check and KINDS[k].kind is k for k in KINDS)
    assert len({type(c) for c in KINDS.values()}) == len(Check)
    assert all(isinstance(c, CheckKind) and c.word for c in KINDS.values())


class Thing:
    pass


THING = Thing()
X = FakeTensor((4, 3))

# (kind, expectation as its class keeps it, symbols, values that pass, values that fail)
SAMPLES = [
    (Check.TENSOR, (FakeTensor, F32, CPU, (4, 3), (3, 1), False), NO_SYMBOLS,
     [X, FakeTensor((4, 3))],
     [FakeTensor((4, 4)), FakeTensor((4, 3), stride=(1, 4)), FakeTensor((4, 3), dtype=1),
      FakeTensor((4, 3), device="cuda"), FakeTensor((4, 3), requires_grad=True),
      [4, 3], MISSING]),
    (Check.EQ, (int, 3), NO_SYMBOLS, [3], [4, True, 3.0, "3", MISSING]),
    (Check.LEN, (tuple, 2), NO_SYMBOLS, [(1, 2), (3, 4)], [(1,), [1, 2], {1: 2}, MISSING]),
    (Check.ID, holder(THING), NO_SYMBOLS, [THING], [Thing(), None, MISSING]),
    (Check.ID, holder(len), NO_SYMBOLS, [len], [print, MISSING]),
    (Check.ABSENT, None, NO_SYMBOLS, [MISSING], [None, 0, THING]),
    (Check.DYNTENSOR, (FakeTensor, F32, CPU, ("s0", 3), (3, 1), False),
     Symbols({"s0": 0}, {}), [X, FakeTensor((9, 3))],
     [FakeTensor((9, 4)), FakeTensor((9, 3), stride=(1, 9)), [9, 3], MISSING]),
    (Check.DYNINT, "s0", Symbols({"s0": 0}, {}), [0, -5, 7, (1 << 63) - 1],
     [True, 7.0, "7", 1 << 63, -(1 << 63) - 1, None, MISSING]),
]


@pytest.mark.parametrize("kind, expected, symbols, good, bad", SAMPLES,
                         ids=[s[0].name for s in SAMPLES])
def test_each_kinds_c_row_and_python_class_agree(kind, expected, symbols, good, bad):
    """The class's compile is what the C row accepts, and its Python reading (passes)
    answers as the C fast check does."""
    check = KINDS[kind]
    symbolic = (1, (), (), None) if symbols.index else None
    p = compile_program([(Load.LOCAL, -1, "v")],
                        [(0, kind, *check.compile(expected, symbols))], symbolic=symbolic)
    for value, want in [(v, True) for v in good] + [(v, False) for v in bad]:
        f_locals = {} if value is MISSING else {"v": value}
        assert p(f_locals, {}, {}) is want, (kind, value)
        assert check.passes(expected, value, None, {}) is want, (kind, value)
        if not want:
            assert check.got(value) and check.shown(expected)


def test_every_check_kind_is_covered_by_the_samples():
    assert {s[0] for s in SAMPLES} == set(Check)


@pytest.mark.parametrize("kind", [len(Check), 99, -1])
def test_an_unknown_check_kind_is_refused_naming_the_table(kind):
    with pytest.raises(ValueError, match=r"bad guard check 0: .*unknown check kind"):
        compile_program([(Load.LOCAL, -1, "x")], [(0, kind, None, None)])


@pytest.mark.parametrize("kind, a, b", [
    (Check.TENSOR, FakeTensor, (F32, CPU, (4,), (1,))),
    (Check.TENSOR, "not a type", (F32, CPU, (4,), (1,), False)),
    (Check.EQ, 3, 3),
    (Check.LEN, list, -1),
    (Check.LEN, list, "2"),
    (Check.ID, THING, True),
    (Check.ID, THING, 1),
    (Check.ABSENT, THING, None),
    (Check.DYNTENSOR, FakeTensor, (F32, CPU, (-1,), (1,), False)),   # no symbols
    (Check.DYNINT, int, -1),   # no symbols
    (Check.DYNINT, float, -1),
    (Check.DYNINT, int, 0),
])
def test_each_check_kinds_row_refuses_what_it_cannot_check(kind, a, b):
    with pytest.raises(ValueError, match=f"bad guard check 0 \\({kind.name}\\): expects"):
        compile_program([(Load.LOCAL, -1, "x")], [(0, kind, a, b)])


# -- GuardFlag --------------------------------------------------------------------------


def flag_program(flags):
    """self.child.w, a store value checked as a tensor: what CHECK_KNOWN_TENSORS keeps."""
    loads = [(Load.LOCAL, -1, "self"), (Load.ATTR, 0, "child"), (Load.ATTR, 1, "w")]
    checks = [(0, Check.ID, weakref.ref(ROOT_MODULE), True),
              (1, Check.ID, weakref.ref(ROOT_MODULE.child), True),
              (2, Check.TENSOR, FakeTensor, (F32, CPU, (4, 3), contiguous((4, 3)), False))]
    return compile_program(loads, checks, flags, module_type=FakeModule, outputs=[2])


ROOT_MODULE = FakeModule(child=FakeModule())
ROOT_MODULE.child._parameters["w"] = X


def test_each_guard_flag_changes_what_the_memo_skips():
    memos = {}
    for flags in [GuardFlag(0), *GuardFlag]:
        p = flag_program(flags)
        for _ in range(3):
            assert p.run({"self": ROOT_MODULE}, {}, {}) == (X,)
        memos[flags] = p._memo()
    assert memos[GuardFlag(0)]["valid"] and memos[GuardFlag(0)]["skipped_checks"] == 3
    assert memos[GuardFlag.CHECK_KNOWN_TENSORS]["skipped_checks"] == 2
    assert not memos[GuardFlag.NO_MEMO]["valid"]
    assert all(flag.value & (flag.value - 1) == 0 for flag in GuardFlag)   # bits


def test_an_unknown_guard_flag_is_refused_naming_the_table():
    unknown = max(GuardFlag).value << 1
    with pytest.raises(ValueError, match="guard_flag"):
        compile_program([], flags=unknown)
    with pytest.raises(ValueError, match="guard_flag"):
        compile_program([], flags=-1)


# -- Part -------------------------------------------------------------------------------


def test_why_names_every_part_by_its_id():
    flag = {"on": True}
    ge5 = (SizeOp.SYM, 0, SizeOp.CONST, 5, SizeOp.GE)   # s0 >= 5
    p = compile_program(
        [(Load.LOCAL, -1, "x"), (Load.LOCAL, -1, "a"), (Load.LOCAL, -1, "b"), (Load.LOCAL, -1, "c"),
         (Load.LOCAL, -1, "d")],
        [(0, Check.DYNTENSOR, FakeTensor, (F32, CPU, (-1, 3), (3, 1), False)),
         (1, Check.EQ, int, 1)],
        aliases=[(2, 3)], probes=[(flag.get, ("on",), True)],
        symbolic=(1, (tuple(int(w) for w in ge5),), (0,), None), distinct=[2, 4])
    shared = object()
    ok = {"x": FakeTensor((6, 3)), "a": 1, "b": shared, "c": shared, "d": object()}
    assert p.why(ok, {}, {}) is None
    seen = {p.why({**ok, "a": 2}, {}, {}), p.why({**ok, "c": object()}, {}, {}),
            p.why({**ok, "d": shared}, {}, {}), p.why({**ok, "x": FakeTensor((4, 3))}, {}, {})}
    flag["on"] = False
    seen.add(p.why(ok, {}, {}))
    assert {part for part, _ in seen} == {part.id for part in Part}


# -- every Python user reads kinds from agspeed.protocol -------------------------------

_KINDY = re.compile(r"(^|_)(kind|kinds|op|ops|flag|flags|part|load|check)$", re.I)
_MEMBERS = {m.name for t in (Check, GuardFlag, Load, Part) for m in t} | {"DYN"}
_IDS = {m.id for t in (Load, Check) for m in t}
# Readers that may compare a kind with a number: none.
_KNOWN: set = set()


def _ints(node):
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_ints(e) for e in node.elts)
    return False


def _name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return None


def literal_kinds(path):
    """Where the file names a kind by number: a kind compared with an int, names
    numbered by range(), a name of a kind bound to an int, a {source id: int} table,
    and (in guards/) why()'s parts as strings."""
    tree = ast.parse(open(path).read())
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_name(n) and _KINDY.search(_name(n)) for n in sides) and \
                    any(_ints(n) for n in sides):
                hits.append(node)
        elif isinstance(node, ast.Assign):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "range" \
                    and any(isinstance(t, ast.Tuple) for t in node.targets):
                hits.append(node)
            elif _ints(value) and any((_name(t) or "").strip("_").upper() in _MEMBERS
                                      for t in node.targets):
                hits.append(node)
        elif isinstance(node, ast.Dict):
            if node.keys and all(isinstance(k, ast.Constant) and k.value in _IDS
                                 for k in node.keys) and all(_ints(v) for v in node.values):
                hits.append(node)
        elif isinstance(node, ast.Constant) and "/guards/" in path and \
                "/tests/" not in path and node.value in {p.id for p in Part}:
            hits.append(node)
    return [ast.unparse(h) for h in hits]


def test_the_scan_finds_kinds_named_by_number(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("_TENSOR, _EQ = range(2)\n_CHECK_KNOWN_TENSORS = 1\n"
                    "if kind == 5: pass\nOPS = {'local': 0, 'attr': 3}\n"
                    "if c[1] in (0, 5): pass\n")
    assert len(literal_kinds(str(path))) == 4   # c[1] is not named: the scan's limit


def test_no_python_names_a_guard_kind_by_number():
    files = sorted(glob.glob(os.path.join(ROOT, "guards", "*.py")) +
                   glob.glob(os.path.join(ROOT, "agspeed", "*.py")) +
                   [os.path.join(ROOT, "tests", "guards", f) for f in (
                       "test_program.py", "test_symbolic.py", "test_memo.py",
                       "test_load.py")])
    found = {(os.path.relpath(f, ROOT), hit) for f in files for hit in literal_kinds(f)}
    assert found - _KNOWN == set()


@pytest.mark.torch
def test_a_compiled_guard_names_loads_checks_and_flags_by_their_enums():
    torch = pytest.importorskip("torch")
    import agspeed
    from agspeed.guards import Guard

    class Spy(Guard):
        def _set_program(self, loads, checks, aliases, probes, step, missing, mtype,
                         outputs, flags, symbolic, distinct, tensor_batch):
            self.seen = loads, checks, flags
            super()._set_program(loads, checks, aliases, probes, step, missing, mtype,
                                 outputs, flags, symbolic, distinct, tensor_batch)

    lin = torch.nn.Linear(3, 3)

    def f(x, m):
        return m(x) + x

    agspeed.optimize(f, backend="eager")(torch.randn(2, 3), lin)
    (guard,) = [e.guard for e in _C.code_cache(f.__code__)["entries"]]
    spy = Spy.__new__(Spy)
    for name in Guard.__slots__:
        setattr(spy, name, getattr(guard, name))
    spy._compile()
    loads, checks, flags = spy.seen
    assert loads and all(type(load[0]) is Load for load in loads)
    assert {type(c[1]) for c in checks} == {Check}
    assert GuardFlag(flags) in (GuardFlag(0), GuardFlag.CHECK_KNOWN_TENSORS)
    assert {Check(c[1]) for c in guard.checks} >= {Check.TENSOR, Check.ID}
    agspeed.reset()


# -- ownership: a refused program keeps no reference it did not take -------------------


def test_a_refused_program_leaves_every_reference_as_it_was():
    key, a, b = object(), Thing(), object()
    p = _C.GuardProgram()
    bad = [
        dict(loads=[(Load.LOCAL, -1, key, "not an int")]),        # fails after the key
        dict(loads=[(Load.LOCAL, -1, key), (Load.ATTR, -1, key)]),
        dict(loads=[(Load.LOCAL, -1, key)], checks=[("x", Check.ID, a, b)]),
        dict(loads=[(Load.LOCAL, -1, key)], checks=[(0, Check.ID, a, b)]),
        dict(loads=[(Load.LOCAL, -1, key)], checks=[(0, Check.EQ, a, b)]),
        dict(loads=[(Load.LOCAL, -1, key)], checks=[(0, 99, a, b)]),
        dict(loads=[(Load.LOCAL, -1, key)], aliases=[(0, 5)]),
        dict(loads=[(Load.LOCAL, -1, key)], outputs=[3]),
        dict(loads=[(Load.LOCAL, -1, key)], flags=64),
    ]
    counts = sys.getrefcount(key), sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(50):
        for spec in bad:
            with pytest.raises((ValueError, TypeError)):
                p._set_program(spec.get("loads", []), spec.get("checks", []),
                               spec.get("aliases", []), (), resolve_step, MISSING, None,
                               spec.get("outputs", []), spec.get("flags", 0))
            with pytest.raises(RuntimeError, match="not compiled"):
                p({}, {}, {})
    assert (sys.getrefcount(key), sys.getrefcount(a), sys.getrefcount(b)) == counts
    p._set_program([(Load.LOCAL, -1, key)], [(0, Check.ID, a, False)], [], (),
                   resolve_step, MISSING, None, [0])
    assert sys.getrefcount(key) == counts[0] + 1 and sys.getrefcount(a) == counts[1] + 1
    del p
    assert (sys.getrefcount(key), sys.getrefcount(a), sys.getrefcount(b)) == counts
