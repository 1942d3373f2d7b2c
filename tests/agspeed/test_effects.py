"""Side effects (agspeed/_effects.py): writes to objects that existed before the call are
recorded during capture and replayed after the graph, in order, so every later call and
the caller see the state eager would have left; reads after a write see it; writes that
cannot be replayed safely still break."""

import collections
import dataclasses
import functools
import gc
import logging
import warnings
import sys
import weakref

import pytest

import agspeed
from _dynamo_ref import dynamo_graph_count
from agspeed import _C

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch


class Config:
    def __init__(self):
        self.scale = 2.0
        self.last_shape = None


class KeepsState(nn.Module if nn is not None else object):
    def __init__(self, cfg):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.cfg = cfg
        self.hidden = None

    def forward(self, x):
        h = self.fc(x).relu()
        self.hidden = h  # a tensor the graph computes, kept on the module
        self.cfg.last_shape = tuple(x.shape)  # a plain value on another object
        self.cfg.scale = self.cfg.scale  # a write of what was read
        return self.hidden * self.cfg.scale  # reads see the writes


def test_attribute_writes_are_replayed_after_the_graph():
    torch.manual_seed(0)
    cfg_eager, cfg_fast = Config(), Config()
    eager = KeepsState(cfg_eager)
    fast_model = KeepsState(cfg_fast)
    fast_model.load_state_dict(eager.state_dict())
    report = agspeed.explain(fast_model, torch.randn(3, 4))
    assert report.graph_count == 1 and report.graph_break_count == 0
    assert report.graph_count <= dynamo_graph_count(eager, torch.randn(3, 4))

    fast = agspeed.optimize(fast_model, backend="eager")
    for rows in (3, 3, 5):
        x = torch.randn(rows, 4)
        expected, got = eager(x), fast(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(fast_model.hidden, eager.hidden)
        assert cfg_fast.last_shape == cfg_eager.last_shape == (rows, 4)
        assert type(fast_model.hidden) is torch.Tensor
        # the kept tensor is the graph's, with its autograd history
        g_eager = torch.autograd.grad(eager.hidden.sum(), eager.fc.weight)
        g_fast = torch.autograd.grad(fast_model.hidden.sum(), fast_model.fc.weight)
        torch.testing.assert_close(g_fast[0], g_eager[0])


class Bag:
    pass


def _set_then_look_in_dict(x, bag):
    bag.a = x * 2
    return x + 1 if "a" in bag.__dict__ else x - 1


def _dict_held_then_set(x, bag):
    store = bag.__dict__
    bag.a = x * 2
    return store["a"] + 1 if "a" in store else x - 1


def _set_through_dict_then_read(x, bag):
    bag.a = x
    bag.__dict__["a"] = x * 3
    bag.__dict__["b"] = 5
    return bag.a + bag.b


@pytest.mark.parametrize("fn", [_set_then_look_in_dict, _dict_held_then_set,
                                _set_through_dict_then_read], ids=lambda f: f.__name__)
def test_an_objects_dict_shows_the_attributes_the_frame_set(fn):
    # the writes are made after the graph: the frame reads its __dict__ as it would be
    opt = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        mine, theirs = Bag(), Bag()
        torch.testing.assert_close(opt(x, mine), fn(x, theirs))
        assert vars(mine).keys() == vars(theirs).keys()
        for name in vars(theirs):
            torch.testing.assert_close(getattr(mine, name), getattr(theirs, name))
    ex = agspeed.explain(fn, torch.randn(3), Bag())
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    bag = Bag()
    opt(torch.randn(3), bag)
    gone = weakref.ref(bag)
    del bag
    gc.collect()
    assert gone() is None       # neither the entry nor its shadow keeps the object


class Counts(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2 + self.calls


def test_a_counter_on_the_module_counts_as_eager_does():
    model, ref = Counts(), Counts()
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), ref(x))
    assert model.calls == ref.calls == 4
    out = agspeed.explain(Counts(), torch.randn(3))
    assert out.graph_count == 1 and out.graph_break_count == 0


class Ordered:
    pass


def writes_in_order(x, box):
    box.a = x + 1
    box.b = box.a * 2
    box.a = box.b - 1  # the last write wins, as in eager
    return box.a + box.b


