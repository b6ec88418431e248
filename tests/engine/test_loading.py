"""Bad checkpoints and bad engine settings fail at start-up with errors that name the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ConfigError, EngineConfig
from engine.envelope import local_envelope
from engine.llm_engine import LLMEngine, RequestError
from engine.model.loader import WeightsError
from engine.sampling_params import SamplingParams


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(path: Path, **changes) -> None:
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


def engine_for(path: Path, **kwargs) -> LLMEngine:
    kwargs.setdefault("dtype", "float32")  # the HF oracle runs in float32
    return LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=16 << 20, **kwargs))


def test_unknown_architecture_names_it_and_the_supported_ones(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    edit_config(path, architectures=["GPTNeoXForCausalLM"])
    with pytest.raises(ConfigError,
                       match="'GPTNeoXForCausalLM'.*LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"):
        engine_for(path)


def test_unsupported_rope_type_is_named(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    edit_config(path, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    with pytest.raises(ConfigError, match="'yarn'"):
        engine_for(path)


def test_config_values_of_the_wrong_type_are_config_errors(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    edit_config(path, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": None})
    with pytest.raises(ConfigError, match="wrong type"):
        engine_for(path)


def test_architectures_given_as_a_string_is_understood(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    edit_config(path, architectures="LlamaForCausalLM")
    assert engine_for(path).model_config.architecture == "LlamaForCausalLM"


def test_missing_weights_file(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    (path / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match="no model.safetensors"):
        engine_for(path)


def test_corrupt_weights_file(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="model.safetensors"):
        engine_for(path)


def test_garbage_weights_file(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    (path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        engine_for(path)


def test_missing_tensor_is_named(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(WeightsError, match="'model.layers.1.mlp.up_proj.weight' is missing"):
        engine_for(path)


def test_shape_mismatch_is_named(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(WeightsError, match=r"'model.layers.0.self_attn.k_proj.weight'.*\(8, 64\).*\(32, 64\)"):
        engine_for(path)


def test_config_that_disagrees_with_weights_is_caught(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    edit_config(path, intermediate_size=96)
    with pytest.raises(WeightsError, match=r"'model.layers.0.mlp.down_proj.weight'.*\(64, 128\).*\(64, 96\)"):
        engine_for(path)


def test_missing_shard_is_named(tiny_dir, tmp_path) -> None:
    path = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    (path / "model.safetensors").unlink()
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="'model-00001-of-00002.safetensors'.*missing"):
        engine_for(path)


def test_missing_directory_and_config(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        engine_for(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json not found"):
        engine_for(tmp_path / "empty")


def test_kv_budget_too_small_for_the_asked_max_model_len_fails_at_start(tiny_dir) -> None:
    with pytest.raises(ConfigError, match="fewer than one sequence of max_model_len=512"):
        LLMEngine(EngineConfig(model=str(tiny_dir), kv_cache_memory_bytes=64 << 10, max_model_len=512))
    with pytest.raises(ConfigError, match="max_model_len=512"):
        LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=4, block_size=16, max_model_len=512))


def test_without_a_max_model_len_the_engine_serves_what_the_kv_cache_holds(tiny_dir) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=4, block_size=16))
    assert engine.max_model_len == 64 < engine.model_config.max_position_embeddings
    with pytest.raises(RequestError, match="context is 64 tokens"):
        engine.add_request("long", list(range(2, 70)), SamplingParams(max_tokens=1), local_envelope())


@pytest.mark.parametrize(
    "kwargs", [{"dtype": "float64"}, {"block_size": 0}, {"max_num_seqs": -1}, {"max_model_len": 0},
               {"num_kv_blocks": 0}, {"gpu_memory_utilization": 0}, {"gpu_memory_utilization": 1.5},
               {"gpu_memory_utilization": "0.9"}]
)
def test_invalid_engine_settings(kwargs) -> None:
    with pytest.raises(ConfigError):
        EngineConfig(**kwargs)


def test_fingerprint_tracks_weights_dtype_and_numerics_settings(tiny_dir, tmp_path) -> None:
    base = engine_for(tiny_dir).fingerprint
    assert engine_for(tiny_dir).fingerprint == base
    assert engine_for(tiny_dir, dtype="bfloat16").fingerprint != base

    rope = copy_checkpoint(tiny_dir, tmp_path / "rope")
    edit_config(rope, rope_parameters={"rope_type": "default", "rope_theta": 20000.0})
    assert engine_for(rope).fingerprint != base

    weights = copy_checkpoint(tiny_dir, tmp_path / "weights")
    tensors = load_file(weights / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.001
    save_file(tensors, weights / "model.safetensors")
    assert engine_for(weights).fingerprint != base

    tok = copy_checkpoint(tiny_dir, tmp_path / "tok")
    raw = json.loads((tok / "tokenizer.json").read_text())
    raw["added_tokens"][0]["content"] = "<bos>"
    (tok / "tokenizer.json").write_text(json.dumps(raw))
    assert engine_for(tok).fingerprint != base
