"""Graph breaks that resume: the code a break runs and the callable that runs it.

``agspeed._resume`` finds where a frame's capture stopped and how each slot of its
state there is rebuilt (a ``Layout``); this module writes, for that place and layout,
the *break function* (runs the break instruction for real, then calls on) and the
*resume functions* (the user's code behind a prologue that takes the stack and the
locals as parameters), assembled by ``_C.emit``, and the *runner*: the compiled
callable of the frame's CALL entry, which runs the graph and calls the break function
with the rebuilt state.  The design is in ``agspeed._resume``'s docstring.

Generated code objects are cached per (code, break offset, layout key, globals), so
later calls reuse them and their cache entries.  A resume function's own break maps
back to the user's code (``original``): its break and resume functions are the
user's code's for that place, so a loop's every pass after the first runs in one
resume function, whose code is made once.
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from typing import Any, NamedTuple

from agspeed import _C
from agspeed._resume import BreakSite, Layout, cell_only, decode

__all__ = ["generated", "runner", "is_generated", "is_resume", "in_loop", "original",
           "offset_in", "original_state"]

_OP = dis.opmap
_NO_OP = -1     # an instruction's jump target when it has none
# what a spent FOR_ITER jumps past at its target: nothing on 3.11, END_FOR on 3.12,
# END_FOR and POP_TOP on 3.13
_SPENT_SKIPPED = ("END_FOR", "POP_TOP")[:max(0, sys.version_info[1] - 11)]

# Per-version facts of the code this module writes (values are opcode names).
# CALL_FUNCTION_EX takes [NULL, callable, args] on 3.11/3.12, [callable, NULL, args]
# on 3.13: pushing these two in this order and then SWAP 3 puts the callable where it
# belongs (the args tuple comes first).
_CALL_EX_PUSH = {(3, 11): ("LOAD_FAST", "PUSH_NULL"), (3, 12): ("LOAD_FAST", "PUSH_NULL"),
                 (3, 13): ("PUSH_NULL", "LOAD_FAST")}[sys.version_info[:2]]
# ... and CALL takes [NULL, callable, args] on 3.11/3.12, [callable, NULL, args] on 3.13.
_CALL_PUSH = ("PUSH_NULL", "LOAD_CONST") if sys.version_info < (3, 13) else \
    ("LOAD_CONST", "PUSH_NULL")
_CO_VAR = 0x04 | 0x08  # CO_VARARGS | CO_VARKEYWORDS: a resume function takes a tuple

# code -> {(offset, layout key, id(globals)): (break function, resume functions)}
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GENERATED: weakref.WeakSet = weakref.WeakSet()
_RESUMES: weakref.WeakSet = weakref.WeakSet()  # the resume functions' code objects
# a resume function's code -> (a weak reference to the code it continues, how many
# instructions its prologue put before that code's own): weak, as that code's _CACHE
# entry holds the resume function's code
_ORIGIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOOPED: weakref.WeakSet = weakref.WeakSet()  # those that start inside a loop


def is_resume(code: types.CodeType) -> bool:
    """True for a resume function's code."""
    return code in _RESUMES


def in_loop(code: types.CodeType) -> bool:
    """True for a resume function's code that starts inside a loop: it is called
    once per pass, each pass with its own values (the items left, the loop's
    variables), so each pass is an entry of its own rather than a recompile."""
    return code in _LOOPED


def _in_loop(instrs: list, at: int) -> bool:
    """Whether instruction ``at`` (an index of ``decode``'s instructions) lies inside a
    loop: a jump at or after it goes back to it or before it."""
    return any(0 <= target <= at <= i for i, (_op, _arg, target, _pos) in enumerate(instrs))


def original(code: types.CodeType, offset: int) -> tuple | None:
    """For a break at byte ``offset`` of a resume function's ``code``: the user's code
    it continues, the offset of the same instruction there, and how many instructions
    prologues put before it in ``code`` (``(base, offset, shift)``); None where
    ``code`` is not a resume function or the offset is in a prologue.

    A break in a resume function then resumes as a break of the user's code would: its
    resume functions are those the user's code has for that place (a loop's every pass
    after the first breaks in one resume function, whose code is made once)."""
    if code not in _ORIGIN:
        return None
    rows = _C.decode(code)
    at = next((i for i, r in enumerate(rows) if r[1] == offset), None)
    total = 0
    while at is not None and code in _ORIGIN:
        ref, shift = _ORIGIN[code]
        code = ref()
        if code is None or at < shift:
            return None
        at, total = at - shift, total + shift
    if at is None:
        return None
    return code, _C.decode(code)[at][1], total


