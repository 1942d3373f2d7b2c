"""Plain ints and floats that keep changing become symbols: a position argument
(``x[:, pos:pos+n]``), a step counter written back (``self.steps += 1``), a mixing weight.
After ``dynamic_after`` distinct values one graph serves every value, with eager's results
and result types; what the code decides on an int (a branch, ``n % k``) is guarded
symbolically; an int the code fixes anyway (a loop over ``range(n)``, a list index) and a
float anything is decided on are never made symbols again; ``dynamic=False`` and backends
without dynamic support keep them static, and floats are symbols only for backends that
declare ``float_inputs``; compiled guards agree with their Python reading; nothing
leaks."""

import gc
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from agspeed.protocol import Check  # noqa: E402
from test_checks import Counting  # noqa: E402

pytestmark = pytest.mark.torch


def entries(fn):
    code = fn.__code__ if hasattr(fn, "__code__") else type(fn).forward.__code__
    return _C.code_cache(code)["entries"]


def window(x, pos):
    return x[:, pos:pos + 3] * pos + 1


def test_a_position_argument_goes_dynamic_and_one_graph_serves_every_value():
    backend = Counting()
    fast = agspeed.optimize(window, backend=backend)
    x = torch.randn(4, 40, requires_grad=True)
    for pos in range(20):
        got, want = fast(x, pos), window(x, pos)
        torch.testing.assert_close(got, want)
        (g,) = torch.autograd.grad(got.sum(), x)
        (w,) = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(g, w)
    assert backend.graphs == 3   # 0 and 1 static, then the symbol from the third value
    (entry,) = entries(window)   # the static entries were replaced
    assert entry.hits == 20 - 3
    assert any(c[1] == Check.DYNINT for c in entry.guard.checks)
    (record,) = agspeed.recompiles()
    assert record.dynamic == ("pos",) and record.count == 2
    # past the end of x: an empty slice, as in eager
    assert fast(x, 45).shape == window(x, 45).shape == (4, 0)


