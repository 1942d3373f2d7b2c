"""Capture coverage on real models: agspeed's graphs and breaks next to Dynamo's.

Models: HuggingFace ``transformers`` architectures built from tiny configs (2 layers,
hidden 32, random weights, nothing downloaded: BERT, GPT-2, LLaMA, T5, BART, Mistral,
DistilBERT, ViT) and the model zoo of tests/models/test_zoo.py.  Each runs in two modes:

  eval   ``model.eval()`` under ``torch.no_grad()``, no labels;
  train  ``model.train()`` with labels (the transformers models' own loss; the zoo's
         outputs summed), forward and backward.

Dropout is zeroed everywhere (config fields and nn.Dropout modules) so that both runtimes
compute exactly what eager does.  For each model and mode:

  graphs, breaks   ``agspeed.explain`` next to ``torch._dynamo.explain`` on the same call;
  reasons          agspeed's most frequent break reasons (reason: detail);
  capture_ms       the first call (forward only), from ``agspeed.optimize(model,
                   backend="eager")`` or ``torch.compile(model, backend="eager")`` until
                   its result is back, both runtimes reset first; the two are interleaved,
                   their order alternating per round, median over rounds;
  equal            agspeed's result (and, in train, loss and every parameter's gradient)
                   equal to eager's, fp32 tolerances.

Every model runs in a process of its own (one JSON line back), so one that crashes the
process is reported as an error and the others still run; a warm-up capture in that
process keeps one-time import costs out of the timings.  Threads are limited to one.

    python benchmarks/coverage.py [--models bert,gpt2,mlp] [--modes eval,train]
        [--rounds 3] [--out benchmarks/results/coverage.json] [--md docs/coverage.md]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))

from _report import machine, save  # noqa: E402

VOCAB, SEQ, BATCH, HIDDEN, LAYERS, HEADS, FFN = 99, 8, 2, 32, 2, 2, 64
MODES = ("eval", "train")
WORKER_TIMEOUT_S = 900


# --- models --------------------------------------------------------------------------------


def _tokens(gen, b=BATCH, t=SEQ):
    import torch

    return torch.randint(1, VOCAB, (b, t), generator=gen)


def _mask(gen, b=BATCH, t=SEQ):
    """Attention mask: each row keeps a random prefix of at least half the tokens."""
    import torch

    lengths = torch.randint(t // 2, t + 1, (b, 1), generator=gen)
    return (torch.arange(t).unsqueeze(0) < lengths).long()


def _no_dropout(model):
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _hf(config_cls, model_cls, **fields):
    """A builder of ``model_cls`` from a tiny ``config_cls`` (sdpa attention)."""
    def build():
        import transformers

        config = getattr(transformers, config_cls)(**fields)
        config._attn_implementation = "sdpa"
        return _no_dropout(getattr(transformers, model_cls)(config))
    return build


def _lm_inputs(gen, labels):
    ids = _tokens(gen)
    kw = {"input_ids": ids, "attention_mask": _mask(gen)}
    if labels:
        kw["labels"] = ids.clone()
    return kw


def _cls_inputs(gen, labels):
    import torch

    kw = {"input_ids": _tokens(gen), "attention_mask": _mask(gen)}
    if labels:
        kw["labels"] = torch.randint(0, 3, (BATCH,), generator=gen)
    return kw


def _bert_inputs(gen, labels):
    kw = _cls_inputs(gen, labels)
    kw["token_type_ids"] = kw["input_ids"] * 0
    return kw


def _seq2seq_inputs(gen, labels):
    kw = {"input_ids": _tokens(gen), "attention_mask": _mask(gen)}
    target = _tokens(gen, t=SEQ // 2)
    if labels:
        kw["labels"] = target
    else:
        kw["decoder_input_ids"] = target
    return kw


def _vit_inputs(gen, labels):
    import torch

    kw = {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=gen)}
    if labels:
        kw["labels"] = torch.randint(0, 3, (BATCH,), generator=gen)
    return kw


_DECODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=1, intermediate_size=FFN,
                max_position_embeddings=64, use_cache=False, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)

# name -> (family, builder per mode, inputs(gen, labels) -> kwargs, about)
HF_MODELS = {
    "bert": ("transformers",
             {"eval": _hf("BertConfig", "BertModel", vocab_size=VOCAB, hidden_size=HIDDEN,
                          num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          intermediate_size=FFN, max_position_embeddings=64,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
              "train": _hf("BertConfig", "BertForSequenceClassification", vocab_size=VOCAB,
                           hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=FFN,
                           max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
                           num_labels=3)},
             _bert_inputs, "BertModel (eval), BertForSequenceClassification (train)"),
    "gpt2": ("transformers",
             {m: _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_positions=64,
                     n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=1, eos_token_id=2) for m in MODES},
             _lm_inputs, "GPT2LMHeadModel"),
    "llama": ("transformers",
              {m: _hf("LlamaConfig", "LlamaForCausalLM", **_DECODER) for m in MODES},
              _lm_inputs, "LlamaForCausalLM (grouped-query attention, RoPE)"),
    "mistral": ("transformers",
                {m: _hf("MistralConfig", "MistralForCausalLM", **_DECODER) for m in MODES},
                _lm_inputs, "MistralForCausalLM"),
    "t5": ("transformers",
           {m: _hf("T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB, d_model=HIDDEN,
                   d_kv=HIDDEN // HEADS, d_ff=FFN, num_layers=LAYERS, num_decoder_layers=LAYERS,
                   num_heads=HEADS, dropout_rate=0.0, use_cache=False,
                   decoder_start_token_id=0, pad_token_id=0) for m in MODES},
           _seq2seq_inputs, "T5ForConditionalGeneration (encoder-decoder)"),
    "bart": ("transformers",
             {m: _hf("BartConfig", "BartForConditionalGeneration", vocab_size=VOCAB,
                     d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                     encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64,
                     dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                     use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     decoder_start_token_id=2, forced_eos_token_id=None) for m in MODES},
             _seq2seq_inputs, "BartForConditionalGeneration (encoder-decoder)"),
    "distilbert": ("transformers",
                   {m: _hf("DistilBertConfig", "DistilBertForSequenceClassification",
                           vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                           hidden_dim=FFN, max_position_embeddings=64, dropout=0.0,
                           attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=3)
                    for m in MODES},
                   _cls_inputs, "DistilBertForSequenceClassification"),
    "vit": ("transformers",
            {m: _hf("ViTConfig", "ViTForImageClassification", image_size=16, patch_size=4,
                    num_channels=3, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                    num_attention_heads=HEADS, intermediate_size=FFN,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
             for m in MODES},
            _vit_inputs, "ViTForImageClassification, 16x16 images, patch 4"),
}

ZOO_NAMES = ("mlp", "resnet", "encoder", "gpt", "loop")


def model_names() -> list[str]:
    return list(HF_MODELS) + list(ZOO_NAMES)


def build(name: str, mode: str, seed: int = 0):
    """(model in ``mode``, inputs as (args, kwargs)) for model ``name``, seeded."""
    import torch

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if name in HF_MODELS:
        _family, builders, inputs, _about = HF_MODELS[name]
        model = builders[mode]()
        args, kwargs = (), inputs(gen, mode == "train")
    else:
        from test_zoo import ZOO

        cls, make_inputs = ZOO[name]
        model = _no_dropout(cls())
        args, kwargs = tuple(make_inputs()), {}
    return (model.train() if mode == "train" else model.eval()), args, kwargs


# --- measuring (in the worker) -------------------------------------------------------------


def _leaves(out) -> list:
    """The tensors of a result, in order: ModelOutput, tuple, list, dict, tensor."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # ModelOutput is an OrderedDict of its non-None fields
        return [t for v in out.values() for t in _leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _leaves(v)]
    return []


