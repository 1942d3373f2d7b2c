"""The symbolic interpreter, driven with a recording builder so it runs on every version.

A stand-in "tensor" class and a builder that records what it is asked let these tests pin
the interpreter's handling of each version's bytecode (3.11's PRECALL and LOAD_METHOD,
3.12's KW_NAMES, 3.13's CALL_KW and superinstructions) without torch.  Torch-free.
"""

import builtins
import dis
import sys
import types

import pytest

from agspeed import _C
from agspeed._sources import MISSING, _class_lookup, static_attr
from agspeed.protocol import Attr, Compare, Plan, Reason


class T:
    """Plays the tensor: instances become graph inputs."""


class Node:
    def __init__(self, label, tensor=True):
        self.label, self.tensor = label, tensor
        # what the interpreter reads of a real node: a tensor's stands for a T
        self.meta = {"example_value": T() if tensor else 0}

    def __repr__(self):
        return self.label


class GraphBreakLike(Exception):
    def __init__(self, reason, detail=""):
        super().__init__(detail or reason)
        self.reason = reason


class Mode:
    """Plays a context manager the builder models (as agspeed._ctx does torch.no_grad)."""

    def __init__(self, flag):
        self.flag = flag

    def enter(self):
        return self.flag

    def exit(self, *exc):
        assert exc == (None, None, None)


