"""Sets and dict merges assembled at run time (csrc/interp_build.c), driven with the
recording builder of test_interp so they run on every version.  Torch-free."""

from agspeed.protocol import Reason
from test_interp import Node, Recorder, T, capture, tlib


def sets(x, more):
    s = {1, 2, *more}
    t = {i % 2 for i in range(5)}
    s.add(9)
    return len(s), len(t), 9 in s, x


def test_set_displays_comprehensions_and_adds_build_one_owned_set():
    out, b = capture(sets, x=T(), more=[2, 3])
    assert out["status"] == "graph", out
    assert out["result"][:3] == (4, 2, True)


def tensors_in_a_set(x):
    y = tlib.relu(x)
    s = {x, y, x}
    return len(s), s


def test_a_set_of_tensors_holds_their_nodes_once_each():
    out, b = capture(tensors_in_a_set, x=T())
    assert out["status"] == "graph", out
    n, members = out["result"]
    assert n == 2 and type(members) is set and len(members) == 2


def size_member(x):
    return {x.size(0), 3}


class Sizes(Recorder):
    """Answers x.size(0) with a size's node."""

    def call_method(self, name, args, kwargs):
        if name == "size":
            return Node("size", tensor=False)
        return super().call_method(name, args, kwargs)


def test_a_size_is_no_set_member_a_node_could_stand_for():
    """A size hashes by its value in eager: its node would make {n, 3} two members
    where eager has one."""
    out, _ = capture(size_member, x=T(), builder=Sizes(allowed=(tlib.relu,)))
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_VALUE, out


def unhashable_member(x):
    return {x, ()} | {[1]}


def test_a_set_member_only_user_code_could_hash_breaks():
    out, _ = capture(unhashable_member, x=T())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_VALUE


def passes_kwargs(x, kw):
    return tlib.relu(x, **kw, scale=2)


def test_kwargs_from_a_program_dict_are_read_item_by_item_from_its_source():
    t = T()
    out, b = capture(passes_kwargs, x=T(), kw={"bias": t, "flag": True})
    assert out["status"] == "graph", out
    name, args, kwargs = b.ops[0]
    assert set(kwargs) == {"bias", "flag", "scale"} and kwargs["flag"] is True
    assert repr(kwargs["bias"]) == "bias"   # a graph input read from ("item", kw, "bias")
    assert ("item", ("local", "kw"), "bias") in b.inputs


def repeated_keyword(x, kw):
    return tlib.relu(x, **kw, **kw)


def test_a_keyword_given_twice_breaks_as_eager_raises():
    out, _ = capture(repeated_keyword, x=T(), kw={"a": 1})
    assert out["status"] == "break" and out["reason"] == Reason.BAD_CALL


def forwards(x, **kwargs):
    return inner(x, **kwargs)


def inner(x, scale=1, shift=0):
    return x * scale + shift


def merged(x):
    d = {"scale": 3}
    e = {**d, "shift": 4, **{"scale": 5}}
    return forwards(x, **e), e


def test_dict_updates_and_kwargs_passed_on_by_an_inlined_function():
    out, b = capture(merged, x=T())
    assert out["status"] == "graph", out
    assert out["result"][1] == {"scale": 5, "shift": 4}
    assert [(op[0], op[1][1]) for op in b.ops] == [("mul", 5), ("add", 4)]


def dict_comprehensions(x, names):
    d = {n: tlib.relu(x) for n in names}
    e = {k: i for i, k in enumerate(d) if k != "a"}
    return d["b"], e


def test_dict_comprehensions_build_one_owned_dict_each():
    out, b = capture(dict_comprehensions, x=T(), names=("a", "b"))
    assert out["status"] == "graph", out
    node, e = out["result"]
    assert e == {"b": 1} and [op[0] for op in b.ops] == ["relu", "relu"]


def tensor_keyed(x):
    return {x: 1 for _ in range(1)}


def test_a_dict_comprehension_keyed_by_a_tensor_breaks():
    out, _ = capture(tensor_keyed, x=T())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_VALUE