def offset_in(code: types.CodeType, base: types.CodeType, offset: int,
              shift: int) -> int:
    """The byte offset in the resume function ``code`` of the instruction at
    ``offset`` of ``base``, which ``code``'s prologues moved ``shift`` on."""
    at = next(i for i, r in enumerate(_C.decode(base)) if r[1] == offset)
    return _C.decode(code)[at + shift][1]


def original_state(state: dict, code: types.CodeType, base: types.CodeType) -> dict:
    """A resume function's stopped ``state`` as ``base``'s frame would hold it there:
    ``base``'s locals, then its cells, without the parameters the prologues took."""
    if code is base:
        return state
    cells = len(cell_only(base))
    rows = state["locals"]
    return dict(state, locals=rows[:base.co_nlocals] +
                rows[code.co_nlocals:code.co_nlocals + cells])


def is_generated(code: types.CodeType) -> bool:
    """True for a break code (never captured)."""
    return code in _GENERATED


def _line(code: types.CodeType, instrs: list, i: int) -> int:
    pos = instrs[i][3]
    return pos[0] if pos else code.co_firstlineno


def _fresh(code: types.CodeType, prefix: str, count: int) -> tuple:
    """``count`` parameter names ``prefix``0, 1, ... that ``code`` does not have yet: a
    resume function's own break adds stack parameters to those it has, and a local is
    read by its name (two of one name gave the second's value for both)."""
    taken = sum(1 for name in code.co_varnames if name.startswith(prefix))
    return tuple(f"{prefix}{taken + i}" for i in range(count))


def _enter(out: list, slot: tuple, consts: list, pos: Any) -> None:
    """Make and enter the manager of a ("ctx", cls, args) stack slot: its exit stays
    on the stack."""
    def const(obj: Any) -> tuple:
        consts.append(obj)
        return (_OP["LOAD_CONST"], len(consts) - 1, _NO_OP, pos)

    _kind, cls, args = slot
    for name in _CALL_PUSH:         # the callable and the call protocol's NULL
        out.append(const(cls) if name == "LOAD_CONST" else (_OP["PUSH_NULL"], 0, _NO_OP, pos))
    out += [const(a) for a in args]
    if "PRECALL" in _OP:
        out.append((_OP["PRECALL"], len(args), _NO_OP, pos))
    out += [(_OP["CALL"], len(args), _NO_OP, pos), (_OP["BEFORE_WITH"], 0, _NO_OP, pos),
            (_OP["POP_TOP"], 0, _NO_OP, pos)]


def _is_ctx(kind: Any) -> bool:
    return type(kind) is tuple and kind[0] == "ctx"


def _is_iter(kind: Any) -> bool:
    """A for loop's iterator: "iter" (the items it had left, as a tuple) or ("live",
    position) (the program's list, stepped to where the loop was)."""
    return kind == "iter" or type(kind) is tuple and kind[0] == "live"


def _is_param(kind: Any) -> bool:
    """Whether a stack slot of this kind is handed over as a parameter (a NULL or a
    with block's exit is made anew)."""
    return kind == "value" or _is_iter(kind)


def _leave(out: list, count: int, none: int, pos: Any) -> None:
    """Call ``count`` with-block exits lying under the top value, innermost first,
    with no exception (``exit(None, None, None)``, the way a block's normal end calls
    it: the exit takes the place of a method and the first None of its self)."""
    for _ in range(count):
        out.append((_OP["SWAP"], 2, _NO_OP, pos))
        out += [(_OP["LOAD_CONST"], none, _NO_OP, pos)] * 3
        if "PRECALL" in _OP:
            out.append((_OP["PRECALL"], 2, _NO_OP, pos))
        out += [(_OP["CALL"], 2, _NO_OP, pos), (_OP["POP_TOP"], 0, _NO_OP, pos)]