class Stepping(nn.Module):
    """A counter read and written back on every call, and used by the graph."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        y = self.fc(x) * (self.steps % 3 + 1)
        if self.steps % 4 == 0:
            y = -y
        return y, self.steps


def test_a_counter_written_back_on_every_call_stops_recompiling():
    torch.manual_seed(0)
    model, twin = Stepping(), Stepping()
    twin.load_state_dict(model.state_dict())
    backend = Counting()
    fast = agspeed.optimize(twin, backend=backend)
    x = torch.randn(3, 8)
    for _ in range(24):
        (got, n), (want, m) = fast(x), model(x)
        torch.testing.assert_close(got, want)
        assert n == m and type(n) is int
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(twin.fc.weight.grad, model.fc.weight.grad)
    assert twin.steps == model.steps == 24 and type(twin.steps) is int
    # two static captures, then one per side of `steps % 4 == 0`
    assert backend.graphs == 4
    assert len(entries(twin)) == 2
    assert agspeed.recompiles()[0].dynamic == ("self.steps",)


def test_a_branch_on_the_int_is_guarded_on_both_sides():
    def signed(x, n):
        if n > 5:
            return x + n
        return x - n

    backend = Counting()
    fast = agspeed.optimize(signed, backend=backend)
    x = torch.randn(3)
    for n in list(range(12)) + [-7, 100, 3, 6]:
        torch.testing.assert_close(fast(x, n), signed(x, n))
    assert backend.graphs == 4   # 0, 1, then n <= 5 and n > 5


def test_a_first_call_that_did_no_tensor_work_leaves_other_values_to_capture():
    # n == 0 returns x untouched: that call runs eager, and only calls like it do; the
    # values that do tensor work are captured
    def scaled(x, n):
        if n == 0:
            return x
        return x * n + 1

    backend = Counting()
    fast = agspeed.optimize(scaled, backend=backend)
    x = torch.randn(3)
    assert fast(x, 0) is x
    assert backend.graphs == 0
    for n in (2, 0, 3, 4, 0, 5):
        out = fast(x, n)
        torch.testing.assert_close(out, scaled(x, n))
        assert (out is x) == (n == 0)
    assert backend.graphs == 2   # n == 2, then one graph for every n != 0
    counters = agspeed.counters()
    assert counters["graph_calls"] == 4


class _Token:
    """A plain object passed to a call that does no tensor work."""


def test_the_eager_entry_of_a_call_without_tensor_work_keeps_no_argument_alive():
    def idle(x, token, n):
        if n == 0:
            return x
        return x * n

    fast = agspeed.optimize(idle)
    x, token = torch.randn(3), _Token()
    before = sys.getrefcount(x)
    gone = weakref.ref(token)
    assert fast(x, token, 0) is x
    assert len(entries(idle)) == 1
    del token
    gc.collect()
    assert gone() is None
    assert sys.getrefcount(x) == before


def test_plain_python_called_with_new_ints_is_not_captured_again():
    # no tensor among the arguments: another value runs eager at once
    def arithmetic(a, b):
        return a * b + 1

    fast = agspeed.optimize(arithmetic)
    assert [fast(a, 3) for a in range(10)] == [a * 3 + 1 for a in range(10)]
    assert len(entries(arithmetic)) == 1
    assert not [r for r in agspeed.recompiles() if r.function.startswith("arithmetic ")]


def test_ints_returned_and_formatted_keep_their_values_and_types():
    def report(x, n):
        return x * 2, n + 1, n * 3 // 2, -n, f"step {n}", n / 4

    fast = agspeed.optimize(report, backend="eager")
    x = torch.randn(2)
    for n in range(-3, 9):
        got, want = fast(x, n), report(x, n)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
        assert [type(v) for v in got] == [type(v) for v in want]
    (mine,) = [r for r in agspeed.recompiles() if r.function.startswith("report ")]
    assert mine.dynamic == ("n",)


def test_a_method_of_an_int_made_a_symbol_taken_by_getattr():
    # getattr(n, name)() is n.name(): the symbolic int's method, called on the plain int
    # the graph is given (a recorded torch function would be written as torch.<name>)
    def scaled(x, n, name):
        return x * getattr(n, name)() + getattr(n, "conjugate")()

    fast = agspeed.optimize(scaled, backend="eager", fullgraph=True)
    x = torch.randn(2)
    for name in ("conjugate", "bit_length"):
        for n in (1, 2, 30, 400, 5000):
            torch.testing.assert_close(fast(x, n, name), scaled(x, n, name))
    assert agspeed.recompiles()[0].dynamic == ("n",)


def test_an_int_the_code_fixes_is_never_made_a_symbol_again():
    def unrolled(x, n):
        for k in range(n):
            x = x + k
        return x * 2

    seen = []

    def backend(gm, example_inputs):
        seen.append(sum(isinstance(v, int) for v in example_inputs))
        return gm.forward

    fast = agspeed.optimize(unrolled, backend=backend)
    x = torch.randn(3)
    for n in range(1, 7):
        torch.testing.assert_close(fast(x, n), unrolled(x, n))
    # the third capture tried the symbol (the loop fixed it); the later ones do not
    assert seen == [0, 0, 1, 0, 0, 0]
    assert agspeed.recompiles()[0].dynamic == ()


def test_dynamic_false_and_backends_without_dynamic_support_keep_ints_static():
    class Static(Counting):
        supports_dynamic = False

    x = torch.randn(4, 40)
    for backend, options in ((Counting(), {"dynamic": False}), (Static(), {})):
        agspeed.reset()
        fast = agspeed.optimize(window, backend=backend, **options)
        for pos in range(6):
            torch.testing.assert_close(fast(x, pos), window(x, pos))
        assert backend.graphs == 6


def test_an_int_beyond_int64_is_a_constant_and_bools_are_not_ints():
    def scaled(x, n):
        return x * (n % 7)

    fast = agspeed.optimize(scaled, backend="eager")
    x = torch.randn(3)
    for n in (1, 2, 3, 4, 10 ** 30, 10 ** 30 + 1, True, False, 5):
        got, want = fast(x, n), scaled(x, n)
        torch.testing.assert_close(got, want)
        assert got.dtype == want.dtype


def test_compiled_int_guards_agree_with_their_python_reading():
    fast = agspeed.optimize(window, backend="eager")
    x = torch.randn(4, 40)
    for pos in range(4):
        fast(x, pos)
    (entry,) = entries(window)
    guard = entry.guard
    builtins = vars(__builtins__) if not isinstance(__builtins__, dict) else __builtins__
    answers = []
    for pos in (7, -2, 0, 1 << 62, 1 << 64, True, 3.0, "3", None, torch.tensor(3)):
        frame = ({"x": x, "pos": pos}, globals(), builtins)
        got = guard(*frame)
        assert got == guard.check_in_python(*frame), repr(pos)
        assert got == (not guard.failures(*frame))
        answers.append(got)
    # served: ints that keep the slice's facts (0 <= pos <= 37); refused: a negative
    # start (another meaning), past the end, beyond int64, other types
    assert answers == [True, False, True] + [False] * 7
    fail = guard.first_failure({"x": x, "pos": 3.0}, globals(), builtins)
    assert fail.startswith("pos: expected an int")


def test_dynamic_int_entries_leak_nothing_and_die_with_the_cache():
    model = Stepping()
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(3, 8)
    for _ in range(12):
        fast(x)
    before = sys.getrefcount(x)
    gc.collect()
    blocks = sys.getallocatedblocks()
    for _ in range(400):
        fast(x)
    gc.collect()
    assert sys.getrefcount(x) == before
    assert sys.getallocatedblocks() - blocks < 50
    refs = [weakref.ref(e.guard) for e in entries(model)]
    agspeed.reset()
    gc.collect()
    assert refs and [r() for r in refs] == [None] * len(refs)


class Logged(nn.Module):
    """A counter, and a graph break (print) with the int live across it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.steps = 0

    def forward(self, x, scale):
        self.steps += 1
        y = self.fc(x) * scale
        print("step", self.steps, end="; ")
        return y + self.steps * scale


