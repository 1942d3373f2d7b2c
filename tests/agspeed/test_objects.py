"""Objects the capture makes and returns (agspeed/_objects.py, csrc/interp_object.c):
torch.return_types structseqs, namedtuples, dataclasses, transformers' ModelOutput,
instances of user classes (classmethods, staticmethods, properties, super(), __slots__, a
Python __setattr__, class attributes), the names and reprs of types, hasattr of a tensor,
Tensor.type().

Each test captures a function in one graph with no break, no more graphs than
torch._dynamo.explain counts for it, and the optimized function's result (its type
included) and gradients equal eager's on fresh random inputs."""

import collections
import contextvars
import dataclasses
import gc
import sys

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch

NT = collections.namedtuple("NT", "a b")


def _dynamo_graphs(fn, *args):
    import torch._dynamo

    try:
        return torch._dynamo.explain(fn)(*args).graph_count
    finally:
        torch._dynamo.reset()


def _leaves(value):
    """The tensors and plain values inside a result, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [("key", k) for k in value] + [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _leaves(v)]
    if hasattr(value, "__dict__") or hasattr(type(value), "__slots__"):
        attrs = dict(getattr(value, "__dict__", {}))
        for name in getattr(type(value), "__slots__", ()):
            attrs[name] = getattr(value, name)
        return [x for k in sorted(attrs) for x in [("attr", k)] + _leaves(attrs[k])]
    return [value]


def _assert_same(got, want):
    assert type(got) is type(want)
    g, w = _leaves(got), _leaves(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        if isinstance(b, torch.Tensor):
            assert type(a) is type(b)
            torch.testing.assert_close(a, b)
        else:
            assert a == b


def check(fn, *shapes):
    """fn captures whole and computes what eager does; returns the optimized result."""
    torch.manual_seed(0)
    args = [torch.randn(*s) for s in shapes]
    e = agspeed.explain(fn, *args)
    assert e.graph_break_count == 0, e.break_reasons
    assert e.graph_count == 1
    assert e.graph_count <= _dynamo_graphs(fn, *args)
    opt = agspeed.optimize(fn)
    for _ in range(2):   # the capture, then a cache hit, on fresh inputs
        args = [torch.randn(*s, requires_grad=True) for s in shapes]
        twins = [a.detach().clone().requires_grad_() for a in args]
        got, want = opt(*args), fn(*twins)
        _assert_same(got, want)
        floats = [t for t in _leaves(want) if isinstance(t, torch.Tensor) and t.requires_grad]
        if floats:
            sum(t.sum() for t in floats).backward()
            sum(t.sum() for t in _leaves(got)
                if isinstance(t, torch.Tensor) and t.requires_grad).backward()
            for a, b in zip(args, twins):
                torch.testing.assert_close(a.grad, b.grad)
    return got


# -- torch.return_types --------------------------------------------------------------------


def test_structseq_fields_read_by_name():
    def f(x):
        r = x.max(dim=1)
        return r.values * 2 + r.indices

    check(f, (3, 4))


def test_structseq_items_and_unpacking():
    def f(x):
        r = torch.min(x, 1)
        v, i = torch.sort(x, dim=0)
        return (r[0] + r[1]).sum() + v * i[0]

    check(f, (3, 4))


@pytest.mark.parametrize("op", [
    lambda x: x.max(1), lambda x: torch.max(x, 1), lambda x: x.min(dim=0),
    lambda x: torch.sort(x, descending=True), lambda x: x.topk(2), lambda x: x.kthvalue(2, 1),
    lambda x: torch.median(x, 1), lambda x: torch.cummax(x, 0), lambda x: torch.aminmax(x),
    lambda x: torch.linalg.slogdet(x[:, :3] @ x[:, :3].T + torch.eye(3)),
], ids=["max", "torch.max", "min", "sort", "topk", "kthvalue", "median", "cummax",
        "aminmax", "slogdet"])
def test_structseq_returned_with_its_type(op):
    def f(x):
        return op(x * 1.5)

    got = check(f, (3, 4))
    assert type(got).__module__ == "torch.return_types"


# -- namedtuples and dataclasses -------------------------------------------------------------


def test_namedtuple_fields():
    def f(x):
        n = NT(x, 2)
        return n.a * n.b + n[0]

    check(f, (3, 4))


def test_a_namedtuple_class_made_in_the_frame_belongs_to_its_module():
    def f(x):
        made = collections.namedtuple("made", ["x", "y"])
        return made(x, x + 1)

    out = agspeed.optimize(f, backend="eager")(torch.ones(2))
    assert type(out).__name__ == "made" and type(out).__module__ == __name__
    torch.testing.assert_close(out.y, torch.full((2,), 2.0))


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor = None

    def total(self):
        return self.a + self.b


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    scale: float = 2.0

    def __post_init__(self):
        object.__setattr__(self, "scaled", self.a * self.scale)


def test_dataclass_made_and_read():
    def f(x):
        o = Pair(x, x + 1)
        return o.a + o.b + o.total()

    check(f, (3, 4))


def test_dataclass_returned_with_its_type():
    def f(x):
        return Pair(x.sin(), b=x * 2)

    got = check(f, (3, 4))
    assert isinstance(got.a, torch.Tensor) and got == got


def test_frozen_dataclass_with_post_init():
    def f(x):
        o = Frozen(x)
        return o.scaled + o.a, o

    got = check(f, (3, 4))
    assert type(got[1]) is Frozen


# -- transformers' ModelOutput ---------------------------------------------------------------


def test_model_output_made_indexed_and_returned():
    mo = pytest.importorskip("transformers.modeling_outputs")

    def f(x):
        base = mo.BaseModelOutput(last_hidden_state=x * 2)
        h = base.last_hidden_state + base[0] + base["last_hidden_state"]
        out = mo.CausalLMOutputWithPast(loss=h.sum(), logits=h.relu())
        return out

    got = check(f, (3, 4))
    assert list(got.keys()) == ["loss", "logits"]
    assert got.to_tuple()[1] is got.logits and got[0] is got.loss


def test_model_output_to_tuple_and_keys():
    mo = pytest.importorskip("transformers.modeling_outputs")

    def f(x):
        out = mo.CausalLMOutputWithPast(logits=x + 1)
        t = out.to_tuple()
        return t[0] * len(out.keys()) + out.get("logits")

    check(f, (3, 4))


def test_model_output_item_assignment_sets_item_and_attribute():
    """``out[key] = value`` on a ModelOutput the capture made runs its own
    ``__setitem__`` (item and attribute), as transformers does for hidden states."""
    mo = pytest.importorskip("transformers.modeling_outputs")

    def f(x):
        out = mo.BaseModelOutput(last_hidden_state=x * 2)
        states = [x, x + 1, x * 3]
        states = states[:-1]          # a slice of a list of the capture: a new list
        states.append(out.last_hidden_state)
        out["hidden_states"] = tuple(states)
        return out

    got = check(f, (3, 4))
    assert list(got.keys()) == ["last_hidden_state", "hidden_states"]
    assert len(got.hidden_states) == 3
    for a, b in zip(got.hidden_states, got["hidden_states"]):
        assert a is b


def test_item_assignment_on_a_model_output_of_the_program_still_breaks():
    mo = pytest.importorskip("transformers.modeling_outputs")
    held = [None]

    def f(x):
        held[0]["hidden_states"] = (x,)
        return x + 1

    x = torch.randn(2)
    held[0] = mo.BaseModelOutput(last_hidden_state=torch.zeros(2))
    report = agspeed.explain(f, x)
    assert report.graph_break_count >= 1
    assert "item assignment" in str(report.break_reasons[0])
    held[0] = mo.BaseModelOutput(last_hidden_state=torch.zeros(2))
    torch.testing.assert_close(agspeed.optimize(f, backend="eager")(x), x + 1)
    assert held[0]["hidden_states"][0] is x and held[0].hidden_states[0] is x


# -- user class objects ----------------------------------------------------------------------


class UC:
    factor = 3

    def __init__(self, v):
        self.v = v

    @property
    def p(self):
        return self.v * 2

    @classmethod
    def mk(cls, v):
        return cls(v + 1)

    @staticmethod
    def sm(v):
        return v + 1

    def scaled(self):
        return self.v * self.factor


class Child(UC):
    def __init__(self, v, w):
        super().__init__(v)
        self.w = w

    @property
    def p(self):
        return super().scaled() + self.w


class Grandchild(Child):
    def __init__(self, v):
        super(Child, self).__init__(v)   # skips Child's __init__
        self.w = v.cos()


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a):
        self.a = a
        self.b = a * 2


class Logged:
    def __init__(self, v):
        self.v = v

    def __setattr__(self, name, value):
        object.__setattr__(self, "last", name)
        object.__setattr__(self, name, value * 2)


class Plain:
    def __init__(self, v):
        super().__init__()
        self.v = v


def test_user_object_classmethod_staticmethod_property():
    def f(x):
        o = UC.mk(x)
        return UC.sm(o.p) + o.scaled() + o.mk(x).v

    check(f, (3, 4))


def test_user_object_attribute_writes_are_read_back():
    def f(x):
        o = UC(x)
        o.v = o.v + 1
        o.extra = o.v * 2
        return o.v + o.extra

    check(f, (3, 4))


def test_super_forms():
    def f(x):
        c = Child(x, x * 3)
        g = Grandchild(x)
        p = Plain(x)
        return c.p + c.w + g.w + g.v + p.v

    check(f, (3, 4))


def test_slots_object():
    def f(x):
        s = Slotted(x)
        return s.a + s.b, s

    got = check(f, (3, 4))
    assert type(got[1]) is Slotted


def test_python_setattr_is_inlined():
    def f(x):
        o = Logged(x)
        o.w = x + 1
        return o.v + o.w, o.last

    got = check(f, (3, 4))
    assert got[1] == "w"


def test_user_object_returned_is_rebuilt():
    def f(x):
        o = Child(x.sin(), x * 2)
        return o

    got = check(f, (3, 4))
    assert type(got) is Child and got.p.shape == (3, 4)


def test_objects_made_while_capturing_are_not_kept():
    def f(x):
        o = UC(x)
        return o.v + 1

    def count():
        gc.collect()
        return sum(type(o) is UC for o in gc.get_objects())

    before = count()
    opt = agspeed.optimize(f)
    for _ in range(3):
        opt(torch.randn(2))
    agspeed.explain(f, torch.randn(2))
    assert count() == before


def test_writes_to_objects_of_the_program_are_replayed_after_the_graph():
    o = UC(torch.ones(1))

    def f(x):
        o.v = x * 2
        return x + 1

    x = torch.randn(2)
    e = agspeed.explain(f, x)
    assert (e.graph_count, e.graph_break_count) == (1, 0)  # agspeed/_effects.py
    torch.testing.assert_close(o.v, x * 2)


# -- types, hasattr, Tensor.type ------------------------------------------------------------


def test_names_and_reprs_of_types():
    def f(x):
        return x * len(str(type(x))) + len(repr(UC)) + len(type(x).__name__) + \
            len(UC.__qualname__)

    check(f, (3, 4))


def test_hasattr_of_a_tensor():
    def f(x):
        return x + 1 if hasattr(x, "shape") and not hasattr(x, "nope") else x

    check(f, (3, 4))


def test_tensor_type_conversions():
    def f(x):
        return x.type(torch.DoubleTensor) * 2, x.type()

    got = check(f, (3, 4))
    assert got[0].dtype == torch.float64 and got[1] == "torch.FloatTensor"


class Knob:
    factor = 2

    def __init__(self, v):
        self.v = v

    def scaled(self):
        return self.v * self.factor


def test_class_attributes_of_an_object_made_here_are_guarded():
    def f(x):
        return Knob(x).scaled()

    check(f, (3, 4))
    opt = agspeed.optimize(f)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), x * 2)
    scaled = Knob.scaled
    try:
        Knob.factor = 5
        torch.testing.assert_close(opt(x), x * 5)
        Knob.scaled = lambda self: self.v - 1
        torch.testing.assert_close(opt(x), x - 1)
    finally:
        Knob.factor, Knob.scaled = 2, scaled


SCALE = contextvars.ContextVar("scale", default=2)


def test_context_var_read_is_guarded():
    def f(x):
        return x * SCALE.get()

    check(f, (3, 4))
    opt = agspeed.optimize(f)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), x * 2)
    token = SCALE.set(7)
    try:
        torch.testing.assert_close(opt(x), x * 7)
    finally:
        SCALE.reset(token)
    torch.testing.assert_close(opt(x), x * 2)


def test_fields_class_and_hasattr_of_structures():
    def f(x):
        o = Pair(x, x * 2)
        r = x.max(1)
        n = len(dataclasses.fields(o)) + hasattr(r, "values") + hasattr((x,), "nope")
        return o.__class__.total(o) * n, isinstance(o, Pair)

    check(f, (3, 4))


class Holder:
    def __init__(self, x):
        self.items = [x]


def test_containers_stored_on_objects_are_shared():
    def f(x):
        h = Holder(x * 2)
        h.items.append(x + 1)
        h.extra = {"k": h.items[0]}
        h.extra["j"] = x
        return h, h

    got = check(f, (3, 4))
    assert got[0] is got[1] and len(got[0].items) == 2 and sorted(got[0].extra) == ["j", "k"]


def test_an_object_holding_itself_runs_eager():
    class Loop:
        def __init__(self, x):
            self.x = x
            self.me = self

    def f(x):
        return Loop(x * 2)

    e = agspeed.explain(f, torch.randn(3))
    assert e.graph_count == 0 and [b.reason for b in e.break_reasons][:1] == ["unsupported_value"]
    out = agspeed.optimize(f)(torch.ones(2))
    assert out.me is out and torch.equal(out.x, torch.full((2,), 2.0))


def test_classes_are_not_kept_alive_by_captures():
    def f(x):
        return Child(x.sin(), x), x.max(1)

    agspeed.explain(f, torch.randn(3, 4))
    gc.collect()
    before = sys.getrefcount(Child), sys.getrefcount(torch.return_types.max)
    for _ in range(3):
        agspeed.explain(f, torch.randn(3, 4))
    gc.collect()
    assert (sys.getrefcount(Child), sys.getrefcount(torch.return_types.max)) == before


def test_model_outputs_between_modules():
    mo = pytest.importorskip("transformers.modeling_outputs")

    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, return_dict=True):
            h = self.lin(x).relu()
            if not return_dict:
                return (h,)
            return mo.BaseModelOutput(last_hidden_state=h, hidden_states=(x, h))

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.out = Body(), torch.nn.Linear(4, 3)

        def forward(self, x):
            outputs = self.body(x)
            logits = self.out(outputs[0]) + outputs.hidden_states[0].sum()
            return mo.CausalLMOutputWithPast(logits=logits, hidden_states=outputs.hidden_states)

    model = Head()
    got = check(model, (2, 4))
    assert type(got) is mo.CausalLMOutputWithPast and list(got.keys()) == ["logits",
                                                                           "hidden_states"]


def test_a_model_output_of_the_program_is_read_by_name_and_position():
    # the body breaks (a value read out of a tensor), so the head's frame resumes after
    # the call with the body's ModelOutput, a real object of the program's
    mo = pytest.importorskip("transformers.modeling_outputs")

    class Body(torch.nn.Module):
        def forward(self, x):
            scale = float(x.abs().max())
            h = x * scale
            return mo.BaseModelOutput(last_hidden_state=h, hidden_states=(x, h))

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = Body()

        def forward(self, x):
            outputs = self.body(x)
            return outputs[0] + outputs["last_hidden_state"] * outputs[1][0]

    model = Head()
    opt = agspeed.optimize(model, backend="eager")
    for _ in range(2):
        x = torch.randn(2, 3)
        torch.testing.assert_close(opt(x), model(x))
    ex = agspeed.explain(model, torch.randn(2, 3))
    assert not [b for b in ex.break_reasons if "indexing" in b.detail], ex.break_reasons


class Celsius:
    def __init__(self, t):
        self.kelvin = t + 273.0

    @property
    def celsius(self):
        return self.kelvin - 273.0

    @celsius.setter
    def celsius(self, value):
        self.kelvin = value + 273.0


def test_property_setters_are_inlined():
    def f(x):
        c = Celsius(x)
        c.celsius = c.celsius * 2
        return c.kelvin, c

    check(f, (3, 4))


def test_a_replaced_init_is_seen():
    def f(x):
        return Child(x, x * 2).w

    opt = agspeed.optimize(f)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), x * 2)
    init = Child.__dict__["__init__"]
    try:
        Child.__init__ = lambda self, v, w: object.__setattr__(self, "w", w + 1)
        torch.testing.assert_close(opt(x), x * 2 + 1)
    finally:
        Child.__init__ = init
    torch.testing.assert_close(opt(x), x * 2)


def test_the_truth_of_a_container_made_in_the_frame():
    def f(x, **kwargs):
        parts = [x] if bool(kwargs) else []
        table = {"a": x} if bool(parts) else {}
        return x + 1 if bool(table) or bool((x,)) and not bool(set()) else x - 1

    check(f, (3,))


def test_list_indexed_by_a_constant_tensor():
    def f(a, b):
        items = [a, b, a + 1, b + 1]
        return items[torch.as_tensor(2)] * items[torch.tensor(-1)]

    check(f, (3,), (3,))


def test_checkpoint_probe_and_cublas_flag_are_read_and_guarded():
    def f(x):
        if not torch.autograd._is_checkpoint_valid():
            return x - 1
        if torch.backends.cuda.matmul.allow_tf32:
            return x.sin() + 1
        return x.cos() - 1

    check(f, (3,))
    opt = agspeed.optimize(f)
    x = torch.randn(3)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for flag in (False, True, False, True):
            torch.backends.cuda.matmul.allow_tf32 = flag
            torch.testing.assert_close(opt(x), f(x))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    # the guard reads the flag as the capture did: one entry per value, then hits (its
    # __getattr__ once read as nothing, so every call captured again)
    misses = agspeed.counters()["cache_misses"]
    for _ in range(3):
        torch.testing.assert_close(opt(x), f(x))
    assert agspeed.counters()["cache_misses"] == misses


def test_distributions_made_in_the_frame():
    """torch.distributions objects are made like the program's own objects; with argument
    validation off they capture whole, with it on (the default) the check reads tensor
    data and is assumed to pass (agspeed/_assume.py), and the results are eager's either
    way, eager's error where the check fails."""
    def quiet(x):
        normal = torch.distributions.Normal(x, torch.tensor(1.0), validate_args=False)
        independent = torch.distributions.Independent(normal, 1, validate_args=False)
        return independent.log_prob(x + 1) + normal.mean.sum()

    def checked(x):
        normal = torch.distributions.Normal(x, torch.tensor(1.0))
        return torch.distributions.Independent(normal, 1).log_prob(x * 2)

    check(quiet, (3, 4))
    Distribution = torch.distributions.Distribution
    saved = Distribution._validate_args   # torch._dynamo turns it off for the process
    Distribution.set_default_validate_args(True)
    try:
        opt = agspeed.optimize(checked)
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(opt(x), checked(x))
        with pytest.raises(ValueError) as want:
            checked(torch.full((2,), float("nan")))
        with pytest.raises(ValueError) as got:
            opt(torch.full((2,), float("nan")))
        assert str(got.value) == str(want.value)
    finally:
        Distribution.set_default_validate_args(saved)