def _fields(code: types.CodeType, name: str, varnames: tuple, consts: list) -> dict:
    """The fields of a generated function's code that differ from ``code``'s: every
    variable a positional parameter, no ``*args``/``**kwargs``."""
    return {"co_name": name, "co_qualname": name, "co_varnames": varnames,
            "co_argcount": len(varnames), "co_posonlyargcount": 0,
            "co_kwonlyargcount": 0, "co_nlocals": len(varnames),
            "co_consts": tuple(consts), "co_flags": code.co_flags & ~_CO_VAR}


def _resume_function(code: types.CodeType, f_globals: dict, instrs: list, handlers: list,
                     target: int, kinds: tuple, unbound: tuple) -> tuple[Any, int]:
    """The function continuing ``code`` at instruction ``target`` with the stack
    (its "value" slots) and every local as arguments: (locals..., stack...); a with
    block's slot gets a manager made and entered there again.  Also how far the
    original instructions moved (their index in the new code is theirs plus this)."""
    nv = code.co_nlocals
    cells = cell_only(code)
    nstack = sum(1 for kind in kinds if _is_param(kind))
    shift_slots = len(cells) + nstack   # parameters added before the cell slots
    consts = list(code.co_consts)
    pos = instrs[target][3]
    pro: list = []
    if code.co_freevars:    # the closure the runner makes per call
        pro.append((_OP["COPY_FREE_VARS"], len(code.co_freevars), _NO_OP, pos))
    slot_of = {name: code.co_varnames.index(name) if name in code.co_varnames
               else nv + shift_slots + cells.index(name) for name in code.co_cellvars}
    pro += [(_OP["MAKE_CELL"], slot_of[name], _NO_OP, pos) for name in code.co_cellvars]
    pro.append((_OP["RESUME"], 0, _NO_OP, pos))
    for i, gone in enumerate(unbound[:nv]):
        if gone:
            cell = code.co_varnames[i] in slot_of
            pro.append((_OP["DELETE_DEREF" if cell else "DELETE_FAST"], i, _NO_OP, pos))
    for j, name in enumerate(cells):  # values of the cells that are not parameters
        if not unbound[nv + j]:
            pro += [(_OP["LOAD_FAST"], nv + j, _NO_OP, pos),
                    (_OP["STORE_DEREF"], slot_of[name], _NO_OP, pos)]
    nv += len(cells)
    k = 0
    skips = []                      # (first FOR_ITER, how many) per list stepped on
    for kind in kinds:
        if kind == "null":
            pro.append((_OP["PUSH_NULL"], 0, _NO_OP, pos))
            continue
        if _is_ctx(kind):
            _enter(pro, kind, consts, pos)
            continue
        pro.append((_OP["LOAD_FAST"], nv + k, _NO_OP, pos))
        if _is_iter(kind):          # the items the loop had left, or its list
            pro.append((_OP["GET_ITER"], 0, _NO_OP, pos))
        if type(kind) is tuple:     # stepped past what the loop took, as it did
            skips.append((len(pro), kind[1]))
            pro += [(_OP["FOR_ITER"], 0, _NO_OP, pos), (_OP["POP_TOP"], 0, _NO_OP, pos)] \
                * kind[1]
        k += 1
    jump = len(pro)
    pro.append((_OP["JUMP_FORWARD"], 0, _NO_OP, pos))
    for first, count in skips:      # a list now shorter than that: spent, as the
        stub = len(pro)             # program's iterator would be, and the pass goes on
        pro += [(_OP[name], 0, _NO_OP, pos) for name in _SPENT_SKIPPED]
        pro += [(_OP["LOAD_CONST"], len(consts), _NO_OP, pos), (_OP["GET_ITER"], 0, _NO_OP, pos),
                (_OP["JUMP_BACKWARD"], 0, first + 2 * count, pos)]
        consts.append(())
        for i in range(first, first + 2 * count, 2):
            pro[i] = (_OP["FOR_ITER"], 0, stub, pos)
    shift = len(pro)
    pro[jump] = (_OP["JUMP_FORWARD"], 0, target + shift, pos)
    body = [(*_moved_slots(op, arg, code.co_nlocals, shift_slots), t + shift if t >= 0 else t,
             p) for op, arg, t, p in instrs]
    moved = [(s + shift, e + shift, h + shift, d, lasti) for s, e, h, d, lasti in handlers]
    line = _line(code, instrs, target)
    name = f"resume_in_{code.co_name}_at_{line}"
    varnames = code.co_varnames + _fresh(code, ".cell", len(cells)) + \
        _fresh(code, ".stack", nstack)
    new = _C.emit(code, pro + body, moved, _fields(code, name, varnames, consts))
    _RESUMES.add(new)
    _ORIGIN[new] = (weakref.ref(code), shift)
    if _in_loop(instrs, target):
        _LOOPED.add(new)
    closure = tuple(types.CellType() for _ in code.co_freevars) or None
    return types.FunctionType(new, f_globals, name, None, closure), shift