def _loss(out):
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    return sum(t.float().sum() for t in _leaves(out) if t.is_floating_point())


def _step(fn, model, mode, args, kwargs):
    """One call; in train also the backward.  (result, {param: grad})."""
    import torch

    torch.manual_seed(2)   # any random op left draws the same numbers on every run
    if mode == "eval":
        with torch.no_grad():
            return fn(*args, **kwargs), {}
    out = fn(*args, **kwargs)
    _loss(out).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out, grads


def _equal(ref, res, ref_grads, res_grads) -> tuple[bool, str]:
    import torch

    if type(ref) is not type(res):
        return False, f"type {type(res).__name__}, eager {type(ref).__name__}"
    a, b = _leaves(ref), _leaves(res)
    if len(a) != len(b):
        return False, f"{len(b)} tensors, eager {len(a)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or not torch.allclose(x, y, rtol=1e-4, atol=1e-5):
            return False, f"output tensor {i} differs"
    if set(ref_grads) != set(res_grads):
        return False, "different parameters have gradients"
    for n, g in ref_grads.items():
        if not torch.allclose(g, res_grads[n], rtol=1e-4, atol=1e-5):
            return False, f"gradient of {n} differs"
    return True, ""


# reason -> how one break of it is named in the counts: the part that says what to build
_REASON_KEYS = {
    "unsupported_instruction": lambda b: f"unsupported_instruction: {b.instruction}",
    "exception_handler": lambda b: f"exception_handler: try/except or with in {b.function}",
}