class Recorder:
    """The builder interface the interpreter calls, recording every request.

    Policy as in agspeed._graph.GraphBuilder, without torch: allowed functions and the
    operator module's are recorded, other Python functions inlined, a few builtins
    folded, attributes found by agspeed._sources.static_attr.
    """

    node_type = Node
    FOLDS = (len, range, enumerate, zip, isinstance, min, max, int, tuple, list)

    def __init__(self, allowed=(), non_tensor=(), fail_on=(), classes=()):
        self.ops, self.inputs = [], []
        self.allowed, self.non_tensor, self.fail_on = allowed, non_tensor, fail_on
        self.assumptions, self.known = [], {}
        self.writes, self.shadows, self.stored = [], [], {}
        self.tails, self.tailed = {}, []
        self.classes, self.made = classes, []  # classes called as plain classes

    def new_object(self, cls):
        self.made.append(object.__new__(cls))
        return self.made[-1]

    def store_attr(self, obj, name, value):
        if not any(o is obj for o in self.made):
            raise GraphBreakLike(Reason.SIDE_EFFECT, f"setting attribute {name!r}")
        setter = type(obj).__setattr__
        if type(setter) is types.FunctionType:
            return setter
        object.__setattr__(obj, name, value)
        return None

    def input(self, source, value):
        self.inputs.append(source[1] if source[0] == "local" else source)
        return Node(str(source[-1]))

    def attr(self, obj, name):
        how, value = static_attr(obj, name)
        if how is Attr.UNSUPPORTED:
            raise GraphBreakLike(Reason.UNSUPPORTED_ATTRIBUTE, value)
        if how is Attr.MISSING:
            return how, MISSING, None
        bound = obj.__self__ if isinstance(obj, super) else obj
        return how, value, bound if how is Attr.METHOD else None

    def plan_call(self, fn, source):
        if fn is Mode or (type(fn) is types.MethodType and isinstance(fn.__self__, Mode)):
            return (Plan.CTX, fn)
        if fn is getattr or fn is hasattr:
            return (Plan.GETATTR,) if fn is getattr else (Plan.HASATTR,)
        if type(fn) is types.MethodType:
            return (Plan.INLINE, fn.__func__, fn.__self__, None)
        if fn in self.classes:
            init = fn.__dict__.get("__init__")
            return (Plan.NEW, fn, init, None)
        if fn is object.__setattr__:
            return (Plan.FOLD, fn)
        if fn in self.allowed or getattr(fn, "__module__", None) in ("operator", "_operator"):
            return (Plan.GRAPH, fn)
        if fn in self.FOLDS:
            return (Plan.FOLD, fn)
        if type(fn) is types.FunctionType:
            return (Plan.INLINE, fn, None, source)
        raise GraphBreakLike(Reason.UNSUPPORTED_CALL, f"calling {fn!r}")

    def bind(self, func, nargs, kwnames):
        from agspeed._graph import GraphBuilder

        return GraphBuilder.bind(self, func, nargs, kwnames)

    def call_function(self, fn, args, kwargs):
        return self._record(fn.__name__, args, kwargs)

    def call_method(self, name, args, kwargs):
        return self._record("." + name, args, kwargs)

    def _record(self, name, args, kwargs):
        if name in self.fail_on:
            raise self.fail_on[name]
        if name in self.non_tensor:
            raise GraphBreakLike(Reason.NON_TENSOR_RESULT, name)
        self.ops.append((name, args, kwargs))
        return Node(f"{name}#{len(self.ops)}")

    def fold(self, fn, args, kwargs):
        try:
            return fn(*args, **kwargs)
        except ArithmeticError as exc:
            raise GraphBreakLike(Reason.OP_FAILED, str(exc)) from exc

    def tensor_attr(self, node, name):
        return self._record("." + name, (node,), {})

    def getitem(self, container, index, source):
        if isinstance(container, Node):
            return self._record("getitem", (container, index), {}), None
        return container[index], None

    def setitem(self, container, index, value):
        self._record("setitem", (container, index, value), {})

    def identity(self, a, b):
        """``a is b`` of two known objects, which the graph builder notes."""
        self.identities = getattr(self, "identities", []) + [(a, b)]

    def note_identity(self, *values):
        """What a break's state holds as constants (agspeed._identity)."""

    def compare(self, op, a, b):
        op = Compare(op).op
        if isinstance(a, Node) or isinstance(b, Node):
            return self._record(op, (a, b), {})
        import operator
        fns = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
               ">": operator.gt, ">=": operator.ge}
        if op in ("in", "not in"):
            return (a in b) == (op == "in")
        return fns[op](a, b)

    def truth(self, obj):
        if isinstance(obj, Node):  # as GraphBuilder: only a size node has a truth
            raise GraphBreakLike(Reason.DATA_DEPENDENT, "the truth of a tensor")
        return bool(obj)

    def assume_truth(self, obj, truth):
        """As agspeed._assume: a node's truth assumed where the other way raises."""
        if isinstance(obj, Node):
            self.ops.append(("assume", (obj, truth), {}))
            return truth
        return self.truth(obj)

    def iterate(self, obj, source):
        return tuple((v, None) for v in obj)

    def dunder(self, obj, source, name):
        """As agspeed._dunders: a Python special method found on the type's MRO."""
        found = _class_lookup(type(obj), name)
        if found is MISSING or found is object.__ne__:
            return False
        return (found, None) if type(found) is types.FunctionType else None

    def format(self, value, conversion, spec):
        value = {1: str, 2: repr, 3: ascii}.get(conversion, lambda v: v)(value)
        return builtins.format(value, spec or "")

    def container_method(self, spec, args, kwargs):
        name, container = spec
        return getattr(container, name)(*args, **kwargs)

    def effect_setattr(self, obj, source, name, value):
        self.writes.append((source, name, value))
        self.stored[(id(obj), name)] = value

    def written(self, obj, name):
        key = (id(obj), name)
        return (self.stored[key],) if key in self.stored else None

    def shadow(self, obj, source):
        tail = self.tails.pop(id(obj), None)
        if tail is not None:   # read past appending: the tail, the items put in front
            tail[0:0] = obj
            self.shadows.append((source, tail))
            return tail
        made = list(obj) if type(obj) is list else dict(obj)
        self.shadows.append((source, made))
        return made

    def tail(self, obj, source):
        made = self.tails[id(obj)] = []
        self.tailed.append((source, made))
        return made

    def enter_with(self, cm, source):
        """As agspeed._ctx: a modelled manager's own steps, else its methods bound."""
        if isinstance(cm, Mode):
            return cm.exit, cm.enter
        found = [static_attr(cm, name) for name in ("__exit__", "__enter__")]
        if any(how is not Attr.METHOD for how, _ in found):
            raise GraphBreakLike(Reason.UNSUPPORTED_CALL, f"with {type(cm).__name__}")
        return tuple(types.MethodType(fn, cm) for _, fn in found)

    def ctx(self, fn, args, kwargs):
        self.ops.append((getattr(fn, "__name__", "ctx"), args, kwargs))
        return fn(*args, **kwargs)


