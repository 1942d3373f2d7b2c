"""The bytecode assembler (csrc/emit.c) on every version, torch-free.

Real code objects decoded into abstract instructions (agspeed._resume.decode) and
assembled again come back byte for byte: code, exception table, positions, stack size.
Hand-written functions (arithmetic, calls, jumps both ways, a loop, try/except) run and
agree with the Python they stand for, and dis reads them.
"""

import dis
import importlib
import types

import pytest

from agspeed import _C
from agspeed._resume import decode

MODULES = ["json.decoder", "argparse", "dataclasses", "inspect", "ast", "collections",
           "typing", "functools", "logging", "email.message", "tarfile"]
OP = dis.opmap
# COMPARE_OP's argument for "<" on this version, as its compiler writes it
LESS = next(i.arg for i in dis.get_instructions(lambda a, b: a < b) if i.opname == "COMPARE_OP")


def codes_of(name):
    module = importlib.import_module(name)
    with open(module.__file__) as f:
        stack = [compile(f.read(), module.__file__, "exec")]
    while stack:
        co = stack.pop()
        yield co
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))


@pytest.mark.parametrize("module", MODULES)
def test_round_trip_is_exact(module):
    n = 0
    for co in codes_of(module):
        instrs, handlers, _ = decode(co)
        new = _C.emit(co, instrs, handlers, {})
        assert new.co_code == co.co_code, co
        assert new.co_exceptiontable == co.co_exceptiontable, co
        assert list(new.co_positions()) == list(co.co_positions()), co
        assert new.co_stacksize == co.co_stacksize, co
        n += 1
    assert n > 10


def sample(a, b):
    total = 0
    for i in range(a):
        if i % 2:
            total += i * b
        else:
            total -= len(str(i))
    try:
        total += 1 // (a - 3)
    except ZeroDivisionError:
        total = -total
    return total


def test_round_tripped_function_runs_like_the_original():
    instrs, handlers, _ = decode(sample.__code__)
    fn = types.FunctionType(_C.emit(sample.__code__, instrs, handlers, {}), globals())
    for a, b in [(0, 1), (3, 2), (7, -4), (10, 5)]:
        assert fn(a, b) == sample(a, b)
    assert list(dis.get_instructions(fn))


def _extended_jump_code():
    """A loop whose backward jump needs an EXTENDED_ARG: x counts to n by 1, with
    300 dead stores padding the body."""
    def template(n):
        x = 0
        return x
    co = template.__code__
    consts = co.co_consts + (0, 1)
    zero, one = len(consts) - 2, len(consts) - 1
    ins = [(OP["RESUME"], 0, -1, None),
           (OP["LOAD_CONST"], zero, -1, (2, 2, 4, 5)),
           (OP["STORE_FAST"], 1, -1, (2, 2, 4, 5))]
    head = len(ins)
    ins += [(OP["LOAD_FAST"], 1, -1, (3, 3, 4, 5)), (OP["LOAD_FAST"], 0, -1, (3, 3, 8, 9)),
            (OP["COMPARE_OP"], LESS, -1, (3, 3, 4, 9))]
    if "TO_BOOL" in OP:
        ins.append((OP["TO_BOOL"], 0, -1, None))
    exit_at = len(ins)
    jump_if_false = OP.get("POP_JUMP_IF_FALSE", OP.get("POP_JUMP_FORWARD_IF_FALSE"))
    ins.append((jump_if_false, 0, None, (3, 3, 4, 9)))
    for _ in range(300):
        ins += [(OP["LOAD_FAST"], 1, -1, (4, 4, 4, 5)), (OP["STORE_FAST"], 1, -1, (4, 4, 4, 5))]
    ins += [(OP["LOAD_FAST"], 1, -1, (5, 5, 4, 5)), (OP["LOAD_CONST"], one, -1, (5, 5, 8, 9)),
            (OP["BINARY_OP"], 13, -1, (5, 5, 4, 9)), (OP["STORE_FAST"], 1, -1, (5, 5, 4, 5)),
            (OP["JUMP_BACKWARD"], 0, head, (6, 6, 0, 1))]
    end = len(ins)
    ins += [(OP["LOAD_FAST"], 1, -1, (7, 7, 11, 12)), (OP["RETURN_VALUE"], 0, -1, (7, 7, 4, 12))]
    op, arg, _, pos = ins[exit_at]
    ins[exit_at] = (op, arg, end, pos)
    return co, consts, ins


def test_jumps_both_ways_with_extended_args_run():
    co, consts, ins = _extended_jump_code()
    new = _C.emit(co, ins, [], {"co_consts": consts})
    fn = types.FunctionType(new, {})
    assert [fn(n) for n in (0, 1, 5, 40)] == [0, 1, 5, 40]
    names = [i.opname for i in dis.get_instructions(new)]
    assert "EXTENDED_ARG" in names and "JUMP_BACKWARD" in names
    # positions survive: the return's line is 7
    assert any(p[0] == 7 for p in new.co_positions())


def test_a_jump_picks_its_direction():
    """A JUMP_FORWARD whose target is behind it becomes JUMP_BACKWARD."""
    co, consts, ins = _extended_jump_code()
    i = next(k for k, row in enumerate(ins) if row[0] == OP["JUMP_BACKWARD"])
    ins[i] = (OP["JUMP_FORWARD"],) + ins[i][1:]
    fn = types.FunctionType(_C.emit(co, ins, [], {"co_consts": consts}), {})
    assert fn(3) == 3


def test_malformed_lists_are_value_errors():
    co = sample.__code__
    with pytest.raises(ValueError):
        _C.emit(co, [(OP["LOAD_FAST"], 0, 5, None)], [], {})
    with pytest.raises(ValueError):   # pops from an empty stack
        _C.emit(co, [(OP["RESUME"], 0, -1, None), (OP["RETURN_VALUE"], 0, -1, None)], [], {})
    with pytest.raises(ValueError):
        _C.emit(co, [(OP["RESUME"], 0, -1, None)], [(0, 0, 0, 0, 0)], {})
