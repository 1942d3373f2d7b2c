"""NumPy code on tensors (agspeed/_numpy.py): ``x.numpy()``, NumPy functions, ufuncs,
array methods, attributes and operators captured in the graph through torch's NumPy
layer, with what leaves the graph made a real ``numpy.ndarray`` (or NumPy scalar, or
dtype) as eager gives it.

Each capture test: one graph, no break, no more graphs than torch._dynamo.explain counts,
and results equal to eager's, types included (an array stays an array of the same dtype
and shape, a NumPy scalar stays one), on fresh inputs twice (the capture, then a cache
hit)."""

import collections
import gc
import sys
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import agspeed  # noqa: E402
from _dynamo_ref import dynamo_graph_count  # noqa: E402

pytestmark = pytest.mark.torch


def same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same(a, b)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            same(got[k], want[k])
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert got == want


def check(fn, *shapes, dynamo=True):
    torch.manual_seed(0)
    args = [torch.randn(*s) for s in shapes]
    e = agspeed.explain(fn, *[a.clone() for a in args])
    assert e.break_reasons == [] and e.graph_count == 1
    if dynamo:
        assert e.graph_count <= dynamo_graph_count(fn, *[a.clone() for a in args])
    opt = agspeed.optimize(fn)
    for _ in range(2):
        args = [torch.randn(*s) for s in shapes]
        twins = [a.clone() for a in args]
        same(opt(*args), fn(*twins))
        for a, b in zip(args, twins):   # what the code wrote through an array, too
            torch.testing.assert_close(a, b)
    return opt


def test_array_of_a_tensor_and_back():
    def f(x):
        a = x.numpy()
        return torch.from_numpy(a.T) * 2, a.shape, a.ndim, a.size, a.itemsize, a.strides

    check(f, (3, 4))


def test_functions_reductions_and_scalars():
    def f(x):
        a = x.numpy()
        m = np.mean(a, axis=1)
        return m, np.sum(m), np.asarray(np.sum(m)), a.max(axis=0), a.max()

    opt = check(f, (3, 4))
    out = opt(torch.randn(3, 4))
    assert type(out[1]) is np.float32      # a reduction to one value is a scalar
    assert type(out[2]) is np.ndarray and out[2].shape == ()   # asarray keeps an array


def test_operators_ufuncs_and_promotion():
    def f(x, y):
        a, b = x.numpy(), y.numpy()
        c = np.exp(a) + b * 2.0 - np.float32(1.5)
        d = np.where(a > 0, a, 0.0)
        return c, d, np.ones(3) + a[0, :3], (a > 0).sum(), a[1], a[:, 2]

    out = check(f, (3, 4), (3, 4))(torch.randn(3, 4), torch.randn(3, 4))
    assert out[2].dtype == np.float64   # NumPy's default float, as eager


def test_methods_submodules_and_dtypes():
    def f(x):
        a = x.numpy()
        dt = np.dtype("float")
        return (a.copy().reshape([1, a.size]), a.transpose(1, 0), a.astype(np.float64),
                np.linalg.norm(a, axis=0), np.fft.fftshift(a), np.full_like(x, 2.4, dtype=dt),
                np.concatenate([a, a]), a.dtype, a.dtype == np.float32,
                np.finfo(a.dtype).eps, np.iinfo(np.int16).max)

    check(f, (3, 4), dynamo=False)   # Dynamo makes no graph of it (it runs eager)


def test_array_results_in_containers():
    def f(x):
        a = x.numpy()
        return {"a": a * 2, "pair": [a.T, 3], "od": collections.OrderedDict(s=a.sum(0))}

    check(f, (2, 3))


def test_writes_through_an_array_reach_the_tensor():
    def f(x):
        a = x.numpy()
        a += 1
        a[0] = 7.0
        return x * 2

    check(f, (2, 3))


