"""cudagraphs' replay logic without a GPU: which inputs a recording reads in place, when it
records again, and that outputs outlive the next replay.

A CUDA graph replays its kernels over the addresses it recorded.  Here the recording is
replaced by one that does the same on the CPU: a replay runs the graph over the very
tensors the recording was given (the parameters themselves, the buffers of the other
inputs) and writes its results into the recording's own outputs.  So a replay that
read a stale buffer, missed a parameter's update or handed out its own output memory
gives wrong numbers here as it would on the GPU.  tests/backends/test_cuda.py runs the
real thing on a GPU.
"""

import copy
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from agspeed.backends import cudagraphs  # noqa: E402

pytestmark = pytest.mark.torch


class _Recording:
    """Replays over the addresses it recorded: the parameters read in place are the ones
    the call was given (their addresses were checked), the other inputs the recording's
    buffers."""

    def __init__(self, owner, static_in, static_out):
        self.owner, self.static_in, self.static_out = owner, list(static_in), static_out

    def replay(self):
        given = self.owner.given
        ins = [given[i] if p is not None else b
               for i, (b, p) in enumerate(zip(self.static_in, self.owner.places))]
        for mine, new in zip(self.static_out, self.owner.graph(*ins)):
            if isinstance(mine, torch.Tensor):
                mine.copy_(new)


class _CpuReplay(cudagraphs._Replay):
    made: list = []

    def __init__(self, graph):
        super().__init__(graph)
        self.given = None
        _CpuReplay.made.append(self)

    def __call__(self, args):
        self.given = list(args)
        try:
            return super().__call__(args)
        finally:
            self.given = None

    def _capture(self):
        out = list(self.graph(*self.static_in))
        buffers = [None if p is not None else a for a, p in zip(self.static_in, self.places)]
        return _Recording(self, buffers, out), out


def _backend(gm, example_inputs):
    from torch._functorch.aot_autograd import aot_module_simplified

    def compiler(graph, _):
        return _CpuReplay(graph)

    return aot_module_simplified(gm, list(example_inputs), fw_compiler=compiler,
                                 bw_compiler=compiler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x))))


@pytest.fixture(autouse=True)
def _fresh():
    _CpuReplay.made = []
    agspeed.reset()
    yield
    agspeed.reset()


def _pair():
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    return model, twin, agspeed.optimize(model, backend=_backend)


def _step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _train(steps=5, between=None):
    model, twin, optimized = _pair()
    def optimizers():
        return (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9))

    opt, opt_twin = optimizers()
    for step in range(steps):
        if between is not None and between(step, model, twin):
            opt, opt_twin = optimizers()   # the model's parameters are new objects
        x = torch.randn(6, 8)
        torch.testing.assert_close(_step(optimized, opt, x), _step(twin, opt_twin, x))
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, msg=name)
        for b, c in zip(model.buffers(), twin.buffers()):
            torch.testing.assert_close(b, c)
    return model


def test_training_reads_parameters_in_place_and_copies_the_rest():
    model = _train()
    fw, bw = _CpuReplay.made
    assert fw.records == 1 and bw.records == 1
    params = {p.data_ptr() for p in model.parameters()}
    read = {place[0] for place in fw.places if place is not None}
    assert read == params                    # every weight of the forward in place
    # the batch and BatchNorm's statistics are copied into buffers of the recording
    assert len(fw.buffers) == len(fw.places) - len(params)
    assert all(not isinstance(b, nn.Parameter) for b in fw.buffers)
    assert all(isinstance(b, torch.Tensor) for b in bw.buffers)


def test_a_parameter_that_moves_records_again_and_twice_is_copied():
    moved = []

    def move(step, model, twin):
        if step in (2, 4):
            model.a.weight.data = model.a.weight.data.clone()
            moved.append(step)

    model = _train(steps=6, between=move)
    assert moved == [2, 4]
    fw = _CpuReplay.made[0]
    assert fw.records == 3
    # after its second move the weight is read from a buffer, the others still in place
    assert model.a.weight.data_ptr() not in {p[0] for p in fw.places if p is not None}
    assert model.b.weight.data_ptr() in {p[0] for p in fw.places if p is not None}


def test_load_state_dict_with_assign_records_again_with_the_new_weights():
    def load(step, model, twin):
        if step == 3:
            state = {k: v + 0.5 if v.is_floating_point() else v.clone()
                     for k, v in twin.state_dict().items()}
            model.load_state_dict(state, assign=True)
            twin.load_state_dict(state)
            return True
        return False

    _train(steps=5, between=load)
    fw, bw = _CpuReplay.made
    assert fw.records == 2 and bw.records == 2


def test_outputs_survive_the_next_replay():
    _, twin, optimized = _pair()
    optimized.eval()
    twin.eval()
    xs = [torch.randn(6, 8) for _ in range(4)]
    with torch.no_grad():
        outs = [optimized(x) for x in xs]
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, twin(x))
    assert len({o.data_ptr() for o in outs}) == len(outs)


def test_the_recording_does_not_keep_the_models_weights_alive():
    model, _, optimized = _pair()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _step(optimized, opt, torch.randn(6, 8))
    fw = _CpuReplay.made[0]
    assert fw.cuda_graph is not None
    weight = weakref.ref(model.a.weight)
    del model, optimized, opt
    gc.collect()
    assert weight() is None
    assert fw.cuda_graph is not None          # the replay itself is still there


def test_an_input_the_graph_writes_is_never_read_in_place():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(w, x):
        w.add_(1)
        return (w * x,)

    w = nn.Parameter(torch.randn(3), requires_grad=False)
    graph = make_fx(f)(w, torch.randn(3))
    assert cudagraphs._written_inputs(graph) == {0}
    replay = _CpuReplay(graph)
    replay([w, torch.randn(3)])
    assert replay.places[0] is None
    assert cudagraphs._written_inputs(lambda *a: a) is None
