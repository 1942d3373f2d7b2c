"""Activation checkpointing inside captured code (agspeed/_checkpoint.py): a non-reentrant
``torch.utils.checkpoint.checkpoint`` call is captured into the graph as a region that
still frees its activations and recomputes them in the backward, with eager's results,
eager's random numbers and the saves eager makes; reentrant checkpoints and selective
policies run eager as before."""

import gc
import logging
import weakref

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import agspeed  # noqa: E402
from agspeed import _checkpoint  # noqa: E402
from _train import Block, batches, twins  # noqa: E402

# the recomputation stops early by raising through libtorch
pytestmark = [pytest.mark.torch, pytest.mark.cxx_exceptions]


class Checkpointed(nn.Module):
    def __init__(self, depth=3, dropout=0.2, **options):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(Block(32, dropout=dropout) for _ in range(depth))
        self.head = nn.Linear(32, 5)
        self.options = {"use_reentrant": False, **options}

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = checkpoint(block, h, **self.options)
        return nn.functional.cross_entropy(self.head(h), y)


class Graphs:
    """A backend that keeps the graphs it is given and runs them as they are."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def regions(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _checkpoint.run]


def saves(model, x, y):
    """The shapes of the tensors a program's saved-tensors hook sees in one step."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, y)
    loss.backward()
    return shapes


def step_both(ref, model, data):
    for step, (x, y) in enumerate(data):
        for m in (ref, model):
            torch.manual_seed(step)  # dropout inside the regions
            m(x, y).backward()


def grads(m):
    return [p.grad for p in m.parameters()]


def test_a_non_reentrant_checkpoint_is_captured_as_a_region_of_one_graph():
    spy = Graphs()
    ref, mine = twins(Checkpointed)
    model = agspeed.optimize(mine, backend=spy)
    step_both(ref, model, batches(3))
    (gm,) = spy.graphs  # one graph: no break at the checkpoint calls
    assert len(regions(gm)) == 3
    for a, b in zip(grads(ref), grads(mine)):
        assert torch.equal(a, b)   # the same dropout masks, in the forward and recomputed
    # the region's own operations live in its submodule, recomputed by checkpoint
    body = getattr(gm, regions(gm)[0].args[0].target)
    ops = {n.target for n in body.graph.nodes if n.op == "call_function"}
    assert torch.nn.functional.dropout in ops and torch.nn.functional.gelu in ops


def test_a_program_hook_sees_the_saves_eager_makes():
    """checkpoint saves the tensors passed to it, not the parameters its function reads:
    an offloading hook sees the same tensors through agspeed."""
    ref, mine = twins(Checkpointed, dropout=0.0)
    model = agspeed.optimize(mine)
    x, y = batches(1)[0]
    for _ in range(2):
        assert saves(model, x, y) == saves(ref, x, y)


@pytest.mark.parametrize("options", [{"use_reentrant": True}, {"context_fn": "selective"}])
def test_reentrant_and_selective_checkpoints_run_eager_with_eagers_results(options):
    if options.get("context_fn") == "selective":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default \
                else CheckpointPolicy.PREFER_RECOMPUTE

        options = {"context_fn": lambda: create_selective_checkpoint_contexts(policy)}
    spy = Graphs()
    ref, mine = twins(Checkpointed, **options)
    model = agspeed.optimize(mine, backend=spy)
    step_both(ref, model, batches(2))
    assert not any(regions(gm) for gm in spy.graphs)   # the checkpoint calls ran eager
    for a, b in zip(grads(ref), grads(mine)):
        assert torch.equal(a, b)


def inner(h):
    return torch.relu(h) * 2


def outer(lin, h):
    return lin(checkpoint(inner, h, use_reentrant=False)) + h


def twice(h, scale=1.0):
    return h.sin() * scale, h.cos()


def breaking(h):
    print("inside the region", end="")  # a graph break inside the checkpointed function
    return h.tanh()


def test_nested_regions_keyword_arguments_and_several_outputs():
    spy = Graphs()
    lin = nn.Linear(4, 4)

    def f(x):
        a, b = checkpoint(twice, x, use_reentrant=False, scale=3.0)
        return checkpoint(outer, lin, a, use_reentrant=False) + b

    g = agspeed.optimize(f, backend=spy)
    x = torch.randn(2, 4, requires_grad=True)
    want = f(x)
    (gx_want,) = torch.autograd.grad(want.sum(), x)
    got = g(x)
    (gx,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, gx_want)
    (gm,) = spy.graphs
    assert len(regions(gm)) == 2   # the nested checkpoint is part of its enclosing region


