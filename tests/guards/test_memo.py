"""The structure memo of guard programs (guards/program.c): once a model's guard has
passed, later calls check the model's dicts' version tags (3.11) or a watcher epoch
(3.12+) instead of every submodule, parameter and hook, and every change to the model
is still seen: results always equal eager's on the changed model."""

import gc
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402

pytestmark = pytest.mark.torch


class Stack(nn.Module):
    def __init__(self, n=4, dim=8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.drop(x)


def _entries():
    return _C.code_cache(Stack.forward.__code__)["entries"]


def _memos():
    return [e.guard._memo() for e in _entries() if e.guard is not None]


def _same_as_eager(model, optimized, x):
    with torch.no_grad():
        torch.testing.assert_close(optimized(x), model(x))


def test_an_unchanged_model_runs_through_the_memo():
    torch.manual_seed(0)
    model = Stack(6).eval()
    opt = agspeed.optimize(model, backend="eager")
    for _ in range(5):
        _same_as_eager(model, opt, torch.randn(3, 8))
    (memo,) = _memos()
    assert memo["valid"]
    assert memo["fast"] >= 3
    # every submodule, parameter and hook check is implied by the memo
    assert memo["skipped_checks"] >= 6 * 9
    assert memo["watched"] == (sys.version_info >= (3, 12))


def _stack():
    torch.manual_seed(0)
    model = Stack().eval()
    return model, agspeed.optimize(model, backend="eager")


def _warm(model, opt):
    for _ in range(3):
        _same_as_eager(model, opt, torch.randn(2, 8))
    assert all(m["valid"] for m in _memos())


def _change_train(model):
    model.train()
    model.drop.p = 0.0  # same values in both runs


def _change_parameter(model):
    model.layers[1].weight = nn.Parameter(torch.randn(8, 8))


def _change_parameter_dict(model):
    del model.layers[2]._parameters["bias"]
    model.layers[2].bias = None


def _change_submodule(model):
    model.layers[3] = nn.Sequential(nn.Linear(8, 8), nn.ReLU())


def _change_hook(model):
    model.layers[0].register_forward_hook(lambda m, i, o: o * 2)


def _change_pre_hook(model):
    model.layers[2].register_forward_pre_hook(lambda m, i: (i[0] + 1,))


def _change_class(model):
    class Doubled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model.layers[1].__class__ = Doubled


def _change_instance_forward(model):
    layer = model.layers[0]
    layer.forward = lambda x: nn.functional.linear(x, layer.weight) - 1


def _change_buffer(model):
    model.layers[0].register_buffer("scale", torch.ones(1))


def _change_module_list_length(model):
    model.layers.append(nn.Linear(8, 8))


def _change_in_place_values(model):
    with torch.no_grad():  # an optimizer step: same tensors, new values
        for p in model.parameters():
            p.add_(0.5)


CHANGES = [_change_train, _change_parameter, _change_parameter_dict, _change_submodule,
           _change_hook, _change_pre_hook, _change_class, _change_instance_forward,
           _change_buffer, _change_module_list_length, _change_in_place_values]


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__[8:])
def test_every_change_to_the_model_is_seen(change):
    model, opt = _stack()
    _warm(model, opt)
    change(model)
    for _ in range(3):
        _same_as_eager(model, opt, torch.randn(2, 8))


class Skipping(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.skip, self.order = {1}, [0, 1, 2]

    def forward(self, x):
        for i in self.order:
            if i in self.skip:
                continue
            x = torch.tanh(self.layers[i](x))
        return x


@pytest.mark.parametrize("change", ["set", "list"])
def test_a_set_or_list_of_the_model_changed_in_place_is_seen(change):
    # (equal to what they held is a check the memo must run on every call: such a value
    # changes in place, with no dict the memo watches changing; a set's was skipped, so a
    # layer added to `skip` after the memo was built was still run)
    torch.manual_seed(0)
    model = Skipping().eval()
    opt = agspeed.optimize(model, backend="eager")
    for _ in range(3):
        _same_as_eager(model, opt, torch.randn(2, 8))
    if change == "set":
        model.skip.add(2)
    else:
        model.order.reverse()
    for _ in range(2):
        _same_as_eager(model, opt, torch.randn(2, 8))


def test_a_class_attribute_set_after_the_memo_is_seen():
    class Scaled(nn.Module):
        factor = 2.0

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * self.factor

    model = Scaled()
    opt = agspeed.optimize(model, backend="eager")
    x = torch.randn(2, 4)
    for _ in range(3):
        _same_as_eager(model, opt, x)
    Scaled.factor = 5.0
    _same_as_eager(model, opt, x)
    model.__dict__["factor"] = -1.0  # an instance attribute now shadows it
    _same_as_eager(model, opt, x)


def test_a_replaced_instance_dict_is_seen():
    def run(m, x):
        return m(x)

    torch.manual_seed(0)
    model = Stack().eval()
    opt = agspeed.optimize(run, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 8)
        torch.testing.assert_close(opt(model, x), model(x))
    (entry,) = _C.code_cache(run.__code__)["entries"]
    assert entry.guard._memo()["fast"] >= 1
    d = dict(model.__dict__)
    d["_modules"] = dict(d["_modules"])
    d["_modules"]["layers"] = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
    model.__dict__ = d
    x = torch.randn(2, 8)
    torch.testing.assert_close(opt(model, x), model(x))


@pytest.mark.cxx_exceptions
def test_data_replaced_in_place_is_seen_with_guard_parameters():
    model, opt = _stack()
    _warm(model, opt)
    with agspeed.config.override(guard_parameters=True):
        model2, opt2 = _stack()
        _warm(model2, opt2)
        model2.layers[0].weight.data = torch.randn(8, 8, dtype=torch.float64)
        model2.layers[0].bias.data = torch.randn(8, dtype=torch.float64)
        with pytest.raises(RuntimeError) as want:
            model2(torch.randn(2, 8))
        with pytest.raises(RuntimeError) as got:
            opt2(torch.randn(2, 8))
        assert str(got.value) == str(want.value)


def test_the_memo_keeps_no_model_alive():
    model, opt = _stack()
    _warm(model, opt)
    refs = [weakref.ref(model)] + [weakref.ref(p) for p in model.parameters()]
    counts = [sys.getrefcount(p) for p in model.parameters()]
    for _ in range(20):
        _same_as_eager(model, opt, torch.randn(2, 8))
    assert [sys.getrefcount(p) for p in model.parameters()] == counts
    del model, opt
    gc.collect()
    assert all(r() is None for r in refs)
    # the entry (kept with the code) still works for a new model of the class
    model, opt = _stack()
    for _ in range(3):
        _same_as_eager(model, opt, torch.randn(2, 8))


def test_two_models_of_one_class_each_keep_their_own_entry():
    a, opt_a = _stack()
    torch.manual_seed(1)
    b = Stack().eval()
    opt_b = agspeed.optimize(b, backend="eager")
    for _ in range(4):
        x = torch.randn(2, 8)
        _same_as_eager(a, opt_a, x)
        _same_as_eager(b, opt_b, x)
    assert len(_entries()) == 2
    assert all(m["valid"] and m["fast"] >= 2 for m in _memos())


def test_training_steps_through_the_memo_match_eager():
    torch.manual_seed(0)
    ref = Stack().train()
    ref.drop.p = 0.0
    model = Stack().train()
    model.drop.p = 0.0
    model.load_state_dict(ref.state_dict())
    opt = agspeed.optimize(model, backend="eager")
    sgd = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    for _ in range(6):
        x = torch.randn(4, 8)
        for m, o in ((ref, sgd[0]), (opt, sgd[1])):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    for (name, w), (_, g) in zip(ref.state_dict().items(), model.state_dict().items()):
        torch.testing.assert_close(g, w, msg=name)
    (memo,) = _memos()
    assert memo["fast"] >= 4


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.full((8,), 2.0))  # found in _buffers

    def forward(self, x):
        return x * self.k