def test_numpy_in_a_module_forward():
    class Scaler(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                stats = np.std(self.lin(x).numpy(), axis=0)
            return self.lin(x) * torch.from_numpy(stats)

    torch.manual_seed(0)
    m = Scaler()
    x = torch.randn(5, 4)
    e = agspeed.explain(m, x)
    assert e.graph_count == 1 and e.break_reasons == []
    opt = agspeed.optimize(m)
    got, want = opt(x), m(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    g = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    want.sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(g[n], p.grad)


@pytest.mark.cxx_exceptions   # libtorch throws eager's error
def test_numpy_of_a_tensor_that_requires_grad_raises_as_eager():
    def f(x):
        return x.numpy() * 2

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError) as want:
        f(x)
    opt = agspeed.optimize(f)
    with pytest.raises(RuntimeError) as got:
        opt(x)
    assert str(got.value) == str(want.value)
    out = opt(torch.randn(3))           # the cache serves the next good call
    assert type(out) is np.ndarray

    def g(x):
        return x.numpy(force=True) + 1   # force: a detached copy, captured

    same(agspeed.optimize(g)(x), g(x))


def test_numpy_random_runs_eager():
    """NumPy's global generator is the program's: its draws are not moved into a graph
    (which would draw from torch's), so seeded results stay eager's."""
    def f(x):
        return x + torch.from_numpy(np.random.rand(3).astype(np.float32))

    e = agspeed.explain(f, torch.randn(3))
    assert e.graph_break_count >= 1
    assert any("numpy.random" in str(b) for b in e.break_reasons)
    opt = agspeed.optimize(f)
    x = torch.randn(3)
    np.random.seed(3)
    want = f(x)
    np.random.seed(3)
    torch.testing.assert_close(opt(x), want)


def test_array_live_at_a_break_is_an_array_after_it():
    def f(x):
        a = x.numpy() * 2
        torch._dynamo.graph_break()
        return type(a).__name__, x + 1

    opt = agspeed.optimize(f)
    for _ in range(2):
        x = torch.randn(3)
        same(opt(x), f(x))


def test_graph_targets_and_outputs_leave_nothing_behind():
    def f(x):
        return np.sum(x.numpy() * 2, axis=0)

    opt = agspeed.optimize(f)
    x = torch.randn(3, 4)
    opt(x)
    ref = weakref.ref(x)
    before = sys.getrefcount(x)
    for _ in range(5):
        out = opt(x)
    del out
    gc.collect()
    assert sys.getrefcount(x) == before
    del x
    gc.collect()
    assert ref() is None


def test_arrays_of_the_program_are_graph_inputs():
    """An array argument is the tensor sharing its memory, read on every call: a new
    dtype or shape captures again, a write through the graph reaches the array, and one
    torch cannot share (read-only, object dtype) keeps the frame eager."""
    def f(a, x):
        b = np.sin(a) * 2
        a[0] = 5.0
        return b, torch.from_numpy(a.T) + x, a.shape

    opt = agspeed.optimize(f)
    e = agspeed.explain(f, np.ones((3, 4), np.float32), torch.randn(4, 3))
    assert e.graph_count == 1 and e.break_reasons == []
    for dtype, shape in ((np.float32, (3, 4)), (np.float64, (3, 4)), (np.float32, (2, 4)),
                         (np.float32, (3, 4))):
        a = np.random.randn(*shape).astype(dtype)
        twin = a.copy()
        x = torch.randn(shape[::-1])
        same(opt(a, x), f(twin, x))
        np.testing.assert_array_equal(a, twin)
    frozen = np.ones((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError) as want:
        f(frozen, torch.randn(4, 3))
    with pytest.raises(ValueError) as got:
        opt(frozen, torch.randn(4, 3))
    assert str(got.value) == str(want.value)


def test_the_numpy_source_reads_a_shared_tensor_or_nothing():
    from agspeed._sources import MISSING, describe, resolve

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = resolve(("numpy", ("local", "a")), {"a": a}, {}, {}, {})
    assert isinstance(t, torch.Tensor) and np.shares_memory(t.numpy(), a)
    frozen = a.copy()
    frozen.flags.writeable = False
    for bad in (frozen, np.array(["x"], dtype=object), [1.0], a.view(np.matrix), a[:, ::-1],
                a.astype(">f4")):
        assert resolve(("numpy", ("local", "a")), {"a": bad}, {}, {}, {}) is MISSING
    assert describe(("numpy", ("local", "a"))) == "torch.from_numpy(a)"


@pytest.mark.cxx_exceptions   # libtorch throws eager's error
def test_bfloat16_numpy_raises_as_eager():
    def f(x):
        return x.numpy()

    x = torch.randn(3).to(torch.bfloat16)
    with pytest.raises(TypeError) as want:
        f(x)
    with pytest.raises(TypeError) as got:
        agspeed.optimize(f)(x)
    assert str(got.value) == str(want.value)


def test_ufuncs_of_constants_are_numpy_scalars_and_arrays_come_from_the_graph():
    def f(x):
        scale = np.sqrt(64) * np.float32(0.5)     # NumPy's scalars, evaluated at capture
        return x * scale + np.log(2.0), np.sqrt(9), np.array([1.0, 2.0]) * 2

    out = check(f, (3,))(torch.randn(3))
    assert type(out[1]) is np.float64 and type(out[2]) is np.ndarray


def test_a_tensor_back_from_an_array_is_a_new_tensor_sharing_the_memory():
    """torch.from_numpy(x.numpy()) is not x in eager: a change to its metadata (shape,
    requires_grad) must not reach the caller's tensor."""
    def f(x):
        a = x.numpy()
        return torch.from_numpy(a), torch.as_tensor(a.real), torch.from_numpy(a.T)

    x = torch.randn(2, 3)
    for got, want in zip(agspeed.optimize(f)(x), f(x)):
        assert got is not x and want is not x
        assert got.data_ptr() == want.data_ptr() == x.data_ptr()
        torch.testing.assert_close(got, want)
        assert (got.shape, got.stride(), got.requires_grad) == \
            (want.shape, want.stride(), want.requires_grad)
    out = agspeed.optimize(f)(x)[0]
    out.requires_grad_()
    assert not x.requires_grad


def array_minus_tensor(a, b):
    return a - b


def adds_an_array_in_place(t, arr):
    t += arr
    return t


@pytest.mark.cxx_exceptions   # torch's operators refusing an array throw inside libtorch
def test_an_array_meeting_a_tensor_at_a_break_stays_an_array():
    """An operator between an array and a tensor ends the capture; the break used to hand
    the break instruction the graph's tensor for the array, so it computed what eager
    refuses (ndarray - Tensor) and changed a tensor eager leaves alone (t += array)."""
    a, b = np.array([1.0, 2.0]), torch.tensor([1.0, 1.0])
    with pytest.raises(TypeError):
        array_minus_tensor(a, b)
    with pytest.raises(TypeError):
        agspeed.optimize(array_minus_tensor, backend="eager")(a, b)
    arr = np.array([1.0, 1.0], dtype=np.float32)
    for fn in (adds_an_array_in_place, agspeed.optimize(adds_an_array_in_place,
                                                        backend="eager")):
        t = torch.tensor([1.0, 2.0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # NumPy 2's __array_wrap__
            out = fn(t, arr)
        torch.testing.assert_close(t, torch.tensor([1.0, 2.0]))   # unchanged, as eager
        assert type(out) is torch.Tensor


def test_an_array_method_torch_lacks_at_a_break_runs_eager_without_an_internal_error(caplog):
    def fn(x):
        x += 1
        z = x.tobytes()
        x += 1
        return z

    with caplog.at_level("WARNING", logger="agspeed"):
        a, b = np.array([1, 2]), np.array([1, 2])
        assert agspeed.optimize(fn, backend="eager")(a) == fn(b)
        assert (a == b).all()
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