tlib = types.ModuleType("tlib")
tlib.relu = lambda x: x
tlib.relu.__name__ = "relu"


def capture(fn, builder=None, **f_locals):
    builder = builder or Recorder(allowed=(tlib.relu,))
    out = _C.capture(fn.__code__, f_locals, fn.__globals__, builtins.__dict__, builder, T)
    return out, builder


def straight_line(x, y, n):
    a = tlib.relu(x) + y * n
    b = x.transpose(0, 1).sum(dim=0, keepdim=True)
    return a, b


def test_straight_line_code_is_recorded_in_order():
    out, b = capture(straight_line, x=T(), y=T(), n=3)
    assert out["status"] == "graph"
    assert b.inputs == ["x", "y"]
    names = [op[0] for op in b.ops]
    assert names == ["relu", "mul", "add", ".transpose", ".sum"]
    assert b.ops[1][1][1] == 3  # y * n with the constant 3
    assert b.ops[3][1][1:] == (0, 1)
    assert b.ops[4][2] == {"dim": 0, "keepdim": True}
    a, s = out["result"]
    assert a.label == "add#3" and s.label == ".sum#5"
    # in the order they were read: arguments are guarded when first used
    assert [src for src, _ in out["assumptions"]] == [
        ("global", "tlib"), ("attr", ("global", "tlib"), "relu"), ("local", "n")]


def folds_constants(x, n):
    return x * (n * 2 + 1)


def test_constant_arithmetic_is_folded():
    out, b = capture(folds_constants, x=T(), n=4)
    assert [op[0] for op in b.ops] == ["mul"]
    assert b.ops[0][1][1] == 9


def divides_by_zero(x, n):
    return x * (n / 0)


def test_failing_constant_arithmetic_is_a_graph_break():
    out, b = capture(divides_by_zero, x=T(), n=3)
    assert out["status"] == "break" and out["reason"] == Reason.OP_FAILED
    assert "division by zero" in out["detail"] and b.ops == []


def returns_constant(x):
    return 5


def test_returning_a_constant():
    out, b = capture(returns_constant, x=T())
    assert out["status"] == "graph" and out["result"] == 5 and b.ops == []


def stores_and_reloads(x, y):
    a, b = x, y
    c = a - b
    a = c * c
    return a, c


def test_locals_are_stored_and_reloaded():
    out, b = capture(stores_and_reloads, x=T(), y=T())
    assert out["status"] == "graph"
    assert [op[0] for op in b.ops] == ["sub", "mul"]
    a, c = out["result"]
    assert a.label == "mul#2" and c.label == "sub#1"


def calls_print(x):
    print(x)
    return x


def test_calls_that_cannot_be_recorded_stop_the_capture(capsys):
    out, b = capture(calls_print, x=T())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_CALL
    assert dis.opname[out["opcode"]] == "CALL"
    assert "print" in out["detail"]
    assert capsys.readouterr().out == ""  # print never ran


def branches(x, n):
    if n > 1:
        return x
    return -x


def test_known_conditions_are_resolved_and_the_taken_branch_recorded():
    out, b = capture(branches, x=T(), n=2)
    assert out["status"] == "graph" and b.ops == []
    out, b = capture(branches, x=T(), n=0)
    assert out["status"] == "graph" and [op[0] for op in b.ops] == ["neg"]


def signs(x):
    return +x, -x, ~x


def test_unary_operators_are_recorded_on_every_version():
    """+x is UNARY_POSITIVE on 3.11 and an intrinsic of CALL_INTRINSIC_1 since 3.12."""
    out, b = capture(signs, x=T())
    assert out["status"] == "graph" and [op[0] for op in b.ops] == ["pos", "neg", "invert"]


def branches_on_tensor(x):
    if x:
        return x
    return -x


