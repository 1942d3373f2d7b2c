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


class T:
    """Plays the tensor: instances become graph inputs."""


class Node:
    def __init__(self, label, tensor=True):
        self.label, self.tensor = label, tensor

    def __repr__(self):
        return self.label


class GraphBreakLike(Exception):
    reason = "data_dependent"


class Recorder:
    """The builder interface the interpreter calls, recording every request."""

    def __init__(self, allowed=(), non_tensor=(), fail_on=()):
        self.ops, self.inputs = [], []
        self.allowed, self.non_tensor, self.fail_on = allowed, non_tensor, fail_on

    def input(self, source, value):
        self.inputs.append(source)
        return Node(source)

    def can_record(self, fn):
        return fn in self.allowed or fn.__module__ in ("operator", "_operator")

    def call_function(self, fn, args, kwargs):
        return self._record(fn.__name__, args, kwargs)

    def call_method(self, name, args, kwargs):
        return self._record("." + name, args, kwargs)

    def _record(self, name, args, kwargs):
        if name in self.fail_on:
            raise self.fail_on[name]
        self.ops.append((name, args, kwargs))
        return Node(f"{name}#{len(self.ops)}", tensor=name not in self.non_tensor)

    def is_tensor(self, node):
        return node.tensor


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
    assert [(k, src) for k, src, _ in out["assumptions"]] == [
        ("local", "n"), ("global", "tlib"), ("attr", "tlib.relu")]


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
    assert out["status"] == "break" and out["reason"] == "op_failed"
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
    assert out["status"] == "break" and out["reason"] == "unsupported_call"
    assert dis.opname[out["opcode"]] == "CALL"
    assert "print" in out["detail"]
    assert capsys.readouterr().out == ""  # print never ran


def branches(x, n):
    if n > 1:
        return x
    return -x


def test_control_flow_stops_the_capture_at_the_condition():
    out, _ = capture(branches, x=T(), n=2)
    assert out["status"] == "break" and out["reason"] == "unsupported_instruction"
    assert dis.opname[out["opcode"]] == "COMPARE_OP"
    offsets = {i.offset: i.positions.lineno for i in dis.get_instructions(branches)}
    assert offsets[out["offset"]] == branches.__code__.co_firstlineno + 1


def test_closures_generators_and_unknown_globals():
    k = 2

    def closure(x):
        return x * k

    def gen(x):
        yield x

    def unknown(x):
        return not_defined_anywhere(x)  # noqa: F821

    assert capture(closure, x=T())[0]["reason"] == "closure"
    assert capture(gen, x=T())[0]["reason"] == "generator"
    out = capture(unknown, x=T())[0]
    assert out["reason"] == "unknown_global" and "not_defined_anywhere" in out["detail"]


class Holder:
    scale = 2


def attribute_of_object(x, h):
    return x * h.scale


def test_attributes_of_non_modules_stop_the_capture():
    out, b = capture(attribute_of_object, x=T(), h=Holder())
    assert out["reason"] == "unsupported_attribute" and b.ops == []


def non_tensor_result(x):
    return x.size()


def test_operations_giving_non_tensors_stop_the_capture():
    out, _ = capture(non_tensor_result, Recorder(non_tensor={".size"}), x=T())
    assert out["status"] == "break" and out["reason"] == "non_tensor_result"


def data_dependent(x):
    return x.item()


def test_builder_graph_breaks_and_errors():
    out, _ = capture(data_dependent, Recorder(fail_on={".item": GraphBreakLike("item")}),
                     x=T())
    assert out["status"] == "break" and out["reason"] == "builder"
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
    before = [sys.getrefcount(o) for o in (x, y, tlib.relu, tlib)]
    for _ in range(50):
        b.ops.clear()
        capture(straight_line, b, x=x, y=y, n=3)
        capture(calls_print, b, x=x)
    assert [sys.getrefcount(o) for o in (x, y, tlib.relu, tlib)] == before