# 3.13's instructions naming two locals, one per half of the argument's low byte
_PAIRED = {_OP[n] for n in ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
                            "STORE_FAST_STORE_FAST") if n in _OP}
_SLOTTED = (set(dis.haslocal) | set(dis.hasfree)) - _PAIRED
_PROLOGUE = {_OP[n] for n in ("COPY_FREE_VARS", "MAKE_CELL") if n in _OP}


def _moved_slots(op: int, arg: int, nv: int, by: int) -> tuple:
    """``(op, arg)`` of an original instruction in a resume function, whose cell and
    free slots (those from ``nv`` on) are ``by`` further on; the original prologue
    (which the resume function jumps over, having its own) becomes NOPs."""
    if op in _PROLOGUE:
        return _OP["NOP"], 0
    if op in _SLOTTED:
        return op, arg + by if arg >= nv else arg
    if op in _PAIRED:
        hi, lo = arg >> 4, arg & 15
        hi, lo = (hi + by if hi >= nv else hi), (lo + by if lo >= nv else lo)
        if hi > 15 or lo > 15:
            raise ValueError("a paired local instruction past slot 15 after the shift")
        return op, hi << 4 | lo
    return op, arg


def _tail(instrs_out: list, nv: int, nstack: int, below: list, unbound: tuple, fn: int,
          consts: list, pos: Any, exits: int = 0) -> None:
    """Return ``fn(*locals, *below, *top)``: ``top`` the ``nstack`` values on the
    stack, ``below`` the parameters holding the stack slots under them; the ``exits``
    with-block exits under ``top`` are called first."""
    def const(obj: Any) -> int:
        consts.append(obj)
        return len(consts) - 1

    none = const(None)
    out = instrs_out
    out.append((_OP["BUILD_TUPLE"], nstack, _NO_OP, pos))
    _leave(out, exits, none, pos)
    for i in range(nv):
        out.append((_OP["LOAD_CONST"], none, _NO_OP, pos) if unbound[i]
                   else (_OP["LOAD_FAST"], i, _NO_OP, pos))
    out += [(_OP["LOAD_FAST"], p, _NO_OP, pos) for p in below]
    out.append((_OP["BUILD_TUPLE"], nv + len(below), _NO_OP, pos))
    out.append((_OP["SWAP"], 2, _NO_OP, pos))
    out.append((_OP["BINARY_OP"], 0, _NO_OP, pos))   # locals + stack
    for name in _CALL_EX_PUSH:     # fn: the parameter holding the resume function
        out.append((_OP[name], fn if name == "LOAD_FAST" else 0, _NO_OP, pos))
    out.append((_OP["SWAP"], 3, _NO_OP, pos))
    out.append((_OP["CALL_FUNCTION_EX"], 0, _NO_OP, pos))
    out.append((_OP["RETURN_VALUE"], 0, _NO_OP, pos))