def test_writes_replay_in_order_and_the_last_one_wins():
    box, ref = Ordered(), Ordered()
    fast = agspeed.optimize(writes_in_order, backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(fast(x, box), writes_in_order(x, ref))
    torch.testing.assert_close(box.a, ref.a)
    torch.testing.assert_close(box.b, ref.b)
    other = Ordered()  # another object: the guard sees another identity, still right
    y = torch.randn(2)
    fast(y, other)
    torch.testing.assert_close(other.a, (y + 1) * 2 - 1)


class Guarded:
    def __init__(self):
        self._v = 0

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, value):
        self._v = value + 100


class CustomSetattr:
    def __setattr__(self, name, value):
        object.__setattr__(self, name, value * 10)


def writes_property(x, obj):
    obj.v = 1
    return x + obj.v


def writes_custom(x, obj):
    obj.w = 1
    return x + obj.w


def test_own_setattr_runs_inlined_and_its_write_replays():
    # the class's __setattr__ is Python: inlined, and its object.__setattr__ is the
    # side effect replayed after the graph
    obj = CustomSetattr()
    report = agspeed.explain(writes_custom, torch.zeros(1), obj)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    obj = CustomSetattr()
    got = agspeed.optimize(writes_custom, backend="eager")(torch.zeros(1), obj)
    assert obj.w == 10
    torch.testing.assert_close(got, torch.full((1,), 10.0))


@pytest.mark.parametrize("fn, make, attr, expected", [
    (writes_property, Guarded, "v", 101),
])
def test_writes_through_code_the_capture_does_not_model_break_and_stay_right(
        fn, make, attr, expected):
    obj = make()
    report = agspeed.explain(fn, torch.zeros(1), obj)
    # the write runs for real in the break code, and the frame resumes after it: one
    # graph, reading the value the write left (__setattr__ itself, run eager, breaks too)
    assert report.graph_count == 1 and report.resume_functions
    assert report.break_reasons[0].reason == "side_effect"
    obj = make()
    got = agspeed.optimize(fn, backend="eager")(torch.zeros(1), obj)
    assert getattr(obj, attr) == expected
    torch.testing.assert_close(got, torch.full((1,), float(expected)))


class Replaces(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.spare = nn.Identity()

    def forward(self, x):
        self.fc = self.spare
        return self.fc(x)


def test_replacing_a_submodule_still_breaks():
    report = agspeed.explain(Replaces(), torch.randn(1, 2))
    assert report.graph_count == 0 and report.break_reasons[0].reason == "side_effect"


def test_a_written_object_is_not_kept_alive_by_the_cache():
    box = Ordered()
    ref = weakref.ref(box)
    fast = agspeed.optimize(writes_in_order, backend="eager")
    fast(torch.randn(2), box)
    fast(torch.randn(2), box)
    count = sys.getrefcount(box)
    fast(torch.randn(2), box)
    assert sys.getrefcount(box) == count
    del box
    gc.collect()
    assert ref() is None
    assert _C.counters()["graph_calls"] >= 3


_probe_log = logging.getLogger("agspeed_tests.effects")


def logs_as_it_goes(x):
    y = x * 2
    _probe_log.info("y is %s", y)
    _probe_log.debug("never at INFO")
    logging.getLogger("agspeed_tests.effects").warning("shape %s", tuple(y.shape))
    return y + 1


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        # where the record says it was made: the program's line, as in eager
        self.lines.append((record.levelname, record.getMessage(), record.pathname,
                           record.lineno, record.funcName))


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.ERROR])
def test_logging_calls_are_replayed_and_the_level_decides_at_run_time(level):
    keep = _Keep()
    _probe_log.addHandler(keep)
    _probe_log.propagate = False
    try:
        _probe_log.setLevel(logging.ERROR)
        report = agspeed.explain(logs_as_it_goes, torch.ones(2))
        assert (report.graph_count, report.graph_break_count) == (1, 0)
        fast = agspeed.optimize(logs_as_it_goes, backend="eager")
        x = torch.randn(3)
        fast(x)  # captured with the logger quiet
        _probe_log.setLevel(level)  # then the level changes: no recapture needed
        keep.lines.clear()
        torch.testing.assert_close(fast(x), logs_as_it_goes.__wrapped__(x)
                                   if hasattr(logs_as_it_goes, "__wrapped__") else x * 2 + 1)
        got = list(keep.lines)
        keep.lines.clear()
        logs_as_it_goes(x)  # eager, for the reference
        assert got == keep.lines
        assert len(got) == {logging.DEBUG: 3, logging.INFO: 2, logging.ERROR: 0}[level]
    finally:
        _probe_log.removeHandler(keep)
        _probe_log.propagate = True
        _probe_log.setLevel(logging.NOTSET)