class Table:
    weights = {"a": 1.0, "b": 2.0}

    def __init__(self, x):
        self.x = x

    def weighted(self):
        return self.x * self.weights["a"]

    def loud(self):
        print("weighing")                 # a break inside the method
        return self.x + 1


def test_class_table_read_through_an_object_made_here_is_guarded():
    def f(x):
        return Table(x).weighted()

    check(f, (3,))
    opt = agspeed.optimize(f)
    x = torch.randn(3)
    saved = dict(Table.weights)
    try:
        for value in (1.0, 10.0, -2.0):
            Table.weights["a"] = value
            torch.testing.assert_close(opt(x), f(x))
    finally:
        Table.weights.clear()
        Table.weights.update(saved)


def test_break_in_a_method_of_an_object_made_here_gets_a_real_object(capsys):
    """At a break surfacing at the call, the object the capture made (holding graph
    values) is rebuilt with real tensors for the code that runs the call."""
    def f(x):
        t = Table(x * 2)
        return t.loud() + t.x

    opt = agspeed.optimize(f)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(opt(x), f(x))
    assert capsys.readouterr().out.count("weighing") == 4


class Attrs:
    def __init__(self, a):
        self.a = a


def deletes_attributes(x, program_obj):
    made = Attrs(x)
    made.b = x * 2
    del made.a               # an object made here: done in the capture
    out = made.b + hasattr(made, "a")
    del program_obj.a        # the program's object: a break, eager's delete
    return out


def test_del_of_an_attribute_on_objects_made_here_and_of_the_program():
    fast = agspeed.optimize(deletes_attributes, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        mine, theirs = Attrs(1), Attrs(1)
        torch.testing.assert_close(fast(x, mine), deletes_attributes(x, theirs))
        assert not hasattr(mine, "a") and not hasattr(theirs, "a")
    report = agspeed.explain(deletes_attributes, torch.randn(3), Attrs(1))
    assert report.graph_count == 1 and len(report.break_reasons) == 1
    assert report.break_reasons[0].instruction == "DELETE_ATTR"
    with pytest.raises(AttributeError, match="'Attrs' object has no attribute 'a'"):
        fast(torch.randn(3), object.__new__(Attrs))
