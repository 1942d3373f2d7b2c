"""Attribute lookup rules have one home: a guard program's attribute load (guards/load.c)
answers what agspeed._sources.static_attr answers, rule by rule.

C answers the common cases itself (a Python module's dict, a class's function, constant
or property, an instance dict, nn.Module's stores) and hands every other case to the
Python step (resolve_step, which asks static_attr).  Each rule below pins both: the value
a program's ("attr", ...) load reads is what static_attr finds, and which side answered."""

import collections
import threading
import types

import pytest

from agspeed import _C
from agspeed._sources import MISSING, resolve_step, static_attr
from agspeed.protocol import Attr, Load

C, PY = "C", "Python"

RAN = []   # user code that ran: none may, while guarding or in static_attr


class Recorder:
    """A program's Python step that records which (kind, base, key) it was asked."""

    def __init__(self):
        self.calls = []

    def __call__(self, kind, base, key):
        self.calls.append((kind, key))
        return resolve_step(kind, base, key)


def read_attr(obj, name, module_type=None):
    """(value, who answered) for obj.<name> through a guard program's attribute load."""
    step = Recorder()
    p = _C.GuardProgram()
    p._set_program([(Load.LOCAL, -1, "obj"), (Load.ATTR, 0, name)], [], [], (), step,
                   MISSING, module_type, [1])
    RAN.clear()
    (got,) = p.read({"obj": obj}, {}, {})
    assert RAN == [], f"the guard program ran user code: {RAN}"
    return got, (PY if ("attr", name) in step.calls else C)


def static(obj, name):
    """What static_attr says a guard reads: the value it finds, or MISSING where it
    finds nothing or only running code could answer."""
    RAN.clear()
    how, found = static_attr(obj, name)
    assert RAN == [], f"static_attr ran user code: {RAN}"
    return found if how in (Attr.VALUE, Attr.METHOD, Attr.PROPERTY) else MISSING


class Descriptor:
    def __get__(self, obj, cls=None):
        RAN.append("__get__")
        return self


class DataDescriptor(Descriptor):
    def __set__(self, obj, value):
        RAN.append("__set__")


class Plain:
    constant = 7
    builtin = len
    nested = dict
    plain_descriptor = Descriptor()
    data_descriptor = DataDescriptor()

    def __init__(self):
        self.x = 1

    def method(self):
        return 1

    @property
    def prop(self):
        RAN.append("prop")

    @staticmethod
    def static():
        return 2

    @classmethod
    def klass(cls):
        return 3


class Shadow(Plain):
    def __init__(self):
        super().__init__()
        self.method = "an instance value wins over a class function"


class Slotted:
    __slots__ = ("s", "unset")

    def __init__(self):
        self.s = 5


class CustomGetattr:
    def __init__(self):
        self.x = 1

    def __getattr__(self, name):
        RAN.append("__getattr__")
        raise AttributeError(name)


class CustomGetattribute:
    def __init__(self):
        self.x = 1

    def __getattribute__(self, name):
        RAN.append("__getattribute__")
        return object.__getattribute__(self, name)


class Naming(type):
    @property
    def __name__(cls):
        RAN.append("__name__")
        return "renamed"


class Named(metaclass=Naming):
    pass


Point = collections.namedtuple("Point", "x y")


class PerThread(threading.local):
    constant = 7

    def __init__(self):
        self.x = 1


LOCAL, PER_THREAD = threading.local(), PerThread()
LOCAL.x = 2

# (rule, object, attribute, who answers)
class LazyModule(types.ModuleType):
    def __getattr__(self, name):
        RAN.append("__getattr__")
        raise AttributeError(name)


LAZY = LazyModule("lazy")
LAZY.here = 1

RULES = [
    ("module dict", types, "FunctionType", C),
    ("module dict, missing", types, "no_such_name", C),
    ("module subclass's dict", LAZY, "here", C),
    ("module subclass, missing: its own reading decides", LAZY, "nothing", PY),
    ("class function (a method)", Plain(), "method", C),
    ("class constant", Plain(), "constant", C),
    ("class builtin function", Plain(), "builtin", C),
    ("class holding a class", Plain(), "nested", C),
    ("class property", Plain(), "prop", C),
    ("class staticmethod", Plain(), "static", PY),
    ("class classmethod", Plain(), "klass", PY),
    ("class descriptor", Plain(), "plain_descriptor", PY),
    ("class data descriptor", Plain(), "data_descriptor", PY),
    ("instance dict", Plain(), "x", C),
    ("instance dict over a class function", Shadow(), "method", C),
    ("missing on a plain object", Plain(), "nothing", C),
    ("an object's own __class__", Plain(), "__class__", C),
    ("__slots__ member", Slotted(), "s", PY),
    ("__slots__ member never set", Slotted(), "unset", PY),
    ("missing on a slotted object", Slotted(), "nothing", C),
    ("class: its name", Plain, "__name__", C),
    ("class: its qualified name", Shadow, "__qualname__", C),
    ("class: its MRO", Shadow, "__mro__", C),
    ("class: its module", Plain, "__module__", PY),
    ("class with a metaclass naming itself", Named, "__name__", PY),
    ("class: its attribute", Plain, "constant", PY),
    ("class: its function", Plain, "method", PY),
    ("class: its staticmethod", Plain, "static", PY),
    ("class: its property", Plain, "prop", PY),
    ("super object", super(Shadow, Shadow()), "method", PY),
    ("super object, missing", super(Shadow, Shadow()), "nothing", PY),
    ("custom __getattr__, instance dict", CustomGetattr(), "x", C),
    ("custom __getattr__, missing", CustomGetattr(), "anything", PY),
    ("custom __getattribute__, instance dict", CustomGetattribute(), "x", C),
    ("custom __getattribute__, missing", CustomGetattribute(), "anything", C),
    ("namedtuple field", Point(3, 4), "y", PY),
    ("threading.local's per-thread dict", LOCAL, "x", PY),
    ("threading.local subclass's per-thread dict", PER_THREAD, "x", PY),
    ("threading.local subclass's class constant", PER_THREAD, "constant", PY),
    ("threading.local, missing", PER_THREAD, "nothing", PY),
    ("builtin type's instance", 3, "real", PY),
    ("builtin type's instance, missing", 3, "nothing", PY),
]