def _says_where_it_was_called(v):
    _probe_log.log(logging.WARNING, "from my caller %s", v, stacklevel=2)


def logs_through_a_helper(x):
    y = x + 1
    _says_where_it_was_called(3)
    _probe_log.warning("extra %s", 4, extra={"note": "kept"})
    return y


def test_a_replayed_record_names_eagers_place_stacklevel_and_extra_included():
    keep = _Keep()
    _probe_log.addHandler(keep)
    _probe_log.propagate = False
    try:
        fast = agspeed.optimize(logs_through_a_helper, backend="eager")
        x = torch.randn(3)
        fast(x)
        keep.lines.clear()
        fast(x)   # a cache hit: the replay
        got = list(keep.lines)
        keep.lines.clear()
        logs_through_a_helper(x)
        assert got == keep.lines and len(got) == 2
        assert got[0][4] == "logs_through_a_helper"
        assert agspeed.explain(logs_through_a_helper, x).graph_break_count == 0
    finally:
        _probe_log.removeHandler(keep)
        _probe_log.propagate = True


SEEN = []


def appends_to_a_global(x):
    y = x.sin()
    SEEN.append(y)
    SEEN.append(len(SEEN))
    return y * 2


def test_appends_to_a_global_list_are_written_back():
    SEEN.clear()
    report = agspeed.explain(appends_to_a_global, torch.randn(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    assert len(SEEN) == 2  # explain ran it once, as eager would
    SEEN.clear()
    fast = agspeed.optimize(appends_to_a_global, backend="eager")
    xs = [torch.randn(3) for _ in range(3)]
    outs = [fast(x) for x in xs]
    got = list(SEEN)
    SEEN.clear()
    expected = [appends_to_a_global(x) for x in xs]
    for a, b in zip(outs, expected):
        torch.testing.assert_close(a, b)
    assert len(got) == len(SEEN) == 6
    for a, b in zip(got, SEEN):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b
    SEEN.clear()


def fills_a_dict(x, table):
    scale = table.get("scale", 1.0)
    table["out"] = x * scale
    table.setdefault("calls", 0)
    table["calls"] += 1
    table.pop("drop", None)
    return table["out"] + 1


def test_writes_to_a_dict_argument_are_written_back_and_read_back():
    fast = agspeed.optimize(fills_a_dict, backend="eager")
    for scale in (2.0, 2.0, 3.0):
        mine, ref = {"scale": scale, "drop": 1}, {"scale": scale, "drop": 1}
        x = torch.randn(2)
        torch.testing.assert_close(fast(x, mine), fills_a_dict(x, ref))
        assert mine.keys() == ref.keys() and list(mine) == list(ref)
        torch.testing.assert_close(mine["out"], ref["out"])
        assert mine["calls"] == ref["calls"] == 1
    report = agspeed.explain(fills_a_dict, torch.randn(2), {"scale": 2.0})
    assert (report.graph_count, report.graph_break_count) == (1, 0)


class KeepsHistory(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.history = []
        self.options = {"act": "tanh"}

    def forward(self, x):
        y = self.fc(x)
        if self.options.get("act") == "tanh":
            y = y.tanh()
        self.history.append(y.detach())
        return y


def test_a_modules_list_attribute_grows_as_in_eager():
    torch.manual_seed(0)
    model = KeepsHistory()
    ref = KeepsHistory()
    ref.load_state_dict(model.state_dict())
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(fast(x), ref(x))
    assert len(model.history) == len(ref.history) == 3
    for a, b in zip(model.history, ref.history):
        torch.testing.assert_close(a, b)


def reads_a_global_list(x):
    return x * SEEN[0] + len(SEEN)


def returns_the_list(x):
    SEEN.append(1)
    return SEEN, x + 1


def test_a_list_only_read_writes_nothing_and_one_returned_has_its_contents():
    SEEN[:] = [2.0]
    fast = agspeed.optimize(reads_a_global_list, backend="eager")
    before = SEEN
    torch.testing.assert_close(fast(torch.ones(2)), torch.full((2,), 3.0))
    assert SEEN is before and SEEN == [2.0]
    out, y = agspeed.optimize(returns_the_list, backend="eager")(torch.ones(1))
    assert SEEN == [2.0, 1] and out == SEEN  # (a copy: see agspeed/_effects.py)
    torch.testing.assert_close(y, torch.full((1,), 2.0))
    SEEN.clear()


def _warns(x):
    warnings.warn("scale is deprecated", DeprecationWarning)  # the line eager names
    return x * 2


def _warns_for_caller(x):
    _helper_that_warns()  # stacklevel=2 names this line
    return x + 1


def _helper_that_warns():
    warnings.warn("called from the frame", UserWarning, stacklevel=2)


def _warns_above(x):
    warnings.warn("names a caller", UserWarning, stacklevel=2)
    return x - 1


@pytest.mark.parametrize("fn", [_warns, _warns_for_caller])
def test_warnings_are_replayed_where_eager_would_warn(fn):
    report = agspeed.explain(fn, torch.ones(2))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    fast = agspeed.optimize(fn, backend="eager")
    fast(torch.ones(2))  # the capture
    for _ in range(2):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            torch.testing.assert_close(fast(torch.ones(2)), fn(torch.ones(2)))
        ours, eager = got[0], got[1]
        assert len(got) == 2
        assert (str(ours.message), ours.category, ours.filename, ours.lineno) == \
            (str(eager.message), eager.category, eager.filename, eager.lineno)


def test_a_warning_naming_a_caller_of_the_optimized_frame_breaks():
    report = agspeed.explain(_warns_above, torch.ones(2))
    assert report.break_reasons[0].reason == "unsupported_call"
    assert report.break_reasons[0].instruction == "CALL"  # the warning runs for real


def test_the_capture_site_is_per_thread():
    # a capture lets the GIL go while the builder runs Python: another thread's capture
    # starting and ending meanwhile must not leave this thread pointing at it
    import threading

    def work(n):
        for i in range(n):
            def fresh(x, i=i):
                return x * (i + 1) + 1
            agspeed.optimize(fresh, backend="eager")(torch.randn(2))
        seen.append(_C.capture_site())

    seen = []
    threads = [threading.Thread(target=work, args=(8,)) for _ in range(3)]
    for t in threads:
        t.start()
    work(8)
    for t in threads:
        t.join()
    assert seen == [()] * 4 and _C.capture_site() == ()


class _OnceLogger(logging.Logger):
    pass


@functools.lru_cache(None)
def _warn_once(self, *args, **kwargs):
    self.warning(*args, **kwargs)


_OnceLogger.warn_once_for_test = _warn_once
_ONCE = _OnceLogger("agspeed.test.once")
_ONCE.parent = logging.getLogger()   # made directly: joined to the hierarchy by hand


def logs_once(x):
    _ONCE.warn_once_for_test("said once")
    return x + 1


def test_an_lru_cached_logger_method_is_replayed_and_dedupes(caplog):
    report = agspeed.explain(logs_once, torch.zeros(1))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    _warn_once.cache_clear()
    fast = agspeed.optimize(logs_once, backend="eager")
    with caplog.at_level(logging.WARNING, logger="agspeed.test.once"):
        torch.testing.assert_close(fast(torch.zeros(1)), torch.ones(1))
        first = len(caplog.records)
        for _ in range(3):
            torch.testing.assert_close(fast(torch.zeros(1)), torch.ones(1))
    said = [r.getMessage() for r in caplog.records if r.name == "agspeed.test.once"]
    assert first >= 1 and said == ["said once"] * first, said   # nothing after the first
    assert _warn_once.cache_info().hits == 3


def biased_by_a_fresh_leaf(x, w):
    bias = torch.zeros(x.shape)
    bias.requires_grad = True          # T5's position bias under checkpointing
    return (x @ w + bias).sum(), bias.requires_grad


def marks_a_computed_tensor(x, w):
    h = x @ w
    h.requires_grad = True             # not a leaf: eager's setter raises
    return h


def test_requires_grad_set_on_a_tensor_made_in_the_frame():
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    report = agspeed.explain(biased_by_a_fresh_leaf, x, w)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    fast = agspeed.optimize(biased_by_a_fresh_leaf, backend="eager")
    for _ in range(2):
        (got, flag), (want, want_flag) = fast(x, w), biased_by_a_fresh_leaf(x, w)
        torch.testing.assert_close(got, want)
        assert flag is want_flag is True and got.requires_grad
        gw, = torch.autograd.grad(got, w)
        ww, = torch.autograd.grad(want, w)
        torch.testing.assert_close(gw, ww)


@pytest.mark.cxx_exceptions   # autograd's check throws inside libtorch
def test_requires_grad_set_on_a_computed_tensor_raises_eagers_error():
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf variables"):
        marks_a_computed_tensor(x, w)
    with pytest.raises(RuntimeError, match="leaf variables"):
        agspeed.optimize(marks_a_computed_tensor, backend="eager")(x, w)


BY_NAME = collections.defaultdict(list)
ORDER = collections.OrderedDict(first=0)


def files_by_name(x):
    BY_NAME["sum"].append(x.sum())     # a missing key: made by the read, in the shadow
    BY_NAME["count"] = len(BY_NAME["sum"])
    ORDER["last"] = 1
    ORDER.move_to_end("first")
    return x * BY_NAME["count"]


def test_a_defaultdict_and_an_ordereddict_of_the_program_change_as_in_eager():
    BY_NAME.clear()
    fast = agspeed.optimize(files_by_name, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), x)          # nothing changed while capturing
    assert list(BY_NAME) == ["sum", "count"] and BY_NAME["count"] == 1
    torch.testing.assert_close(BY_NAME["sum"][0], x.sum())
    assert list(ORDER) == ["last", "first"]
    torch.testing.assert_close(fast(x), 2 * x)
    assert BY_NAME["count"] == 2 and len(BY_NAME["sum"]) == 2
    assert BY_NAME.default_factory is list
    report = agspeed.explain(files_by_name, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    BY_NAME.clear()


def test_a_slice_of_a_list_is_a_new_list_the_frame_may_change():
    """``xs[1:]`` (of a list built in the frame or of an argument) is a new list: it
    grows in the graph's capture and the original is left as eager leaves it."""
    def f(x, given):
        mine = [x + 1, x * 2, x - 3]
        mine = mine[:-1]
        mine.append(x.sin())
        rest = given[1:]
        rest.append(x.cos())
        rest.insert(0, mine[0])
        return mine, rest

    x, given = torch.randn(3), [torch.randn(3), torch.randn(3)]
    report = agspeed.explain(f, x, given)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    fast = agspeed.optimize(f, backend="eager")
    for _ in range(2):
        x, given = torch.randn(3), [torch.randn(3), torch.randn(3)]
        before = list(given)
        (mine, rest), (want_mine, want_rest) = fast(x, given), f(x, given)
        assert len(given) == 2 and all(a is b for a, b in zip(given, before))
        assert type(mine) is list and type(rest) is list
        assert [len(mine), len(rest)] == [len(want_mine), len(want_rest)] == [3, 3]
        for a, b in zip(mine + rest, want_mine + want_rest):
            torch.testing.assert_close(a, b)
        assert rest[1] is given[1]


def appends_and_returns(a, x):
    a.append(x.sin())
    return a


def fills_and_returns(d, x):
    d["y"] = d["x"] * 2 + x
    return d


def returns_in_a_tuple(a, x):
    a.append(a[0] * x)
    return x + 1, (a, len(a))


@pytest.mark.parametrize("fn", [appends_and_returns, fills_and_returns, returns_in_a_tuple])
def test_a_list_or_dict_of_the_program_that_is_changed_and_returned_is_that_object(fn):
    """``a.append(x); return a`` returns the caller's own list in eager: the graph's copy
    is written back into it and it is what comes out, here as at the top level or inside
    a returned tuple, so a later change through either name is seen by both."""
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        mine = {"x": torch.ones(3)} if fn is fills_and_returns else [torch.ones(3)]
        theirs = {"x": torch.ones(3)} if fn is fills_and_returns else [torch.ones(3)]
        got, want = fast(mine, x), fn(theirs, x)
        got_obj = got if fn is not returns_in_a_tuple else got[1][0]
        want_obj = want if fn is not returns_in_a_tuple else want[1][0]
        assert got_obj is mine and want_obj is theirs
        assert len(mine) == len(theirs)
        for a, b in zip(mine.values() if isinstance(mine, dict) else mine,
                        theirs.values() if isinstance(theirs, dict) else theirs):
            torch.testing.assert_close(a, b)
        if fn is returns_in_a_tuple:
            assert type(got) is tuple and type(got[1]) is tuple and got[1][1] == want[1][1]
    report = agspeed.explain(fn, mine, torch.randn(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons


def test_a_returned_list_of_the_program_is_not_held_by_the_entry():
    fast = agspeed.optimize(appends_and_returns, backend="eager")
    mine, x = [torch.ones(3)], torch.randn(3)
    for _ in range(3):
        fast(mine, x)
    gc.collect()
    before = sys.getrefcount(mine)
    for _ in range(20):
        assert fast(mine, x) is mine
    gc.collect()
    assert sys.getrefcount(mine) == before and len(mine) == 24


@dataclasses.dataclass
class _Holder:
    items: list
    scale: float = 1.0


def holds_then_appends(items, x):
    held = _Holder(items)
    held.items.append(x * 2)    # the list changes after the object took it
    return held, x + 1


def appends_then_holds(items, x):
    items.append(x * 2)         # the list changes before the object takes it
    return _Holder(items, 0.5), x + 1


def returns_unchanged(items, x):
    return items, [items], x + 1


@pytest.mark.parametrize("fn", [holds_then_appends, appends_then_holds, returns_unchanged])
def test_a_list_of_the_program_in_the_result_is_that_list_wherever_it_is(fn):
    """A dataclass made in the frame around the caller's list holds that list in eager,
    with whatever the frame appended through either name; so does a list returned
    unchanged, at the top or inside a list: never a copy, on every call."""
    fast = agspeed.optimize(fn, backend="eager")
    for k in range(3):
        mine, theirs, x = [k], [k], torch.randn(3)
        got, want = fast(mine, x), fn(theirs, x)
        if fn is returns_unchanged:
            assert got[0] is mine and got[1][0] is mine and type(got[1]) is list
            torch.testing.assert_close(got[2], want[2])
            continue
        assert type(got[0]) is _Holder and got[0].items is mine
        assert len(mine) == len(theirs) == 2 and mine[0] == k
        torch.testing.assert_close(mine[1], theirs[1])
        assert got[0].scale == want[0].scale
    assert agspeed.explain(fn, [0], torch.randn(3)).graph_count == 1


def test_a_list_the_result_holds_is_not_kept_alive_by_the_entry():
    fast = agspeed.optimize(holds_then_appends, backend="eager")
    mine, x = [0], torch.randn(3)
    for _ in range(3):
        fast(mine, x)
    gc.collect()
    before = sys.getrefcount(mine)
    for _ in range(20):
        held, _ = fast(mine, x)
        assert held.items is mine
    del held
    gc.collect()
    assert sys.getrefcount(mine) == before and len(mine) == 24


class _Bag:
    pass


def test_a_closure_made_in_the_frame_stored_on_an_object_breaks_with_eagers_result():
    """Its cells are the capture's (here a graph value): stored on the program's object,
    eager's function must be what the object holds."""
    agspeed.reset()
    held = _Bag()

    def fn(x):
        y = x * 2
        held.later = lambda: y + 1
        return x + 1

    x = torch.ones(2)
    torch.testing.assert_close(agspeed.optimize(fn, backend="eager")(x), x + 1)
    torch.testing.assert_close(held.later(), x * 2 + 1)


def test_a_closure_over_the_programs_variable_crossing_a_break_sets_it():
    """A function made (in an inlined call) over a variable of an enclosing function of
    the program, held across a break and called after it: its ``nonlocal`` write reaches
    the program's variable, as in eager."""
    agspeed.reset()
    k = 0

    def make():
        def setk():
            nonlocal k
            k = 100
        return setk

    def fn(x):
        s = make()
        y = x + 1
        torch._dynamo.graph_break()
        s()
        return y

    torch.testing.assert_close(agspeed.optimize(fn, backend="eager")(torch.ones(1)),
                               torch.full((1,), 2.0))
    assert k == 100


def test_a_contextmanager_made_in_an_inlined_call_sets_the_programs_nonlocals():
    import contextlib

    agspeed.reset()
    z = k = 0

    def create():
        @contextlib.contextmanager
        def ctx(x):
            nonlocal k
            k = 100
            yield x.sin()
        return ctx

    def run(ctx, x):
        nonlocal z
        with ctx(x) as y:
            z = k
            return y.cos()

    def fn(x):
        return run(create(), x)

    x = torch.tensor([1.0])
    torch.testing.assert_close(agspeed.optimize(fn, backend="eager")(x), x.sin().cos())
    assert (z, k) == (100, 100)


SUMS = collections.defaultdict(lambda: [])


def notes_sums(x, scale):
    SUMS["sums"].append(x.sum())         # missing on the first call: the lambda runs
    made = collections.defaultdict(lambda: torch.zeros(3))
    made["sum"] += x                     # the frame's own: a tensor the graph makes
    made["twice"] = made["sum"] * 2
    nested = collections.defaultdict(lambda: [scale])   # a closure over the frame
    nested["k"].append(x)
    return made["sum"] + made["twice"] + made["none"], len(nested["k"]), nested["k"][0]


def test_a_defaultdict_whose_factory_is_a_python_function_fills_missing_keys_as_eager():
    report = agspeed.explain(notes_sums, torch.randn(3), 2.0)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    SUMS.clear()
    fast = agspeed.optimize(notes_sums, backend="eager", fullgraph=True)
    xs, misses = [], 0
    for n in (1, 2, 3):
        xs.append(torch.randn(3))
        misses = agspeed.counters()["cache_misses"] if n == 2 else misses
        got = fast(xs[-1], 2.0)
        torch.testing.assert_close(got[0], 3 * xs[-1])
        assert got[1:] == (2, 2.0)
        assert list(SUMS) == ["sums"] and len(SUMS["sums"]) == n
    torch.testing.assert_close(torch.stack(SUMS["sums"]), torch.stack(xs).sum(1))
    # the key missing, then present: captured again once; the factory guarded, not
    # what it made
    assert agspeed.counters()["cache_misses"] == misses + 1
    SUMS.clear()


def test_a_defaultdict_of_the_program_with_a_python_factory_is_changed_through_a_shadow():
    def fill(d, x):
        d["a"] = x + 1
        return d["b"], d          # "b" is missing: the factory's dict is stored

    x = torch.randn(2, 2)
    d, ref = collections.defaultdict(lambda: {}), collections.defaultdict(lambda: {})
    fast = agspeed.optimize(fill, backend="eager", fullgraph=True)
    (got, back), (want, _) = fast(d, x), fill(ref, x)
    assert back is d and got == want == {} and got is d["b"]
    assert list(d) == list(ref) == ["a", "b"]
    torch.testing.assert_close(d["a"], x + 1)
    factory = d.default_factory
    d.default_factory = lambda: {"other": 1}      # a new factory: captured again
    d.pop("b")
    got, _ = fast(d, x)
    assert got == {"other": 1} and d.default_factory is not factory


def test_a_python_factory_with_a_tensor_key_missing_breaks_and_runs_eager():
    params = [torch.nn.Parameter(torch.randn(2))]
    state = collections.defaultdict(lambda: {"n": 0})

    def step(x):
        for p in params:
            state[p]["n"] += 1
        return x * 2

    fast = agspeed.optimize(step, backend="eager")
    for n in (1, 2):
        torch.testing.assert_close(fast(torch.ones(2)), torch.full((2,), 2.0))
        assert state[params[0]] == {"n": n}


def test_the_programs_containers_inside_a_changed_dict_keep_their_identity():
    """Writing a dict back after the frame changed it puts the program's own lists and
    dicts back in it (and returns them) as eager leaves them, on every call, not the
    objects the capture saw nor copies."""
    def change(d, x):
        d["history"]["last"] = x * 2      # a dict inside, changed too
        d["step"] = x + 1
        return d["items"], d["history"]

    fast = agspeed.optimize(change, backend="eager", fullgraph=True)
    for _ in range(3):
        items, history = [1, 2], {}
        d = {"items": items, "history": history}
        x = torch.randn(2)
        got_items, got_history = fast(d, x)
        assert d["items"] is items and got_items is items
        assert d["history"] is history and got_history is history
        torch.testing.assert_close(history["last"], 2 * x)
        torch.testing.assert_close(d["step"], x + 1)