def test_branching_on_a_tensor_stops_the_capture_at_the_condition():
    out, _ = capture(branches_on_tensor, x=T())
    assert out["status"] == "break" and out["reason"] == Reason.DATA_DEPENDENT
    offsets = {i.offset: i.positions.lineno for i in dis.get_instructions(branches_on_tensor)}
    assert offsets[out["offset"]] == branches_on_tensor.__code__.co_firstlineno + 1
    assert out["code"] is branches_on_tensor.__code__


def helper(a, b=3, *rest, scale=2, **extra):
    return a * b * scale + len(rest) + len(extra)


def calls_helpers(x, xs):
    total = x
    for i, v in enumerate(xs):
        if v is not None:
            total = total + v * i
    ys = [y for y in xs if y is not None]
    first, *_ = ys
    return helper(total, 4, 5, 6, scale=first, k=1), f"{len(ys)}:{first!r:>3}", ys[1:]


def test_functions_loops_comprehensions_and_fstrings_are_inlined():
    out, b = capture(calls_helpers, x=T(), xs=(1, 2, None, 3))
    assert out["status"] == "graph", out
    result, text, tail = out["result"]
    assert text == "3:  1" and tail == [2, 3]
    # the loop unrolled (v * i folded, then added), then helper inlined with its binding
    assert [op[0] for op in b.ops] == ["add", "add", "add", "mul", "mul", "add", "add"]


def test_closures_generators_and_unknown_globals():
    k = 2

    def closure(x):
        return x * k

    def gen(x):
        yield x

    def unknown(x):
        return not_defined_anywhere(x)  # noqa: F821

    out, b = capture(closure, x=T(), k=2)  # free variables come in f_locals
    assert out["status"] == "graph" and b.ops[0][1][1] == 2
    assert capture(gen, x=T())[0]["reason"] == Reason.GENERATOR
    out = capture(unknown, x=T())[0]
    assert out["reason"] == Reason.UNKNOWN_GLOBAL and "not_defined_anywhere" in out["detail"]


class Holder:
    scale = 2


def attribute_of_object(x, h):
    return x * h.scale


def test_attributes_are_read_without_running_code_and_guarded():
    h = Holder()
    out, b = capture(attribute_of_object, x=T(), h=h)
    assert out["status"] == "graph" and b.ops[0][1][1] == 2
    assert (("attr", ("local", "h"), "scale"), 2) in out["assumptions"]


class Dynamic:
    def __getattr__(self, name):
        raise AssertionError("never called while capturing")


def test_attributes_only_code_could_give_stop_the_capture():
    out, b = capture(attribute_of_object, x=T(), h=Dynamic())
    assert out["reason"] == Reason.UNSUPPORTED_ATTRIBUTE and b.ops == []


def non_tensor_result(x):
    return x.size()


def test_operations_giving_non_tensors_stop_the_capture():
    out, _ = capture(non_tensor_result, Recorder(non_tensor={".size"}), x=T())
    assert out["status"] == "break" and out["reason"] == Reason.NON_TENSOR_RESULT


def data_dependent(x):
    return x.item()


def test_builder_graph_breaks_and_errors():
    out, _ = capture(data_dependent, Recorder(fail_on={".item": GraphBreakLike(Reason.DATA_DEPENDENT)}),
                     x=T())
    assert out["status"] == "break" and out["reason"] == Reason.DATA_DEPENDENT
    with pytest.raises(KeyError, match="bug"):
        capture(data_dependent, Recorder(fail_on={".item": KeyError("bug")}), x=T())


def test_bad_arguments_are_type_errors():
    with pytest.raises(TypeError):
        _C.capture(straight_line.__code__, {}, {}, builtins.__dict__, Recorder(), "T")
    with pytest.raises(TypeError):
        _C.capture(straight_line, {}, {}, builtins.__dict__, Recorder(), T)


