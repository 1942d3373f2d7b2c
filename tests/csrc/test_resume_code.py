"""The code a graph break generates (agspeed/_resume.py and _resume_code.py over csrc/emit.c), torch-free.

The interpreter runs with a recording builder (test_interp.Recorder) up to a break,
then again stopping before it; the break function and resume functions generated from
that state run for real and must print and return what the original function does,
on every version.  Graphs are not involved: the values are plain Python.
"""

import builtins
import dis

import pytest

from agspeed import _C, _resume, _resume_code
from test_interp import Recorder, T


class Stopper(Recorder):
    stop_at = None

    def check_output(self, value, placed=True):
        """Containers of plain values are returned as they are (no graph here)."""
        assert "Node" not in repr(type(value)), "no tensors in these tests"

    def is_shadow(self, value):
        """No list or dict of the program is changed in these tests."""
        return False

    def can_escape(self, value):
        """No object made in these frames is live at their breaks."""
        return False


def resumed(fn, **f_locals):
    """fn(**f_locals) run the way a resumed frame runs it: break code, then resume."""
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        f_locals[name] = cell.cell_contents     # as the hook reads a closure
    out = _C.capture(code, dict(f_locals), fn.__globals__, builtins.__dict__, Stopper(), T)
    assert out["status"] == "break", out
    site = _resume.break_site(code, out["root_offset"])
    assert not isinstance(site, str), site
    builder = Stopper()
    builder.stop_at = site.offset
    out = _C.capture(code, dict(f_locals), fn.__globals__, builtins.__dict__, builder, T)
    assert out["status"] == "stopped", out
    layout = _resume.layout_of(out["state"], code, builder)
    assert not isinstance(layout, str), layout
    fn_break, resumes = _resume_code.generated(code, fn.__globals__, site, layout)
    # the "graph" returns its outputs as they are: plain values here
    run = _resume_code.runner(lambda: layout.outputs, lambda *a: (), layout, fn_break,
                              resumes, code.co_freevars)
    return run(dict(f_locals), fn.__globals__, builtins.__dict__), fn_break, resumes


def prints(a, b):
    c = a * b + 1
    print("between", c, sep=": ")
    d = c - a
    return d * 2, c


def test_a_call_breaks_and_the_frame_resumes(capsys):
    out, fn, resumes = resumed(prints, a=3, b=4)
    assert out == prints(3, 4)
    assert capsys.readouterr().out == "between: 13\n" * 2
    assert fn.__code__.co_filename == prints.__code__.co_filename
    assert [r.__name__ for r in resumes] == [f"resume_in_prints_at_"
                                             f"{prints.__code__.co_firstlineno + 2}"]
    assert list(dis.get_instructions(fn)) and list(dis.get_instructions(resumes[0]))


def nested_call(a, b):
    n = int(sorted([b, a])[0]) + 1
    return n * 10


def test_a_null_below_the_call_stays_for_the_resume_function():
    out, _fn, resumes = resumed(nested_call, a=5, b=2)
    assert out == nested_call(5, 2)


def unbound_later(a):
    s = str(a)
    t = s + "!"
    return t


def test_unbound_locals_stay_unbound():
    out, _fn, _r = resumed(unbound_later, a=7)
    assert out == "7!"


def test_generated_code_is_cached_per_site_and_layout():
    _o, fn1, r1 = resumed(prints, a=1, b=2)
    _o, fn2, r2 = resumed(prints, a=5, b=6)
    assert fn1 is fn2 and r1 == r2


def looping(n):
    total = 0
    for i in range(n):
        total += len(str(i))
    return total


def test_a_break_in_a_loop_has_a_site():
    out = _C.capture(looping.__code__, {"n": 3}, looping.__globals__, builtins.__dict__,
                     Stopper(), T)
    assert out["status"] == "break"
    site = _resume.break_site(looping.__code__, out["root_offset"])
    assert isinstance(site, _resume.BreakSite) and not site.branch