def test_a_counter_at_a_graph_break_is_resumed_and_goes_dynamic(capsys):
    torch.manual_seed(0)
    model, twin = Logged(), Logged()
    twin.load_state_dict(model.state_dict())
    fast = agspeed.optimize(twin)
    x = torch.randn(2, 4)
    for k in range(12):
        torch.testing.assert_close(fast(x, k % 5), model(x, k % 5))
    assert twin.steps == model.steps == 12
    out = capsys.readouterr().out.split("; ")[:-1]
    assert out[0::2] == out[1::2]   # each step printed the same by both
    counts = agspeed.counters()
    assert counts["graph_calls"] >= 2 * (12 - 3)   # both sides of the break, graphs
    records = {r.function.split()[0]: r for r in agspeed.recompiles()}
    assert "self.steps" in records["forward"].dynamic


def reshaped(x, shape, n):
    y = x.reshape(shape) * n   # the list checked whole, by equality
    print(end="")   # a graph break
    return y + n


def test_a_break_recurring_with_a_list_checked_resumes_and_goes_dynamic():
    """The checks a recurring break drops are compared by identity: a list expectation
    (unhashable) among them once made the runtime fail and run the frame eager."""
    fast = agspeed.optimize(reshaped, backend="eager")
    x = torch.randn(6)
    shape = [2, 3]
    for k in range(8):
        torch.testing.assert_close(fast(x, shape, k), reshaped(x, shape, k))
    # both sides of the break run graphs once n is a symbol (from the third call)
    assert agspeed.counters()["graph_calls"] >= 2 * 6
    assert "n" in agspeed.recompiles()[0].dynamic