@pytest.mark.parametrize("rule, obj, name, where", RULES, ids=[r[0] for r in RULES])
def test_an_attribute_load_reads_what_static_attr_finds(rule, obj, name, where):
    got, answered = read_attr(obj, name)
    assert got is static(obj, name), rule
    assert answered == where, rule


# -- nn.Module: its stores in order, its __getattr__ -----------------------------------


def module_rules(torch):
    nn = torch.nn

    class Custom(nn.Module):
        def __getattr__(self, name):
            RAN.append("__getattr__")
            return super().__getattr__(name)

    m = nn.Module()
    m.register_parameter("both_pb", nn.Parameter(torch.zeros(1)))
    m._buffers["both_pb"] = torch.ones(1)          # a parameter shadows a buffer
    m.register_buffer("both_bm", torch.zeros(2))
    m._modules["both_bm"] = nn.Identity()          # a buffer shadows a submodule
    m.register_module("child", nn.Identity())
    m.register_parameter("p", nn.Parameter(torch.zeros(3)))
    custom = Custom()
    custom.register_buffer("b", torch.zeros(1))
    return [
        ("parameter", m, "p", C),
        ("parameter before buffer", m, "both_pb", C),
        ("buffer before submodule", m, "both_bm", C),
        ("submodule", m, "child", C),
        ("instance attribute", m, "training", C),
        ("class function", m, "forward", C),
        ("missing, nn.Module's own __getattr__", m, "nothing", C),
        ("custom __getattr__, store", custom, "b", C),
        ("custom __getattr__, missing", custom, "nothing", PY),
    ]


@pytest.mark.torch
def test_module_attribute_loads_read_what_static_attr_finds():
    torch = pytest.importorskip("torch")
    for rule, obj, name, where in module_rules(torch):
        got, answered = read_attr(obj, name, torch.nn.Module)
        assert got is static(obj, name), rule
        assert answered == where, rule


@pytest.mark.torch
def test_an_optimized_modules_view_reads_what_static_attr_finds():
    """A view class's __getattr__ only forwards to the original's: static_attr looks past
    it, and C leaves absent attributes of a view to Python."""
    torch = pytest.importorskip("torch")
    import agspeed

    view = agspeed.optimize(torch.nn.Linear(2, 2), backend="eager")
    for name, where in [("weight", C), ("in_features", C), ("nothing", PY)]:
        got, answered = read_attr(view, name, torch.nn.Module)
        assert got is static(view, name), name
        assert answered == where, name


# -- module globals past the module, and a dict's keys and values ------------------------


def read_load(base, load, key=None):
    """(value, who answered) for a load of ``base`` (LOCAL "obj") by ``load``."""
    step = Recorder()
    p = _C.GuardProgram()
    p._set_program([(Load.LOCAL, -1, "obj"), (load, 0, key)], [], [], (), step,
                   MISSING, None, [1])
    (got,) = p.read({"obj": base}, {}, {})
    return got, (PY if step.calls else C)


def read_gmod(module, name):
    step = Recorder()
    p = _C.GuardProgram()
    p._set_program([(Load.GMOD, -1, (module, name))], [], [], (), step, MISSING, None, [0])
    (got,) = p.read({}, {}, {})
    return got, (PY if step.calls else C)


def test_a_modules_global_falls_back_to_its_builtins_in_c():
    assert read_gmod("collections", "OrderedDict") == (collections.OrderedDict, C)
    assert read_gmod("collections", "isinstance") == (isinstance, C)
    assert read_gmod("collections", "no_such_name") == (MISSING, C)
    assert read_gmod("collections", "isinstance")[0] is \
        resolve_step("gmod", collections, "isinstance")


def test_keys_and_values_of_dicts_read_in_c_as_in_python():
    od = collections.OrderedDict(a=1, b=2, c=3)
    od.move_to_end("a")                       # its own order, not its dict's
    dd = collections.defaultdict(list, x=[1], y=[2])

    class Sub(dict):
        def keys(self):
            RAN.append("keys")
            return []

    cases = [({"p": 1, "q": 2}, C, C), (dd, C, C), (od, C, PY), (Sub(k=1), PY, PY)]
    for base, keys_by, values_by in cases:
        RAN.clear()
        for load, kind, by in ((Load.KEYS, "keys", keys_by),
                               (Load.VALUES, "values", values_by)):
            got, answered = read_load(base, load)
            assert got == resolve_step(kind, base, None) and type(got) is tuple
            assert answered == by, (type(base).__name__, kind)
        assert RAN == []
    assert read_load(od, Load.KEYS)[0] == ("b", "c", "a")


@pytest.mark.torch
def test_torch_vf_reads_torchs_builtins():
    """torch._VF answers past its dict from torch's builtins (nn.LSTM's _VF.lstm)."""
    torch = pytest.importorskip("torch")
    got, answered = read_attr(torch._VF, "lstm")
    assert got is static(torch._VF, "lstm") is torch._C._VariableFunctions.lstm
    assert answered == PY
    assert read_attr(torch._VF, "no_such_function")[0] is MISSING