def test_a_stopped_capture_says_which_objects_it_made():
    out = _C.capture(looping.__code__, {"n": 3}, looping.__globals__, builtins.__dict__,
                     Stopper(), T)
    site = _resume.break_site(looping.__code__, out["root_offset"])
    builder = Stopper()
    builder.stop_at = site.offset
    out = _C.capture(looping.__code__, {"n": 3}, looping.__globals__, builtins.__dict__,
                     builder, T)
    assert out["status"] == "stopped"
    state = out["state"]
    assert isinstance(state["owned"], frozenset)
    kinds = [row[0] for row in state["stack"]]
    assert kinds[0] == "ITER"      # range(n)'s elements, the loop one pass in
    elements, position, followed, programs = state["stack"][0][1]
    assert elements == (0, 1, 2) and position == 1
    assert followed is None and not programs   # a range: nothing the body can change


class Log:
    """A context manager writing down what happens to it; ``swallow``: its exit
    swallows an exception."""

    def __init__(self, events, swallow=False):
        self.events, self.swallow = events, swallow

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.events.append(("exit", kind))
        return self.swallow


def block_with_print(a, cm):
    b = a + 1
    with cm:
        print("inside", b)
        c = b * 2
    return c + 1


def block_with_failure(a, cm):
    b = a + 1
    c = 0
    with cm:
        c = int(b)
        c = float("not a number")
        c = c + 100
    return c + b


def resumed_in_block(fn, events, monkeypatch, **f_locals):
    """fn resumed at a break inside its with block, the block's manager standing for
    one the builder models (a new Log per call, as torch.no_grad() is made anew)."""
    monkeypatch.setattr(_resume, "_modelled_exit", lambda value: value.__self__ if (
        isinstance(getattr(value, "__self__", None), Log)) else None)
    swallow = f_locals["cm"].swallow

    class Made(Log):
        def __init__(self):
            super().__init__(events, swallow)

    monkeypatch.setattr(_resume, "_maker", lambda model: (Made, ()))
    return resumed(fn, **f_locals)


def test_a_break_in_a_with_block_enters_the_block_again(capsys, monkeypatch):
    events = []
    out, fn, resumes = resumed_in_block(block_with_print, events, monkeypatch,
                                        a=3, cm=Log([]))
    assert out == block_with_print(3, Log([]))
    assert capsys.readouterr().out == "inside 4\n" * 2
    # the break code's own block around print, then the resume function's around the rest
    assert events == ["enter", ("exit", None), "enter", ("exit", None)]
    assert fn.__code__.co_exceptiontable  # its block's exit runs when print raises
    assert len(resumes) == 2      # after the break, and at the block's handler
    assert "WITH_EXCEPT_START" in {i.opname for i in dis.get_instructions(resumes[1])}


def test_an_exception_at_the_break_reaches_the_blocks_exit(monkeypatch):
    events = []
    out, _fn, _r = resumed_in_block(block_with_failure, events, monkeypatch,
                                    a=3, cm=Log([], swallow=True))
    assert out == block_with_failure(3, Log([], swallow=True)) == 8
    # the break code leaves its block; the handler's resume function enters it again
    # and its exit sees the exception (and swallows it, so the frame goes on)
    assert events == ["enter", ("exit", None), "enter", ("exit", ValueError)]
    events.clear()
    with pytest.raises(ValueError) as info:
        resumed_in_block(block_with_failure, events, monkeypatch, a=3, cm=Log([]))
    assert events == ["enter", ("exit", None), "enter", ("exit", ValueError)]
    lines = [tb.tb_lineno for tb in _walk(info.value.__traceback__)]
    assert block_with_failure.__code__.co_firstlineno + 5 in lines


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def tried(a):
    try:
        print("in try", a)
    finally:
        a = a + 1
    return a


def test_a_break_under_try_is_not_resumed():
    out = _C.capture(tried.__code__, {"a": 3}, tried.__globals__, builtins.__dict__,
                     Stopper(), T)
    assert out["status"] == "break"
    assert "try" in _resume.break_site(tried.__code__, out["root_offset"])


def make_adder(k):
    def adds(a):
        b = a + k
        print("adds", b)
        return b * k
    return adds


