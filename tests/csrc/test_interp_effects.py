"""The symbolic interpreter's side effects, with the recording builder of test_interp.py:
attribute and global writes handed to the builder, never done; the program's lists and
dicts changed in shadows only; a list only appended to gets a tail, only its type
assumed.  Torch-free."""

from agspeed.protocol import Reason
from test_interp import Configured, GraphBreakLike, Recorder, T, capture


def stores_attribute(x, h):
    h.seen = 1
    return x * 2


def test_attribute_writes_are_handed_to_the_builder_not_done():
    h = Configured()
    out, b = capture(stores_attribute, x=T(), h=h)
    assert out["status"] == "graph", out
    assert b.writes == [(("local", "h"), "seen", 1)]
    assert not hasattr(h, "seen")  # the capture never writes; the entry replays it


STEPS = 0


def counts_globally(x):
    global STEPS
    STEPS = STEPS + 1
    return x * STEPS, STEPS


def test_global_writes_are_handed_to_the_builder_and_read_back():
    out, b = capture(counts_globally, x=T())
    assert out["status"] == "graph", out
    module = ("item", ("gmod", "sys", "modules"), counts_globally.__module__)
    assert b.writes == [(module, "STEPS", 1)]
    assert STEPS == 0                           # the capture never writes
    assert b.ops[0][0] == "mul" and b.ops[0][1][1] == 1   # the stored value, read back
    assert out["result"][1] == 1


REGISTRY = [1]


def changes_the_programs_containers(x, table):
    REGISTRY.append(x)
    table["seen"] = len(REGISTRY)
    alias = REGISTRY  # another load of the same list: its shadow
    alias.append(2)
    return x * table["seen"], len(REGISTRY)


def test_lists_and_dicts_of_the_program_are_changed_in_shadows_only():
    table = {"old": 0}
    out, b = capture(changes_the_programs_containers, x=T(), table=table)
    assert out["status"] == "graph", out
    assert REGISTRY == [1] and table == {"old": 0}  # the capture changes nothing
    # the first append makes a tail (the list's items unread), which the len() that
    # follows turns into the whole list
    ((src_tail, tail),) = b.tailed
    (src_list, shadow_list), (src_dict, shadow_dict) = b.shadows
    assert src_tail == src_list == ("global", "REGISTRY") and tail is shadow_list
    assert src_dict == ("local", "table")
    assert shadow_list[0] == 1 and shadow_list[2] == 2 and len(shadow_list) == 3
    assert shadow_dict == {"old": 0, "seen": 2}
    assert out["result"][1] == 3
    assert b.ops[-1][0] == "mul" and b.ops[-1][1][1] == 2


LOG = [1, 2]


def only_appends(x, out):
    LOG.append(x)
    LOG.extend([x, 3])
    out.append(x * 2)
    return x


def appends_after_reading(x, out):
    n = len(out)
    out.append(x)
    return x * n


def test_a_list_only_appended_to_is_not_read_only_its_type_is_assumed():
    out, b = capture(only_appends, x=T(), out=[T()])
    assert out["status"] == "graph", out
    assert not b.shadows and LOG == [1, 2]
    (log_src, log_tail), (out_src, out_tail) = b.tailed
    assert log_src == ("global", "LOG") and out_src == ("local", "out")
    assert len(log_tail) == 3 and log_tail[2] == 3 and len(out_tail) == 1
    sources = [src for src, _ in out["assumptions"]]
    assert ("global", "LOG") not in sources and ("local", "out") not in sources
    assert (("type", ("global", "LOG")), list) in out["assumptions"]
    assert (("type", ("local", "out")), list) in out["assumptions"]


def test_a_list_read_before_its_append_stays_assumed_whole():
    held = [1, 2]
    out, b = capture(appends_after_reading, x=T(), out=held)
    assert out["status"] == "graph", out
    assert (("local", "out"), held) in out["assumptions"]
    assert not b.tailed and len(b.shadows) == 1


class Bag:
    pass


class Folding(Recorder):
    """Folds delattr as the runtime's builder does: on the objects it made only."""

    def fold(self, fn, args, kwargs):
        if fn is delattr:
            self.deleted.append(args)
            if not any(o is args[0] for o in self.made):
                raise GraphBreakLike(Reason.SIDE_EFFECT, f"deleting {args[1]!r}")
        return super().fold(fn, args, kwargs)


def deletes(x, kept):
    b = Bag()
    b.v, b.w = x, 2
    del b.w
    del kept.v
    return b.v


def test_del_of_an_attribute_is_delattr_folded_by_the_builder():
    b = Folding(classes=(Bag,))
    b.deleted = []
    kept = Bag()
    kept.v = 1
    out, b = capture(deletes, b, x=T(), kept=kept)
    assert out["status"] == "break" and out["reason"] == Reason.SIDE_EFFECT, out
    made = b.made[0]
    assert [(o is made, name) for o, name in b.deleted] == [(True, "w"), (False, "v")]
    assert not hasattr(made, "w") and made.v is not None
    assert kept.v == 1   # the program's object: left to eager after the break