def test_capture_leaks_no_references():
    x, y = T(), T()
    b = Recorder(allowed=(tlib.relu,))
    capture(straight_line, b, x=x, y=y, n=3)
    capture(calls_print, b, x=x)
    b.assumptions.clear()
    b.known.clear()
    before = [sys.getrefcount(o) for o in (x, y, tlib.relu, tlib)]
    for _ in range(50):
        b.ops.clear()
        b.assumptions.clear()
        b.known.clear()
        capture(straight_line, b, x=x, y=y, n=3)
        capture(calls_print, b, x=x)
    b.assumptions.clear()
    b.known.clear()
    assert [sys.getrefcount(o) for o in (x, y, tlib.relu, tlib)] == before


class Configured:
    scale = 3

    def twice(self, x):
        return x * 2


def reflects(x, h):
    y = x * getattr(h, "scale")
    if hasattr(h, "bias"):
        y = y + h.bias
    step = getattr(h, "twice")  # a bound method used as a value
    return step(y) * getattr(h, "missing", 5)


def test_getattr_and_hasattr_read_guard_and_guard_absence():
    out, b = capture(reflects, x=T(), h=Configured())
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["mul", "mul", "mul"]
    assert [op[1][1] for op in b.ops] == [3, 2, 5]
    h = ("local", "h")
    assert (("attr", h, "scale"), 3) in out["assumptions"]
    assert (("attr", h, "bias"), MISSING) in out["assumptions"]
    assert (("attr", h, "missing"), MISSING) in out["assumptions"]


def test_getattr_of_a_missing_attribute_without_default_breaks():
    def no_default(x, h):
        return x * getattr(h, "nothing")

    def computed_name(x, h, name):
        return x * getattr(h, name + "")

    out, _ = capture(no_default, x=T(), h=Configured())
    assert out["reason"] == Reason.MISSING_ATTRIBUTE and "nothing" in out["detail"]
    out, _ = capture(computed_name, x=T(), h=Configured(), name="scale")
    assert out["status"] == "graph"  # a name folded to a constant is fine
    out, _ = capture(no_default, x=T(), h=Dynamic())
    assert out["reason"] == Reason.UNSUPPORTED_ATTRIBUTE


class Box:
    def __init__(self, x, k):
        self.x = x * k
        self.k = k


class Doubling:
    def __init__(self, x):
        self.x = x

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value * 2)


class Bare:
    pass


def makes_objects(x, k):
    b = Box(x, k)
    b.y = b.x + b.k
    d = Doubling(b.y)
    e = Bare()
    e.z = d.x
    return e.z, b, d


def test_objects_made_in_the_frame_take_writes_and_read_them_back():
    out, b = capture(makes_objects, Recorder(classes=(Box, Doubling, Bare)), x=T(), k=3)
    assert out["status"] == "graph"
    assert [op[0] for op in b.ops] == ["mul", "add", "mul"]
    z, box, dbl = out["result"]
    assert type(box) is Box and box.k == 3 and box.y.label == "add#2"
    assert type(dbl) is Doubling and dbl.x is z and z.label == "mul#3"
    assert b.ops[2][1] == (box.y, 2)   # Doubling's __setattr__ ran inlined


class Based(Box):
    def __init__(self, x):
        super().__init__(x, 2)   # LOAD_SUPER_ATTR on 3.12+, a super() call before
        self.z = self.x + 1


def makes_a_subclass_object(x):
    return Based(x).z


def test_super_init_of_an_object_made_here_is_inlined():
    out, b = capture(makes_a_subclass_object, Recorder(classes=(Based,)), x=T())
    assert out["status"] == "graph", out.get("detail")
    assert [op[0] for op in b.ops] == ["mul", "add"]
    assert out["result"].label == "add#2"


def calls_with_wrong_arguments(x):
    return Box(x)


def test_an_object_made_with_bad_arguments_breaks_as_a_bad_call():
    out, _ = capture(calls_with_wrong_arguments, Recorder(classes=(Box,)), x=T())
    assert out["status"] == "break" and out["reason"] == Reason.BAD_CALL


def nested_functions(x, k):
    scale = k * 2

    def inner(y, bias=1):
        return y * scale + bias

    first = inner(x)
    scale = 10  # rebinding after the def: the call below must see it
    shift = lambda y, s=3: y - s  # noqa: E731
    rows = [inner(x) * j for j in range(2)]
    return first, inner(x, bias=0), shift(x), rows


