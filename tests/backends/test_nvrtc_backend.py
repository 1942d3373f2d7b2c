"""The nvrtc backend's graph side on real training graphs, without a GPU: AOTAutograd's
forward and backward partitioned into fused groups, each group's kernel generated and
run on the CPU through the host launcher (_nvrtc_host.py), compared with eager."""

import logging

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from agspeed.backends import nvrtc  # noqa: E402
from agspeed.backends.nvrtc import partition  # noqa: E402
from torch._functorch.aot_autograd import aot_function  # noqa: E402

import _nvrtc_host as host  # noqa: E402

nn, F = torch.nn, torch.nn.functional
HOST = nvrtc.compile_with(host.launcher)


def _recording_compiler():
    """A list, and a compiler for aot_function that appends each graph's fused groups to
    it and runs the graph through the host launcher's kernels."""
    from functorch.compile import make_boxed_func

    found = []

    def compiler(gm, example_inputs):
        found.append(partition.groups(gm))
        return make_boxed_func(nvrtc.compile_aten(gm, host.launcher).forward)

    return found, compiler


def _decompositions():
    """The decomposition table the backend traces with."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def _fused_gradients(f, *inputs, **tol):
    """Runs ``f`` forward and backward through the fused kernels (aot_function with the
    recording compiler), checks the gradients of ``inputs`` against eager's for a random
    output gradient, and returns the groups of each graph."""
    found, compiler = _recording_compiler()
    out = aot_function(f, fw_compiler=compiler, bw_compiler=compiler,
                       decompositions=_decompositions())(*inputs)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(f(*inputs), inputs, g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, **tol)
    return found


@pytest.fixture(autouse=True)
def _no_fallback(caplog):
    """Every graph here must run through the fused kernels, not fall back to eager."""
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        yield
    assert not [r for r in caplog.get_records("call") if "runs eagerly" in r.getMessage()]


class Block(nn.Module):
    """Linear, layer norm, GELU, a softmax over the rows, a residual, a sigmoid."""

    def __init__(self, width=32):
        super().__init__()
        self.fc = nn.Linear(16, width)
        self.ln = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, 16)

    def forward(self, x):
        h = F.gelu(self.ln(self.fc(x)))
        a = torch.softmax(h @ h.t() / 4.0, -1)
        return (x + self.fc2(a @ h)).sigmoid()


class Norms(nn.Module):
    """RMSNorm by hand, tanh-GELU, log_softmax, a bias broadcast over a 3-d input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(24) + 0.5)
        self.b = nn.Parameter(torch.randn(24))

    def forward(self, x):
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        y = F.gelu(rms + self.b, approximate="tanh")
        return F.log_softmax(y, dim=-1).clamp(min=-20.0)


def _twins(cls):
    torch.manual_seed(0)
    a, b = cls(), cls()
    b.load_state_dict(a.state_dict())
    return a, b


def _train_and_compare(cls, make_input, steps=2, **opts):
    eager, model = _twins(cls)
    optimized = agspeed.optimize(model, backend=HOST, **opts)
    for _ in range(steps):
        x = make_input()
        want, got = eager(x), optimized(x)
        torch.testing.assert_close(got, want)
        want.square().mean().backward()
        got.square().mean().backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    return optimized


def test_a_block_trains_like_eager_through_fused_kernels():
    _train_and_compare(Block, lambda: torch.randn(8, 16))


def test_norms_and_broadcasts_over_three_dimensions():
    _train_and_compare(Norms, lambda: torch.randn(2, 5, 24) * 3)


def test_a_transposed_input_is_read_through_its_strides():
    _train_and_compare(Norms, lambda: (torch.randn(24, 6) * 2).t())


def test_one_compile_serves_every_size_of_a_dynamic_graph():
    _train_and_compare(Norms, lambda: torch.randn(torch.randint(2, 9, ()).item(), 24),
                       steps=4, dynamic=True)
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 1


