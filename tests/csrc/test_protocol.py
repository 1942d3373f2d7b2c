"""The C/Python contract (csrc/protocol.h, agspeed/protocol.py): every kind that crosses
is one C row, exported, read by Python from the export, and an unknown kind fails loudly.
Torch-free."""

import pathlib
import re
import types

import pytest

from agspeed import _C, protocol
from agspeed.protocol import Attr, BuilderOp, Compare, Plan, Reason

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = (ROOT / "csrc" / "protocol.h").read_text()

# table export name -> (X-macro list in protocol.h, IntEnum)
TABLES = {
    "action": ("AGS_ACTION_LIST", protocol.Action),
    "reason": ("AGS_REASON_LIST", protocol.Reason),
    "builder_op": ("AGS_BUILDER_OP_LIST", protocol.BuilderOp),
    "plan": ("AGS_PLAN_LIST", protocol.Plan),
    "attr": ("AGS_ATTR_LIST", protocol.Attr),
    "bind": ("AGS_BIND_LIST", protocol.Bind),
    "compare": ("AGS_COMPARE_LIST", protocol.Compare),
    "load": ("AGS_LOAD_LIST", protocol.Load),
    "check": ("AGS_CHECK_LIST", protocol.Check),
    "guard_flag": ("AGS_GFLAG_LIST", protocol.GuardFlag),
    "part": ("AGS_PART_LIST", protocol.Part),
    "size_op": ("AGS_SOP_LIST", protocol.SizeOp),
    "kernel_op": ("AGS_KOP_LIST", protocol.KernelOp),
    "kernel_kind": ("AGS_KKIND_LIST", protocol.KernelKind),
    "kernel_type": ("AGS_KTYPE_LIST", protocol.KernelType),
}


def rows_in_header(macro):
    """The row names of an X-macro list, read from the header's text."""
    body = re.search(r"#define %s\(X\) \\\n(.*?)\n\n" % macro, HEADER, re.S).group(1)
    return re.findall(r"^\s*X\((\w+),", body, re.M)


def test_every_table_of_the_header_is_exported():
    in_header = set(re.findall(r"#define (AGS_\w+_LIST)\(X\)", HEADER))
    assert in_header == {macro for macro, _ in TABLES.values()}
    assert set(_C.PROTOCOL) == set(TABLES)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_c_row_is_exported_in_order_with_its_meaning(table):
    macro, enum = TABLES[table]
    names = rows_in_header(macro)
    assert names and [row[0] for row in _C.PROTOCOL[table]] == names
    assert [m.name for m in enum] == names
    for member in enum:
        assert member.id == member.name.lower()
        assert isinstance(member.doc, str) and member.doc
    if table != "guard_flag":
        assert [int(m) for m in enum] == list(range(len(names)))


def test_reasons_carry_an_explanation_and_a_hint():
    for reason in Reason:
        assert reason.what and reason.hint and Reason.by_id[reason.id] is reason


def test_compare_rows_name_their_operator():
    assert [c.op for c in Compare] == ["<", "<=", "==", "!=", ">", ">=", "in", "not in"]


def test_the_interpreter_names_reasons_and_operations_only_through_the_tables():
    csrc = "".join(p.read_text() for p in sorted((ROOT / "csrc").glob("interp*.c")))
    assert "strcmp" not in csrc
    assert not re.search(r'ags_stopf?\(it, "', csrc)          # reasons are enum rows
    assert not re.search(r'ags_call_builder\(it, "', csrc)    # operations too
    used = set(re.findall(r"AGS_REASON_(\w+)", csrc)) - {"COUNT"}
    assert used and used <= {r.name for r in Reason}
    ops = set(re.findall(r"AGS_BOP_(\w+)", csrc)) - {"COUNT"}
    assert ops == {op.name for op in BuilderOp}                 # every operation is used


def test_python_reads_kinds_from_the_export():
    py = "".join(p.read_text() for p in sorted((ROOT / "agspeed").glob("*.py")))
    assert not re.search(r'GraphBreak\("', py)
    assert not re.search(r'return \("(graph|fold|inline|module|const|super)"', py)
    assert not re.search(r'\("(default|star|starstar)", ', py)
    assert not re.search(r'return \(?"(value|method|property|missing|unsupported)"', py)


def test_a_builder_missing_an_operation_is_refused():
    from agspeed._graph import GraphBuilder

    assert protocol.check_builder(GraphBuilder) is GraphBuilder

    class Partial:
        def attr(self, obj, name):
            return None

    with pytest.raises(TypeError, match="plan_call"):
        protocol.check_builder(Partial)


def test_a_graph_break_with_an_unknown_reason_fails_loudly():
    from agspeed._graph import GraphBreak

    with pytest.raises(ValueError, match="unknown graph-break reason"):
        GraphBreak("side_effect", "a string is not a reason")
    assert GraphBreak(Reason.SIDE_EFFECT, "x").reason is Reason.SIDE_EFFECT


class Tensorish:
    pass


class Builder:
    """Answers with a kind C does not know."""

    node_type = type(None)

    def __init__(self, answer=None, reason=None):
        self.assumptions, self.known = [], {}
        self.answer, self.reason = answer, reason

    def plan_call(self, fn, source):
        if self.reason is not None:
            exc = Exception("break")
            exc.reason, exc.detail = self.reason, "detail"
            raise exc
        return self.answer

    def attr(self, obj, name):
        return self.answer

    def bind(self, func, nargs, kwnames):
        return ()


def _calls_len(x):
    return len(x)


def _reads_attr(x):
    return x.real


def _capture(fn, builder, **f_locals):
    return _C.capture(fn.__code__, f_locals, fn.__globals__, vars(__builtins__)
                      if isinstance(__builtins__, types.ModuleType) else __builtins__,
                      builder, Tensorish)


@pytest.mark.parametrize("answer, error", [
    ((99, len), "unknown call plan kind 99"),
    ((-1, len), "unknown call plan kind -1"),
    (("graph", len), "a call plan kind must be an int"),
])
def test_an_unknown_call_plan_fails_loudly(answer, error):
    with pytest.raises((ValueError, TypeError), match=error):
        _capture(_calls_len, Builder(answer), x=(1, 2))


def test_an_unknown_attribute_answer_fails_loudly():
    with pytest.raises(ValueError, match="unknown attribute answer kind 42"):
        _capture(_reads_attr, Builder((42, 1, None)), x=3)


def test_an_unknown_break_reason_fails_loudly():
    with pytest.raises(ValueError, match="unknown break reason kind 1000"):
        _capture(_calls_len, Builder(reason=1000), x=(1, 2))
    out = _capture(_calls_len, Builder(reason=Reason.UNSUPPORTED_CALL), x=(1, 2))
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_CALL


def test_known_kinds_round_trip_through_c():
    out = _capture(_reads_attr, Builder((Attr.VALUE, 5, None)), x=3)
    assert out["status"] == "graph" and out["result"] == 5
    out = _capture(_calls_len, Builder((Plan.CONST, 7)), x=(1, 2))
    assert out["status"] == "graph" and out["result"] == 7


def test_kernel_rows_carry_their_columns():
    assert protocol.KernelOp.WHERE.operands == 3 and protocol.KernelOp.LOAD.operands == 0
    assert protocol.KernelType.BF16.ctype == "unsigned short"
    assert protocol.KernelType.BF16.bytes == 2 and protocol.KernelType.I64.bytes == 8
