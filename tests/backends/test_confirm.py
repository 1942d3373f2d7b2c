"""The autotuner's choice for a training graph, checked again on the program's own steps.

The candidates are small backends registered here, with a known trait: one multiplication
standing for a chain of 300 (right, and far faster than eager), and the same made slow
once the program's loop starts (fast while tuned, slow where it counts: what happens when
a graph was measured on a busy machine).  So each verdict is certain whatever the load.
"""

import gc
import time
import weakref

import pytest

import agspeed
from agspeed import backends
from agspeed.backends import _confirm, autotune, knowledge

try:
    import torch
    import torch.nn as nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch

_LOOP = {"slow": False, "calls": 0}

if torch is not None:

    class Chain(nn.Module):
        """300 multiplications by one: slow in eager, exactly one multiplication."""

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))

        def forward(self, x):
            y = x * self.scale
            for _ in range(300):
                y = y * 1.0
            return y


def _one_mul(gm, example_inputs):
    return lambda x, scale: (x * scale,)


def _slow_in_the_loop(gm, example_inputs):
    def run(x, scale):
        _LOOP["calls"] += 1
        if _LOOP["slow"]:
            # slower than eager's step on any machine: under AddressSanitizer, with
            # the other test worker busy, eager's step took over 30 ms
            time.sleep(0.25)
        return (x * scale,)
    return run


def _slow_while_tuned(gm, example_inputs):
    def run(x, scale):
        if _LOOP["tuning"]:
            time.sleep(0.25)   # a busy machine while the graph was measured
        return (x * scale,)
    return run


@pytest.fixture
def kb(tmp_path):
    agspeed.register_backend("c_fast", _one_mul, override=True)
    agspeed.register_backend("c_late", _slow_in_the_loop, override=True)
    agspeed.register_backend("c_early", _slow_while_tuned, override=True)
    _LOOP.update(slow=False, tuning=False)
    with agspeed.config.override(cache_dir=str(tmp_path / "kb"), progress=False,
                                 tune_after=1):   # tuned on the capturing call
        yield
    _LOOP.update(slow=False, tuning=False)
    for name in ("c_fast", "c_late", "c_early"):
        backends._registered.pop(name, None)


def _batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 8, generator=g) for _ in range(n)]