def test_bf16_storage_and_autocast():
    eager, model = _twins(Norms)
    optimized = agspeed.optimize(model, backend=HOST)
    x = torch.randn(4, 24).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = eager(x), optimized(x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_layer_norm_and_its_activation_are_one_kernel():
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    x = torch.randn(6, 32, requires_grad=True)

    def f(x, w, b):
        return torch.relu(F.layer_norm(x, (32,), w, b) * 2.0 + 1.0)

    found, compiler = _recording_compiler()
    out = aot_function(f, fw_compiler=compiler, bw_compiler=compiler,
                       decompositions=_decompositions())(x, w, b)
    torch.testing.assert_close(out, f(x, w, b))
    forward = found[0]
    assert len(forward) == 1 and forward[0].nred == 1   # one ROWS kernel does it all
    # x read at its own index, w and b as rows (the same for every row: vector loads)
    desc, _ = partition.describe(forward[0], "layer_norm_relu")
    assert sorted(flag for _, flag in desc[4]) == [0, 2, 2]
    out.sum().backward()
    assert len(found) == 2 and all(g.nodes for g in found[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conversions_to_and_from_half_types_stay_in_the_kernel(dtype):
    """A half-precision chain computes in fp32 between conversions (GELU on bf16, a
    residual added after): each conversion is an instruction of the one kernel, not a
    kernel of its own, forward and backward."""
    x, b, r = (torch.randn(8, 64, dtype=dtype, requires_grad=True) for _ in range(3))

    def f(x, b, r):
        return F.gelu(x + b) + r

    found, compiler = _recording_compiler()
    out = aot_function(f, fw_compiler=compiler, bw_compiler=compiler,
                       decompositions=_decompositions())(x, b, r)
    torch.testing.assert_close(out, f(x, b, r))
    out.backward(torch.ones_like(out))
    forward, backward = found
    assert len(forward) == 1 and len(backward) == 1
    targets = {str(n.target) for n in forward[0].nodes + backward[0].nodes}
    assert "prims.convert_element_type.default" in targets


def test_weight_and_bias_gradients_are_column_sums_of_the_norms_kernel():
    """A layer norm's backward is one kernel: dx at each element, and the weight and
    bias gradients (sums over the rows) added up in it as column sums rather than
    stored at each element for aten to sum."""
    w, b = torch.randn(48, requires_grad=True), torch.randn(48, requires_grad=True)
    x = torch.randn(3, 37, 48, requires_grad=True)

    def f(x, w, b):
        return F.layer_norm(x, (48,), w, b)

    found = _fused_gradients(f, x, w, b, rtol=1e-4, atol=1e-4)
    backward = [grp for grp in found[1] if grp.nred]
    assert len(backward) == 1 and len(backward[0].columns) == 2
    sums = [n for n in backward[0].nodes if n.target is torch.ops.aten.sum.dim_IntList
            and n in backward[0].columns]
    assert sorted(len(n.args[1]) for n in sums) == [2, 2]    # over B and T


@pytest.mark.parametrize("cols", [1100, _C.NVRTC_COLUMN_COLS + 4])
def test_column_sums_join_rows_up_to_the_registers_bound(cols):
    """Past the warp path's 1024 elements the block path keeps the weight and bias
    gradients' sums in registers, up to NVRTC_COLUMN_COLS; past that they are aten's
    sums."""
    w = torch.randn(cols, requires_grad=True)
    b = torch.randn(cols, requires_grad=True)
    x = torch.randn(4, cols, requires_grad=True)

    def f(x, w, b):
        return F.layer_norm(x, (cols,), w, b)

    found = _fused_gradients(f, x, w, b, rtol=1e-4, atol=1e-4)
    joined = [grp for grp in found[1] if grp.columns]
    assert len(joined) == (cols <= _C.NVRTC_COLUMN_COLS)
    assert [grp for grp in found[1] if grp.nred]      # dx one row kernel either way


def test_a_bias_gradient_turns_its_pointwise_kernel_into_rows():
    """GELU's backward over (B, T, C) with the bias gradient summed over B and T: one
    kernel, whose rows are C long, stores the input gradient and adds up the bias's."""
    b = torch.randn(40, requires_grad=True)
    x = torch.randn(2, 9, 40, requires_grad=True)

    def f(x, b):
        return F.gelu(x + b)

    found = _fused_gradients(f, x, b)
    (backward,) = [grp for grp in found[1] if grp.columns]
    assert backward.nred == 1 and backward.space[-1] == 40


def test_a_linear_layers_bias_gradient_is_summed_through_its_view():
    """A linear layer's bias gradient is a sum over a view of the gradient that merges
    its leading dimensions (B * T rows for the matmul): it becomes the sum of the
    gradient itself over B and T, a column sum of the kernel that computes it."""
    b = torch.randn(40, requires_grad=True)
    w = torch.randn(40, 24, requires_grad=True)
    x = torch.randn(2, 9, 24, requires_grad=True)

    def f(x, w, b):
        return F.gelu(F.linear(x, w, b))

    found = _fused_gradients(f, x, w, b, rtol=1e-4, atol=1e-5)
    sums = [n for grp in found[1] for n in grp.columns]
    assert sums and all(len(n.args[1]) == 2 for n in sums)   # over B and T


@pytest.mark.parametrize("keepdim", [False, True])
def test_a_column_sum_is_not_read_by_its_own_kernel(keepdim):
    """A sum over the rows that the same space then uses (here broadcast back over the
    rows, in a square space where it has a row's shape too) is complete only after the
    kernel: its users run in a kernel of their own."""
    x, y = torch.randn(24, 24), torch.randn(24, 24)

    def f(x, y):
        s = (x * y).sum(0, keepdim=keepdim)
        return x * s + y, s

    found, compiler = _recording_compiler()
    got = aot_function(f, fw_compiler=compiler, decompositions=_decompositions())(x, y)
    want = f(x, y)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    assert got[1].shape == want[1].shape
    with_columns = [grp for grp in found[0] if grp.columns]
    assert len(with_columns) == 1
    users = {u for n in with_columns[0].columns for u in n.users}
    assert not users & set(with_columns[0].nodes)


def test_column_sums_in_half_precision_round_once_as_eager_does():
    """A bf16 sum over the rows is added up in fp32 across the slots and rounded once,
    as eager rounds its fp32 accumulation."""
    x = (torch.randn(300, 64) * 4).bfloat16()

    def f(x):
        return (x * 2).sum(0), torch.relu(x)

    found, compiler = _recording_compiler()
    got = aot_function(f, fw_compiler=compiler, decompositions=_decompositions())(x)
    want = f(x)
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert [len(grp.columns) for grp in found[0]] == [1]


def test_rms_norms_backward_is_one_kernel():
    """RMSNorm's backward reads the forward's saved rstd once a row, computes its row
    values from it (rstd cubed), spreads them over the row (an expand) and adds up the
    weight gradient: one kernel, where it was three."""
    w = torch.rand(40, requires_grad=True)
    x = torch.randn(3, 7, 40, requires_grad=True)

    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    found = _fused_gradients(f, x, w, rtol=1e-4, atol=1e-5)
    assert len(found[0]) == 1 and len(found[1]) == 1
    assert found[1][0].columns


def test_a_row_value_spread_over_its_row_for_the_output_is_stored_by_the_row_kernel():
    """An expand of a row value that the graph returns is an element output holding a
    row value: the row kernel stores it at every element of its row (place 0), beside
    its row output (place 3), and the rest fuses with them: one kernel."""
    x = torch.randn(6, 32)

    def f(x):
        s = (x * 2).sum(-1, keepdim=True)
        return s.expand(6, 32), torch.relu(x - s), s + 1

    found, compiler = _recording_compiler()
    got = aot_function(f, fw_compiler=compiler, decompositions=_decompositions())(x)
    for a, e in zip(got, f(x)):
        torch.testing.assert_close(a, e)
    assert len(found[0]) == 1 and found[0][0].nred
    assert any(n.target is torch.ops.aten.expand.default for n in found[0][0].nodes)


def test_a_node_joins_no_group_that_its_other_operands_depend_on():
    # y = exp(x); z = mm(y, y) (not fusible); w = y + z: w cannot join y's group, or the
    # group would both feed and wait for the mm
    found, compiler = _recording_compiler()
    def f(x):
        y = x.exp()
        return y + y @ y

    x = torch.randn(5, 5)
    torch.testing.assert_close(aot_function(f, fw_compiler=compiler)(x), f(x))
    assert len(found[0]) == 2


def test_dropout_keeps_eagers_random_numbers():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return F.dropout(F.silu(self.fc(x)), 0.3, self.training) * 2.0

    eager, model = _twins(Drop)
    optimized = agspeed.optimize(model, backend=HOST)
    x = torch.randn(6, 8)
    torch.manual_seed(3)
    want = eager(x)
    torch.manual_seed(3)
    got = optimized(x)
    torch.testing.assert_close(got, want)


@pytest.fixture(scope="module")
def zoo():
    import os
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
    sys.path.insert(0, os.path.abspath(root))
    try:
        import _models
    finally:
        sys.path.pop(0)
    return _models


@pytest.mark.parametrize("name", ["mlp", "resnet", "encoder", "gpt", "hf_bert", "hf_gpt2",
                                  "hf_vit"])
def test_the_zoo_trains_like_eager_and_nvrtc_compiles_every_kernel(zoo, name):
    """A training step of each benchmark model (quick size): every kernel of its forward
    and backward compiles to PTX with NVRTC, and runs on the CPU to eager's loss and
    gradients."""
    from agspeed import _C
    from agspeed.backends.nvrtc import _libs, kernels

    assert _libs.nvrtc()[0] is not None, _libs.nvrtc()[1]
    compiled = []

    def launcher(desc):     # with the backend's options
        ptx = _C.nvrtc_compile(_C.nvrtc_source(desc), desc[0] + ".cu",
                               kernels.compile_options("--gpu-architecture=compute_80"),
                               False)
        compiled.append((desc[1], len(ptx)))
        return host.launcher(desc)

    if zoo.SPECS[name].family == "transformers" and not zoo.have_transformers():
        pytest.fail("transformers is part of the test set-up")
    eager = zoo.build(name, "quick", seed=0)
    model = zoo.build(name, "quick", seed=0)
    optimized = agspeed.optimize(model, backend=nvrtc.compile_with(launcher))
    batch = zoo.SPECS[name].batch("quick", torch.Generator().manual_seed(1))
    want, got = eager(*batch), optimized(*batch)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    want.backward()
    got.backward()
    for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
        if p.grad is None:
            assert q.grad is None, pname
            continue
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=pname)
    assert compiled and any(kind == 1 for kind, _ in compiled)  # rows kernels among them


def test_groups_that_would_wait_on_themselves_are_given_up():
    """A group holding exp(x) and exp(mm(exp(x), .)) could run neither before nor after
    the mm: such a group is dropped (its nodes run through aten), never run out of
    order."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        a = x.exp()
        return (a @ a).exp()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 4))
    exps = [n for n in gm.graph.nodes if n.target is torch.ops.aten.exp.default]
    bad = partition.Group(partition._shape(exps[0]), 0)
    bad.nodes = exps
    assert partition._without_cycles(gm, [bad]) == []
    with pytest.raises(RuntimeError, match="cannot run in order"):
        partition.rewrite(gm, [bad], lambda desc, plan: None)


def test_producers_of_one_node_become_one_kernel():
    found, compiler = _recording_compiler()
    def f(x):   # two chains from one input, joined at the end: one kernel
        return (x * 0.5) * (torch.erf(x * 0.7) + 1.0)

    x = torch.randn(6, 10)
    torch.testing.assert_close(aot_function(f, fw_compiler=compiler)(x), f(x))
    assert len(found[0]) == 1 and len(found[0][0].nodes) == 5


def test_a_group_whose_kernel_fails_runs_through_aten(caplog):
    calls = []

    def flaky(desc):
        calls.append(desc[0])
        if len(calls) == 1:
            raise RuntimeError("no kernel for this one")
        return host.launcher(desc)

    eager, model = _twins(Block)
    optimized = agspeed.optimize(model, backend=nvrtc.compile_with(flaky))
    x = torch.randn(3, 16)
    with caplog.at_level(logging.INFO, logger="agspeed.autotune"):
        torch.testing.assert_close(optimized(x), eager(x))
    assert len(calls) >= 2 and "runs through aten" in caplog.text


def test_groups_reading_one_input_become_one_kernel():
    found, compiler = _recording_compiler()
    def f(x):   # two independent results of one input: one kernel, two outputs
        return x.exp() * 2.0, torch.tanh(x) + 1.0

    x = torch.randn(7, 9)
    got = aot_function(f, fw_compiler=compiler)(x)
    for g, w in zip(got, f(x)):
        torch.testing.assert_close(g, w)
    assert len(found[0]) == 1


class PooledBlocks(nn.Module):
    """Two residual blocks of one shape (conv, batch norm, relu), then a batch norm, a
    relu and the mean over H and W: a CNN's head."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(4, 4, 3, padding=1) for _ in range(2))
        self.bns = nn.ModuleList(nn.BatchNorm2d(4) for _ in range(3))

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = x + F.relu(bn(conv(x)))
        return F.relu(self.bns[2](x)).mean((2, 3))


def test_repeated_blocks_share_kernels_and_channel_weights_are_read_once_a_row():
    """Kernels are named by what they compute, so the groups of two blocks of one shape
    are one source (compiled once); the pooled head reads the batch norm's per-channel
    values once a row through their strides (flag 4), and trains like eager."""
    descs = []

    def launcher(desc):
        descs.append(desc)
        return host.launcher(desc)

    eager, model = _twins(PooledBlocks)
    optimized = agspeed.optimize(model, backend=nvrtc.compile_with(launcher))
    for _ in range(2):
        x = torch.randn(3, 4, 6, 6)
        want, got = eager(x), optimized(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        want.square().sum().backward()
        got.square().sum().backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    names = [d[0] for d in descs]
    assert all(d[0] == partition.content_name(d) for d in descs)
    assert all(n.startswith("ags_rows_" if d[1] == 1 else "ags_pointwise_")
               for n, d in zip(names, descs))
    assert len(set(names)) < len(names)         # the blocks' groups, one source
    pooled = [d for d in descs if d[1] == 1 and any(f == 4 for _, f in d[4])]
    assert pooled, [d[4] for d in descs]


def test_a_source_wanted_by_several_threads_is_compiled_once(monkeypatch):
    """The graph's kernels are made on several threads: those that want one source wait
    for the first one's compile and read its image from the cache."""
    import threading
    import time
    import uuid

    from agspeed import _C
    from agspeed.backends.nvrtc import kernels

    calls = []

    def slow_compile(source, name, options, cubin):
        calls.append(name)
        time.sleep(0.2)
        return b"image of " + source.encode()

    monkeypatch.setattr(_C, "nvrtc_compile", slow_compile)
    source = f"// {uuid.uuid4()}\n"
    got = []
    threads = [threading.Thread(target=lambda: got.append(
        kernels.image_for(source, "k", "--gpu-architecture=sm_90", True))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["k.cu"] and got == [b"image of " + source.encode()] * 4
    assert not kernels._keys      # nothing left behind for sources no thread wants
    other = f"// {uuid.uuid4()}\n"
    kernels.image_for(other, "k", "--gpu-architecture=sm_90", True)
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["llama", "mistral", "t5", "bart", "distilbert"])
def test_more_transformers_train_like_eager(name):
    """RMSNorm, rotary embeddings, T5's relative attention bias, encoder-decoders: a
    training step through the fused kernels gives eager's loss and gradients."""
    import copy

    import test_transformers as tt

    model = tt._build(name, "train")
    twin = copy.deepcopy(model)
    fast = agspeed.optimize(twin, backend=HOST)
    inputs = tt._inputs(tt.MODELS[name][4], True, torch.Generator().manual_seed(1))
    ref, ref_grads = tt._step(model, model, "train", inputs)
    out, grads = tt._step(fast, twin, "train", inputs)
    torch.testing.assert_close(out.loss, ref.loss, rtol=tt.RTOL, atol=tt.ATOL)
    assert set(grads) == set(ref_grads)
    for pname, grad in ref_grads.items():
        torch.testing.assert_close(grads[pname], grad, rtol=tt.RTOL, atol=tt.ATOL,
                                   msg=pname)


def test_masks_combined_bitwise_are_fused_and_integers_are_not():
    """``&`` and ``|`` of bool masks (attention and padding masks) are the logical ops in
    a kernel; on integers they are bitwise and stay aten's."""
    found, compiler = _recording_compiler()
    def masks(x, y):
        keep = ((x > 0) & (y < 0.5)) | (x < -1)
        return torch.where(keep, x * 2.0, y)

    def integers(a, b):
        return (a & b) + (a | b)

    x, y = torch.randn(5, 7), torch.randn(5, 7)
    torch.testing.assert_close(aot_function(masks, fw_compiler=compiler)(x, y), masks(x, y))
    assert len(found[0]) == 1 and {str(n.target) for n in found[0][0].nodes} >= {
        "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor"}
    a, b = torch.randint(0, 64, (5, 7)), torch.randint(0, 64, (5, 7))
    torch.testing.assert_close(aot_function(integers, fw_compiler=compiler)(a, b),
                               integers(a, b))
    assert not any("bitwise" in str(n.target) for g in found[1] for n in g.nodes)
