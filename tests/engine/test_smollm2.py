"""SmolLM2-135M-Instruct, the default model, against HF transformers loading the same GGUF file."""

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import EngineConfig
from engine.envelope import local_envelope
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer

# Float32 on both sides (measured: at most 9e-5 apart over these prompts).
LOGIT_ATOL = 3e-4
CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash function is in one sentence.",
    "List three primary colors.",
    "How do I reverse a list in Python?",
]

_WORDS = ["hello", "world", "Gateway", "tenant", "naïve", "café", "Straße", "日本語", "中文", "한국어", "Привет",
          "مرحبا", "שלום", "😀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "\u200b", "\ufeff", "\ufffd", "e\u0301", "ﬁ", "Ⅻ", "²"]
_SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "    \n\t"]
_CODE = ["def f(x):\n    return x**2", "for (int i = 0; i < n; ++i) {}", "SELECT * FROM t WHERE a='b';",
         "<div class=\"x\">&amp;</div>", "$ ls -la | grep '^d'", "{\"key\": [1, 2.5e-3, null]}", "a_b-c.d/e\\f",
         "x += 1  # comment", "'s 're 've 'm 'll 'd 'S", "1234567890", "3.14159", "0x1F", "1,000,000"]
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_start|>user\n", "<|im_end|>\n",
            "<|im_start", "im_end|>", "<|unknown|>", "<repo_name>", "<filename>"]


def corpus(n: int = 1200) -> list[str]:
    rng = random.Random(20261201)
    pools = [_WORDS, _SPACES, _CODE, _SPECIAL]
    strings = [s for pool in pools for s in pool]
    while len(strings) < n:
        pieces = [rng.choice(rng.choice(pools)) for _ in range(rng.randrange(1, 8))]
        strings.append("".join(pieces) if rng.random() < 0.5 else " ".join(pieces))
    return strings


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf: Path):
    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def test_tokenizer_matches_transformers_on_1200_strings(tokenizer, hf_tokenizer):
    strings = corpus()
    assert len(strings) >= 1000
    for text in strings:
        assert tokenizer.encode(text, parse_special=True) == hf_tokenizer(text)["input_ids"], text
        plain = tokenizer.encode(text)
        assert plain == hf_tokenizer(text, split_special_tokens=True)["input_ids"], text
        assert tokenizer.decode(plain, skip_special_tokens=False) == hf_tokenizer.decode(plain), text


def test_chat_template_and_special_tokens_come_from_the_gguf(tokenizer, hf_tokenizer):
    messages = [{"role": "user", "content": CHATS[0]}]
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.apply_chat_template(messages) == expected
    assert expected.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == frozenset({tokenizer.token_id("<|im_end|>")})
    assert tokenizer.vocab_size == len(hf_tokenizer) == 49152


def test_greedy_chat_matches_transformers(smollm2_gguf, smollm2_dir, tokenizer):
    """Our greedy tokens are HF's argmax at every position given the same prefix, and fp32 logits agree
    (the dequantized path, which transformers also runs; the quantized one is held to it below)."""
    hf = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                              dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig(model=str(smollm2_dir), dtype="float32", kv_cache_memory_bytes=64 << 20,
                                    max_model_len=1024, weights="dequantized"))
    prompts = [tokenizer.encode_chat([{"role": "user", "content": chat}]) for chat in CHATS]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, keep_logits=True)
    results = engine.generate(prompts, params, local_envelope())
    for prompt, result in zip(prompts, results):
        with torch.inference_mode():
            expected = hf(torch.tensor([prompt + result.token_ids[:-1]])).logits[0, len(prompt) - 1 :]
        assert result.token_ids == expected.argmax(-1).tolist()
        torch.testing.assert_close(torch.stack(result.logits), expected, atol=LOGIT_ATOL, rtol=0)
    assert results[0].text.startswith("The capital of France is Paris.")


def test_quantized_weights_match_the_dequantized_path(smollm2_dir, tokenizer):
    """The default model's Q4_1 layers and tied Q8_0 table read in place: the same greedy tokens as the
    dequantized weights, and float32 logits within the same tolerance as HF's (tests/engine/test_quant.py
    says why: the weights are bit for bit the same, only the order of the fp32 sums differs). In the
    serving dtype (bfloat16 here) the first tokens agree too."""
    prompts = [tokenizer.encode_chat([{"role": "user", "content": chat}]) for chat in CHATS]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, keep_logits=True)

    def run(weights: str, dtype: str):
        engine = LLMEngine(EngineConfig(model=str(smollm2_dir), dtype=dtype, kv_cache_memory_bytes=64 << 20,
                                        max_model_len=1024, weights=weights))
        assert engine.runner.weights.startswith(weights)
        return engine.generate(prompts, params, local_envelope())

    for quantized, dense in zip(run("quantized", "float32"), run("dequantized", "float32")):
        assert quantized.token_ids == dense.token_ids
        torch.testing.assert_close(torch.stack(quantized.logits), torch.stack(dense.logits), atol=LOGIT_ATOL, rtol=0)
    served = run("quantized", "auto")
    assert served[0].text.startswith("The capital of France is Paris.")
