"""Dicts of the program keyed by tensors (parameters, arguments; hashed by identity):
stored into, read with ``d[t]``, ``d.get(t)`` and ``t in d``, captured with eager's
results, the very tensor objects written back as keys; a tensor the graph computes, or a
dict the capture built, keyed by a tensor still breaks with eager's result; nothing is
kept alive by the entry."""

import collections
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


def _decisions():
    return [r.decision for r in agspeed._runtime.frame_records()]


@pytest.mark.parametrize("factory", [dict, list, tuple, set])
def test_a_defaultdict_of_the_program_keyed_by_a_parameter(factory):
    agspeed.reset()
    dd = collections.defaultdict(factory)
    param = torch.nn.Parameter(torch.ones(2, 2))

    def fn(x):
        dd["a"] = x + 1
        dd[param] = 123
        dd["c"] = x * 2
        return dd["b"], dd

    x = torch.randn(4, 4)
    fn(x)   # eager first: the dict holds the parameter as a key already
    first, same = agspeed.optimize(fn, backend="eager", fullgraph=True)(x)
    assert same is dd and first == factory()
    assert list(dd) == ["a", param, "c", "b"] and list(dd)[1] is param
    assert dd[param] == 123
    torch.testing.assert_close(dd["a"], x + 1)
    torch.testing.assert_close(dd["c"], x * 2)


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.uses = {}

    def forward(self, x):
        w = self.fc.weight
        self.uses[w] = self.uses.get(w, 0) + 1
        if w in self.uses:
            x = x * 2
        return self.fc(x)


def test_a_module_counting_uses_per_parameter_matches_eager():
    agspeed.reset()
    torch.manual_seed(0)
    ref, mine = Counting(), Counting()
    mine.load_state_dict(ref.state_dict())
    fast = agspeed.optimize(mine, backend="eager")
    for _ in range(6):
        x = torch.randn(2, 3)
        torch.testing.assert_close(fast(x), ref(x))
    (key,) = mine.uses
    assert key is mine.fc.weight and mine.uses[key] == 6 == ref.uses[ref.fc.weight]
    assert not [d for d in _decisions() if "break" in d], _decisions()


def test_keys_passed_in_are_written_back_as_themselves():
    agspeed.reset()

    def store(d, k, x):
        d[k] = x.sum()
        return x * 2

    fast = agspeed.optimize(store, backend="eager", fullgraph=True)
    d = {"a": 1}
    k1, k2 = torch.ones(2), torch.ones(2)
    for k in (k1, k2, k1, k2):
        x = torch.randn(2)
        torch.testing.assert_close(fast(d, k, x), x * 2)
        assert d[k] == x.sum()
    assert list(d) == ["a", k1, k2] and list(d)[1] is k1 and list(d)[2] is k2


def test_membership_and_reads_by_a_tensor_key():
    def look(d, k, x):
        if k in d:
            return x + d[k]
        return x - 1

    fast = agspeed.optimize(look, backend="eager", fullgraph=True)
    k, other = torch.zeros(1), torch.zeros(1)
    x = torch.randn(3)
    d = {k: torch.full((3,), 5.0)}
    torch.testing.assert_close(fast(d, k, x), look(d, k, x))
    torch.testing.assert_close(fast({"z": 1}, other, x), look({"z": 1}, other, x))
    d[k] = torch.full((3,), 7.0)   # the value read on every call
    torch.testing.assert_close(fast(d, k, x), look(d, k, x))


def test_a_computed_key_or_a_built_dict_keyed_by_a_tensor_breaks_with_eagers_result():
    def computed(d, x):
        d[x * 2] = 1
        return x + 1

    def built(p, x):
        d = {}
        d[p] = x
        return d

    agspeed.reset()
    d = {}
    x = torch.randn(2)
    torch.testing.assert_close(agspeed.optimize(computed, backend="eager")(d, x), x + 1)
    (key,) = d
    torch.testing.assert_close(key, x * 2)
    p = torch.nn.Parameter(torch.ones(1))
    out = agspeed.optimize(built, backend="eager")(p, x)
    assert type(out) is dict and list(out)[0] is p and out[p] is x
    assert any("break" in d for d in _decisions())


def test_the_entry_keeps_neither_the_dict_nor_its_keys_alive():
    def store(d, k, x):
        d[k] = x.sum()
        return x * 2

    fast = agspeed.optimize(store, backend="eager")
    d, k = {}, torch.ones(2)
    d[k] = 0
    for _ in range(2):
        fast(d, k, torch.randn(2))
    gone = weakref.ref(k)
    del d, k
    gc.collect()
    assert gone() is None


def test_a_computed_key_read_from_a_defaultdict_of_the_program_breaks_cleanly():
    def read(dd, k, x):
        dd["seen"] = 1            # the capture's copy of the dict, from here on
        dd[x * 2].append(1)       # a missing key the factory fills: a computed tensor
        return k in dd

    dd = collections.defaultdict(list)
    k = torch.ones(1)
    x = torch.randn(1)
    assert agspeed.optimize(read, backend="eager")(dd, k, x) is False
    assert len(dd) == 2 and dd["seen"] == 1
    assert [v for key, v in dd.items() if not isinstance(key, str)] == [[1]]


def test_an_absent_tensor_key_of_a_dict_keyed_by_objects_is_not_assumed_absent():
    class Tag:
        pass

    def has(d, k, x):
        return x + 1 if k in d else x - 1

    fast = agspeed.optimize(has, backend="eager")
    k, x = torch.ones(1), torch.zeros(1)
    d = {Tag: 1}
    torch.testing.assert_close(fast(d, k, x), has(d, k, x))
    d = {k: 1}   # the same length, the tensor now a key
    torch.testing.assert_close(fast(d, k, x), has(d, k, x))
