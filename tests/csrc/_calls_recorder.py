"""A recording builder with the standard library's call plans (csrc/interp_iter.c), for the
torch-free tests of interp_build.c, interp_import.c and interp_iter.c."""

import functools

from agspeed.protocol import Plan
from test_interp import Recorder


class CallsRecorder(Recorder):
    """Recorder, plus map/filter/reduce/partial plans and real iterators from iter()."""

    FOLDS = Recorder.FOLDS + (iter, next, sorted, set, sum)

    def plan_call(self, fn, source):
        if fn is map:
            return (Plan.MAP,)
        if fn is filter:
            return (Plan.FILTER,)
        if fn is functools.reduce:
            return (Plan.REDUCE,)
        if type(fn) is functools.partial:
            return (Plan.PARTIAL, fn.func, fn.args, dict(fn.keywords), None)
        if fn is functools.partial:
            return (Plan.FOLD, fn)
        return super().plan_call(fn, source)

    def fold(self, fn, args, kwargs):
        if fn is iter:
            return iter(tuple(args[0]))
        return super().fold(fn, args, kwargs)
