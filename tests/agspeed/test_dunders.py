"""Special methods written in Python, inlined (csrc/interp_dunder.c, agspeed/_dunders.py):
``b[k]``, ``k in b`` / ``k not in b``, ``len(b)``, ``iter(b)`` / ``for x in b`` and the
truth of ``b`` on objects whose class defines them in Python, looked up on the type's MRO
as CPython does, including the mixin methods of ``collections.abc`` (``Mapping.__contains__``,
``Mapping.get``), for objects of the program (globals) and objects the capture makes.

Each test captures a function in one graph with no break, no more graphs than
torch._dynamo.explain counts for it, and the optimized function's result (its type
included) and gradients equal eager's on fresh random inputs; the tests on a global
mapping then change it (a key added, removed, a value replaced) and check that the
optimized function follows, as the guards on the mapping must make it."""

import collections.abc
import dataclasses

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from _dynamo_ref import dynamo_graph_count  # noqa: E402

pytestmark = pytest.mark.torch


def check(fn, *shapes):
    """fn captures whole and computes what eager does, on fresh inputs twice (the capture,
    then a cache hit); returns the optimized function."""
    torch.manual_seed(0)
    args = [torch.randn(*s) for s in shapes]
    e = agspeed.explain(fn, *args)
    assert e.graph_break_count == 0, e.break_reasons
    assert e.graph_count == 1
    assert e.graph_count <= dynamo_graph_count(fn, *args)
    opt = agspeed.optimize(fn)
    for _ in range(2):
        same(opt, fn, shapes)
    return opt


def same(opt, fn, shapes):
    """opt and fn give equal results, of the same type, and equal gradients."""
    args = [torch.randn(*s, requires_grad=True) for s in shapes]
    twins = [a.detach().clone().requires_grad_() for a in args]
    got, want = opt(*args), fn(*twins)
    assert type(got) is type(want)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    for a, b in zip(args, twins):
        torch.testing.assert_close(a.grad, b.grad)


class Registry(collections.abc.MutableMapping):
    """Like transformers' GeneralInterface: a class-wide mapping and a local one."""

    _global_mapping = {"relu": torch.relu, "tanh": torch.tanh}

    def __init__(self):
        self._local_mapping = {}

    def __getitem__(self, key):
        if key in self._local_mapping:
            return self._local_mapping[key]
        return self._global_mapping[key]

    def __setitem__(self, key, value):
        self._local_mapping.update({key: value})

    def __delitem__(self, key):
        del self._local_mapping[key]

    def __iter__(self):
        return iter({**self._global_mapping, **self._local_mapping})

    def __len__(self):
        return len({**self._global_mapping, **self._local_mapping})


class SubRegistry(Registry):
    """The methods found on a base class of the MRO, as AttentionInterface's are."""

    def get_interface(self, name, default):
        if name not in self:
            raise KeyError(name)
        return super().get(name, default)


REG = SubRegistry()


@pytest.fixture
def reg():
    saved = dict(Registry._global_mapping), dict(REG._local_mapping)
    yield REG
    Registry._global_mapping.clear()
    Registry._global_mapping.update(saved[0])
    REG._local_mapping.clear()
    REG._local_mapping.update(saved[1])


def test_mapping_in_then_getitem_follows_changes(reg):
    def f(x):
        if "act" in REG:
            fn = REG["act"]
        else:
            fn = REG["relu"]
        return fn(x) * 2

    reg["act"] = torch.sigmoid
    opt = check(f, (3, 4))
    reg["act"] = torch.tanh            # a value replaced
    same(opt, f, [(3, 4)])
    del reg["act"]                      # a key removed: the other branch
    same(opt, f, [(3, 4)])
    Registry._global_mapping["act"] = torch.sin   # added to the class-wide mapping
    same(opt, f, [(3, 4)])


def test_mapping_not_in(reg):
    def f(x):
        if "gelu" not in REG:
            return REG["tanh"](x) + 1
        return REG["gelu"](x)

    opt = check(f, (5,))
    reg["gelu"] = torch.nn.functional.gelu
    same(opt, f, [(5,)])


