"""HuggingFace transformers models through ``agspeed.optimize(model, backend="eager")``:
tiny configs, random seeded weights, nothing downloaded.  In eval (no labels) and in
training (labels: the model's own loss, then backward), the optimized model returns the
same ModelOutput type as eager, with equal fields and loss, and leaves every parameter
with the gradient eager leaves, on the capturing call and on a cache hit with new inputs.

Each model is also one graph with no break (torch._dynamo.explain makes one, or more),
and the call after the capture is served from the cache; capture times next to Dynamo's
are benchmarks/coverage.py's business (docs/coverage.md).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")  # slow: imported once for the module

import agspeed  # noqa: E402
from _dynamo_ref import dynamo_graph_count  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB, SEQ, BATCH, HIDDEN, LAYERS, HEADS, FFN = 99, 8, 2, 32, 2, 2, 64
RTOL, ATOL = 1e-4, 1e-5   # fp32; the eager backend runs the same kernels


def _config(cls_name: str, **fields):
    config = getattr(transformers, cls_name)(**fields)
    config._attn_implementation = "sdpa"
    return config


_DECODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=1, intermediate_size=FFN,
                max_position_embeddings=64, use_cache=False, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
_BERT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
             num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_SEQ2SEQ_BART = dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS,
                     decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                     decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                     max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                     activation_dropout=0.0, use_cache=False, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                     forced_eos_token_id=None)
_T5 = dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN,
           num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0,
           use_cache=False, decoder_start_token_id=0, pad_token_id=0)

# name -> (model class for eval, for train, config class, config fields, inputs kind)
MODELS = {
    "bert": ("BertModel", "BertForSequenceClassification", "BertConfig",
             dict(_BERT, classifier_dropout=0.0, num_labels=3), "bert"),
    "gpt2": ("GPT2LMHeadModel", "GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=VOCAB, n_positions=64, n_embd=HIDDEN, n_layer=LAYERS,
                  n_head=HEADS, n_inner=FFN, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                  use_cache=False, bos_token_id=1, eos_token_id=2), "lm"),
    "llama": ("LlamaForCausalLM", "LlamaForCausalLM", "LlamaConfig", _DECODER, "lm"),
    "mistral": ("MistralForCausalLM", "MistralForCausalLM", "MistralConfig", _DECODER, "lm"),
    # mixture of experts: the experts' grouped matmul is a custom operator of
    # transformers' (torch.ops.transformers.grouped_mm_fallback on CPU), in the graph
    "mixtral": ("MixtralForCausalLM", "MixtralForCausalLM", "MixtralConfig",
                dict(_DECODER, num_local_experts=4, num_experts_per_tok=2), "lm"),
    "t5": ("T5ForConditionalGeneration", "T5ForConditionalGeneration", "T5Config", _T5,
           "seq2seq"),
    "bart": ("BartForConditionalGeneration", "BartForConditionalGeneration", "BartConfig",
             _SEQ2SEQ_BART, "seq2seq"),
    "distilbert": ("DistilBertForSequenceClassification",
                   "DistilBertForSequenceClassification", "DistilBertConfig",
                   dict(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                        hidden_dim=FFN, max_position_embeddings=64, dropout=0.0,
                        attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=3), "cls"),
    # the default use_cache=True: a DynamicCache (for encoder-decoders, one made from a
    # deep copy of the config) is built in the forward and returned
    "llama_cache": ("LlamaForCausalLM", "LlamaForCausalLM", "LlamaConfig",
                    dict(_DECODER, use_cache=True), "lm"),
    "t5_cache": ("T5ForConditionalGeneration", "T5ForConditionalGeneration", "T5Config",
                 dict(_T5, use_cache=True), "seq2seq"),
    "bart_cache": ("BartForConditionalGeneration", "BartForConditionalGeneration",
                   "BartConfig", dict(_SEQ2SEQ_BART, use_cache=True), "seq2seq"),
    "vit": ("ViTForImageClassification", "ViTForImageClassification", "ViTConfig",
            dict(image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN,
                 num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3),
            "image"),
}


def _inputs(kind: str, labels: bool, gen: torch.Generator, seq: int = SEQ) -> dict:
    """One batch for a model of input ``kind``, drawn from ``gen``; text of ``seq``
    tokens."""
    if kind == "image":
        kw = {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=gen)}
        if labels:
            kw["labels"] = torch.randint(0, 3, (BATCH,), generator=gen)
        return kw
    ids = torch.randint(1, VOCAB, (BATCH, seq), generator=gen)
    lengths = torch.randint(seq // 2, seq + 1, (BATCH, 1), generator=gen)
    kw = {"input_ids": ids, "attention_mask": (torch.arange(seq) < lengths).long()}
    if kind == "bert":
        kw["token_type_ids"] = torch.zeros_like(ids)
    if kind == "seq2seq":
        target = torch.randint(1, VOCAB, (BATCH, seq // 2), generator=gen)
        kw["labels" if labels else "decoder_input_ids"] = target
    elif labels:
        kw["labels"] = (ids.clone() if kind == "lm"
                        else torch.randint(0, 3, (BATCH,), generator=gen))
    return kw


def _build(name: str, mode: str):
    eval_cls, train_cls, config_cls, fields, _kind = MODELS[name]
    torch.manual_seed(0)
    model = getattr(transformers, train_cls if mode == "train" else eval_cls)(
        _config(config_cls, **fields))
    for m in model.modules():   # config fields cover most dropouts; modules the rest
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train() if mode == "train" else model.eval()


def _step(fn, model, mode, inputs):
    """One call (and in train the loss's backward): (output, {name: grad})."""
    if mode == "eval":
        with torch.no_grad():
            return fn(**inputs), {}
    out = fn(**inputs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out, grads


def _assert_same_output(ref, out, where: str) -> None:
    assert type(out) is type(ref), where
    assert list(out.keys()) == list(ref.keys()), where
    for key, value in ref.items():
        got = out[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"{where}: {key}"
            assert got.shape == value.shape and got.dtype == value.dtype, f"{where}: {key}"
            torch.testing.assert_close(got, value, rtol=RTOL, atol=ATOL,
                                       msg=f"{where}: {key} differs")
        elif isinstance(value, transformers.cache_utils.Cache):   # use_cache=True
            assert type(got) is type(value), f"{where}: {key}"
            mine, theirs = _tensors_in(got), _tensors_in(value)
            assert len(mine) == len(theirs) > 0, f"{where}: {key}"
            for a, b in zip(mine, theirs):
                torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL,
                                           msg=f"{where}: {key} differs")
        elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
            # hidden states, attentions (output_hidden_states, output_attentions)
            assert type(got) is tuple and len(got) == len(value), f"{where}: {key}"
            for k, (a, b) in enumerate(zip(got, value)):
                torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL,
                                           msg=f"{where}: {key}[{k}] differs")
        else:
            assert got == value, f"{where}: {key}"


def _tensors_in(value, depth: int = 0) -> list:
    """The tensors an object holds, in attribute order (a cache's keys and values)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 6:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        value = list(vars(value).values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v, depth + 1)]
    return []


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_model_matches_eager(name, mode):
    kind = MODELS[name][4]
    model = _build(name, mode)
    twin = copy.deepcopy(model)
    fast = agspeed.optimize(twin, backend="eager")
    gen = torch.Generator().manual_seed(1)
    for call in ("capture", "cache hit"):   # the second call gets new inputs
        inputs = _inputs(kind, mode == "train", gen)
        ref, ref_grads = _step(model, model, mode, inputs)
        out, grads = _step(fast, twin, mode, inputs)
        where = f"{name} {mode}, {call}"
        _assert_same_output(ref, out, where)
        if mode == "train":
            assert ref.loss is not None and out.loss is not None
            torch.testing.assert_close(out.loss, ref.loss, rtol=RTOL, atol=ATOL)
            assert set(grads) == set(ref_grads) == {
                n for n, p in model.named_parameters() if p.requires_grad}, where
            for pname, grad in ref_grads.items():
                torch.testing.assert_close(grads[pname], grad, rtol=RTOL, atol=ATOL,
                                           msg=f"{where}: gradient of {pname} differs")


# T5 with its cache reads the decoder's length out of a tensor (its position bias takes
# cache_position[-1] + 1 as a length), which fixes that length: each new one captures again
# (docs/coverage.md); its results are checked by the other tests
@pytest.mark.parametrize("name", sorted(n for n in MODELS
                                        if MODELS[n][4] != "image" and n != "t5_cache"))
def test_one_dynamic_graph_serves_every_sequence_length(name):
    """With ``dynamic=True`` the first capture makes the sequence length a symbol: later
    lengths are cache hits of that one graph (nothing in the model's code, its masks,
    reshapes and loss included, fixes the length), with eager's loss and gradients."""
    kind = MODELS[name][4]
    model = _build(name, "train")
    twin = copy.deepcopy(model)
    fast = agspeed.optimize(twin, backend="eager", dynamic=True)
    gen = torch.Generator().manual_seed(3)
    misses = None
    # the first call may change the model (BERT's classifier sets config.problem_type),
    # which the second call's guard sees: counting starts after it
    for k, seq in enumerate((8, 11, 6, 14, 9)):
        inputs = _inputs(kind, True, gen, seq)
        ref, ref_grads = _step(model, model, "train", inputs)
        out, grads = _step(fast, twin, "train", inputs)
        _assert_same_output(ref, out, f"{name}, {seq} tokens")
        for pname, grad in ref_grads.items():
            torch.testing.assert_close(grads[pname], grad, rtol=RTOL, atol=ATOL,
                                       msg=f"{name}, {seq} tokens: gradient of {pname}")
        if k == 1:
            misses = agspeed.counters()["cache_misses"]
    assert agspeed.counters()["cache_misses"] == misses, agspeed.recompiles()
    (record,) = [r for r in agspeed.recompiles() if r.dynamic]
    assert any("input_ids'].size(1)" in d for d in record.dynamic), record


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_model_is_one_graph(name, mode):
    kind = MODELS[name][4]
    model = _build(name, mode)
    gen = torch.Generator().manual_seed(2)
    inputs = _inputs(kind, mode == "train", gen)
    grad = torch.no_grad() if mode == "eval" else torch.enable_grad()
    with grad:
        report = agspeed.explain(model, **inputs)
        dynamo = dynamo_graph_count(model, **inputs)
    assert (report.graph_count, report.graph_break_count) == (1, 0), \
        [str(b) for b in report.break_reasons]
    assert report.graph_count <= dynamo
    agspeed.reset()
    fast = agspeed.optimize(model, backend="eager")
    with grad:
        fast(**inputs)
        before = agspeed.counters()
        fast(**_inputs(kind, mode == "train", gen))   # new values, same shapes
        after = agspeed.counters()
    assert after["cache_misses"] == before["cache_misses"]
    assert after["graph_calls"] == before["graph_calls"] + 1


@pytest.mark.parametrize("name", ["bert", "llama", "t5", "vit"])
def test_hidden_states_and_attentions_are_one_graph_with_eagers_values(name):
    """``output_hidden_states=True, output_attentions=True``: transformers collects them
    with forward hooks on the layers (closures, reading the collector from a context
    variable, appending to lists it then slices and stores into the ModelOutput). All of
    it is captured: one graph, the tuples and the loss's gradients equal to eager's."""
    kind = MODELS[name][4]
    model = _build(name, "train")
    model.config._attn_implementation = "eager"   # sdpa gives no attention weights
    twin = copy.deepcopy(model)
    fast = agspeed.optimize(twin, backend="eager")
    gen = torch.Generator().manual_seed(4)
    flags = dict(output_hidden_states=True, output_attentions=True)
    for call in ("capture", "cache hit"):
        inputs = dict(_inputs(kind, True, gen), **flags)
        ref, ref_grads = _step(model, model, "train", inputs)
        out, grads = _step(fast, twin, "train", inputs)
        where = f"{name}, {call}"
        hidden = ref.get("hidden_states", ref.get("encoder_hidden_states"))
        assert hidden is not None and len(hidden) == LAYERS + 1, where
        _assert_same_output(ref, out, where)
        for pname, grad in ref_grads.items():
            torch.testing.assert_close(grads[pname], grad, rtol=RTOL, atol=ATOL,
                                       msg=f"{where}: gradient of {pname} differs")
    report = agspeed.explain(model, **dict(_inputs(kind, True, gen), **flags))
    assert (report.graph_count, report.graph_break_count) == (1, 0), \
        [str(b) for b in report.break_reasons]