class Stores(nn.Module):
    """Attributes found in each nn.Module store, and one found in none."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)                        # found in _modules
        self.scale = Scale()

    def forward(self, x):
        y = self.scale(self.lin(x))
        if hasattr(self.lin, "extra"):                    # in no store, yet
            y = y + self.lin.extra
        return y


def _shadow_buffer_with_parameter(model):
    # the lookup searches _parameters first: the parameter now wins over the buffer
    model.scale._parameters["k"] = nn.Parameter(torch.full((8,), 3.0))


def _replace_buffer_in_store(model):
    model.scale._buffers["k"] = torch.full((8,), 5.0)


def _replace_submodule_in_store(model):
    model._modules["lin"] = nn.Linear(8, 8)


def _shadow_submodule_with_buffer(model):
    # a buffer named like the submodule: found first, and not callable, as in eager
    model._buffers["lin"] = torch.ones(8)


def _absent_found_in_parameters_store(model):
    model.lin._parameters["extra"] = nn.Parameter(torch.ones(8))


def _absent_found_in_buffers_store(model):
    model.lin._buffers["extra"] = torch.ones(8)


def _absent_found_in_modules_store(model):
    model.lin._modules["extra"] = nn.Identity()   # y + a module: eager's TypeError


@pytest.mark.parametrize("change", [
    _shadow_buffer_with_parameter, _replace_buffer_in_store, _replace_submodule_in_store,
    _shadow_submodule_with_buffer, _absent_found_in_parameters_store,
    _absent_found_in_buffers_store,
    # tensor + module: torch raises its TypeError through a C++ exception
    pytest.param(_absent_found_in_modules_store, marks=pytest.mark.cxx_exceptions)],
    ids=lambda f: f.__name__[1:])
def test_the_memo_watches_every_store_an_answer_depended_on(change):
    """A found attribute depends on the stores searched before the one that held it,
    and an absent one on all three: a change to any of them is seen, whichever the
    memo watches to save reads."""
    torch.manual_seed(0)
    model = Stores().eval()
    opt = agspeed.optimize(model, backend="eager")
    x = torch.randn(2, 8)
    for _ in range(3):
        _same_as_eager(model, opt, x)
    (entry,) = [e for e in _C.code_cache(Stores.forward.__code__)["entries"]
                if e.guard is not None]
    memo = entry.guard._memo()
    assert memo["valid"] and memo["fast"] >= 1
    change(model)
    try:
        with torch.no_grad():
            want = model(x)
    except Exception as exc:   # eager's error, and the same from the optimized call
        with pytest.raises(type(exc)) as got:
            with torch.no_grad():
                opt(x)
        assert str(got.value) == str(exc)
        return
    with torch.no_grad():
        torch.testing.assert_close(opt(x), want)


def test_a_layer_costs_the_memo_only_the_stores_its_lookups_searched():
    def witnesses(n):
        agspeed.reset()
        torch.manual_seed(0)
        model = Stack(n).eval()
        opt = agspeed.optimize(model, backend="eager")
        for _ in range(3):
            _same_as_eager(model, opt, torch.randn(2, 8))
        (memo,) = _memos()
        return memo["witnesses"]

    per_layer = (witnesses(6) - witnesses(2)) / 4
    # Linear: its type and __dict__, _parameters (weight and bias are found there, so
    # _buffers and _modules are not read) and the hook dicts its call reads
    assert per_layer == int(per_layer) and per_layer <= 8
