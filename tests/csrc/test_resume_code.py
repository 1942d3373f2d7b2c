"""The code a graph break generates (agspeed/_resume.py over csrc/emit.c), torch-free.

The interpreter runs with a recording builder (test_interp.Recorder) up to a break,
then again stopping before it; the break function and resume functions generated from
that state run for real and must print and return what the original function does,
on every version.  Graphs are not involved: the values are plain Python.
"""

import builtins
import dis

from agspeed import _C, _resume
from test_interp import Recorder, T


class Stopper(Recorder):
    stop_at = None

    def check_output(self, value):
        """Containers of plain values are returned as they are (no graph here)."""
        assert "Node" not in repr(type(value)), "no tensors in these tests"


def resumed(fn, **f_locals):
    """fn(**f_locals) run the way a resumed frame runs it: break code, then resume."""
    code = fn.__code__
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
    fn_break, resumes = _resume.generated(code, fn.__globals__, site, layout)
    # the "graph" returns its outputs as they are: plain values here
    run = _resume.runner(lambda: layout.outputs, lambda *a: (), layout, fn_break)
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


def test_a_break_in_a_loop_is_not_resumed():
    out = _C.capture(looping.__code__, {"n": 3}, looping.__globals__, builtins.__dict__,
                     Stopper(), T)
    assert out["status"] == "break"
    assert "loop" in _resume.break_site(looping.__code__, out["root_offset"])