def _reason(brk) -> str:
    key = _REASON_KEYS.get(brk.reason)
    return key(brk) if key else f"{brk.reason}: {brk.detail}"


def _explain(name, mode, runtime):
    import torch

    import agspeed

    model, args, kwargs = build(name, mode)
    ctx = torch.no_grad() if mode == "eval" else torch.enable_grad()
    with ctx:
        if runtime == "agspeed":
            out = agspeed.explain(model, *args, **kwargs)
            reasons = Counter(_reason(b) for b in out.break_reasons)
        else:
            torch._dynamo.reset()
            out = torch._dynamo.explain(model)(*args, **kwargs)
            reasons = Counter(str(b.reason).splitlines()[0] for b in out.break_reasons)
            torch._dynamo.reset()
    return {"graphs": out.graph_count, "breaks": out.graph_break_count,
            "reasons": reasons.most_common()}


def _first_call_ms(name, mode, runtime) -> float:
    import torch

    import agspeed

    model, args, kwargs = build(name, mode)
    agspeed.reset()
    torch._dynamo.reset()
    ctx = torch.no_grad() if mode == "eval" else torch.enable_grad()
    with ctx:
        start = time.perf_counter()
        if runtime == "agspeed":
            fast = agspeed.optimize(model, backend="eager")
        else:
            fast = torch.compile(model, backend="eager")
        fast(*args, **kwargs)
        return (time.perf_counter() - start) * 1e3


def _warm_up() -> None:
    """Capture a small function once with each runtime: imports and first-use setup."""
    import torch

    import agspeed

    def f(x):
        return torch.relu(x) + 1

    x = torch.randn(4)
    agspeed.optimize(f, backend="eager")(x)
    torch.compile(f, backend="eager")(x)
    agspeed.reset()
    torch._dynamo.reset()