def _train(model, batches, opt=None, accumulate=1, seen=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05)
    for k, x in enumerate(batches):
        model(x).square().mean().backward()
        if seen is not None:
            head = _confirm._clock.head() if _confirm._clock.head is not None else None
            seen[-1].append(None if head is None else head.fn)
        if (k + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
            if seen is not None:
                seen.append([])
    return opt


def _steps():
    # tuning's call, then the turns: (1 warm + confirm_steps) of each, and one to spare
    return 2 + 2 * (1 + agspeed.config.confirm_steps) + 1


def test_a_choice_that_wins_in_the_loop_too_is_kept_and_remembered(kb):
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    _train(optimized, _batches(_steps()))
    (d,) = autotune.decisions()
    assert d.choice == "c_fast" and d.loop is not None and d.loop > 1
    (rec,) = knowledge.records()
    assert rec["choice"] == "c_fast" and rec["loop"]["kept"] is True
    assert rec["loop"]["candidate"] == "c_fast" and rec["loop"]["steps"] == \
        agspeed.config.confirm_steps
    assert not _confirm.hooked()  # nothing left to watch: the hook is gone

    # a later run takes the checked choice from the knowledge base and watches nothing
    agspeed.reset()
    optimized = agspeed.optimize(Chain(), candidates=("c_fast",))
    _train(optimized, _batches(2))
    (d,) = autotune.decisions()
    assert d.source == "knowledge base" and d.choice == "c_fast"
    assert not _confirm.hooked()


def test_a_choice_that_loses_in_the_loop_runs_eager_from_then_on(kb):
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_late",))
    batches = _batches(_steps() + 3)
    optimized(batches[0]).sum().backward()  # tuned here: c_late is fast
    (d,) = autotune.decisions()
    assert d.choice == "c_late" and d.loop is None
    model.zero_grad()
    _LOOP["slow"] = True  # and slow on the program's steps
    _train(optimized, batches)
    (d,) = autotune.decisions()
    assert d.choice == "eager" and d.loop < 1
    (rec,) = knowledge.records()
    assert rec["choice"] == "eager"
    assert rec["loop"]["candidate"] == "c_late" and rec["loop"]["kept"] is False
    assert rec["candidates"]["c_late"]["status"] == "ok"  # the tuning's figure stays
    # later calls run eager: the compiled callable is never called again
    calls = _LOOP["calls"]
    x = batches[0]
    torch.testing.assert_close(optimized(x), model(x))
    assert _LOOP["calls"] == calls

    # a later run takes eager from the knowledge base
    agspeed.reset()
    _train(agspeed.optimize(Chain(), candidates=("c_late",)), _batches(2))
    (d,) = autotune.decisions()
    assert d.source == "knowledge base" and d.choice == "eager"
    assert not _confirm.hooked()


def test_a_graph_remembered_as_eager_gets_one_look_on_the_steps(kb):
    # measured slow (a busy machine): eager, remembered so
    _LOOP["tuning"] = True
    _train(agspeed.optimize(Chain(), candidates=("c_early",)), _batches(2))
    (d,) = autotune.decisions()
    assert d.choice == "eager" and d.loop is None
    assert not _confirm.hooked()    # it lost by far when measured: not watched then
    (rec,) = knowledge.records()
    assert rec["choice"] == "eager" and rec["candidates"]["c_early"]["status"] == "ok"

    # a later run watches the candidate against eager on its steps, where it wins
    _LOOP["tuning"] = False
    agspeed.reset()
    model = Chain()
    reference = Chain()
    reference.load_state_dict(model.state_dict())
    batches = _batches(_steps())
    _train(agspeed.optimize(model, candidates=("c_early",)), batches)
    _train(reference, batches)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)
    (d,) = autotune.decisions()
    assert d.source == "knowledge base" and d.choice == "c_early" and d.loop > 1
    (rec,) = knowledge.records()
    assert rec["choice"] == "c_early" and rec["loop"]["candidate"] == "c_early"
    assert rec["loop"]["kept"] is True

    # and the one after takes it as checked
    agspeed.reset()
    _train(agspeed.optimize(Chain(), candidates=("c_early",)), _batches(2))
    (d,) = autotune.decisions()
    assert d.choice == "c_early" and not _confirm.hooked()


def test_a_graph_remembered_as_eager_is_looked_at_once(kb):
    _LOOP["tuning"] = True
    _train(agspeed.optimize(Chain(), candidates=("c_early",)), _batches(2))
    agspeed.reset()
    _train(agspeed.optimize(Chain(), candidates=("c_early",)), _batches(_steps()))
    (d,) = autotune.decisions()     # still slow on the steps: eager stays
    assert d.choice == "eager" and d.loop is not None and d.loop < 1
    (rec,) = knowledge.records()
    assert rec["choice"] == "eager" and rec["loop"]["candidate"] == "c_early"
    assert rec["judged"] == ["c_early"]
    agspeed.reset()
    _train(agspeed.optimize(Chain(), candidates=("c_early",)), _batches(2))
    assert not _confirm.hooked()    # judged once: not watched again


def _remember_verdict(name, kept, ratio):
    """Overwrite the one record's verdict as another process's steps might have left it."""
    (rec,) = knowledge.records()
    meta = {k: v for k, v in rec.items()
            if k not in ("format", "key", "env", "candidates", "choice", "loop", "judged",
                         "updated")}
    verdict = {"kept": kept, "median_s": 0.010, "eager_s": 0.010 * ratio, "ratio": ratio,
               "steps": 5}
    return knowledge.confirm(rec["key"], rec["env"], meta, name, verdict)