class CachedAttention(nn.Module):
    """Decoding with a key/value cache, as LLaMA's reference code writes it: the
    position ``start_pos`` (an int) slices the cache, is written at, and widens the
    mask of a prompt."""

    def __init__(self, dim=16, heads=2, max_len=48):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.register_buffer("ck", torch.zeros(2, heads, max_len, dim // heads))
        self.register_buffer("cv", torch.zeros(2, heads, max_len, dim // heads))

    def forward(self, x, start_pos):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        self.ck[:b, :, start_pos:start_pos + n] = k
        self.cv[:b, :, start_pos:start_pos + n] = v
        keys, values = self.ck[:b, :, :start_pos + n], self.cv[:b, :, :start_pos + n]
        scores = q @ keys.transpose(2, 3) / (d // self.heads) ** 0.5
        if n > 1:
            mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
            scores = scores + torch.hstack([torch.zeros(n, start_pos), mask])
        y = scores.softmax(-1) @ values
        return self.out(y.transpose(1, 2).reshape(b, n, d))


@torch.no_grad()
def decode(step, prompt, steps):
    out, pos = [step(prompt, 0)[:, -1:]], prompt.shape[1]
    for _ in range(steps):
        out.append(step(out[-1], pos))
        pos += 1
    return torch.cat(out, 1)


def test_decoding_with_a_kv_cache_compiles_three_graphs_for_every_position():
    torch.manual_seed(0)
    model, twin = CachedAttention(), CachedAttention()
    twin.load_state_dict(model.state_dict())
    backend = Counting()
    fast = agspeed.optimize(twin, backend=backend)
    prompt = torch.randn(2, 5, 16)
    torch.testing.assert_close(decode(fast, prompt, 30), decode(model, prompt, 30))
    torch.testing.assert_close(twin.ck, model.ck)
    # the prompt, the first decoding step, then one graph for every later position
    assert backend.graphs == 3
    assert agspeed.recompiles()[0].dynamic == ("start_pos",)


def test_a_tensor_indexed_by_the_int_keeps_it_a_symbol():
    def row(x, n):
        return x[n] * 2 + x.select(1, n)

    backend = Counting()
    fast = agspeed.optimize(row, backend=backend)
    x = torch.randn(12, 12)
    for n in list(range(12)) + [-1, -12, 5]:
        torch.testing.assert_close(fast(x, n), row(x, n))
    assert backend.graphs == 3 + 1   # 0, 1, every n >= 0, every negative n


@pytest.mark.cxx_exceptions   # libtorch throws the fake select's IndexError
def test_an_index_past_the_end_raises_eagers_error():
    def row(x, n):
        return x[n] * 2

    fast = agspeed.optimize(row, backend="eager")
    x = torch.randn(12, 12)
    for n in range(4):
        fast(x, n)
    with pytest.raises(IndexError) as want:
        row(x, 12)
    with pytest.raises(IndexError) as got:
        fast(x, 12)
    assert str(got.value) == str(want.value)


class FloatTaking(Counting):
    capabilities = agspeed.backends.Capabilities(float_inputs=True)


def mix(x, y, lam):
    return lam * x + (1 - lam) * y, 1 - lam


def test_a_changing_float_goes_dynamic_for_a_backend_that_takes_float_inputs():
    backend = FloatTaking()
    fast = agspeed.optimize(mix, backend=backend)
    x, y = torch.randn(4, requires_grad=True), torch.randn(4)
    for lam in (0.1, 0.25, 0.5, 0.75, float("inf"), -0.0, 2.5):
        (got, g), (want, w) = fast(x, y, lam), mix(x, y, lam)
        torch.testing.assert_close(got, want, equal_nan=True)
        assert type(g) is float and g == w
        (ga,) = torch.autograd.grad(got.nan_to_num().sum(), x)
        (wa,) = torch.autograd.grad(want.nan_to_num().sum(), x)
        torch.testing.assert_close(ga, wa, equal_nan=True)
    assert backend.graphs == 3
    assert agspeed.recompiles()[0].dynamic == ("lam",)
    # an int where the float was: another type, another entry, eager's result
    torch.testing.assert_close(fast(x, y, 2)[0], mix(x, y, 2)[0])
    assert backend.graphs == 4


def gate(x, lam):
    return x * lam if lam > 0.5 else x - lam


def test_a_float_the_code_compares_stays_a_symbol_guarded_by_the_comparison():
    # (SGD's `if momentum != 0` under a scheduler cycling the momentum)
    backend = FloatTaking()
    fast = agspeed.optimize(gate, backend=backend)
    x = torch.randn(3)
    for lam in (0.1, 0.7, 0.2, 0.9, 0.3, 0.8, 0.5, 0.45, float("inf"), float("nan")):
        torch.testing.assert_close(fast(x, lam), gate(x, lam), equal_nan=True)
    # 0.1 and 0.7 constants; 0.2 a symbol with lam <= 0.5, 0.9 one with lam > 0.5; the
    # rest served by those two; NaN, which no comparison orders, captured apart
    assert backend.graphs == 5 and agspeed.recompiles()[0].dynamic == ("lam",)
    guards = [line for e in entries(gate) for line in e.guard.lines()]
    assert "size: lam <= 0.5" in guards and "size: lam > 0.5" in guards, guards


def test_a_float_the_code_finds_equal_to_a_value_stays_a_constant():
    def snap(x, lam):
        return x * 2 if lam == 0.25 else x * lam

    backend = FloatTaking()
    fast = agspeed.optimize(snap, backend=backend)
    x = torch.randn(3)
    values = (0.1, 0.2, 0.25, 0.3, 0.25, 0.4)
    for lam in values:
        torch.testing.assert_close(fast(x, lam), snap(x, lam))
    assert backend.graphs == 5 and agspeed.recompiles()[0].dynamic == ()


def test_floats_stay_constants_for_backends_that_do_not_declare_float_inputs():
    from agspeed.backends import get_backend, takes_float_inputs

    assert takes_float_inputs(get_backend("eager"))
    assert takes_float_inputs(get_backend("inductor"))   # as 0-d tensors
    assert not takes_float_inputs(get_backend("jit"))
    assert takes_float_inputs(get_backend("auto"))   # its candidates are filtered
    assert not takes_float_inputs(Counting())
    backend = Counting()
    fast = agspeed.optimize(mix, backend=backend)
    x, y = torch.randn(4), torch.randn(4)
    for lam in (0.1, 0.2, 0.3, 0.4):
        torch.testing.assert_close(fast(x, y, lam)[0], mix(x, y, lam)[0])
    assert backend.graphs == 4


def test_dynamic_true_makes_int_arguments_symbols_from_the_first_capture():
    backend = Counting()
    fast = agspeed.optimize(window, backend=backend, dynamic=True)
    x = torch.randn(4, 40)
    for pos in range(10):
        torch.testing.assert_close(fast(x, pos), window(x, pos))
    assert backend.graphs == 1
    assert "pos" in agspeed.recompiles()[0].dynamic


class _Window:
    def __init__(self):
        self.seen, self.width = 0, 4


def windowed(x, state):
    state.seen += x.shape[0]
    offset = max(state.seen - state.width + 1, 0)
    last = min(state.seen, state.width)
    return x * last + offset


def test_max_and_min_of_a_counter_keep_it_dynamic():
    """max()/min() of ints among which is a symbol are symbols again (torch.sym_max):
    taking the counter's value there would capture again on every call."""
    agspeed.reset()
    fast = agspeed.optimize(windowed, backend="eager")
    mine, ref = _Window(), _Window()
    for step in range(12):
        x = torch.randn(1 if step else 3)
        torch.testing.assert_close(fast(x, mine), windowed(x, ref))
        assert mine.seen == ref.seen
    (record,) = [r for r in agspeed.recompiles() if r.function.startswith("windowed ")]
    assert record.dynamic == ("state.seen",) and record.count <= 3


class Mixing(nn.Module):
    """Floats kept in the program's tuple and dict, changed between calls, as an LR
    scheduler changes an optimizer's ``betas`` and ``lr``."""

    def __init__(self):
        super().__init__()
        self.betas = (0.9, 0.999)
        self.cfg = {"scale": 1.0, "pair": (0.5, 2)}

    def forward(self, x):
        b1, b2 = self.betas
        y = x * b1 + self.betas[-1] * x.sin() + len(self.betas)
        y = y * self.cfg["scale"] + self.cfg["pair"][0] * self.cfg["pair"][1]
        self.saved = self.betas   # the tuple itself, stored and returned
        return y, self.betas


def _mix_both(model, fast, x):
    want = Mixing.forward(model, x)
    want_saved = model.saved
    got = fast(x)
    torch.testing.assert_close(got[0], want[0])
    for out, expected in ((got[1], want[1]), (model.saved, want_saved)):
        assert type(out) is type(expected) and out == expected
        assert [type(v) for v in out] == [type(v) for v in expected]


def test_floats_in_the_programs_tuples_and_dicts_go_dynamic_item_by_item():
    backend = FloatTaking()
    model = Mixing()
    fast = agspeed.optimize(model, backend=backend)
    for i in range(8):
        model.betas = (0.9 - i / 100, 0.999)
        model.cfg["scale"] = 1.0 + i
        model.cfg["pair"] = (0.5 + i, 2)
        _mix_both(model, fast, torch.randn(3))
    assert backend.graphs == 3
    (record,) = agspeed.recompiles()
    assert set(record.dynamic) == {"self.betas[0]", "self.cfg['scale']",
                                   "self.cfg['pair'][0]"}
    entry = entries(model)[0]   # the dynamic one (newest first), used by every call since
    assert entry.hits == 8 - 3
    checks = {c[0]: c[1] for c in entry.guard.checks}
    assert checks[("attr", ("local", "self"), "betas")] == Check.LEN   # not its values
    graphs = backend.graphs
    # the item that stayed the same is still checked, an int item stays a constant,
    # and a tuple of another length, of another type, or with an int where the float
    # was is not the one the graph was made for
    for betas, pair in (((0.5, 0.75), (1.5, 2)), ((0.5, 0.999), (1.5, 3)),
                        ((0.5, 0.25, 0.999), (1.5, 2)), ([0.5, 0.999], (1.5, 2)),
                        ((1, 0.999), (1.5, 2))):
        model.betas, model.cfg["pair"] = betas, pair
        if len(betas) == 3:
            with pytest.raises(ValueError, match="too many values to unpack"):
                fast(torch.randn(3))
            continue
        _mix_both(model, fast, torch.randn(3))
        assert backend.graphs == graphs + 1
        graphs = backend.graphs


def test_a_float_tuple_used_whole_stays_a_constant():
    """A tuple the code hands whole to torch (``torch.tensor(betas)``) is decided on:
    its items are never made symbols, each tuple compiles apart, eager's results."""
    def fn(x, model):
        return x * torch.tensor(model.betas).sum() + model.betas[0]

    backend = FloatTaking()
    fast = agspeed.optimize(fn, backend=backend)
    model = Mixing()
    for i in range(5):
        model.betas = (0.9 - i / 10, 0.5)
        x = torch.randn(3)
        torch.testing.assert_close(fast(x, model), fn(x, model))
    assert backend.graphs == 5 and agspeed.recompiles()[0].dynamic == ()


def test_tuples_loaded_item_by_item_keep_no_reference():
    backend = FloatTaking()
    model = Mixing()
    fast = agspeed.optimize(model, backend=backend)
    made = []
    for i in range(3):   # the third capture loads the tuple item by item
        made.append((0.5 + i / 10, 0.999 + i / 1000))
        model.betas = made[-1]
        fast(torch.randn(3))
    assert backend.graphs == 3
    captured = made[-1]
    model.betas = t = (0.25 + len(made) / 1000, 0.999)
    counts = sys.getrefcount(t), sys.getrefcount(captured)
    for _ in range(3):
        out = fast(torch.randn(3))
    del out
    model.saved = None
    assert (sys.getrefcount(t), sys.getrefcount(captured)) == counts
    assert backend.graphs == 3
    agspeed.reset()
    gc.collect()
    assert sys.getrefcount(captured) == 3   # made, the local, the argument


def test_an_int_read_out_of_the_programs_tuple_goes_dynamic_too():
    """``x[:, :self.cfg[0]]``: an int read by itself out of a tuple of the program
    becomes a symbol as an attribute's does, the tuple checked by its length."""
    class Sliced(nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = (2, 0.5)

        def forward(self, x):
            return x[:, :self.cfg[0]] * self.cfg[1] + len(self.cfg)

    backend = FloatTaking()
    model = Sliced()
    fast = agspeed.optimize(model, backend=backend)
    for n in range(2, 10):
        model.cfg = (n, 0.5 + n)
        x = torch.randn(3, 12)
        torch.testing.assert_close(fast(x), Sliced.forward(model, x))
    (record,) = agspeed.recompiles()
    assert set(record.dynamic) == {"self.cfg[0]", "self.cfg[1]"}
    assert backend.graphs <= 5 and entries(model)[0].hits >= 3


def test_guards_said_in_python_decide_as_sympy_does():
    import sympy

    from agspeed._shapes import python_check, to_python

    s, f = sympy.Symbol("s", integer=True), sympy.Symbol("f")
    guards = [sympy.Ne(f, 0), sympy.Gt(2 * f + 1, s), sympy.Le(f, sympy.Rational(1, 3)),
              sympy.Or(sympy.Eq(s, 4), sympy.Ge(s * s, 9)), sympy.Lt(f, 0.30000000000000004)]
    for g in guards:
        check = python_check([g], [s, f])
        for sv, fv in [(4, 0.0), (3, 0.25), (1, -0.5), (5, 1 / 3), (2, 0.3),
                       (3, 0.30000000000000004)]:
            want = bool(g.xreplace({s: sympy.Integer(sv), f: sympy.Float(fv)}))
            assert check((sv, fv)) is want, (g, sv, fv)
        assert check((None, 0.5)) is False   # an unbound symbol: the guard fails
    assert to_python(sympy.Function("Unknown")(s), {s: 0}) is None
    assert python_check([sympy.Function("Unknown")(s) > 0], [s]) is None