def measure(name: str, modes: list[str], rounds: int) -> dict:
    """Every figure of one model, in the worker process."""
    import torch

    import agspeed

    torch.set_num_threads(1)
    _warm_up()
    out = {}
    for mode in modes:
        row: dict = {}
        try:
            row["agspeed"] = _explain(name, mode, "agspeed")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            row["agspeed"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        try:
            row["dynamo"] = _explain(name, mode, "dynamo")
        except Exception as exc:  # noqa: BLE001
            row["dynamo"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        samples: dict[str, list[float]] = {"agspeed": [], "dynamo": []}
        errors = {}
        for r in range(rounds):
            for runtime in (("agspeed", "dynamo") if r % 2 == 0 else ("dynamo", "agspeed")):
                if runtime in errors:
                    continue
                try:
                    samples[runtime].append(_first_call_ms(name, mode, runtime))
                except Exception as exc:  # noqa: BLE001
                    errors[runtime] = f"{type(exc).__name__}: {exc}"[:300]
        for runtime, times in samples.items():
            row[runtime]["capture_ms"] = statistics.median(times) if times else None
            if runtime in errors:
                row[runtime]["capture_error"] = errors[runtime]
        # results: eager and agspeed each on their own copy of the same weights
        try:
            model, args, kwargs = build(name, mode)
            twin = copy.deepcopy(model)
            agspeed.reset()
            ref, ref_grads = _step(model, model, mode, args, kwargs)
            fast = agspeed.optimize(twin, backend="eager")
            equal, why = True, ""
            for _ in range(2):  # the capture, then a cache hit
                res, res_grads = _step(fast, twin, mode, args, kwargs)
                ok, detail = _equal(ref, res, ref_grads, res_grads)
                if not ok:
                    equal, why = False, detail
                    break
            row["equal"], row["equal_detail"] = equal, why
        except Exception as exc:  # noqa: BLE001
            row["equal"], row["equal_detail"] = False, f"{type(exc).__name__}: {exc}"[:300]
        out[mode] = row
    return out


# --- driver --------------------------------------------------------------------------------


def run_worker(name: str, modes: list[str], rounds: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
           "--modes", ",".join(modes), "--rounds", str(rounds)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {m: {"crash": f"no answer in {WORKER_TIMEOUT_S} s"} for m in modes}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {m: {"crash": f"exit status {proc.returncode}: {tail[:300]}"} for m in modes}


def _versions() -> dict:
    import torch

    try:
        import transformers
        tv = transformers.__version__
    except Exception:  # noqa: BLE001
        tv = None
    git = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h"],
                         capture_output=True, text=True).stdout.strip()
    return {"machine": machine(), "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": tv, "commit": git,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def _gb(side: dict) -> str:
    if "error" in side:
        return "error"
    return f"{side['graphs']} / {side['breaks']}"


def _ms(side: dict) -> str:
    ms = side.get("capture_ms")
    return "error" if ms is None else f"{ms:.0f}"


def markdown(data: dict) -> str:
    v = data["versions"]
    lines = [
        "# Capture coverage on real models",
        "",
        "`benchmarks/coverage.py`: HuggingFace transformers models from tiny configs "
        f"({LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, sequence {SEQ}, batch {BATCH}, "
        "random weights, dropout off, sdpa attention, `use_cache=False`) and the model zoo "
        "of tests/models/test_zoo.py, in eval (`no_grad`, no labels) and in training "
        "(labels, forward and backward).",
        "",
        "- graphs / breaks: `agspeed.explain` and `torch._dynamo.explain` on the same call "
        "(one graph and no break is the target).",
        "- capture ms: the first call (forward), from `agspeed.optimize(model, "
        "backend=\"eager\")` or `torch.compile(model, backend=\"eager\")` until the result "
        f"is back; median of {data['rounds']} interleaved round(s), one thread.  Where "
        "agspeed breaks, its first call captured only part of the model and ran the rest "
        "eager, so its time is not yet comparable with Dynamo's one-graph capture.",
        "- equal: agspeed's outputs (and in training the loss and every parameter's "
        "gradient) equal to eager's, on the capture and on a cache hit.",
        "",
        f"Machine: {v['machine']}; torch {v['torch']}, transformers {v['transformers']}; "
        f"commit {v['commit']}, {v['date']}.",
        "",
        "| model | mode | agspeed graphs / breaks | Dynamo graphs / breaks | agspeed capture ms "
        "| Dynamo capture ms | equal | agspeed's top break reasons |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, modes in data["models"].items():
        for mode, row in modes.items():
            if "crash" in row:
                lines.append(f"| {name} | {mode} | crash | | | | no | {row['crash'][:120]} |")
                continue
            a, d = row["agspeed"], row["dynamo"]
            reasons = "; ".join(f"{n}x {r[:80]}" for r, n in a.get("reasons", [])[:4])
            if "error" in a:
                reasons = a["error"][:120]
            eq = "yes" if row.get("equal") else f"no ({row.get('equal_detail', '')[:80]})"
            lines.append(f"| {name} | {mode} | {_gb(a)} | {_gb(d)} | {_ms(a)} | {_ms(d)} "
                         f"| {eq} | {reasons.replace('|', '/')} |")
    s = data["summary"]
    lines += ["", f"Summary: agspeed makes one graph with no break on {s['agspeed_one_graph']} "
              f"of {s['cases']} model/mode cases (Dynamo: {s['dynamo_one_graph']}); its graphs "
              f"are at most Dynamo's count with no more breaks on {s['agspeed_at_most_dynamo']}; "
              f"results equal to eager on {s['equal']}.", ""]
    for group, ratios in s.get("capture_ratios", {}).items():
        if ratios:
            lines += [f"Capture time, Dynamo's over agspeed's, on the {group} cases where "
                      f"agspeed makes one graph with no break ({len(ratios)}): "
                      f"{min(ratios):.1f}x to {max(ratios):.1f}x, median "
                      f"{statistics.median(ratios):.1f}x (target: 5x or more; "
                      f"{'met' if min(ratios) >= 5 else 'not met'}).", ""]
    if s["top_reasons"]:
        lines.append("agspeed's break reasons over all cases (breaks):")
        lines.append("")
        lines += [f"- {n}x {r}" for r, n in s["top_reasons"]]
        lines.append("")
    lines.append("Reproduce: `.venv/bin/python benchmarks/coverage.py` (about ten minutes on "
                 "two cores); figures in benchmarks/results/coverage.json.")
    return "\n".join(lines) + "\n"


def summarize(models: dict) -> dict:
    cases = one = dyn_one = at_most = equal = 0
    reasons: Counter = Counter()
    ratios: dict[str, list] = {"transformers": [], "zoo": []}
    hf = set(HF_MODELS)
    for name, modes in models.items():
        for row in modes.values():
            cases += 1
            a, d = row.get("agspeed", {}), row.get("dynamo", {})
            ok_a = "graphs" in a
            one_graph = ok_a and a["graphs"] == 1 and a["breaks"] == 0
            one += one_graph
            if one_graph and a.get("capture_ms") and d.get("capture_ms"):
                ratios["transformers" if name in hf else "zoo"].append(
                    d["capture_ms"] / a["capture_ms"])
            dyn_one += "graphs" in d and d["graphs"] == 1 and d["breaks"] == 0
            at_most += (ok_a and "graphs" in d and a["graphs"] <= max(d["graphs"], 1)
                        and a["breaks"] <= d["breaks"])
            equal += bool(row.get("equal"))
            for r, n in a.get("reasons", []):
                reasons[r] += n
    return {"cases": cases, "agspeed_one_graph": one, "dynamo_one_graph": dyn_one,
            "agspeed_at_most_dynamo": at_most, "equal": equal,
            "capture_ratios": ratios, "top_reasons": reasons.most_common(20)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(model_names()))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=3, help="first-call timings per runtime")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "coverage.json"))
    parser.add_argument("--md", default=None, help="also write the markdown table here "
                        "(docs/coverage.md for the committed figures)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(set(modes) - set(MODES))}; known: {MODES}")
    if args.worker:
        print(json.dumps(measure(args.worker, modes, args.rounds)))
        return 0
    names = [n for n in args.models.split(",") if n]
    unknown = set(names) - set(model_names())
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {model_names()}")
    if any(n in HF_MODELS for n in names):
        try:
            import transformers  # noqa: F401
        except Exception:  # noqa: BLE001
            parser.error("the transformers models need the transformers package")
    models = {}
    for name in names:
        models[name] = run_worker(name, modes, args.rounds)
        for mode, row in models[name].items():
            if "crash" in row:
                print(f"  {name:10s} {mode:5s}  crash: {row['crash']}", flush=True)
                continue
            a, d = row["agspeed"], row["dynamo"]
            print(f"  {name:10s} {mode:5s}  agspeed {_gb(a):>7s} {_ms(a):>6s} ms   "
                  f"dynamo {_gb(d):>7s} {_ms(d):>6s} ms   equal "
                  f"{'yes' if row['equal'] else 'NO ' + row['equal_detail']}", flush=True)
    data = {"benchmark": "coverage", "versions": _versions(), "rounds": args.rounds,
            "modes": modes, "models": models, "summary": summarize(models)}
    data["machine"] = data["versions"]["machine"]
    s = data["summary"]
    print(f"coverage on {data['machine']}: agspeed one graph on {s['agspeed_one_graph']} of "
          f"{s['cases']} (Dynamo {s['dynamo_one_graph']}), equal to eager on {s['equal']}")
    save(data, args.out)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(data))
        print(f"  wrote {args.md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
