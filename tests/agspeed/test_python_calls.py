"""Calls built at run time, imports, sets, iterators, builtins, the standard library and the
methods of containers the capture built: each function below captures as one graph with no
break (never more graphs than torch._dynamo.explain reports for it), and its results, their
types and its gradients equal eager's on fresh random inputs."""

import collections
import collections.abc
import contextlib
import functools
import itertools
import operator
import typing

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from _dynamo_ref import dynamo_graph_count  # noqa: E402

pytestmark = pytest.mark.torch

OPTIONS = {"alpha": 2.0}


def inner(x, *, alpha=1.0, beta=0.0):
    return x * alpha + beta


def passes_kwargs(x, **kwargs):
    return inner(x, **kwargs)


@functools.lru_cache(maxsize=None)
def cached_scale(n):
    return n * 3


def add(a, b):
    return a + b


# -- functions: name -> (function, input shapes) ------------------------------------------

def f_kwargs_dict_built_here(x):
    kw = {"alpha": 2}
    return torch.add(x, x, **kw)


def f_kwargs_received_and_passed_on(x):
    return passes_kwargs(x, alpha=3.0, beta=1.0) + passes_kwargs(x)


def f_kwargs_from_a_global_dict(x):
    return inner(x, **OPTIONS, beta=0.5)


def f_dict_merge_display(x):
    d = {**{"a": x}, "b": x * 2, **OPTIONS}
    return d["a"] + d["b"] * d["alpha"]


def f_star_args_built_at_run_time(x):
    parts = [x]
    parts.append(x + 1)
    return torch.cat([*parts, x], dim=0) + torch.add(*parts)[:1].sum()


def f_local_imports(x):
    import math
    import torch.nn.functional as F
    from math import pi
    import os.path
    return F.relu(x) * math.e + pi * len(os.path.sep)


def f_set_literals_and_operators(x):
    s = {1, 2, 3}
    t = {i % 2 for i in range(5)}
    s.add(4)
    s.discard(1)
    u = (s | t) - {0}
    names = set(["b", "a", "b"])
    return x * len(u) + (3 in s) + len(s & {2, 3}) + max(u) * len(sorted(names)[0])


def f_set_of_tensors(x):
    y = x + 1
    s = {x, y}
    s.add(x)
    z = x * 2
    return x * len(s) + (y in s) + (z not in s) + (x in {z})


def f_next_and_iter(x):
    it = iter([x, x + 1, x + 2])
    first = next(it)
    second = next(it)
    rest = list(it)
    return first + second + rest[0] + next(it, x) * 0


def f_for_over_iterator_shares_position(x):
    it = iter((x, x * 2, x * 3))
    total = next(it)
    for v in it:
        total = total + v
    return total


def f_zip_enumerate_reversed(x):
    xs = [x, x * 2, x * 3]
    acc = x
    for i, (a, b) in enumerate(zip(xs, reversed(xs))):
        acc = acc + a * b * i
    return acc


def f_map_and_filter(x):
    ys = list(map(lambda t: t + 1, [x, x * 2]))
    zs = list(filter(lambda n: n % 2 == 0, range(6)))
    ws = list(map(torch.sin, (x, x)))
    return ys[0] + ys[1] * len(zs) + ws[1]


def f_slices_and_sum_of_tensors(x):
    xs = (x, x + 1, x + 2, x + 3)
    return sum(xs[1:]) + sum(xs[::-2], x) + xs[-1]


def f_builtins_over_constants(x):
    vals = [3, 1, 2]
    return x * (max(vals) + min(vals) + sum(vals) + sorted(vals)[0] + any(vals) + all(vals))


def f_dict_methods(x):
    d = {"a": x, "b": x * 2}
    d.setdefault("c", x * 3)
    d.update(e=x * 4)
    got = d.get("a") + d.pop("b") + d.get("zz", x)
    k, v = d.popitem()
    e = d.copy()
    return got + v + sum(e.values()) + len(d) * (k == "e")


def f_dict_views_are_live(x):
    d = {"a": x}
    keys = d.keys()
    d["b"] = x * 2
    items = d.items()
    d["c"] = x * 3
    acc = x
    for k, v in items:
        acc = acc + v * len(k)
    return x * len(keys) + sum(d.values()) + acc