def test_nested_functions_share_their_makers_cells():
    out, b = capture(nested_functions, x=T(), k=2)
    assert out["status"] == "graph", out
    consts = [op[1][1] for op in b.ops if op[0] in ("mul", "add", "sub")]
    # first: *4 +1; rows: (*10 +1) * 0 and * 1; inner(x, bias=0): *10 +0; shift: -3
    assert consts == [4, 1, 10, 1, 0, 10, 1, 1, 10, 0, 3]


def counter(x):
    n = 0

    def bump():
        nonlocal n
        n += 1

    bump()
    bump()
    return x * n


def test_nonlocal_writes_from_a_made_function_are_seen_by_the_maker():
    out, b = capture(counter, x=T())
    assert out["status"] == "graph", out
    assert b.ops[-1][0] == "mul" and b.ops[-1][1][1] == 2


def make_writer():
    total = 0

    def write(x):
        nonlocal total
        total = total + 1
        return x * total

    return write


def test_nonlocal_writes_into_the_programs_cells_stop_the_capture():
    write = make_writer()
    out = _C.capture(write.__code__, {"x": T(), "total": 0}, write.__globals__,
                     builtins.__dict__, Recorder(), T)
    assert out["reason"] == Reason.SIDE_EFFECT and "'total'" in out["detail"]
    assert write.__closure__[0].cell_contents == 0


def guarded(x):
    y = x * 2
    try:
        y = y + 1
    except ValueError:
        y = y - 1
    return y


def guarded_finally(x):
    try:
        y = x * 2
    finally:
        x = x + 1
    return y, x


def comprehension_only(x, n):
    return [x * i for i in range(n)]


def test_code_under_a_try_is_captured_and_its_handler_never_entered():
    out, b = capture(guarded, x=T())
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["mul", "add"]  # the except clause did not run
    # the normal-path copy of a finally block runs once, after the body
    out, b = capture(guarded_finally, x=T())
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["mul", "add"]
    assert [r.label for r in out["result"]] == ["mul#1", "add#2"]
    # cleanup-only handlers (3.12+ inlined comprehensions) likewise
    out, b = capture(comprehension_only, x=T(), n=3)
    assert out["status"] == "graph", out


# Generators: a generator value holds a suspended frame, stepped by its consumers.

class FoldingRecorder(Recorder):
    FOLDS = Recorder.FOLDS + (any, all, sum, sorted, dict, iter)


def two_values(x):
    yield x * 2
    yield x + 1


def returns_after_a_yield(x):
    yield x
    return 5


def delegates(x):
    yield from two_values(x)
    yield from (7, 8)
    r = yield from returns_after_a_yield(x)
    yield r


def genexpr_to_tuple(x, ks):
    return tuple(x * k for k in ks)


def loop_over_generator(x):
    out = x
    for v in two_values(x):
        out = out - v
    return out


def comprehension_over_a_generator(x):
    return [v * 3 for v in two_values(x)]


def list_of_delegates(x):
    return list(delegates(x))


def next_with_default(x):
    g = two_values(x)
    a = next(g)
    b = next(g)
    return a, b, next(g, None)


def next_past_the_end(x):
    g = returns_after_a_yield(x)
    next(g)
    return next(g)


def any_of_known_then_tensor(x):
    return any(v for v in (True, x)), all(v for v in (0, x))


def any_reaching_a_tensor(x):
    return any(v for v in (False, x))


def genexpr_in_a_genexpr(x, ks):
    return tuple(a + 1 for a in (x * k for k in ks))


def returns_a_generator(x):
    return two_values(x)


def stores_a_generator(x):
    return [two_values(x)]


def measures_a_generator(x):
    return len(two_values(x))


def iter_of_a_generator_is_itself(x):
    return tuple(iter(two_values(x)))


def breaks_with_a_generator_suspended(x):
    g = two_values(x)
    v = next(g)
    print(v)
    return v