def test_mapping_get_through_super_and_mixins(reg):
    def f(x):
        act = REG.get_interface("tanh", torch.relu)
        other = REG.get("relu")
        return act(x) + other(x) * len(REG)

    opt = check(f, (2, 3))
    reg["extra"] = torch.sin            # len changes
    same(opt, f, [(2, 3)])
    Registry._global_mapping["tanh"] = torch.sigmoid
    same(opt, f, [(2, 3)])


def test_mapping_iteration(reg):
    def f(x):
        out = x
        for name in REG:
            out = out + len(name)
        return out * len(list(REG))

    opt = check(f, (3,))
    reg["longer_name"] = torch.cos
    same(opt, f, [(3,)])


class Named:
    """str() through a Python __str__."""

    def __str__(self):
        return "named"


class Shown:
    """repr() and, through object's __str__, str() through a Python __repr__."""

    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"Shown({self.n})"


def test_str_and_repr_run_the_classes_python_methods():
    named, shown = Named(), Shown(3)

    def f(x):
        return x * 2, str(named), str(shown), repr(shown)

    e = agspeed.explain(f, torch.randn(2))
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    opt = agspeed.optimize(f)
    x = torch.randn(2)
    assert opt(x)[1:] == f(x)[1:] == ("named", "Shown(3)", "Shown(3)")
    shown.n = 5                          # what __repr__ reads is guarded
    assert opt(x)[1:] == ("named", "Shown(5)", "Shown(5)")
    named, shown = Shown(1), Named()     # other classes: captured again (object's
    got, want = opt(x), f(x)             # repr of a Named, its address, runs eager)
    assert got[1:] == want[1:] and got[1:3] == ("Shown(1)", "named")


class TensorStore(collections.abc.MutableMapping):
    """A mapping of the program whose values are tensors, read by its Python methods."""

    def __init__(self):
        self._dict = {}

    def __getitem__(self, key):
        return self._dict[key]

    def __setitem__(self, key, value):
        self._dict[key] = value

    def __delitem__(self, key):
        del self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self):
        return len(self._dict)


STORE = TensorStore()


def test_dict_of_a_mapping_holding_tensors_gives_this_calls_tensors():
    # dict(STORE) reads the program's tensors through STORE's own methods: held by a
    # graph they would be the first call's; the capture breaks there instead, cleanly
    def f(x):
        copied = dict(STORE)
        return x * copied["a"]

    STORE["a"] = torch.full((3,), 2.0)
    e = agspeed.explain(f, torch.randn(3))
    assert ["dict() of a TensorStore holding tensors" in str(b) for b in e.break_reasons] \
        == [True] + [False] * (len(e.break_reasons) - 1)
    opt = agspeed.optimize(f)
    for value in (2.0, 3.0):
        STORE["a"] = torch.full((3,), value)
        x = torch.randn(3)
        torch.testing.assert_close(opt(x), x * value)


class Seq:
    """A sequence class: __len__ and __getitem__ in Python, no __iter__."""

    def __init__(self, *scales):
        self.scales = list(scales)

    def __len__(self):
        return len(self.scales)

    def __getitem__(self, i):
        return self.scales[i]


SEQ = Seq(1.0, 2.0, 3.0)


def test_sequence_len_and_getitem_in_a_loop():
    def f(x):
        out = x
        for i in range(len(SEQ)):
            out = out * SEQ[i] + SEQ[-1 - i]
        return out

    opt = check(f, (4,))
    SEQ.scales.append(0.5)
    try:
        same(opt, f, [(4,)])
    finally:
        SEQ.scales.pop()