def f_get_from_a_program_dict(x, options=OPTIONS):
    return x * options.get("alpha", 1.0) + options.get("beta", 0.5)


def f_dict_fromkeys(x):
    return x * len(dict.fromkeys(["a", "b", "a"]))


def f_list_methods(x):
    xs = [x, x * 2]
    xs.insert(0, x * 3)
    xs.extend([x * 4])
    last = xs.pop()
    xs.reverse()
    ns = [3, 1, 2]
    ns.sort()
    ns.remove(2)
    return xs[0] + last * ns[-1] + ns.index(3) + [1, 2, 2].count(2)


def f_tuple_and_str_methods(x):
    name = "Layer.Norm"
    parts = name.lower().split(".")
    tag = "-".join(parts)
    t = (1, 2, 2)
    return x * (len(tag) + tag.startswith("layer") + t.count(2) + t.index(1)
                + len("{}:{}".format(*parts)) + len(name.replace(".", ""))
                + len(str(type(x))))


def f_itertools(x):
    xs = [x, x * 2]
    prods = [a * b for a, b in itertools.product([1, 2], xs)]
    chained = list(itertools.chain(xs, [x]))
    flat = list(itertools.chain.from_iterable([[x], xs]))
    pairs = list(itertools.combinations(xs + [x], 2))
    longest = list(itertools.zip_longest(xs, [1], fillvalue=0))
    head = list(itertools.islice(itertools.repeat(2, 5), 3))
    sums = list(itertools.accumulate(xs))
    return (prods[-1] + chained[2] + flat[0] + pairs[2][1] + longest[1][0] * longest[1][1]
            + sum(head) + sums[-1])


def f_functools_partial_and_reduce(x):
    p = functools.partial(torch.add, alpha=2)
    q = functools.partial(add, x)
    r = functools.reduce(lambda a, b: a * b, [x, x + 1, x + 2])
    s = functools.reduce(operator.add, [1, 2, 3], 10)
    return p(x, x) + q(x) + r + s


def f_lru_cache_function_is_inlined(x):
    return x * cached_scale(2)


def f_operator_functions(x):
    xs = (x, x * 2, 5)
    get = operator.itemgetter(1)
    pick = operator.itemgetter(0, 2)
    a, b = pick(xs)
    return operator.add(get(xs), operator.mul(a, b)) + operator.getitem(xs, 0)


def f_ordered_dict(x):
    d = collections.OrderedDict(a=x)
    d["b"] = x * 2
    d.move_to_end("a")
    return d["a"] + d["b"], list(d), d


