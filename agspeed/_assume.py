"""Branches assumed: the truth of a tensor where one way of the branch only raises.

``if not valid.all(): raise ValueError(...)`` (torch.distributions' argument checks),
``assert (x >= 0).all()``, range checks before an embedding: the branch depends on the
tensor's data, which capture does not know, and would be a graph break.  But the way
that does not raise is the one the program means to take, so capture assumes it (the
interpreter finds which way only raises: csrc/interp_flow.c).  The tested tensor becomes
an extra output of the graph, and the entry checks each such output after the graph
ran (``checked``); where one went the other way, nothing the graph computed is kept:
the callable raises ``_C.AssumptionFailed`` and the hook runs the frame's own bytecode,
which raises eager's error with eager's message.  An error the graph itself raises on
such an input (an index the check guarded, out of range) is taken the same way.

Dropping the graph's work is sound while the graph leaves no trace but its outputs: a
capture assumes a branch only where the graph changes none of its inputs in place and
draws random numbers from the CPU's default generator at most (whose state the entry
saves before the graph and puts back where a check fails); a graph that does otherwise
after an assumption is captured again without assuming (the branch is then a break).
Where a tested tensor is on a GPU, a graph that indexes by a tensor's values does not
assume either: an index out of range there is a device-side assert.  ``config.assume_branches=False``
turns assuming off.  The ``with`` blocks the graph entered are left as on any raise
(``agspeed._ctx.restoring_modes`` wraps this callable).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

from agspeed import _C
from agspeed._builder_types import concrete

__all__ = ["Assumptions", "AssumedUnsafe", "checked"]

# operators that write into their left operand (x += y on a tensor)
_IN_PLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift, operator.imatmul, operator.setitem,
    operator.delitem,
})
# calls that draw from a random number generator whatever their arguments
_RANDOM = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
    "bernoulli", "multinomial", "normal", "poisson", "binomial", "_standard_gamma",
    "_sample_dirichlet", "native_dropout", "gumbel_softmax", "fractional_max_pool2d",
    "fractional_max_pool3d", "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices", "uniform_", "normal_", "random_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "bernoulli_",
})
# random only in training with p > 0: (position of p, position of training)
_DROPOUTS = {
    "dropout": (1, 2), "dropout1d": (1, 2), "dropout2d": (1, 2), "dropout3d": (1, 2),
    "alpha_dropout": (1, 2), "feature_alpha_dropout": (1, 2), "feature_dropout": (1, 2),
    "rrelu": (None, 3), "rrelu_": (None, 3),
}


# calls that read memory at indices their tensor arguments hold: on a GPU, an index out
# of range is a device-side assert that ends the process's CUDA context, not an error the
# entry could take back (a check before them is not assumed where a tested tensor is on
# a GPU)
_INDEXING = frozenset({
    "embedding", "embedding_bag", "gather", "scatter", "scatter_", "scatter_add",
    "scatter_add_", "scatter_reduce", "scatter_reduce_", "index_select", "index_add",
    "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_", "index_put",
    "index_put_", "index_reduce", "take", "take_along_dim", "one_hot", "nll_loss",
    "cross_entropy", "multi_margin_loss", "multilabel_margin_loss", "bincount",
    "getitem", "setitem", "__getitem__", "__setitem__",
})


class AssumedUnsafe(Exception):
    """A graph that assumed a branch then changed an input in place or drew random
    numbers: its capture is done again without assuming."""


def _name(kind: str, target: Any) -> str:
    return str(target) if kind == "call_method" else getattr(target, "__name__", "")


def _arg(args: tuple, kwargs: dict, at: int | None, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    if at is not None and len(args) > at:
        return args[at]
    return default


class Assumptions:
    """The builder's part: branches assumed, and what keeps assuming them sound."""

    # whether this capture may assume branches (agspeed._capture turns it off for a
    # capture done again after AssumedUnsafe)
    assume_branches: bool = True

    def _assume_init(self) -> None:
        self.assumed: list[tuple[Any, bool]] = []   # (node tested, truth assumed)
        self.assumed_on_device = False   # a tested tensor is on a GPU: no indexing

    def assume_truth(self, obj: Any, truth: bool) -> bool:
        """The truth of ``obj`` where a branch's other way only raises: a one-element
        tensor's assumed to be ``truth`` (checked after the graph); else ``truth()``."""
        from agspeed import config

        torch = self._torch
        if not isinstance(obj, self.node_type) or self.is_size(obj) or \
                not (self.assume_branches and config.assume_branches):
            return self.truth(obj)
        fake = obj.meta.get("example_value")
        if not isinstance(fake, torch.Tensor) or concrete(fake.numel()) != 1:
            return self.truth(obj)   # the data-dependent break, as without assuming
        prior = self.assumed_on_device
        self.assumed_on_device = prior or fake.device.type != "cpu"
        if any(self._leaves_trace(n.op, n.target, n.args, n.kwargs, n.meta.get("example_value"))
               for n in self.graph.nodes if n.op in ("call_function", "call_method")):
            self.assumed_on_device = prior
            return self.truth(obj)
        self.assumed.append((obj, bool(truth)))
        return bool(truth)

    def _check_assumable(self, kind: str, target: Any, args: tuple, kwargs: dict,
                         out: Any) -> None:
        """Called for each node recorded (``out``: its fake result): one that leaves a
        trace, after a branch was assumed, makes the capture start again without
        assuming."""
        if self.assumed and self._leaves_trace(kind, target, args, kwargs, out):
            raise AssumedUnsafe(_name(kind, target))

    def _leaves_trace(self, kind: str, target: Any, args: tuple, kwargs: dict,
                      out: Any = None) -> bool:
        """Whether a call changes one of the graph's inputs in place, draws random
        numbers other than from the CPU's default generator (what running the graph and
        then the frame eagerly would do twice: the entry restores that generator), or,
        where a tested tensor is on a GPU, reads at indices a tensor holds."""
        name = _name(kind, target)
        if self.assumed_on_device and self._indexes(name, args):
            return True
        if self._draws(name, args, kwargs) and \
                ("generator" in kwargs or not self._all_on_cpu(out)):
            return True
        writes = (kind == "call_method" and name.endswith("_")) or \
            (kind == "call_function" and (name.endswith("_") or target in _IN_PLACE_OPERATORS)) \
            or kwargs.get("inplace") is True or kwargs.get("out") is not None
        # what such a call writes: its first argument (self, the target of `t[i] = v`,
        # of `x += y`, of inplace=True), or its `out=`
        return writes and self._touches_input((args[:1], kwargs.get("out")))

    def _draws(self, name: str, args: tuple, kwargs: dict) -> bool:
        """Whether a call draws random numbers."""
        if name in _RANDOM:
            return True
        if name in _DROPOUTS:
            p_at, training_at = _DROPOUTS[name]
            p = _arg(args, kwargs, p_at, "p", 0.5) if p_at is not None else 1
            training = _arg(args, kwargs, training_at, "training",
                            name.startswith("rrelu") is False)
            return training is not False and p != 0
        return name == "scaled_dot_product_attention" and \
            _arg(args, kwargs, 4, "dropout_p", 0.0) != 0

    def _all_on_cpu(self, out: Any) -> bool:
        """Whether every tensor of a fake result is on the CPU."""
        torch = self._torch
        values = [out]
        while values:
            value = values.pop()
            if isinstance(value, (tuple, list)):
                values.extend(value)
            elif isinstance(value, torch.Tensor) and value.device.type != "cpu":
                return False
        return True

    def draws_from_cpu_generator(self) -> bool:
        """Whether the graph draws random numbers (all from the CPU's default generator,
        or it would not have assumed): the entry saves that generator's state."""
        return any(self._draws(_name(n.op, n.target), n.args, n.kwargs)
                   for n in self.graph.nodes if n.op in ("call_function", "call_method"))

    def _fakes_in(self, values: Any) -> list:
        """The fake values of the nodes in ``values`` (through tuples, lists, dicts)."""
        import torch.fx

        fakes: list = []
        torch.fx.node.map_arg(values, lambda node: fakes.append(node.meta.get("example_value")))
        return fakes

    def _indexes(self, name: str, args: tuple) -> bool:
        """Whether a call reads or writes at indices a tensor holds (an item access
        only where its index holds an integer tensor)."""
        if name not in _INDEXING:
            return False
        if name not in ("getitem", "setitem", "__getitem__", "__setitem__"):
            return True
        torch = self._torch
        return any(isinstance(fake, torch.Tensor) and fake.dtype is not torch.bool
                   for fake in self._fakes_in(args[1:2]))

    def _touches_input(self, values: Any) -> bool:
        """Whether any of ``values`` (nodes, or tuples and lists of them) is a graph
        input or a view of one."""
        torch = self._torch
        inputs = {id(node.meta.get("example_value")) for node, _ in self._inputs.values()}
        for fake in self._fakes_in(values):
            while isinstance(fake, torch.Tensor):
                if id(fake) in inputs:
                    return True
                fake = fake._base
        return False

    def assumed_output(self, built: Any) -> Any:
        """The graph's output with the tested tensors after it, when it assumed any."""
        if not self.assumed:
            return built
        return built, tuple(node for node, _ in self.assumed)


def checked(gm: Any, compiled: Callable) -> Callable:
    """``compiled`` (the graph of ``gm``, or what a backend made of it) answering its
    result only where every assumed branch went the assumed way: else, or where the
    graph raised, ``_C.AssumptionFailed`` (the frame then runs its own bytecode), with
    the CPU's default generator put back where the graph drew from it."""
    wants = gm.meta.get("agspeed_assumed")
    if not wants:
        return compiled
    failed = _C.AssumptionFailed
    generator = None
    if gm.meta.get("agspeed_assumed_rng"):
        import torch

        generator = torch.default_generator

    def run(*inputs: Any) -> Any:
        state = generator.get_state() if generator is not None else None
        try:
            result, tested = compiled(*inputs)
            ok = all(bool(value) is want for value, want in zip(tested, wants))
        except Exception as exc:   # the graph's own error where a check would have failed
            if state is not None:
                generator.set_state(state)
            raise failed(f"the graph raised {type(exc).__name__}") from exc
        if not ok:
            if state is not None:
                generator.set_state(state)
            raise failed("an assumed branch went the other way")
        return result

    return run
