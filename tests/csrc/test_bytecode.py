"""The C bytecode decoder agrees with the standard library's dis on every version.

Thousands of real code objects (whole standard-library modules, nested code included)
are decoded in C and compared instruction by instruction with dis.get_instructions:
offsets, opcodes, full arguments, jump targets and the extent of inline caches.
Torch-free.
"""

import dis
import importlib
import sys
import types

import pytest

from agspeed import _C

MODULES = ["json.decoder", "json.encoder", "dis", "inspect", "typing", "collections",
           "asyncio.tasks", "email.message", "argparse", "dataclasses", "shutil",
           "unittest.case", "difflib", "tarfile", "pickle"]


def code_objects(root):
    stack, seen = [root], set()
    while stack:
        co = stack.pop()
        if id(co) in seen:
            continue
        seen.add(id(co))
        yield co
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))


def module_codes(name):
    module = importlib.import_module(name)
    source_file = module.__file__
    with open(source_file) as f:
        return list(code_objects(compile(f.read(), source_file, "exec")))


def expected_instructions(co):
    """(start, offset, opcode, arg, target, next) per real instruction, from dis."""
    result, pending_start = [], None
    listed = [i for i in dis.get_instructions(co) if i.opname != "CACHE"]
    for k, ins in enumerate(listed):
        if ins.opname == "EXTENDED_ARG":
            if pending_start is None:
                pending_start = ins.offset
            continue
        start = ins.offset if pending_start is None else pending_start
        pending_start = None
        target = ins.argval if ins.opcode in dis.hasjrel else -1
        following = listed[k + 1].offset if k + 1 < len(listed) else len(co.co_code)
        result.append((start, ins.offset, ins.opcode, ins.arg or 0, target, following))
    return result


@pytest.mark.parametrize("module", MODULES)
def test_decoder_matches_dis_on_standard_library_code(module):
    codes = module_codes(module)
    assert len(codes) > 10
    for co in codes:
        assert _C.decode(co) == expected_instructions(co), co


def big_function_source(n):
    body = "\n".join(f"    v{i} = a + {i}" for i in range(n))
    branches = "\n".join(f"    if a == {i}:\n        return v{i}" for i in range(n))
    return f"def big(a):\n{body}\n{branches}\n    return None\n"


def test_extended_args_and_long_jumps():
    namespace = {}
    exec(compile(big_function_source(400), "<big>", "exec"), namespace)
    co = namespace["big"].__code__
    decoded = _C.decode(co)
    assert decoded == expected_instructions(co)
    assert any(start != offset for start, offset, *_ in decoded)  # prefixes were folded
    assert any(arg > 255 for _, _, _, arg, _, _ in decoded)
    assert namespace["big"](399) == 399 + 399


def test_decoding_reads_base_opcodes_of_specialized_code():
    def hot(x):
        total = 0
        for i in range(x):
            total += i * 2
        return total

    before = _C.decode(hot.__code__)
    for _ in range(2000):  # lets the specializing interpreter rewrite the live copy
        hot(10)
    assert _C.decode(hot.__code__) == before == expected_instructions(hot.__code__)


def test_jump_targets_start_instructions():
    for co in module_codes("json.decoder"):
        decoded = _C.decode(co)
        starts = {start for start, *_ in decoded}
        for *_, target, _next in decoded:
            assert target == -1 or target in starts


def replace_code(co, raw):
    return co.replace(co_code=bytes(raw))


def sample():
    x = 1
    while x < 10:
        x += 1
    return x


def first_jump_index(co):
    for ins in dis.get_instructions(co):
        if ins.opcode in dis.hasjrel:
            return ins.offset
    raise AssertionError("no jump")


def test_malformed_bytecode_is_a_value_error():
    co = sample.__code__
    raw = bytearray(co.co_code)
    at = first_jump_index(co)
    bad = bytearray(raw)
    bad[at + 1] = 250  # jump far past the end
    with pytest.raises(ValueError, match="jump target outside"):
        _C.decode(replace_code(co, bad))
    tail = bytearray(raw) + bytes([dis.opmap["EXTENDED_ARG"], 0])
    with pytest.raises(ValueError, match="EXTENDED_ARG at the end"):
        _C.decode(replace_code(co, tail))
    with pytest.raises(TypeError, match="not function"):
        _C.decode(sample)


def test_decoding_leaks_no_references():
    co = sample.__code__
    _C.decode(co)
    before = sys.getrefcount(co)
    for _ in range(100):
        _C.decode(co)
    assert sys.getrefcount(co) == before


@pytest.mark.parametrize("module", MODULES)
def test_exception_table_decoder_matches_dis(module):
    # dis's own parser of co_exceptiontable (3.11+): start, end, target, depth, lasti
    checked = 0
    for co in module_codes(module):
        want = [(e.start, e.end, e.target, e.depth, int(e.lasti))
                for e in dis._parse_exception_table(co)]
        assert _C.exception_table(co) == want, co
        checked += bool(want)
    assert checked > 0


def test_truncated_exception_table_is_a_value_error_not_a_crash():
    def f(x):
        try:
            return x + 1
        except TypeError:
            return 0

    table = f.__code__.co_exceptiontable
    assert table and _C.exception_table(f.__code__)
    broken = f.__code__.replace(co_exceptiontable=table[:-1] + bytes([table[-1] | 64]))
    with pytest.raises(ValueError, match="truncated exception table"):
        _C.exception_table(broken)
    assert _C.exception_table((lambda: 0).__code__) == []