def test_generator_expressions_run_one_value_at_a_time():
    out, b = capture(genexpr_to_tuple, FoldingRecorder(), x=T(), ks=(1, 2, 3))
    assert out["status"] == "graph", out
    assert type(out["result"]) is tuple
    assert [n.label for n in out["result"]] == ["mul#1", "mul#2", "mul#3"]
    assert [op[1][1] for op in b.ops] == [1, 2, 3]
    out, b = capture(genexpr_in_a_genexpr, FoldingRecorder(), x=T(), ks=(1, 2))
    assert out["status"] == "graph", out
    # the inner generator is stepped by the outer one's FOR_ITER: values interleave
    assert [op[0] for op in b.ops] == ["mul", "add", "mul", "add"]


def test_generator_functions_are_resumed_after_each_yield():
    out, b = capture(loop_over_generator, x=T())
    assert out["status"] == "graph", out
    # FOR_ITER resumes the frame once per iteration: its work interleaves with the body
    assert [op[0] for op in b.ops] == ["mul", "sub", "add", "sub"]
    out, b = capture(comprehension_over_a_generator, x=T())
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["mul", "mul", "add", "mul"]
    assert [n.label for n in out["result"]] == ["mul#2", "mul#4"]
    out, b = capture(next_with_default, x=T())
    assert out["status"] == "graph", out
    a, c, end = out["result"]
    assert (a.label, c.label, end) == ("mul#1", "add#2", None)
    out, b = capture(next_past_the_end, x=T())
    assert out["reason"] == Reason.RAISE and "StopIteration" in out["detail"]


def test_yield_from_passes_values_and_returns_the_inner_result():
    out, b = capture(list_of_delegates, FoldingRecorder(), x=T())
    assert out["status"] == "graph", out
    result = out["result"]
    assert [getattr(v, "label", v) for v in result] == ["mul#1", "add#2", 7, 8, "x", 5]


def test_any_and_all_stop_at_the_first_decisive_value():
    out, b = capture(any_of_known_then_tensor, FoldingRecorder(), x=T())
    assert out["status"] == "graph", out
    assert out["result"] == (True, False)  # the tensor's truth was never asked
    out, b = capture(any_reaching_a_tensor, FoldingRecorder(), x=T())
    assert out["reason"] == Reason.DATA_DEPENDENT


def test_generators_leaving_the_code_stop_the_capture():
    for fn in (returns_a_generator, stores_a_generator, measures_a_generator):
        out, b = capture(fn, x=T())
        assert out["reason"] == Reason.GENERATOR, out
        assert "generator" in out["detail"]
    # builtins that consume an iterable see its values; len() above sees the generator
    out, b = capture(iter_of_a_generator_is_itself, FoldingRecorder(), x=T())
    assert out["status"] == "graph" and len(out["result"]) == 2, out
    out, b = capture(breaks_with_a_generator_suspended, x=T())
    assert out["reason"] == Reason.UNSUPPORTED_CALL and "print" in out["detail"]


def test_generator_frames_are_released():
    x = T()
    fns = (genexpr_to_tuple, loop_over_generator, list_of_delegates, next_with_default,
           any_of_known_then_tensor, returns_a_generator, breaks_with_a_generator_suspended,
           next_past_the_end)

    def run_all():
        for fn in fns:
            b = FoldingRecorder()
            kw = {"ks": (1, 2, 3)} if fn is genexpr_to_tuple else {}
            capture(fn, b, x=x, **kw)

    run_all()
    watched = (x, two_values, delegates, two_values.__code__, returns_after_a_yield)
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(30):
        run_all()
    assert [sys.getrefcount(o) for o in watched] == before


def raises_into_handler(x):
    try:
        y = x * 2
        raise ValueError
    except ValueError:
        y = x - 1
    return y


def test_a_body_that_raises_ends_the_capture_before_the_handler():
    out, b = capture(raises_into_handler, x=T())
    assert out["status"] == "break" and out["reason"] == Reason.RAISE
    assert dis.opname[out["opcode"]] == "RAISE_VARARGS"
    assert [op[0] for op in b.ops] == ["mul"]  # the handler's subtraction never recorded


class Scoped:
    """A context manager written in Python: its methods are inlined."""

    scale = 3

    def __enter__(self):
        return self.scale

    def __exit__(self, kind, value, tb):
        tlib.relu((kind, value, tb))
        return None