def test_a_break_inside_the_region_runs_that_checkpoint_eager(capsys):
    def f(x):
        return checkpoint(breaking, x * 2, use_reentrant=False) + 1

    g = agspeed.optimize(f)
    x = torch.randn(3, requires_grad=True)
    f(x).sum().backward()
    printed = capsys.readouterr().out   # in the forward, and again when recomputing
    x.grad = None
    got = g(x)
    got.sum().backward()
    assert capsys.readouterr().out == printed == "inside the region" * 2
    torch.testing.assert_close(got, (x * 2).tanh() + 1)
    torch.testing.assert_close(x.grad, 2 * (1 - (x * 2).tanh() ** 2))


def test_bad_checkpoint_arguments_raise_eagers_error():
    def f(x):
        return checkpoint(inner, x, use_reentrant=False, unknown_option=1)

    g = agspeed.optimize(f)
    x = torch.randn(3)
    with pytest.raises(TypeError) as want:
        f(x)
    with pytest.raises(TypeError) as got:
        g(x)
    assert str(got.value) == str(want.value)


def test_jit_refuses_a_graph_with_regions_and_the_tagged_graph_calls_torchs_operator():
    from agspeed.backends import jit

    spy = Graphs()
    model = agspeed.optimize(Checkpointed(dropout=0.0), backend=spy)
    x, y = batches(1)[0]
    model(x, y)
    (gm,) = spy.graphs
    inputs = [p for p in gm.graph.nodes if p.op == "placeholder"]
    with pytest.raises(RuntimeError, match="checkpoints activations"):
        jit.backend(gm, [n.meta["example_value"] for n in inputs])
    tagged = _checkpoint.tagged(gm)
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    calls = [n for n in tagged.graph.nodes if n.target is tag_activation_checkpoint]
    assert len(calls) == 3 and not regions(tagged) and len(regions(gm)) == 3
    assert _checkpoint.tagged(tagged) is tagged


def test_inductor_recomputes_the_regions_with_eagers_gradients():
    ref, mine = twins(Checkpointed)
    model = agspeed.optimize(mine, backend="inductor")
    step_both(ref, model, batches(2))
    for a, b in zip(grads(ref), grads(mine)):
        torch.testing.assert_close(a, b)


def test_the_regions_are_freed_with_their_graph():
    spy = Graphs()
    model = agspeed.optimize(Checkpointed(dropout=0.0), backend=spy)
    model(*batches(1)[0])
    (gm,) = spy.graphs
    body = weakref.ref(getattr(gm, regions(gm)[0].args[0].target))
    spy.graphs.clear()
    del gm, model
    agspeed.reset()
    gc.collect()
    assert body() is None


def test_transformers_gradient_checkpointing_is_one_graph_per_step():
    """``gradient_checkpointing_enable()`` checkpoints each layer (non-reentrant) and puts
    a forward hook on the input embeddings (``enable_input_require_grads``): both are
    captured, so a step is one graph call with eager's loss and gradients."""
    transformers = pytest.importorskip("transformers")
    import copy

    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.gradient_checkpointing_enable()
    assert model.get_input_embeddings()._forward_hooks
    ref = copy.deepcopy(model)
    fast = agspeed.optimize(model, backend="eager")
    for step in range(3):
        ids = torch.randint(0, 64, (2, 12))
        calls = agspeed.counters()["graph_calls"]
        got = fast(input_ids=ids, labels=ids)
        got.loss.backward()
        assert agspeed.counters()["graph_calls"] == calls + 1, step
        want = ref(input_ids=ids, labels=ids)
        want.loss.backward()
        torch.testing.assert_close(got.loss, want.loss)
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name)


def logs_inside(h):
    logging.getLogger("agspeed.tests.ckpt").warning("inside the region")
    return h.tanh()


def test_a_logging_call_inside_the_region_is_made_again_by_the_backward(caplog):
    def f(x):
        return checkpoint(logs_inside, x * 2, use_reentrant=False) + 1

    x = torch.randn(3, requires_grad=True)
    with caplog.at_level(logging.WARNING, "agspeed.tests.ckpt"):
        f(x).sum().backward()
        want = [r.getMessage() for r in caplog.records]
        caplog.clear()
        g = agspeed.optimize(f)
        got = g(x)
        got.sum().backward()
        assert [r.getMessage() for r in caplog.records] == want == ["inside the region"] * 2
    torch.testing.assert_close(got, (x * 2).tanh() + 1)