def generated(code: types.CodeType, f_globals: dict, site: BreakSite,
              layout: Layout) -> tuple[Any, list]:
    """The break function of ``site`` for ``layout`` and the resume functions it
    calls.  It is called with every local (None for an unbound one) and then the
    stack's values (its NULL slots left out).

    With blocks open at the break (stack slots of kind "ctx") get a manager made
    anew, entered around the break instructions and left before the resume function
    is called, which makes and enters another around the rest of the block.  When a
    with block's handler covers the break, an exception from the break instructions
    leaves the blocks and goes on in a resume function that starts at that handler,
    with the exception (and the offset it is said to come from) where CPython would
    push them."""
    key = (site.offset, layout.key(), id(f_globals))
    per_code = _CACHE.setdefault(code, {})
    hit = per_code.get(key)
    if hit is not None and hit[2] is f_globals:
        return hit[0], hit[1]
    instrs, handlers, _index = decode(code)
    kinds, unbound = layout.key()
    cells = cell_only(code)
    nv = code.co_nlocals + len(cells)   # parameters before the stack's: locals, cells
    depth = len(kinds)
    effect = 0
    for i in range(site.first, site.last + 1):
        op, arg = instrs[i][0], instrs[i][1]
        if i == site.last and site.branch:
            effect -= 1
        elif dis.opname[op] not in ("KW_NAMES",):
            # an instruction without an argument (BINARY_SUBSCR) takes none here
            effect += dis.stack_effect(op, arg if op >= dis.HAVE_ARGUMENT else None,
                                       jump=False)
    after = depth + effect
    consumed = _consumed(instrs, site, depth, kinds)
    keep = depth - consumed         # slots below the operands, left as they are
    produced = after - keep
    if produced < 0:
        raise ValueError("the break instruction's stack effect is not modelled")
    ctxs = [j for j, kind in enumerate(kinds) if _is_ctx(kind)]
    if any(j >= keep for j in ctxs):
        raise ValueError("a with block's exit among the break instruction's operands")
    if any(map(_is_iter, kinds[keep:])) and not _comprehension_call(layout.stack[keep:]):
        # the callee would be handed an iterator of another type than the program's
        raise ValueError("an iterator made in the frame handed on at the break")
    if site.handler is not None and site.handler[1] > keep:
        raise ValueError("an exception handler keeping the break instruction's operands")
    resumes = []
    targets = [site.last + 1]
    if site.branch:
        targets.append(instrs[site.last][2])
    for target in targets:
        resumes.append(_resume_function(code, f_globals, instrs, handlers, target,
                                        kinds[:keep] + ("value",) * produced, unbound)[0])
    consts = list(code.co_consts)
    pos0 = instrs[site.first][3]
    out: list = [(_OP["RESUME"], 0, _NO_OP, pos0)]
    params: list = []               # parameter index of each non-NULL stack slot
    nstack = 0
    for kind in kinds:
        params.append(nv + nstack if _is_param(kind) else None)
        nstack += _is_param(kind)
    for j in ctxs:
        _enter(out, kinds[j], consts, pos0)
    for j in range(keep, depth):
        out.append((_OP["PUSH_NULL"], 0, _NO_OP, pos0) if params[j] is None
                   else (_OP["LOAD_FAST"], params[j], _NO_OP, pos0))
        if _is_iter(kinds[j]):      # an iterator the call is handed (3.11's comprehension)
            if kinds[j] != "iter" and kinds[j][1]:
                raise ValueError("a list's iterator moved on, handed on at the break")
            out.append((_OP["GET_ITER"], 0, _NO_OP, pos0))
    branch_at = None
    guarded = len(out)
    for i in range(site.first, site.last + 1):
        op, arg, _t, pos = instrs[i]
        if i == site.last and site.branch:
            branch_at = len(out)
        out.append((op, arg, _NO_OP, pos))
    guarded_end = len(out)
    last_pos = instrs[site.last][3]
    below = [p for p in params[:keep] if p is not None]
    nres = len(resumes) + (site.handler is not None)
    _tail(out, nv, produced, below, unbound, nv + nstack, consts, last_pos, len(ctxs))
    if branch_at is not None:
        op, arg, _t, pos = out[branch_at]
        out[branch_at] = (op, arg, len(out), pos)
        _tail(out, nv, produced, below, unbound, nv + nstack + 1, consts, last_pos,
              len(ctxs))
    own_handlers = []
    if site.handler is not None:
        at, hdepth, lasti = site.handler
        onto = kinds[:hdepth] + ("value",) * (1 + bool(lasti))
        fn, shift = _resume_function(code, f_globals, instrs, handlers, at, onto, unbound)
        # never captured: the interpreter does not enter handlers (it would run eager
        # anyway), and a capture would keep the exception and its frames in its records
        _C.mark_skip(fn.__code__)
        resumes.append(fn)
        own_handlers.append((guarded, guarded_end, len(out), len(ctxs), 0))
        consts.append(None)
        _leave(out, len(ctxs), len(consts) - 1, last_pos)
        if lasti:   # where CPython would say the exception came from, in code units
            rows = _C.decode(fn.__code__)
            consts.append(rows[site.last + shift][1] // 2)
            out.append((_OP["LOAD_CONST"], len(consts) - 1, _NO_OP, last_pos))
            out.append((_OP["SWAP"], 2, _NO_OP, last_pos))
        held = [p for p in params[:hdepth] if p is not None]
        _tail(out, nv, 1 + bool(lasti), held, unbound, nv + nstack + nres - 1, consts,
              last_pos)
    # the resume functions are parameters with defaults, not constants: a tool that
    # traces this code (torch._dynamo) need not model a function constant
    varnames = code.co_varnames + _fresh(code, ".cell", len(cells)) + \
        _fresh(code, ".stack", nstack) + _fresh(code, ".resume", len(resumes))
    name = f"break_in_{code.co_name}_at_{_line(code, instrs, site.last)}"
    new = _C.emit(code, out, own_handlers,
                  {**_fields(code, name, varnames, consts), "co_cellvars": (),
                   "co_freevars": ()})
    _C.mark_skip(new)
    _GENERATED.add(new)
    fn = types.FunctionType(new, f_globals, name, tuple(resumes))
    per_code[key] = (fn, resumes, f_globals)
    return fn, resumes


def _comprehension_call(operands: tuple) -> bool:
    """Whether the break instruction's operands call a comprehension's function
    (3.11) or a generator expression's, which only iterate the iterator they are
    handed."""
    fns = [s[1] for s in operands if s[0] == "constant" and type(s[1]) is types.FunctionType]
    return bool(fns) and fns[0].__code__.co_name in _COMPREHENSIONS


_COMPREHENSIONS = ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>")


def _consumed(instrs: list, site: BreakSite, depth: int, kinds: tuple) -> int:
    """How many stack slots, from the top, the break instructions read: a call's
    callable and arguments, a branch's condition, an operator's operands; all of them
    for anything else (then no NULL, with-block exit or loop iterator may be among
    them)."""
    op, arg = instrs[site.last][0], instrs[site.last][1]
    if site.branch:
        return 1
    name = dis.opname[op]
    if name == "CALL":
        return arg + 2              # callable and self-or-NULL, then the arguments
    if name == "CALL_KW":
        return arg + 3              # ... and the tuple of keyword names (3.13)
    if name == "CALL_FUNCTION_EX":
        return 3 + (arg & 1)        # NULL, callable, args tuple, kwargs dict
    if name in _POPS and _POPS[name] <= depth:
        return _POPS[name]
    if any(kind != "value" for kind in kinds):  # (a with block's exit is not "value")
        raise ValueError("a NULL, a with block's exit or a loop's iterator on the stack "
                         "at a break that is not a call")
    return depth


# How many values from the top of the stack an instruction a break code runs reads,
# where that does not depend on its argument (for the rest: everything there is).
_POPS = {"UNARY_NEGATIVE": 1, "UNARY_NOT": 1, "UNARY_INVERT": 1, "TO_BOOL": 1,
         "GET_ITER": 1, "GET_LEN": 1, "UNPACK_SEQUENCE": 1, "LOAD_ATTR": 1,
         "BINARY_OP": 2, "BINARY_SUBSCR": 2, "COMPARE_OP": 2, "CONTAINS_OP": 2,
         "IS_OP": 2, "STORE_ATTR": 2, "DELETE_SUBSCR": 2, "STORE_SUBSCR": 3,
         "BINARY_SLICE": 3, "STORE_SLICE": 4}


class _Then(NamedTuple):
    """What a resume function's runner returns instead of calling its break function:
    the call the runner of the frame that began the chain makes next.  A chain of
    breaks (one per pass of a loop) thus runs at one depth of Python frames."""

    fn: Any
    args: tuple


# What a runner reads for a slot of the layout (``_plan``): the layout's own kinds,
# a tuple of slots, or a weak reference.
_OUTPUT, _CONSTANT, _LOCAL, _SOURCE = "output", "constant", "local", "source"
_TUPLE, _WEAK, _BOUND = "tuple", "weak", "bound"


def _plan(slot: tuple, item: bool = False) -> tuple:
    """(what to read, its argument) for a layout's slot: a loop's items (an "iter"
    slot) and a tuple among them are tuples of their own slots.  A module among a
    loop's items held as a constant (a block left to call, reached through no source)
    is held weakly: an entry must not keep a model alive, and its guard fails once the
    module is gone (it checks it by identity)."""
    kind = slot[0]
    if kind == "iter" and len(slot) == 3:     # the program's list: the prologue steps it
        return _plan(slot[1])
    if kind in ("iter", "tuple"):
        return _TUPLE, tuple(_plan(s, True) for s in slot[1])
    if kind == _BOUND:
        return _BOUND, (slot[1], _plan(slot[2]))
    if item and kind == _CONSTANT and _is_module(slot[1]):
        return _WEAK, weakref.ref(slot[1])
    return kind, slot[1] if len(slot) > 1 else None


def _is_module(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _sources(plan: tuple) -> list:
    """The sources a plan reads, its tuples' included."""
    found: list = []
    for kind, arg in plan:
        if kind == _SOURCE:
            found.append(arg)
        elif kind == _TUPLE:
            found += _sources(arg)
        elif kind == _BOUND:
            found += _sources((arg[1],))
    return found


def _value(kind: str, arg: Any, outs: Any, f_locals: dict, memo: dict) -> Any:
    """A slot's value on this call: ``outs`` the graph's outputs, ``memo`` what each
    source reached before the graph ran."""
    if kind == _OUTPUT:
        return outs[arg]
    if kind == _CONSTANT:
        return arg
    if kind == _LOCAL:
        return f_locals[arg]
    if kind == _SOURCE:
        return memo[arg]
    if kind == _TUPLE:
        return tuple(_value(k, a, outs, f_locals, memo) for k, a in arg)
    if kind == _WEAK:
        return arg()
    if kind == _BOUND:
        owner = _value(*arg[1], outs, f_locals, memo)
        return arg[0].__get__(owner, type(owner))
    return None         # an unbound local


def runner(graph: Any, read: Any, layout: Layout, fn: Any, resumes: list = (),
           free: tuple = (), chained: bool = False) -> Any:
    """The compiled callable of a resumed frame's CALL entry: run ``graph`` on the
    inputs ``read`` gathers, rebuild the locals and stack from its outputs, the
    frame's locals and constants, and call the break function ``fn`` with them
    (through the hook, so the resume functions it calls are captured).  For code
    with free variables (``free``, their names), each call makes the ``resumes``
    anew over cells holding the values the frame started with.

    ``chained``: the frame is a resume function's, called by a break function only,
    whose caller is a runner: the call is handed back to that runner (``_Then``)."""
    from agspeed._sources import resolve

    plan = tuple(_plan(s) for s in layout.locals + layout.cells + layout.stack
                 if s[0] not in ("null", "ctx"))
    sourced = tuple(dict.fromkeys(_sources(plan)))
    made = [(r.__code__, r.__name__) for r in resumes] if free else []

    def run(f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        # read before the graph, whose replayed writes may change what a source reaches
        memo: dict = {}
        for source in sourced:
            resolve(source, f_locals, f_globals, f_builtins, memo)
        outs = graph(*read(f_locals, f_globals, f_builtins))
        args = tuple(_value(k, a, outs, f_locals, memo) for k, a in plan)
        if made:
            closure = tuple(types.CellType(f_locals[n]) if n in f_locals
                            else types.CellType() for n in free)
            args += tuple(types.FunctionType(c, f_globals, n, None, closure)
                          for c, n in made)
        if chained:
            return _Then(fn, args)
        result = _C.call_user(fn, args)
        while type(result) is _Then:
            result = _C.call_user(result.fn, result.args)
        return result

    return run