SCOPED = Scoped()


def with_python_manager(x):
    with SCOPED as k:
        y = x * k
    return y


def test_a_python_context_manager_is_entered_and_left_inline():
    out, b = capture(with_python_manager, x=T())
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["mul", "relu"]
    assert b.ops[0][1][1] == 3  # __enter__'s answer bound by `as`
    assert b.ops[1][1] == ((None, None, None),)  # __exit__ on the normal path
    assert out["result"].label == "mul#1"


def with_modelled(x, flag):
    with Mode(flag) as f:
        with Mode(not flag):
            y = x * f
    return y


def returns_inside_with(x):
    with Mode(True):
        return tlib.relu(x)


def calls_with(x):
    return returns_inside_with(x) + 1


def test_modelled_context_managers_nest_and_leave_on_return():
    out, b = capture(with_modelled, x=T(), flag=2)
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["Mode", "enter", "Mode", "enter", "mul", "exit",
                                       "exit"]
    assert b.ops[0][1] == (2,) and b.ops[2][1] == (False,)
    assert b.ops[5][1] == (None, None, None)
    # a return inside the block leaves it first; in an inlined callee as well
    out, b = capture(calls_with, x=T())
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["Mode", "enter", "relu", "exit", "add"]


def with_unsupported(x, cm):
    with cm:
        y = x * 2
    return y


def test_a_manager_without_python_methods_stops_the_capture():
    import threading

    out, b = capture(with_unsupported, x=T(), cm=threading.Lock())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_CALL
    assert dis.opname[out["opcode"]] == "BEFORE_WITH" and b.ops == []


def test_with_blocks_leave_no_references_behind():
    before = [sys.getrefcount(o) for o in (SCOPED, Scoped, Mode, Scoped.__exit__)]
    for _ in range(20):
        capture(with_python_manager, x=T())
        capture(with_modelled, x=T(), flag=2)
        capture(with_unsupported, x=T(), cm=SCOPED)
    assert [sys.getrefcount(o) for o in (SCOPED, Scoped, Mode, Scoped.__exit__)] == before


# -- where a capture is, for what the builder replays at the program's place ---------------


class SiteRecorder(Recorder):
    def call_function(self, fn, args, kwargs):
        self.sites = _C.capture_site()
        return super().call_function(fn, args, kwargs)


def _site_inner(x):
    return tlib.relu(x)


def site_outer(x):
    y = x * 2
    return _site_inner(y)


def test_the_capture_site_names_each_interpreted_frame_innermost_first():
    assert _C.capture_site() == ()
    builder = SiteRecorder(allowed=(tlib.relu,))
    out, _ = capture(site_outer, builder=builder, x=T())
    assert out["status"] == "graph", out
    (inner, i_off, i_glob), (outer, o_off, o_glob) = builder.sites
    assert inner is _site_inner.__code__ and outer is site_outer.__code__
    assert i_glob is o_glob is globals()
    lines = {o: p[0] for o, p in zip(range(0, 10**6, 2), outer.co_positions())}
    assert lines[o_off] == site_outer.__code__.co_firstlineno + 2  # the call's line
    assert _C.capture_site() == ()


def test_is_between_two_known_objects_is_told_to_the_builder():
    class Thing:
        pass

    def f(x, a, b, c):
        if a is b and c is not None:
            return x + 1
        return x - 1

    one, two = Thing(), Thing()
    rec = Recorder(allowed=())
    _C.capture(f.__code__, {"x": T(), "a": one, "b": two, "c": one}, f.__globals__,
               builtins.__dict__, rec, T)
    assert rec.identities == [(one, two)]   # `c is not None` needs no identity


def annotated(x):
    def inner(a: int, *, b: "list[str]" = None) -> float:
        return a

    return x * len(inner.__annotations__), inner


def test_a_made_function_keeps_its_annotations():
    out, b = capture(annotated, x=T())
    assert out["status"] == "graph", out
    assert b.ops[-1][0] == "mul" and b.ops[-1][1][1] == 3
