"""Sets of the program changed in the frame, in-place operators on lists, dicts and sets
(the capture's own and the program's), and tensors as dict keys.

A set of the program (a global registry of seen names, a set argument) is changed in a
shadow, as lists and dicts are (agspeed/_effects.py): guarded equal to what it held,
written back after the graph, the very object the caller holds.  ``acc += [x]`` and
``seen |= {k}`` change the object every other name for it sees.  A tensor used as a dict
key is refused where the capture would otherwise hold the graph's stand-in for it."""

import collections

import pytest

import agspeed
from _refs import assert_not_held

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch

SEEN_SIZES = set()


def notes_sizes(x):
    SEEN_SIZES.add(x.shape[0])
    SEEN_SIZES.discard(-1)
    return x * len(SEEN_SIZES)


def test_a_global_set_changes_as_in_eager_and_stays_that_object():
    SEEN_SIZES.clear()
    before = SEEN_SIZES
    fast = agspeed.optimize(notes_sizes, backend="eager")
    expected = set()
    for n in (2, 2, 3, 2, 4):
        x = torch.randn(n)
        expected.add(n)
        torch.testing.assert_close(fast(x), x * len(expected))
        assert SEEN_SIZES == expected and SEEN_SIZES is before
    SEEN_SIZES.clear()
    report = agspeed.explain(notes_sizes, torch.randn(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    SEEN_SIZES.clear()


def changes_a_set(x, tags):
    tags.add("seen")
    tags |= {"more", "seen"}
    tags -= {"old"}
    tags.update(["u"])
    total = x
    for t in sorted(tags):
        total = total + len(t)
    return total, tags


@pytest.mark.parametrize("start", [set(), {"old"}, {"old", "keep"}])
def test_a_set_argument_changed_every_way_is_the_callers_set(start):
    fast = agspeed.optimize(changes_a_set, backend="eager")
    for _ in range(2):
        mine, ref, x = set(start), set(start), torch.randn(3)
        got, back = fast(x, mine)
        want, _ = changes_a_set(x, ref)
        torch.testing.assert_close(got, want)
        assert back is mine and mine == ref
    report = agspeed.explain(changes_a_set, torch.randn(3), set(start))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def reads_a_set_it_did_not_change(x, tags):
    return x + (1 if "a" in tags else 0) + len(tags)


def test_a_set_only_read_is_guarded_by_its_members_and_written_nowhere():
    fast = agspeed.optimize(reads_a_set_it_did_not_change, backend="eager")
    for tags in ({"a"}, {"b"}, {"a", "b"}, {"a"}):
        mine, x = set(tags), torch.randn(2)
        torch.testing.assert_close(fast(x, mine), reads_a_set_it_did_not_change(x, tags))
        assert mine == tags


def tags_it(x, tags):
    tags.add("seen")
    return x + len(tags)


def test_a_set_holding_objects_breaks_cleanly_with_eagers_result():
    class Key:
        pass

    k = Key()
    report = agspeed.explain(tags_it, torch.randn(3), {Key()})
    assert any("set of the program holding a Key" in str(r) for r in report.break_reasons)
    fast = agspeed.optimize(tags_it, backend="eager")
    mine, ref, x = {k}, {k}, torch.randn(3)
    torch.testing.assert_close(fast(x, mine), tags_it(x, ref))
    assert mine == ref == {k, "seen"}


def test_a_tensor_put_in_a_set_of_the_program_is_the_tensor():
    def keeps(x, tags):
        tags.add(x)
        return x + 1

    fast = agspeed.optimize(keeps, backend="eager")
    mine, x = set(), torch.randn(2)
    torch.testing.assert_close(fast(x, mine), x + 1)
    assert len(mine) == 1 and next(iter(mine)) is x


def test_a_size_joins_a_set_as_its_number():
    def sizes(x, n):
        s = {n}
        s.add(x.shape[0])
        return x * len(s)

    fast = agspeed.optimize(sizes, backend="eager")
    for rows in (2, 3, 4, 5):
        x = torch.randn(rows)
        torch.testing.assert_close(fast(x, 4), sizes(x, 4))


def grows_everything(x, items, table, tags):
    alias = items
    items += [x * 2]
    items *= 1
    table |= {"y": x + 1}
    tags ^= {"flip"}
    built = [x]
    built += (x - 1,)
    both = {"a": 1}
    both |= [("b", 2)]
    return alias, table, tags, built, both


def test_in_place_operators_change_the_object_every_name_sees():
    fast = agspeed.optimize(grows_everything, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        mine = ([1.0], {"a": 2}, {"flip", "k"})
        ref = ([1.0], {"a": 2}, {"flip", "k"})
        got = fast(x, *mine)
        want = grows_everything(x, *ref)
        assert got[0] is mine[0] and got[1] is mine[1] and got[2] is mine[2]
        assert len(mine[0]) == 2 and mine[0][0] == 1.0
        torch.testing.assert_close(mine[0][1], ref[0][1])
        assert mine[1].keys() == ref[1].keys()
        torch.testing.assert_close(mine[1]["y"], ref[1]["y"])
        assert mine[2] == ref[2] == {"k"}
        torch.testing.assert_close(got[3], want[3])
        assert got[4] == want[4]
    report = agspeed.explain(grows_everything, torch.randn(3), [1.0], {}, set())
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def stores_then_grows(x):
    inner, outer, table, queue = [x], [], {}, collections.deque()
    outer.append(inner)          # the list itself, not its items at the time
    outer.insert(0, inner)
    table.setdefault("k", inner)
    queue.appendleft(inner)
    inner.append(x + 1)
    return outer, table, len(outer[1]) * x, queue


def holds_itself(x, as_dict):
    box = {"x": x * 2} if as_dict else [x * 2]
    if as_dict:
        box["self"] = box
    else:
        box.append(box)
    return box


def test_a_list_stored_by_a_method_is_the_object_its_later_changes_reach():
    fast = agspeed.optimize(stores_then_grows, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        (outer, table, scaled, queue), want = fast(x), stores_then_grows(x)
        assert outer[0] is outer[1] is table["k"] is queue[0]
        assert len(outer[0]) == 2
        torch.testing.assert_close(outer[0][1], want[0][0][1])
        torch.testing.assert_close(scaled, want[2])
    report = agspeed.explain(stores_then_grows, torch.randn(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_container_that_holds_itself_is_returned_as_eager_returns_it(as_dict, caplog):
    fast = agspeed.optimize(holds_itself, backend="eager")
    x = torch.randn(3)
    box = fast(x, as_dict)
    assert (box["self"] if as_dict else box[1]) is box
    torch.testing.assert_close(box["x" if as_dict else 0], x * 2)
    assert "internal error" not in caplog.text


LOOPED = []
LOOPED[:] = [LOOPED, LOOPED, None]
KNOTTED = {}
KNOTTED["me"] = KNOTTED


def returns_the_knots(x):
    return (LOOPED, KNOTTED), x + len(LOOPED)


def grows_a_loop(x, looped):
    looped.append(x * 2)
    y = x + len(looped) + len(LOOPED)
    looped.pop()
    LOOPED.append(y)
    return y


def test_containers_of_the_program_that_hold_themselves_are_read_changed_and_returned(
        caplog):
    # (a tuple holding a dict that holds itself crashed the interpreter, searching it for
    # graph values without end)
    fast = agspeed.optimize(returns_the_knots, backend="eager")
    for _ in range(2):
        (looped, knotted), y = fast(torch.ones(2))
        assert looped is LOOPED and knotted is KNOTTED and knotted["me"] is KNOTTED
        torch.testing.assert_close(y, torch.full((2,), 4.0))
    fast = agspeed.optimize(grows_a_loop, backend="eager")
    mine = []
    mine[:] = [mine]
    for _ in range(2):
        y = fast(torch.ones(2), mine)
        assert LOOPED.pop() is y and len(LOOPED) == 3 and LOOPED[0] is LOOPED
        assert mine == [mine] and mine[0] is mine
        torch.testing.assert_close(y, torch.full((2,), 6.0))
    assert "internal error" not in caplog.text


GROWN = [1]


def grows_a_global(x):
    global GROWN
    GROWN += [len(GROWN)]
    return x + len(GROWN)


def test_an_in_place_add_to_a_global_list_is_written_back():
    GROWN[:] = [1]
    before = GROWN
    fast = agspeed.optimize(grows_a_global, backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(fast(x), x + 2)
    torch.testing.assert_close(fast(x), x + 3)
    assert GROWN is before and GROWN == [1, 1, 2]


def or_with_a_list(x, tags):
    tags |= [1]
    return x


def test_an_in_place_operator_python_refuses_raises_eagers_error():
    fast = agspeed.optimize(or_with_a_list, backend="eager")
    with pytest.raises(TypeError, match="unsupported operand"):
        or_with_a_list(torch.randn(2), set())
    mine = set()
    with pytest.raises(TypeError, match="unsupported operand"):
        fast(torch.randn(2), mine)
    assert mine == set()


class ByParameter(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.counts = {}
        self.scales = {self.fc.weight: 3.0}

    def forward(self, x):
        self.counts[self.fc.weight] = self.counts.get(self.fc.weight, 0) + 1
        return self.fc(x) * self.scales.get(self.fc.weight, 1.0)


def test_a_dict_keyed_by_a_parameter_holds_the_parameter_and_finds_it():
    """The capture's stand-in for a tensor is never a key of the program's dict, and a
    lookup by a tensor finds what eager finds."""
    torch.manual_seed(0)
    model, ref = ByParameter(), ByParameter()
    ref.load_state_dict(model.state_dict())
    ref.scales = {ref.fc.weight: 3.0}
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(fast(x), ref(x))
    assert list(model.counts) == [model.fc.weight]
    assert list(model.counts.values()) == [3]


def keys_by_tensor(x, table):
    table[x] = 1
    table.setdefault(x * 2, 2)
    return x + 1


@pytest.mark.parametrize("fn", [keys_by_tensor])
def test_a_tensor_stored_as_a_key_is_the_tensor(fn):
    fast = agspeed.optimize(fn, backend="eager")
    mine, x = {}, torch.randn(2)
    torch.testing.assert_close(fast(x, mine), x + 1)
    keys = list(mine)
    assert len(keys) == 2 and keys[0] is x
    assert all(type(k) is torch.Tensor for k in keys)
    torch.testing.assert_close(keys[1], x * 2)


def test_a_changed_set_is_not_kept_alive_by_the_cache():
    fast = agspeed.optimize(changes_a_set, backend="eager")
    x = torch.randn(3)
    fast(x, set())
    tags = {"old"}
    fast(x, tags)
    assert_not_held(lambda t: fast(x, t)[1], tags, 10)



def compares_containers(x, seen, opts, order):
    made = {1, 2} == {2, 1} and [1, (2, 3)] == [1, (2, 3)] and {"k": [1]} != {"k": [2]}
    return x * made + x * (seen == {1, 2}) + (opts == {"lr": 0.1}) + (order < [2, 1])


def test_containers_of_plain_values_compare_in_the_capture_guarded_by_their_contents():
    e = agspeed.explain(compares_containers, torch.randn(2), {1, 2}, {"lr": 0.1}, [1, 2])
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    fast = agspeed.optimize(compares_containers, backend="eager")
    seen, opts, order = {1, 2}, {"lr": 0.1}, [1, 2]
    for change in (None, "seen", "opts", "order", None):
        if change == "seen":
            seen.add(3)
        elif change == "opts":
            opts["lr"] = 0.2
        elif change == "order":
            order[0] = 3
        x = torch.randn(2)
        torch.testing.assert_close(fast(x, seen, opts, order),
                                   compares_containers(x, seen, opts, order))


LABELS = ["cat", "dog", "cat"]


def finds_labels(x, order):
    return x * LABELS.index("dog") + LABELS.count("cat") + list.index(order, 3)


def test_a_list_of_the_programs_index_and_count_fold_guarded_by_its_values():
    e = agspeed.explain(finds_labels, torch.randn(2), [3, 1])
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    fast = agspeed.optimize(finds_labels, backend="eager")
    order = [3, 1]
    try:
        for change in (None, "labels", "order", None):
            if change == "labels":
                LABELS[:] = ["dog", "cat", "cat", "cat"]
            elif change == "order":
                order.insert(0, 5)
            x = torch.randn(2)
            torch.testing.assert_close(fast(x, order), finds_labels(x, order))
        with pytest.raises(ValueError):   # eager's error, from eager's own call
            fast(torch.randn(2), [1])
    finally:
        LABELS[:] = ["cat", "dog", "cat"]
