"""The tiny checkpoints other suites build on: loadable by transformers, with a working tokenizer."""

from __future__ import annotations

from harness.tiny_models import BOS_ID, EOS_ID, VOCAB_SIZE


def test_tiny_model_tokenizer_round_trips_any_text(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))
    text = "Héllo, wörld!\n  tabs\tand emoji 🙂"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert all(3 <= i < 259 <= VOCAB_SIZE for i in ids)  # one byte per token, no BOS added
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (BOS_ID, EOS_ID)