def test_a_close_verdict_is_taken_again_once_in_each_process(kb):
    # c_late won on the first process's steps, but only just (1.1x): a later process
    # whose steps it loses on runs eager, and says so in the knowledge base
    _train(agspeed.optimize(Chain(), candidates=("c_late",)), _batches(2))
    _remember_verdict("c_late", True, 1.1)
    agspeed.reset()
    _LOOP["slow"] = True
    model = Chain()
    reference = Chain()
    reference.load_state_dict(model.state_dict())
    batches = _batches(_steps())
    optimized = agspeed.optimize(model, candidates=("c_late",))
    _train(optimized, batches[:2])
    assert _confirm.hooked()            # watched again in this process
    _train(optimized, batches[2:])
    _train(reference, batches)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)
    (d,) = autotune.decisions()
    assert d.source == "knowledge base" and d.choice == "eager" and d.loop < 1
    (rec,) = knowledge.records()
    assert rec["choice"] == "eager" and rec["loop"]["kept"] is False
    assert not _confirm.hooked()

    # the loss was far from even: the next process takes eager without watching
    agspeed.reset()
    _train(agspeed.optimize(Chain(), candidates=("c_late",)), _batches(2))
    (d,) = autotune.decisions()
    assert d.choice == "eager" and not _confirm.hooked()

    # a close loss is looked at again too: where the candidate wins it is the choice
    _remember_verdict("c_late", False, 0.9)
    _LOOP["slow"] = False
    agspeed.reset()
    optimized = agspeed.optimize(Chain(), candidates=("c_late",))
    _train(optimized, _batches(2))
    assert _confirm.hooked()
    _train(optimized, _batches(_steps()))
    (d,) = autotune.decisions()
    assert d.choice == "c_late" and d.loop > 1
    (rec,) = knowledge.records()
    assert rec["choice"] == "c_late" and rec["loop"]["kept"] is True

    # and within one process a graph is watched once, however often it is tuned again
    _remember_verdict("c_late", True, 1.1)
    agspeed._C.clear_caches()
    _train(agspeed.optimize(Chain(), candidates=("c_late",)), _batches(2))
    assert not _confirm.hooked()


def test_training_through_the_turns_gives_eager_training_results(kb):
    batches = _batches(_steps())
    reference = Chain()
    model = Chain()
    model.load_state_dict(reference.state_dict())
    _train(reference, batches)
    _train(agspeed.optimize(model, candidates=("c_fast",)), batches)
    torch.testing.assert_close(model.scale, reference.scale, rtol=0, atol=0)
    assert autotune.decisions()[0].loop is not None


def test_every_call_of_a_step_runs_the_same_variant(kb):
    # four micro-batches per optimizer step: the watched graph runs one variant per step
    seen = [[]]
    model = Chain()
    _train(agspeed.optimize(model, candidates=("c_fast",)), _batches(4 * _steps()),
           accumulate=4, seen=seen)
    steps = [s for s in seen if s]
    turns = [s for s in steps if any(f is not None for f in s)]
    assert len(turns) >= 2 * (1 + agspeed.config.confirm_steps)
    for s in turns[1:-1]:  # the first and last hold the turns' start and end
        assert len({id(f) for f in s}) == 1
    # and the turns alternate between two callables
    assert len({id(s[0]) for s in turns[1:-1]}) == 2
    assert autotune.decisions()[0].loop is not None


def test_a_graph_no_longer_called_is_let_go_with_its_choice(kb):
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    opt = _train(optimized, _batches(2))
    assert _confirm.hooked()
    for _ in range(_confirm._PATIENCE + 2):  # steps without calling the graph
        opt.step()
    assert not _confirm.hooked()
    (d,) = autotune.decisions()
    assert d.choice == "c_fast" and d.loop is None
    (rec,) = knowledge.records()
    assert "loop" not in rec and rec["choice"] == "c_fast"
    # it still runs its choice, checked or not
    x = torch.randn(4, 8)
    torch.testing.assert_close(optimized(x), model(x))


