"""The built-in "demo" model: a small random-weight Llama checkpoint built locally, so nothing needs a download."""

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import save_file
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm

from engine.paths import default_cache_dir

DEMO_MODEL_NAME = "demo"
# Bump whenever anything below changes the built files, so stale caches are never reused.
DEMO_MODEL_VERSION = "demo-v1"
CORPUS_PATH = Path(__file__).with_name("demo_corpus.txt")

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

# ChatML. Content may be a plain string or a list of OpenAI-style parts, of which only text parts are rendered.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WEIGHTS_SEED = 20240611
# Logits come out with about this std, so greedy top-1/top-2 margins stay far above fp32 noise while sampling
# still has choices to make; see tests/engine/test_demo_model.py for the measured margins.
LOGIT_STD = 5.0


@dataclass(frozen=True)
class DemoArchitecture:
    vocab_size: int = 8192
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    intermediate_size: int = 1536
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


DEMO_ARCHITECTURE = DemoArchitecture()


def ensure_demo_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    models_dir = Path(cache_dir if cache_dir is not None else default_cache_dir()) / "models"
    target = models_dir / DEMO_MODEL_VERSION
    if target.is_dir():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename it into place, so a half-built model is never visible.
    staging = models_dir / f".{DEMO_MODEL_VERSION}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        build_demo_model(staging, progress=progress)
        try:
            os.replace(staging, target)
        except OSError:
            if not target.is_dir():
                raise
            # Another process finished first; its files are identical, so keep them.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def build_demo_model(out_dir: Path, progress: bool = True) -> None:
    arch = DEMO_ARCHITECTURE
    steps = len(_tensor_shapes(arch)) + 2  # the tokenizer, each tensor, the safetensors file
    with tqdm(total=steps, desc="Building demo model", unit="step", file=sys.stderr, disable=not progress) as bar:
        tokenizer = train_demo_tokenizer(arch.vocab_size)
        bar.update()
        token_ids = {token: _token_id(tokenizer, token) for token in SPECIAL_TOKENS}
        _write_text(out_dir / "tokenizer.json", tokenizer.to_str(pretty=True))
        _write_json(out_dir / "tokenizer_config.json", demo_tokenizer_config(arch))
        _write_json(out_dir / "generation_config.json", demo_generation_config(token_ids))
        _write_json(out_dir / "config.json", demo_model_config(arch, token_ids))

        tensors = {}
        for name, tensor in demo_weights(arch):
            tensors[name] = tensor
            bar.update()
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        bar.update()


def train_demo_tokenizer(vocab_size: int) -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocabulary, so any text can be encoded.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(CORPUS_PATH)], trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"demo tokenizer has {tokenizer.get_vocab_size()} tokens, expected {vocab_size}: "
            f"{CORPUS_PATH.name} is too small"
        )
    bos_id = _token_id(tokenizer, BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def demo_tokenizer_config(arch: DemoArchitecture) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_max_length": arch.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }


def demo_generation_config(token_ids: dict[str, int]) -> dict:
    return {
        "bos_token_id": token_ids[BOS_TOKEN],
        "eos_token_id": [token_ids[EOS_TOKEN], token_ids[IM_END_TOKEN]],
        "pad_token_id": token_ids[EOS_TOKEN],
    }


def demo_model_config(arch: DemoArchitecture, token_ids: dict[str, int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "hidden_act": "silu",
        "max_position_embeddings": arch.max_position_embeddings,
        "rope_theta": arch.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": arch.rms_norm_eps,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "bos_token_id": token_ids[BOS_TOKEN],
        "eos_token_id": token_ids[EOS_TOKEN],
    }


def demo_weights(arch: DemoArchitecture) -> Iterator[tuple[str, torch.Tensor]]:
    # Uniform draws scaled by exact float ops are bit-identical on every CPU; normal draws take vectorized,
    # CPU-specific paths. The std of U(-b, b) is b / sqrt(3).
    generator = torch.Generator().manual_seed(WEIGHTS_SEED)
    for name, shape in _tensor_shapes(arch).items():
        if name.endswith("norm.weight"):
            # Not all ones, so a loader that drops the norm weights is caught by comparing outputs.
            yield name, 1.0 + _uniform(shape, 0.2, generator)
        else:
            yield name, _uniform(shape, _init_bound(name, shape), generator)


def _init_bound(name: str, shape: tuple[int, ...]) -> float:
    fan_in = shape[-1]
    if name == "model.embed_tokens.weight":
        std = 1.0
    elif name == "lm_head.weight":
        std = LOGIT_STD / fan_in**0.5
    else:
        # Unit-scale outputs: every sublayer adds about as much to the residual stream as the token embedding holds,
        # so the next token depends on the whole context rather than mostly on the last token.
        std = 1.0 / fan_in**0.5
    return std * 3**0.5


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=generator, dtype=torch.float32) * 2 - 1) * bound


def _tensor_shapes(arch: DemoArchitecture) -> dict[str, tuple[int, ...]]:
    hidden, kv_dim = arch.hidden_size, arch.num_key_value_heads * arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, hidden)}
    for i in range(arch.num_hidden_layers):
        prefix = f"model.layers.{i}"
        shapes |= {
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.self_attn.q_proj.weight": (arch.num_attention_heads * arch.head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, arch.num_attention_heads * arch.head_dim),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.mlp.gate_proj.weight": (arch.intermediate_size, hidden),
            f"{prefix}.mlp.up_proj.weight": (arch.intermediate_size, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, arch.intermediate_size),
        }
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    return shapes


def _token_id(tokenizer: tokenizers.Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise RuntimeError(f"demo tokenizer lacks {token!r}")
    return token_id


def _write_json(path: Path, data: dict) -> None:
    _write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _write_text(path: Path, text: str) -> None:
    # Fixed newlines, so the files, and the model fingerprint, are the same on every OS.
    path.write_text(text, encoding="utf-8", newline="\n")
