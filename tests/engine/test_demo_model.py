import json
import statistics
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoTokenizer, LlamaForCausalLM

from engine.errors import ModelNotFoundError
from engine.model import demo
from engine.model.catalog import resolve_model_path
from engine.model.demo import (
    DEMO_MODEL_NAME,
    DEMO_MODEL_VERSION,
    default_cache_dir,
    ensure_demo_model,
)
from engine.tokenizer import Tokenizer

CHECKPOINT_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json"]  # fmt: skip
PROMPTS = ["The quick brown fox", "In Python, a list is", "Ω≈ç√ 😀 emoji"]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_checkpoint_files(demo_model_dir, tenantgate_cache_dir):
    assert demo_model_dir == tenantgate_cache_dir / "models" / DEMO_MODEL_VERSION
    assert sorted(p.name for p in demo_model_dir.iterdir()) == CHECKPOINT_FILES
    assert not [p for p in demo_model_dir.parent.iterdir() if p.name.startswith(".")]  # no staging left

    tokenizer = Tokenizer.from_dir(demo_model_dir)
    ids = {token: tokenizer.token_id(token) for token in demo.SPECIAL_TOKENS}
    config = read_json(demo_model_dir / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["vocab_size"] == tokenizer.vocab_size == 8192
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (512, 8, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (8, 2)
    assert config["tie_word_embeddings"] is False
    assert (config["bos_token_id"], config["eos_token_id"]) == (ids["<|begin_of_text|>"], ids["<|end_of_text|>"])
    generation_config = read_json(demo_model_dir / "generation_config.json")
    assert generation_config["eos_token_id"] == [ids["<|end_of_text|>"], ids["<|im_end|>"]]
    assert tokenizer.has_chat_template


def test_weights(demo_model_dir):
    with safe_open(demo_model_dir / "model.safetensors", framework="pt") as weights:
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        assert {weights.get_slice(name).get_dtype() for name in shapes} == {"F32"}
        norm = weights.get_tensor("model.norm.weight")
    assert len(shapes) == 2 + 8 * 9 + 1
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (8192, 512)
    assert shapes["model.layers.7.self_attn.q_proj.weight"] == (512, 512)
    assert shapes["model.layers.7.self_attn.k_proj.weight"] == (128, 512)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (512, 1536)
    assert 31_000_000 < sum(torch.Size(shape).numel() for shape in shapes.values()) < 34_000_000
    assert not torch.equal(norm, torch.ones_like(norm))  # norm weights matter to the output


def test_build_is_deterministic(demo_model_dir, tmp_path):
    rebuilt = ensure_demo_model(tmp_path, progress=False)
    assert rebuilt == tmp_path / "models" / DEMO_MODEL_VERSION
    for name in CHECKPOINT_FILES:
        assert (rebuilt / name).read_bytes() == (demo_model_dir / name).read_bytes(), name


def test_transformers_loads_and_decodes_varied_text(demo_model_dir):
    model, loading_info = LlamaForCausalLM.from_pretrained(demo_model_dir, output_loading_info=True)
    assert not any(loading_info.values()), loading_info  # every tensor name matched, none left over
    hf_tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    model.eval()
    for prompt in PROMPTS:
        input_ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            output = model.generate(
                input_ids,
                max_new_tokens=64,
                min_new_tokens=64,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
        generated = output.sequences[0, input_ids.shape[1] :].tolist()
        top2 = torch.stack([scores[0].topk(2).values for scores in output.scores])
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        print(f"{prompt!r}: {len(set(generated))} distinct tokens, top1-top2 logit margin "
              f"median {statistics.median(margins):.3f} min {min(margins):.4f}")  # fmt: skip
        assert len(generated) == 64
        assert len(set(generated)) >= 16
        assert statistics.median(margins) > 0.1


def test_ensure_reuses_the_cache(demo_model_dir, monkeypatch):
    monkeypatch.setattr(demo, "build_demo_model", fail_build)
    assert ensure_demo_model() == demo_model_dir
    assert resolve_model_path(DEMO_MODEL_NAME) == demo_model_dir


def fail_build(out_dir: Path, progress: bool = True) -> None:
    (out_dir / "partial.bin").write_bytes(b"half-written")
    raise OSError("disk full")


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "build_demo_model", fail_build)
    with pytest.raises(OSError, match="disk full"):
        ensure_demo_model(tmp_path, progress=False)
    assert list((tmp_path / "models").iterdir()) == []


def test_concurrent_builder_wins(tmp_path, monkeypatch):
    target = tmp_path / "models" / DEMO_MODEL_VERSION

    def build_while_another_process_finishes(out_dir: Path, progress: bool = True) -> None:
        (out_dir / "config.json").write_text("mine", encoding="utf-8")
        target.mkdir()
        (target / "config.json").write_text("theirs", encoding="utf-8")

    monkeypatch.setattr(demo, "build_demo_model", build_while_another_process_finishes)
    assert ensure_demo_model(tmp_path, progress=False) == target
    assert (target / "config.json").read_text(encoding="utf-8") == "theirs"
    assert [p.name for p in (tmp_path / "models").iterdir()] == [DEMO_MODEL_VERSION]


def test_progress_bar_on_stderr(tmp_path, monkeypatch, capsys):
    # A tiny architecture keeps this quick; only the bar is under test.
    monkeypatch.setattr(demo, "DEMO_ARCHITECTURE", demo.DemoArchitecture(hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, intermediate_size=8))  # fmt: skip
    ensure_demo_model(tmp_path, progress=True)
    captured = capsys.readouterr()
    assert "Building demo model" in captured.err and captured.out == ""


def test_default_cache_dir(tenantgate_cache_dir, monkeypatch):
    assert default_cache_dir() == tenantgate_cache_dir
    monkeypatch.delenv("TENANTGATE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "tenantgate"


def test_resolve_model_path(tmp_path):
    assert resolve_model_path(str(tmp_path)) == tmp_path
    with pytest.raises(ModelNotFoundError, match="not found") as error:
        resolve_model_path(str(tmp_path / "missing"))
    assert isinstance(error.value, FileNotFoundError)