def f_defaultdict(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["a"].append(x * 2)
    d["b"]
    return d["a"][1] + len(d), d


def f_deque(x):
    q = collections.deque([x], maxlen=3)
    q.append(x + 1)
    q.appendleft(x * 3)
    first = q.popleft()
    return first + q[0] + q.pop() + len(q), q


def f_device_made_in_the_frame(x):
    return x + torch.ones(1, device=torch.device("cpu"))


def f_sorted_keys_of_a_dict(x):
    table = {1: "d", 10: "b", 3: "e"}
    return x + 1, sorted(table), sorted(table, reverse=True)


def f_containers_inside_containers_are_shared(x):
    out = {"x": x}
    out["z"] = [x + 1, x]
    out["z"].append(x * 2)        # the list in the dict, not a copy of it
    inner = [x]
    outer = [inner, (inner,)]
    inner.append(x * 3)
    return out, len(outer[0]), len(outer[1][0])


def f_closure_shares_a_list_the_frame_changes(x):
    seen = [x]

    def total():
        return sum(seen)

    seen.append(x * 2)
    return total()


def f_defaultdict_fromkeys(x):
    d = collections.defaultdict.fromkeys("a", "b")
    d["a"] = 1
    d.setdefault("a", 10)
    return x + d["a"]


def f_dict_keys_compared(x):
    d = {3: x}
    keys = d.keys()
    d[4] = x + 1
    return x * ((3 in keys) + (5 in keys) + ({4: 0, 3: 1}.keys() == keys))


def f_tuple_plus_equals(x):
    out = (x, x * 2)
    out += (x + 1,)
    return out


def f_tensor_len_and_class(x):
    return x + len(x) + x.__len__(), f"{x.__class__.__name__}"


def f_deque_insert_and_setitem(x):
    q = collections.deque([x, x + 1])
    q.insert(0, "head")
    q[1] = x * 3
    q.remove("head")
    return list(q)


def f_namedtuple_class_made_in_the_frame(x):
    # (its instances' class is made per call in eager: the fields are compared)
    pair = collections.namedtuple("pair", ["a", "b", "c"], defaults=(None, 2))
    made = pair(x, x * 2)
    return tuple(pair(made.a, made[1], made.c * x))


class Span(typing.NamedTuple):
    start: object
    stop: object

    def width(self):
        return self.stop - self.start

    @staticmethod
    def unit():
        return 1

    @classmethod
    def name(cls):
        return cls.__name__


def f_namedtuple_methods(x):
    span = Span(x, x * 3)
    return span.width() * span.unit(), span.name()


def f_list_repeated(x):
    return sum(3 * [x]) + len((x,) * 2)


def f_a_size_argument_is_a_shape(x):
    made = x.new(x.size())   # (uninitialized: only its shape is compared)
    assert made.size() == x.size()
    return x + 1, made.shape, x.new_ones(torch.Size([2, 3])) * 2


def f_annotations_evaluated_in_the_frame(x):
    # a nested function's annotations are subscripted classes and typing forms (torch's
    # pytree helpers define such functions on every call)
    def helper(a: list[typing.Any], b: typing.Optional[int] = None,
               c: typing.Callable[[int], bool] = None) -> dict[str, tuple[int, ...]]:
        return a
    hints = (typing.List[int], collections.abc.Sequence[float], typing.Union[int, str],
             typing.Optional["torch.Tensor"])
    return helper([x + 1])[0] * len(hints), len(helper.__annotations__)


class BaseScaler:
    k = 1

    @classmethod
    def apply(cls, x):
        return x + cls.k


class DerivedScaler(BaseScaler):
    k = 10

    @classmethod
    def apply(cls, x):
        return super().apply(x) * 2     # the base's classmethod, bound to DerivedScaler


def f_super_inside_a_classmethod(x):
    return DerivedScaler.apply(x), BaseScaler.apply(x)


SCALES_BY_TYPE = {list: 2.0, tuple: 3.0}


def f_a_registry_keyed_by_type_is_read(x):
    # `type(v) in REGISTRY`, then its item: lookups by identity, guarded per key
    found = [SCALES_BY_TYPE[k] for k in (list, dict, tuple) if k in SCALES_BY_TYPE]
    return x * sum(found), set in SCALES_BY_TYPE


PROBES = []


@functools.lru_cache
def _probe_installed():
    PROBES.append(1)
    return True


_probe_installed.__wrapped__._dynamo_marked_constant = True   # assume_constant_result's


def f_a_function_marked_constant_is_called_once(x):
    # transformers marks its install probes so; the capture calls it, its answer a constant
    return x * 2 if _probe_installed() else x


TYPE_TABLE = {torch.Tensor: 2.0}


def f_type_of_a_computed_tensor(x):
    # eager's result of an operator is a plain Tensor: its type looks up as one
    y = x * 2
    same = type(y) is torch.Tensor and type(y).__name__ == "Tensor"
    return y * TYPE_TABLE.get(type(y), 100.0) + (1 if same else -1)


class _Parsed:
    """A parser made in the frame keeping names in a set (einops' ParsedExpression)."""

    def __init__(self, text):
        self.names = set()
        self.order = []
        for part in text.split():
            if str.isdecimal(part) or keyword_check(part):
                continue
            self.names.add(part)
            self.order.append(part)


def keyword_check(name):
    import keyword

    return keyword.iskeyword(name)


def f_set_algebra_and_str_tests_of_a_pattern(x):
    left, right = _Parsed("b n 2 d"), _Parsed("b d n if")
    gone = set.symmetric_difference(left.names, right.names)
    kept = set.intersection(left.names, right.names)
    return x * (len(gone) + 10 * len(kept)), sorted(kept), str.isidentifier("a_1")


LOG = __import__("logging").getLogger("agspeed.tests.python_calls")


def f_annotation_unions_and_an_objects_plain_truth(x):
    # typing.cast(Sequence[Tensor] | Sequence[int], ...) as torch.autograd.grad has it
    kind = typing.cast(collections.abc.Sequence[torch.Tensor] | list[int] | None, (x,))
    if LOG:   # a Logger defines neither __bool__ nor __len__: true
        return kind[0] * 2
    return kind[0]


ROPE = {"rope_type": {"full": "default"}}


def f_compares_builtins_of_other_kinds(x):
    kind = ROPE["rope_type"]   # a dict compared with str (transformers' rope wrapper)
    if kind == "longrope" or [1, 2] == (1, 2):
        return x
    return x * 2 if kind != "dynamic" else x


FUNCTIONS = {name: fn for name, fn in globals().items() if name.startswith("f_")}


# -- helpers -------------------------------------------------------------------------------

def tensors_in(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list, collections.deque)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (tuple, list, collections.deque)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want


class Counting:
    """An eager backend that counts the graphs it is given."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_python_call_feature_is_one_graph_matching_eager(name):
    fn = FUNCTIONS[name]
    backend = Counting()
    fast = agspeed.optimize(fn, backend=backend)
    for _ in range(2):
        x = torch.randn(3, 4)
        leaf, ref_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = fast(leaf), fn(ref_leaf)
        assert_same(got, want)
        sum(t.square().sum() for t in tensors_in(got)).backward()
        sum(t.square().sum() for t in tensors_in(want)).backward()
        torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    assert len(backend.graphs) == 1, f"{len(backend.graphs)} graphs"
    explained = agspeed.explain(fn, torch.randn(3, 4))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]
    assert explained.graph_count <= dynamo_graph_count(fn, torch.randn(3, 4))


GLOBAL_LIST = [1]


def appends_to_a_global(x):
    GLOBAL_LIST.append(2)
    return x + 1


def steps_a_program_iterator(x, it):
    return x * next(it)


def test_stepping_a_program_iterator_breaks_and_appending_to_a_program_list_replays():
    explained = agspeed.explain(steps_a_program_iterator, torch.randn(2), iter([3, 4]))
    assert [b.reason for b in explained.break_reasons][:1] == ["side_effect"]
    explained = agspeed.explain(appends_to_a_global, torch.randn(2))  # agspeed/_effects.py
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    it = iter([3, 4])
    fast = agspeed.optimize(steps_a_program_iterator)
    x = torch.randn(2)
    torch.testing.assert_close(fast(x, it), x * 3)   # eager stepped it once
    assert list(it) == [4]
    before = len(GLOBAL_LIST)
    agspeed.optimize(appends_to_a_global)(x)
    assert len(GLOBAL_LIST) == before + 1


def test_a_program_dict_read_with_get_is_guarded_on_each_key_it_read():
    options = {"alpha": 2.0}

    def scaled(x, opts):
        return x * opts.get("alpha", 1.0) + opts.get("beta", 0.0)

    backend = Counting()
    fast = agspeed.optimize(scaled, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x, options), scaled(x, options))
    for changed in ({"alpha": 3.0}, {"alpha": 2.0, "beta": 1.0}, {}):
        torch.testing.assert_close(fast(x, changed), scaled(x, changed))
    assert len(backend.graphs) == 4   # each change of what get() read recompiles


def pops_its_kwargs(x, **kwargs):
    scale = kwargs.pop("scale", 1.0)
    kwargs["shift"] = x * 2
    return x * scale + len(kwargs) + kwargs["shift"] + kwargs.get("bias", x)


def test_the_root_frames_own_kwargs_dict_is_mutated_inside_the_graph():
    backend = Counting()
    fast = agspeed.optimize(pops_its_kwargs, backend=backend)
    x = torch.randn(3)
    calls = ({"scale": 2.0, "flag": 3}, {"scale": 2.0, "flag": 4}, {"bias": x + 1}, {})
    for kw in calls:
        got, want = fast(x, **kw), pops_its_kwargs(x, **kw)
        assert_same(got, want)
    # the second call changed a plain value the graph read, the others the keys
    assert len(backend.graphs) == 4
    explained = agspeed.explain(pops_its_kwargs, x, scale=2.0, bias=x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]
    assert explained.graph_count <= dynamo_graph_count(pops_its_kwargs, x, scale=2.0, bias=x)


SCALES = {"a": 1.5, "b": -2.0}
LAYERS = {}


def test_a_dict_of_the_program_iterated_is_guarded_in_order():
    """items(), keys() and values() of a global dict: its values loaded one by one (a
    tensor among them a graph input), its keys guarded in their order, so a changed
    value, a new key or a new order captures again."""
    torch.manual_seed(0)
    LAYERS.clear()
    LAYERS.update(first=torch.nn.Linear(3, 3), second=torch.nn.Tanh())

    def f(x):
        for name, scale in SCALES.items():
            x = x * scale if name != "b" else x - scale
        for layer in LAYERS.values():
            x = layer(x)
        return x, list(SCALES.keys())

    x = torch.randn(2, 3)
    e = agspeed.explain(f, x)
    assert e.graph_count == 1 and e.break_reasons == []
    assert e.graph_count <= dynamo_graph_count(f, x)
    opt = agspeed.optimize(f)
    saved = dict(SCALES)
    try:
        for change in (None, ("a", 3.0), ("c", 0.5), "reorder", ("layer", None)):
            if change == "reorder":
                SCALES["a"] = SCALES.pop("a")
            elif change and change[0] == "layer":
                LAYERS["first"], LAYERS["second"] = LAYERS["second"], LAYERS["first"]
                LAYERS["second"] = LAYERS.pop("second")
            elif change:
                SCALES[change[0]] = change[1]
            got, want = opt(x), f(x)
            torch.testing.assert_close(got[0], want[0])
            assert got[1] == want[1]
    finally:
        SCALES.clear()
        SCALES.update(saved)


def test_storage_size_of_an_input_is_read_and_guarded():
    """x.untyped_storage().size() of an input (FSDP's _same_storage_size): read at
    capture and guarded, so a view of a larger storage with the same shape captures
    again and answers as eager does."""
    def f(x):
        if x.untyped_storage().size() // x.element_size() == 6:
            return x + 1
        return x - 1

    x = torch.randn(6)
    e = agspeed.explain(f, x)
    assert e.graph_count == 1 and e.break_reasons == []
    assert e.graph_count <= dynamo_graph_count(f, x)
    assert "x.untyped_storage().nbytes() == 24" in str(e)   # its guard line
    opt = agspeed.optimize(f)
    big = torch.randn(12)
    for t in (torch.randn(6), big[:6], torch.randn(6), torch.randn(12)[6:]):
        torch.testing.assert_close(opt(t), f(t))

    def g(x):
        return (x * 2).untyped_storage().size()   # a computed tensor's storage: eager

    assert agspeed.optimize(g)(x) == g(x)


def number_methods(x, n, v):
    return (x * n.as_integer_ratio()[0] + n.bit_length(), v.as_integer_ratio(),
            v.is_integer(), n.bit_count())


def test_the_pure_methods_of_numbers_fold():
    fast = agspeed.optimize(number_methods, backend="eager")
    x = torch.randn(2)
    got, want = fast(x, 6, 2.5), number_methods(x, 6, 2.5)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == ((5, 2), False, 2)
    report = agspeed.explain(number_methods, x, 6, 2.5)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


OFFSET = torch.zeros(3)


def with_tensor_defaults(x, w=OFFSET, *, b=torch.ones(3)):
    return x * 2 + w + b


def calls_with_defaults(x):
    return with_tensor_defaults(x) + with_tensor_defaults(x, b=x)


def test_tensor_default_arguments_are_graph_inputs_read_each_call():
    backend_graphs = []
    fast = agspeed.optimize(calls_with_defaults,
                            backend=lambda gm, ex: backend_graphs.append(gm) or gm)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), calls_with_defaults(x))
    OFFSET.add_(1)                                    # changed in place: seen
    torch.testing.assert_close(fast(x), calls_with_defaults(x))
    saved = with_tensor_defaults.__defaults__
    with_tensor_defaults.__defaults__ = (torch.full((3,), 5.0),)   # replaced: seen
    try:
        torch.testing.assert_close(fast(x), calls_with_defaults(x))
    finally:
        with_tensor_defaults.__defaults__ = saved
    assert len(backend_graphs) == 1
    report = agspeed.explain(calls_with_defaults, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_a_registry_keyed_by_type_changed_between_calls_is_seen():
    fast = agspeed.optimize(f_a_registry_keyed_by_type_is_read, backend="eager")
    x = torch.randn(3, 4)
    try:
        for change in (None, "add", "drop"):
            if change == "add":
                SCALES_BY_TYPE[dict] = 5.0
            elif change == "drop":
                del SCALES_BY_TYPE[list]
            assert_same(fast(x), f_a_registry_keyed_by_type_is_read(x))
    finally:
        SCALES_BY_TYPE.clear()
        SCALES_BY_TYPE.update({list: 2.0, tuple: 3.0})


SELF_HOLDING = []
SELF_HOLDING[:] = [SELF_HOLDING, None]


def test_odd_values_break_or_fold_without_an_internal_error(caplog):
    """A keyword argument named as a Python keyword (``t.uniform_(**{"from": 0})``),
    which a graph's code cannot spell, and a list that holds itself: eager's results,
    no internal error."""
    def draws(t):
        return t.uniform_(**{"from": -2.0, "to": 2.0}) * 2

    def self_holding(x):
        return SELF_HOLDING[0] is SELF_HOLDING, x + 1

    with caplog.at_level("WARNING", logger="agspeed"):
        torch.manual_seed(3)
        want = draws(torch.empty(3))
        torch.manual_seed(3)
        torch.testing.assert_close(agspeed.optimize(draws, backend="eager")(torch.empty(3)),
                                   want)
        x = torch.randn(2)
        got = agspeed.optimize(self_holding, backend="eager")(x)
        assert got[0] is True
        torch.testing.assert_close(got[1], x + 1)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]


def _wraps_inside(x):
    def inner(t):
        """inner's doc"""
        return t + 1

    @functools.wraps(inner)
    def wrapper(t):
        return inner(t) * 2

    return wrapper(x), wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ is inner


def _contextmanager_inside(x):
    @contextlib.contextmanager
    def scaled(v):
        try:
            yield v.sin()
        finally:
            pass

    with scaled(x) as y:
        return y.cos()


@pytest.mark.parametrize("fn", [_wraps_inside, _contextmanager_inside])
def test_decorators_applied_inside_the_frame_are_captured(fn):
    agspeed.reset()
    x = torch.randn(3)
    ref, got = fn(x), agspeed.optimize(fn, backend="eager", fullgraph=True)(x)
    ref, got = (ref, got) if type(ref) is tuple else ((ref,), (got,))
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(b, a)
        else:
            assert a == b


def _program_function(t):
    return t * 3


def test_update_wrapper_of_a_function_of_the_program_breaks_and_leaves_it():
    def fn(x):
        functools.update_wrapper(_program_function, _wraps_inside)
        return x + 1

    agspeed.reset()
    with pytest.raises(agspeed.GraphBreakError, match="update_wrapper"):
        agspeed.optimize(fn, backend="eager", fullgraph=True)(torch.ones(2))
    assert _program_function.__name__ == "_program_function"
    assert not hasattr(_program_function, "__wrapped__")


def _set_method_on_the_wrong_type(x):
    return x + len(set.difference(frozenset({1}), {2}))


def test_set_algebra_that_raises_raises_eagers_error_and_nothing_else(capfd):
    with pytest.raises(TypeError, match="doesn't apply to a 'frozenset'"):
        agspeed.optimize(_set_method_on_the_wrong_type, backend="eager")(torch.zeros(1))
    assert "internal error" not in capfd.readouterr().err
