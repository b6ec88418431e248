"""GGUF checkpoints against HF transformers loading the same file: greedy ids identical, fp32 logits close."""

import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import EngineConfig
from engine.envelope import local_envelope
from engine.llm_engine import LLMEngine
from engine.model.catalog import resolve_model_path
from engine.model.gguf import GGUFError, ensure_converted, find_gguf
from engine.sampling_params import SamplingParams
from tests.utils.gguf_files import write_tiny_gguf

PROMPTS = ["The gateway checks every request", "def add(a, b):\n    return", "Once upon a time, there"]
# Float32 on both sides; the two differ in summation order only (fused q/k/v, paged attention).
LOGIT_ATOL = 2e-4


def hf_gguf_model(path: Path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def hf_greedy(model, tokenizer, prompt_ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id or 0)
    return out.sequences[0, len(prompt_ids):].tolist(), torch.stack(out.logits)[:, 0]


def engine_for(path, **config) -> LLMEngine:
    # The oracle holds the dequantized path to transformers; tests/engine/test_quant.py holds the quantized one to it.
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory_bytes=16 << 20,
                                  weights="dequantized", **config))


def greedy(engine: LLMEngine, prompts: list[list[int]], n: int):
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, keep_logits=True)
    return engine.generate(prompts, params, local_envelope())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_1"])
def test_small_gguf_matches_transformers(tmp_path, demo_model_dir, arch, qtype):
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}-{qtype}.gguf", demo_model_dir, arch=arch, qtype=qtype)
    hf = hf_gguf_model(path)
    hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    engine = engine_for(path)
    prompts = [hf_tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    results = greedy(engine, prompts, 12)
    for prompt, result in zip(prompts, results):
        expected_ids, expected_logits = hf_greedy(hf, hf_tok, prompt, 12)
        assert result.token_ids == expected_ids
        torch.testing.assert_close(torch.stack(result.logits), expected_logits, atol=LOGIT_ATOL, rtol=0)
    assert engine.tokenizer.encode(PROMPTS[0], add_special_tokens=False) == prompts[0]


def test_tied_embeddings_come_from_the_missing_output_tensor(tmp_path, demo_model_dir):
    path = write_tiny_gguf(tmp_path / "tied.gguf", demo_model_dir, qtype="Q8_0", tied=True)
    engine = engine_for(path)
    assert engine.model_config.tie_word_embeddings
    hf = hf_gguf_model(path)
    hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prompt = hf_tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    assert greedy(engine, [prompt], 8)[0].token_ids == hf_greedy(hf, hf_tok, prompt, 8)[0]


def test_conversion_is_cached_by_file_digest(tmp_path, demo_model_dir):
    path = write_tiny_gguf(tmp_path / "a.gguf", demo_model_dir)
    cache = tmp_path / "cache"
    first = ensure_converted(path, cache, progress=False)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_converted(path, cache, progress=False) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    other = write_tiny_gguf(tmp_path / "b.gguf", demo_model_dir, seed=1)
    assert ensure_converted(other, cache, progress=False) != first
    assert not [p for p in (cache / "models").iterdir() if p.name.startswith(".")]  # no staging left behind


def test_a_directory_holding_one_gguf_file_is_a_checkpoint(tmp_path, demo_model_dir):
    folder = tmp_path / "model"
    folder.mkdir()
    path = write_tiny_gguf(folder / "tiny.gguf", demo_model_dir)
    assert find_gguf(folder) == path
    assert resolve_model_path(str(folder), progress=False) == resolve_model_path(str(path), progress=False)
    shutil.copy(path, folder / "second.gguf")
    with pytest.raises(GGUFError, match="several GGUF files"):
        find_gguf(folder)


def test_unsupported_tensor_type_is_named(tmp_path, demo_model_dir):
    path = write_tiny_gguf(tmp_path / "tq.gguf", demo_model_dir, qtype="TQ2_0",
                           shape={"hidden": 256, "intermediate": 256})
    with pytest.raises(GGUFError, match="TQ2_0"):
        ensure_converted(path, tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache" / "models").exists() or not list((tmp_path / "cache" / "models").iterdir())


def test_unsupported_architecture_is_named(tmp_path, demo_model_dir):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", demo_model_dir)
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    for field in reader.fields.values():
        if field.name.startswith("llama.") or field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if len(field.types) > 1 else None)
    writer.add_block_count(2)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match="'phi3'"):
        ensure_converted(tmp_path / "phi.gguf", tmp_path / "cache", progress=False)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(GGUFError, match="broken.gguf"):
        ensure_converted(bad, tmp_path / "cache", progress=False)
