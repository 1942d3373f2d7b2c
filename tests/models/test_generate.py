"""``model.generate()`` through an optimized transformers model: the KV cache passed in
(a DynamicCache the model changes and returns), decode steps of growing length.

Greedy decoding gives eager's tokens; the cache's length becomes a dynamic dimension
rather than a capture per step; and a later ``generate`` call, with a new cache object,
captures nothing again (the cache is guarded by its type, not its identity)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 99


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _mistral():
    # a sliding window shorter than the text: the cache keeps a count of the tokens it
    # has seen, an int read and written back on every step, and takes max() of it
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        sliding_window=4, pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _captures() -> int:
    return sum(r.count for r in agspeed.recompiles())


@pytest.mark.parametrize("make", [_llama, _gpt2, _mistral], ids=["llama", "gpt2", "mistral"])
def test_greedy_generation_matches_eager_and_a_second_call_captures_nothing(make):
    agspeed.reset()
    torch.manual_seed(0)
    model = make().eval()
    fast = agspeed.optimize(model, backend="eager")
    prompts = [torch.randint(3, VOCAB, (2, 5)) for _ in range(3)]
    settings = dict(max_new_tokens=10, do_sample=False, min_new_tokens=10)
    counts = []
    for ids in prompts:
        want = model.generate(ids, **settings)
        got = fast.generate(ids, **settings)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        counts.append(_captures())
    assert counts[2] == counts[1], agspeed.recompiles()
    assert not [r for r in agspeed.recompiles() if r.count >= 8], agspeed.recompiles()


def test_prompts_of_new_batch_sizes_and_lengths_stop_capturing_once_dynamic():
    # an inference service: each call a new batch size and prompt length.  The batch and
    # the length go dynamic, the graphs dynamic in both replace those dynamic in one, and
    # later shapes capture nothing; the model's outer forward never reaches the
    # recompile limit (after which its inner forward would be captured on its own)
    agspeed.reset()
    torch.manual_seed(0)
    model = _llama().eval()
    fast = agspeed.optimize(model, backend="eager")
    settings = dict(max_new_tokens=6, do_sample=False, min_new_tokens=6)
    counts = []
    for b, n in [(2, 5), (2, 9), (3, 13), (1, 7), (4, 6), (2, 11), (5, 8), (3, 4), (6, 10)]:
        ids = torch.randint(3, VOCAB, (b, n))
        torch.testing.assert_close(fast.generate(ids, **settings),
                                   model.generate(ids, **settings), rtol=0, atol=0)
        counts.append(_captures())
    assert counts[-1] == counts[-4], counts
    (row,) = agspeed.recompiles()   # the outer forward's, none of the inner one's
    assert row.function.startswith("wrapper") and row.evictions == 0, row