def test_a_graph_for_a_shape_seen_once_hands_the_turns_on(kb):
    # the first batch's shape is never seen again: its graph is watched first, is not
    # called in its step, and the main graph takes the turns meanwhile
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = [torch.randn(3, 8)] + _batches(_steps() + 1)
    for x in batches:
        optimized(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    once, main = autotune.decisions()
    assert main.loop is not None, main
    assert once.loop is None  # still waiting, running its choice
    for _ in range(_confirm._PATIENCE):  # its own steps come back, uncalled: let go
        opt.step()
    assert not _confirm.hooked()


def test_only_an_optimizer_of_the_graphs_parameters_ticks_its_clock(kb):
    # another optimizer (a GAN's other half) steps twice around the graph's own, on
    # parameters the graph does not read: timed by it, a step would be half of one
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # (steps enough for the most rounds a verdict may take: on a machine busy enough
    # that the side-by-side steps disagree, more are measured)
    most = _steps() + 2 * (_confirm._MOST - 1) * agspeed.config.confirm_steps
    for k, x in enumerate(_batches(most)):
        if k >= _steps() and autotune.decisions()[0].loop is not None:
            break
        loss = optimized(x).sum()
        other.step()  # the first optimizer stepped once the graph is compiled
        loss.backward()
        opt.step()
        opt.zero_grad()
        other.step()
        if k == 2:  # mid-turns: the graph's clock is its own parameters' optimizer
            head = _confirm._clock.head()
            assert head is not None and head.params == {id(model.scale)}
            assert _confirm._clock._clocks(opt, head)
            assert not _confirm._clock._clocks(other, head)
    (d,) = autotune.decisions()
    assert d.loop is not None
    steps = agspeed.config.confirm_steps
    assert knowledge.records()[0]["loop"]["steps"] in range(steps, _confirm._MOST * steps + 1,
                                                            steps)


def test_no_watch_when_turned_off_or_for_inference(kb):
    with agspeed.config.override(confirm_steps=0):
        _train(agspeed.optimize(Chain(), candidates=("c_fast",)), _batches(3))
    assert not _confirm.hooked()
    assert autotune.decisions()[0].choice == "c_fast"
    agspeed.reset()
    with torch.no_grad():
        agspeed.optimize(Chain(), candidates=("c_fast",))(torch.randn(4, 8))
    assert not _confirm.hooked()


def test_reset_stops_watching_and_puts_the_choice_back(kb):
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    _train(optimized, _batches(4))  # mid-turns
    head = _confirm._clock.head()
    assert head is not None and not head.done
    chosen = head.variants[0]
    agspeed.reset()
    assert not _confirm.hooked()
    assert head.done and head.fn is chosen


def test_a_dropped_model_frees_its_watched_graph(kb):
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    opt = _train(optimized, _batches(4))
    head = weakref.ref(_confirm._clock.head())
    param = weakref.ref(model.scale)
    del model, optimized, opt
    agspeed.reset()  # the code cache holds the entries of the (shared) code object
    gc.collect()
    assert head() is None and param() is None
    assert not _confirm.hooked()


def test_a_dropped_model_mid_turns_is_not_held_by_the_clock(kb):
    # without reset: the clock holds watches weakly, so dropping the entries frees them
    model = Chain()
    optimized = agspeed.optimize(model, candidates=("c_fast",))
    _train(optimized, _batches(4))
    head = weakref.ref(_confirm._clock.head())
    refs_before = len(_confirm._clock.queue)
    agspeed._C.clear_caches()
    del model, optimized
    gc.collect()
    assert head() is None and refs_before == 0
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    other.step()  # the clock finds nothing left and removes its hook
    assert not _confirm.hooked()


def test_a_verdict_comes_from_the_steps_side_by_side_and_waits_out_noise():
    # the k-th step of each variant ran next to the other's: their ratios decide
    assert _confirm._faster([1.0] * 5, [2.0] * 5, False) is True
    assert _confirm._faster([2.0] * 5, [1.0] * 5, False) is False
    # a machine that slows down halfway weighs on both: still a clear win
    assert _confirm._faster([1, 1, 3, 3, 3], [1.2, 1.2, 3.5, 3.5, 3.5], False) is True
    # as many pairs each way (noise as large as the difference): measure more...
    mixed = ([1.0, 2.0, 1.0, 2.0, 1.0], [1.5] * 5)
    assert _confirm._faster(*mixed, False) is None
    # ...and on the last round, the median of the ratios
    assert _confirm._faster(*mixed, True) is True


def test_turns_measure_more_rounds_when_asked():
    asked = []

    def decide(samples):
        asked.append([len(s) for s in samples])
        return _confirm.MORE if len(asked) == 1 else 1

    ran = []
    t = _confirm.Turns([lambda: ran.append(0), lambda: ran.append(1)], 2, 0, False, "g",
                       decide)
    t.begin()
    states = []
    for _ in range(8):
        t()
        states.append(t.tick(0.01))
    assert asked == [[2, 2], [4, 4]]
    assert ran == [0, 1] * 4 and states[-1] == _confirm.DONE and states[:-1].count("on") == 7
    t()
    assert ran[-1] == 1 and t.done