class Steps:
    """An iterable whose __iter__ is a generator function."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield i + 1


STEPS = Steps(3)


def test_for_loop_over_python_iter():
    def f(x):
        total = x
        for k in STEPS:
            total = total + x * k
        return total

    opt = check(f, (2, 2))
    STEPS.n = 5
    try:
        same(opt, f, [(2, 2)])
    finally:
        STEPS.n = 3


class Flag:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


class Sized:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)


FLAG, EMPTY = Flag(True), Sized([])


def test_truth_from_bool_and_len():
    def f(x):
        y = x * 2 if FLAG else x - 1
        if not EMPTY:
            y = y + 1
        return y * bool(FLAG) + (1 if bool(EMPTY) else 3)

    opt = check(f, (3,))
    FLAG.on = False
    EMPTY.items.append(1)
    try:
        same(opt, f, [(3,)])
    finally:
        FLAG.on = True
        EMPTY.items.clear()


class Table:
    def __init__(self, scale):
        self.scale = scale

    def __getitem__(self, key):
        return self.scale * key

    def __contains__(self, key):
        return key > 0


def test_object_made_in_the_frame():
    def f(x):
        t = Table(2.0)
        y = x * t[3]
        if 5 in t and -1 not in t:
            y = y + t[1]
        return y

    check(f, (2, 3))


def test_python_contains_on_a_global():
    table = Table(3.0)

    def f(x):
        return x * table[2] if 4 in table else x

    check(f, (3,))


def test_builtin_containers_and_module_lists_keep_their_path():
    layers = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)])
    plain = {"a": 1.0}

    def f(x):
        for layer in layers:
            x = layer(x)
        return layers[0](x) * plain["a"] + len(layers) if "a" in plain else x

    check(f, (2, 3))


class Defaulting(collections.abc.Mapping):
    """A __getitem__ that catches its own KeyError: `in` is then always true."""

    def __init__(self, **items):
        self.items = items

    def __getitem__(self, key):
        try:
            return self.items[key]
        except KeyError:
            return 0.5

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


DEFAULTING = Defaulting(a=2.0)


def test_a_key_error_handled_inside_getitem_is_not_read_as_absent():
    def f(x):
        return x * DEFAULTING["b"] if "b" in DEFAULTING else x - 100

    opt = agspeed.optimize(f)
    for _ in range(2):
        same(opt, f, [(3,)])


def test_mapping_get_of_a_missing_key_gives_the_default(reg):
    def f(x):
        act = REG.get("missing", torch.relu)
        return act(x) - REG.get_interface("relu", torch.tanh)(x)

    opt = check(f, (3, 2))
    reg["missing"] = torch.sigmoid      # now present: the guard sees the mapping changed
    same(opt, f, [(3, 2)])


def test_os_environ_get_in_one_graph(monkeypatch):
    import os

    monkeypatch.delenv("AGSPEED_TEST_DUNDER_SCALE", raising=False)

    def f(x):
        scale = os.environ.get("AGSPEED_TEST_DUNDER_SCALE", "2")
        return x * float(scale)

    opt = check(f, (4,))
    monkeypatch.setenv("AGSPEED_TEST_DUNDER_SCALE", "5")
    same(opt, f, [(4,)])


def test_transformers_attention_interfaces_in_one_graph():
    pytest.importorskip("transformers")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def f(x):
        fn = ALL_ATTENTION_FUNCTIONS.get_interface("sdpa", None)
        mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
        y = x * 2 if fn is sdpa and mask is not None else x
        return y + 1 if "no_such_impl" not in ALL_ATTENTION_FUNCTIONS else y

    check(f, (2, 3))


def _pick(t, i):
    try:
        return t[i]
    except IndexError:
        return t[0]


@pytest.mark.cxx_exceptions   # the out-of-range index throws in libtorch
def test_a_tensors_index_error_is_not_caught_in_the_graph():
    def f(x):
        return _pick(x, 5) * 2

    e = agspeed.explain(f, torch.randn(3))
    reasons = {b.reason for b in e.break_reasons}
    assert reasons == {"op_failed"}, e.break_reasons
    opt = agspeed.optimize(f)
    for n in (3, 7):    # out of range, then in range: each as eager
        x = torch.randn(n)
        torch.testing.assert_close(opt(x), f(x))


@dataclasses.dataclass
class Cfg:
    a: int
    b: str


CFG = Cfg(1, "x")


def test_dataclass_equality_through_its_python_eq():
    def f(x):
        y = x * 2 if CFG == Cfg(1, "x") else x
        return y + 1 if CFG != Cfg(1, "y") and CFG != None else y  # noqa: E711

    opt = check(f, (3,))
    CFG.a = 2
    try:
        same(opt, f, [(3,)])
    finally:
        CFG.a = 1