def test_free_variables_come_from_the_frames_closure(capsys):
    for k in (3, 4):    # one code, two closures: each call's own values
        adds = make_adder(k)
        out, fn, resumes = resumed(adds, a=2)
        assert out == adds(2)
        assert not fn.__code__.co_freevars
        assert resumes[0].__code__.co_freevars == ("k",)


def captures_after(a, c):
    b = a * c
    print("captures", b)
    f = lambda: b + c   # noqa: E731  (cells: a parameter's and a local's)
    c = c + 1
    return f() * c


def test_cell_variables_are_cells_again_in_the_resume_function(capsys):
    out, _fn, resumes = resumed(captures_after, a=2, c=5)
    assert out == captures_after(2, 5)
    assert set(resumes[0].__code__.co_cellvars) == {"b", "c"}


class Base:
    def value(self, a):
        return a + 1


class Child(Base):
    def value(self, a):
        b = super().value(a)
        print("child", b)
        return super().value(b) * 2


def test_argument_less_super_works_in_the_resume_function(capsys):
    child = Child()
    out, _fn, _r = resumed(Child.value, self=child, a=4)
    assert out == child.value(4)


def counts():
    n = 0

    def bump(a):
        nonlocal n
        print("bump", a)
        n += a
        return n
    return bump


def test_a_write_to_an_enclosing_functions_variable_is_not_resumed():
    assert "enclosing" in _resume.break_site(counts().__code__, 0)


def test_a_loop_resumes_with_the_items_it_had_left():
    result, _fn, resumes = resumed(looping, n=12)
    assert result == looping(12)
    first = resumes[0].__code__
    assert _resume_code.is_resume(first) and _resume_code.in_loop(first)
    # the resume function iterates the tuple it is handed: pass one of twelve, so
    # eleven left, with the first pass's state
    assert first.co_argcount == first.co_nlocals


def summing(xs):
    total = 0
    for x in xs:
        total += len(str(x))
    return total


def test_a_loop_over_a_list_resumes_with_its_items():
    result, _fn, _r = resumed(summing, xs=[1, 22, 333, 4444])
    assert result == summing([1, 22, 333, 4444])


def stepping(xs):
    out = []
    for x in xs:
        out.append(x)
        s = str(x)      # the break
        out.append(s)
    return out


def test_a_loop_over_the_programs_list_resumes_on_that_list():
    result, _fn, resumes = resumed(stepping, xs=[1, 22, 333])
    assert result == stepping([1, 22, 333])
    # the resume function is handed the list itself (xs, out, x, s, the list, str's
    # result) and steps past the one item the loop took: an item appended since is seen
    _result, _fn, resumes = resumed(stepping, xs=[1])
    assert resumes[0]([1], [9], 1, None, [1, 22], "r") == [9, "r", 22, "22"]
    # a list now shorter than where the loop was: the pass goes on and the loop ends,
    # as the program's own iterator would
    assert resumes[0]([1], [9], 1, None, [], "r") == [9, "r"]


def comprehending(xs):
    lengths = [len(str(x)) for x in xs]     # a comprehension: inlined from 3.12 on
    return sum(lengths), lengths


def test_a_break_in_a_comprehension_resumes():
    result, _fn, _r = resumed(comprehending, xs=(5, 66, 777))
    assert result == comprehending((5, 66, 777))


def nested_loops(n):
    total = 0
    for i in range(n):
        j = 0
        while j < i:
            total += len(str(i * j)) * (j + 1)
            j += 1
    return total


def test_a_break_in_an_inner_while_loop_resumes():
    result, _fn, _r = resumed(nested_loops, n=4)
    assert result == nested_loops(4)


def shadowing(xs):
    x = "outer"
    lengths = [len(str(x)) for x in xs]     # 3.12 on: hides x, puts it back after
    return x, lengths


def test_a_comprehension_puts_back_the_variable_it_hid():
    result, _fn, _r = resumed(shadowing, xs=(1, 22))
    assert result == ("outer", [1, 2])
