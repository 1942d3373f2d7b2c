"""Branches on a tensor whose other way only raises (csrc/interp_flow.c): the
interpreter asks the builder to assume the way that does not raise (assume_truth),
on every version's bytecode (3.11's forward jumps, 3.12's cold blocks at the end of
the function, 3.13's TO_BOOL before the jump).  Torch-free."""

from test_interp import Recorder, T, capture, tlib


def _assumed(builder):
    return [args[1] for name, args, _ in builder.ops if name == "assume"]


def if_not_raise(x):
    ok = (x > 0).all()
    if not ok:
        raise ValueError(f"expected positive values, got {type(x).__name__}")
    return tlib.relu(x)


def if_raise(x):
    if (x < 0).any():
        raise ValueError("negative")
    return tlib.relu(x)


# compiled here: pytest rewrites the assert statements of test modules
exec(compile("def asserted(x):\n    assert (x >= 0).all(), 'negative'\n    return tlib.relu(x)\n",
             __file__, "exec"))


def raise_then_more(x):
    if not x.all():
        raise ValueError("zero")
    y = tlib.relu(x)
    if y.any():
        raise RuntimeError("nonzero")
    return y


def both_ways_return(x):
    if x.all():
        return tlib.relu(x)
    return x


def raise_in_branchy_message(x, verbose):
    if not x.all():
        raise ValueError("long" if verbose else "short")
    return x


def warns(x, log):
    if not x.all():
        log.append("zero")
    return tlib.relu(x)


def test_the_way_that_does_not_raise_is_assumed():
    for fn, truths in ((if_not_raise, [True]), (if_raise, [False]),
                       (asserted, [True]),  # noqa: F821 (made by exec above)
                       (raise_then_more, [True, False])):
        out, b = capture(fn, x=T())
        assert out["status"] == "graph", fn.__name__
        assert _assumed(b) == truths, fn.__name__
        assert [name for name, _, _ in b.ops].count("relu") == 1


def test_branches_whose_ways_both_go_on_still_break():
    from agspeed.protocol import Reason

    for fn, kw in ((both_ways_return, {}), (raise_in_branchy_message, {"verbose": True}),
                   (warns, {"log": []})):
        out, b = capture(fn, x=T(), **kw)
        assert out["status"] == "break" and out["reason"] == Reason.DATA_DEPENDENT, fn.__name__
        assert _assumed(b) == []


def test_a_builder_that_declines_breaks_there():
    from agspeed.protocol import Reason

    class Declines(Recorder):
        def assume_truth(self, obj, truth):
            return self.truth(obj)

    out, _ = capture(if_not_raise, Declines(allowed=(tlib.relu,)), x=T())
    assert out["status"] == "break" and out["reason"] == Reason.DATA_DEPENDENT


class ZeroDim(Recorder):
    """Every node a 0-d tensor."""

    def tensor_attr(self, node, name):
        return 0 if name == "ndim" else super().tensor_attr(node, name)


exec(compile("def asserted_item(x):\n    assert x.all().item(), 'zero'\n    return tlib.relu(x)\n",
             __file__, "exec"))


def item_then_more(x):
    flag = x.any().item()
    return tlib.relu(x) if flag else x


def test_the_item_of_a_0d_tensor_a_raising_branch_tests_is_the_tensor_assumed():
    from agspeed.protocol import Reason

    out, b = capture(asserted_item, ZeroDim(allowed=(tlib.relu,)), x=T())  # noqa: F821
    assert out["status"] == "graph" and _assumed(b) == [True]
    assert ".item" not in [name for name, _, _ in b.ops]
    out, b = capture(item_then_more, ZeroDim(allowed=(tlib.relu,)), x=T())
    assert ".item" in [name for name, _, _ in b.ops]   # not straight to a raising branch
    out, b = capture(asserted_item, x=T())  # noqa: F821  (ndim unknown: item() as before)
    assert ".item" in [name for name, _, _ in b.ops] or out.get("reason") == Reason.DATA_DEPENDENT
