import json
import random
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

TEXTS = [
    "Hello world",
    "",
    " ",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\r\n",
    "ünïcödé — “curly quotes” and naïve café",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 and a flag 🏳️‍🌈",
    "中文文本，日本語のテキスト、한국어 텍스트",
    "zero\u200bwidth\ufeff and U+FFFD \ufffd itself",
    "<|im_start|>user\nspecial tokens in text<|im_end|>",
    "a<|end_of_text|>b<|begin_of_text|>",
    "x" * 300,
    'The "if" statement is used for conditional execution.',
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a list?"},
        {"role": "assistant", "content": "A mutable sequence."},
        {"role": "user", "content": "Más 😀 por favor\n\nwith blank lines"},
    ],
    [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]}],
    [{"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(demo_model_dir)


@pytest.fixture(scope="module")
def hf_tokenizer(demo_model_dir: Path):
    return AutoTokenizer.from_pretrained(demo_model_dir)


@pytest.fixture
def make_checkpoint(demo_model_dir: Path, tmp_path: Path):
    """A copy of the demo tokenizer with a tokenizer_config.json of the test's choosing."""

    def make(config: dict | None = None, files: dict[str, str] | None = None) -> Path:
        path = tmp_path / "checkpoint"
        path.mkdir()
        shutil.copy(demo_model_dir / "tokenizer.json", path / "tokenizer.json")
        if config is not None:
            (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        for name, text in (files or {}).items():
            (path / name).write_text(text, encoding="utf-8")
        return path

    return make


def demo_config(demo_model_dir: Path, **changes) -> dict:
    config = json.loads((demo_model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(changes)
    return {key: value for key, value in config.items() if value is not None}


def random_ids(rng: random.Random, tokenizer: Tokenizer, length: int) -> list[int]:
    return [rng.randrange(tokenizer.vocab_size) for _ in range(length)]


# --- Tokenizer against transformers ---


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("parse_special", [True, False])
def test_encode_matches_transformers(tokenizer, hf_tokenizer, text, add_special_tokens, parse_special):
    # Plain text (the default) is transformers' split_special_tokens=True: special-token strings stay text.
    expected = hf_tokenizer(text, add_special_tokens=add_special_tokens, split_special_tokens=not parse_special)
    assert tokenizer.encode(text, add_special_tokens, parse_special=parse_special) == expected["input_ids"]


def test_encode_adds_bos_from_post_processor(tokenizer):
    bos_id = tokenizer.token_id("<|begin_of_text|>")
    assert tokenizer.encode("hi")[0] == bos_id
    assert bos_id not in tokenizer.encode("hi", add_special_tokens=False)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(tokenizer, hf_tokenizer, skip_special_tokens):
    rng = random.Random(0)
    sequences = [tokenizer.encode(text) for text in TEXTS]
    # Random ids cut UTF-8 sequences and mix in special tokens, as a random model's output does.
    sequences += [random_ids(rng, tokenizer, rng.randrange(1, 40)) for _ in range(50)]
    for ids in sequences:
        expected = hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_decode_inverts_encode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


def test_token_text_matches_transformers(tokenizer, hf_tokenizer):
    for token_id in [*range(0, 300), *range(8000, 8192)]:
        assert tokenizer.token_text(token_id) == hf_tokenizer.decode([token_id])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.token_text(tokenizer.vocab_size)


def test_vocabulary_and_special_tokens(tokenizer, hf_tokenizer):
    assert tokenizer.vocab_size == len(hf_tokenizer) == 8192
    assert tokenizer.bos_token == "<|begin_of_text|>"
    assert tokenizer.eos_token == "<|end_of_text|>"
    end_of_text, im_end = tokenizer.token_id("<|end_of_text|>"), tokenizer.token_id("<|im_end|>")
    assert tokenizer.eos_token_ids == frozenset({end_of_text, im_end})
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tokenizer.token_id("<|no such token|>")


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tokenizer, hf_tokenizer, messages, add_generation_prompt):
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_chat_template_renders_chatml(tokenizer):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered == "<|begin_of_text|><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # The template already holds the BOS token, so a conversation is encoded without adding another.
    assert tokenizer.encode_chat([{"role": "user", "content": "Hi"}])[:2] == [
        tokenizer.token_id("<|begin_of_text|>"),
        tokenizer.token_id("<|im_start|>"),
    ]


# Exercises what transformers adds to plain jinja: its tojson, the loop controls, namespace(), dict(),
# None-valued keys dropped, whitespace trimming, and reasoning fields copied under their other names.
FEATURE_TEMPLATE = """
{%- set ns = namespace(count=0) -%}
{% for message in messages %}
    {% if loop.index > 3 %}{% break %}{% endif %}
    {% set ns.count = ns.count + 1 %}
    [{{ message.role }}] {{ message.content if message.content is defined else '(no content)' }}
    {{ message | tojson }} {{ dict(a=1, b='<&>') | tojson(indent=2, sort_keys=True) }}
    {% if message.thinking is defined %}thinking={{ message.thinking }} {{ message.reasoning_content }}{% endif %}
{% endfor %}
count={{ ns.count }} tools={{ tools | tojson }} {{ pad_token }}|{{ eos_token }}
{% if add_generation_prompt %}<|im_start|>assistant{% endif %}
"""

FEATURE_MESSAGES = [
    {"role": "system", "content": 'Ünïcode <b>&amp;</b> "quoted"'},
    {"role": "assistant", "content": None, "tool_calls": None},
    {"role": "assistant", "content": "answer", "reasoning": "because"},
    {"role": "user", "content": "never rendered: the loop breaks first"},
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_template_features_match_transformers(demo_model_dir, make_checkpoint, add_generation_prompt):
    path = make_checkpoint(demo_config(demo_model_dir, chat_template=FEATURE_TEMPLATE))
    expected = AutoTokenizer.from_pretrained(path).apply_chat_template(
        FEATURE_MESSAGES, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    rendered = Tokenizer.from_dir(path).apply_chat_template(FEATURE_MESSAGES, add_generation_prompt)
    assert rendered == expected
    assert "thinking=because because" in rendered and "(no content)" in rendered


def test_template_strftime_now(demo_model_dir, make_checkpoint):
    path = make_checkpoint(demo_config(demo_model_dir, chat_template="{{ strftime_now('%Y') }}"))
    assert Tokenizer.from_dir(path).apply_chat_template([{"role": "user", "content": "x"}]) == str(datetime.now().year)


def test_template_generation_tag_is_accepted(demo_model_dir, make_checkpoint):
    template = "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    path = make_checkpoint(demo_config(demo_model_dir, chat_template=template))
    assert Tokenizer.from_dir(path).apply_chat_template([{"role": "user", "content": "x"}]) == "<x>"


def test_template_list_picks_default(demo_model_dir, make_checkpoint, hf_tokenizer):
    templates = [
        {"name": "tool_use", "template": "TOOLS {{ tools | tojson }}"},
        {"name": "default", "template": "DEFAULT {{ messages[0].content }}"},
    ]
    path = make_checkpoint(demo_config(demo_model_dir, chat_template=templates))
    tokenizer = Tokenizer.from_dir(path)
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages) == "DEFAULT hi"
    assert tokenizer.apply_chat_template(messages, tools=[{"name": "f"}]) == 'TOOLS [{"name": "f"}]'
    assert AutoTokenizer.from_pretrained(path).apply_chat_template(messages, tokenize=False) == "DEFAULT hi"


def test_template_file_wins_over_config(demo_model_dir, make_checkpoint):
    path = make_checkpoint(demo_config(demo_model_dir), files={"chat_template.jinja": "FILE {{ bos_token }}"})
    messages = [{"role": "user", "content": "hi"}]
    expected = AutoTokenizer.from_pretrained(path).apply_chat_template(messages, tokenize=False)
    assert Tokenizer.from_dir(path).apply_chat_template(messages) == expected == "FILE <|begin_of_text|>"


def test_added_token_dicts_in_config(demo_model_dir, make_checkpoint):
    added_token = {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                   "rstrip": False, "single_word": False, "special": True}  # fmt: skip
    path = make_checkpoint(demo_config(demo_model_dir, bos_token=added_token))
    tokenizer = Tokenizer.from_dir(path)
    assert tokenizer.bos_token == "<|begin_of_text|>"
    messages = [{"role": "user", "content": "hi"}]
    expected = AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.apply_chat_template(messages) == expected


def test_raise_exception_becomes_tokenizer_error(demo_model_dir, make_checkpoint):
    template = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user') }}{% endif %}"
    )
    path = make_checkpoint(demo_config(demo_model_dir, chat_template=template))
    tokenizer = Tokenizer.from_dir(path)
    with pytest.raises(TokenizerError, match="Conversations must start with a user"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "hi"}])
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == ""


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ messages.append(1) }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ namespace(_x=1) }}",
    ],
)
def test_template_cannot_escape_sandbox(demo_model_dir, make_checkpoint, template):
    path = make_checkpoint(demo_config(demo_model_dir, chat_template=template))
    with pytest.raises(TokenizerError, match="chat template error"):
        Tokenizer.from_dir(path).apply_chat_template([{"role": "user", "content": "hi"}])


def test_invalid_messages(tokenizer):
    with pytest.raises(TokenizerError, match="empty conversation"):
        tokenizer.apply_chat_template([])
    with pytest.raises(TokenizerError, match="must be objects"):
        tokenizer.apply_chat_template(["hello"])
    with pytest.raises(TokenizerError, match="chat template"):
        tokenizer.apply_chat_template([{"content": "no role"}])


def test_template_syntax_error(demo_model_dir, make_checkpoint):
    path = make_checkpoint(demo_config(demo_model_dir, chat_template="{% for m in messages %}"))
    with pytest.raises(TokenizerError, match="not valid Jinja"):
        Tokenizer.from_dir(path)


def test_missing_chat_template(demo_model_dir, make_checkpoint):
    tokenizer = Tokenizer.from_dir(make_checkpoint(demo_config(demo_model_dir, chat_template=None)))
    assert not tokenizer.has_chat_template
    with pytest.raises(TokenizerError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_tokenizer_json_only(make_checkpoint):
    tokenizer = Tokenizer.from_dir(make_checkpoint())
    assert tokenizer.bos_token is None and tokenizer.eos_token is None
    assert tokenizer.eos_token_ids == frozenset()
    assert not tokenizer.has_chat_template
    assert tokenizer.decode(tokenizer.encode("hi there")) == "hi there"


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_corrupt_files(demo_model_dir, make_checkpoint, tmp_path):
    path = make_checkpoint(demo_config(demo_model_dir))
    (path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        Tokenizer.from_dir(path)
    shutil.copy(demo_model_dir / "tokenizer.json", path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(TokenizerError, match="tokenizer_config.json"):
        Tokenizer.from_dir(path)


def test_eos_token_ids_union(demo_model_dir, make_checkpoint):
    path = make_checkpoint(demo_config(demo_model_dir), files={"generation_config.json": '{"eos_token_id": 3}'})
    assert Tokenizer.from_dir(path).eos_token_ids == frozenset({1, 3})
    (path / "generation_config.json").write_text('{"eos_token_id": [2, 3]}', encoding="utf-8")
    assert Tokenizer.from_dir(path).eos_token_ids == frozenset({1, 2, 3})
    (path / "generation_config.json").write_text('{"eos_token_id": "3"}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="generation_config.json"):
        Tokenizer.from_dir(path)


def test_digest(demo_model_dir, make_checkpoint, tokenizer):
    assert tokenizer.digest() == Tokenizer.from_dir(demo_model_dir).digest()
    assert len(tokenizer.digest()) == 64
    path = make_checkpoint(demo_config(demo_model_dir))
    plain = Tokenizer.from_dir(path).digest()
    (path / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    with_template = Tokenizer.from_dir(path).digest()
    assert len({tokenizer.digest(), plain, with_template}) == 3


# --- IncrementalDetokenizer ---


def stream(tokenizer: Tokenizer, ids: list[int], **kwargs) -> tuple[IncrementalDetokenizer, list[str]]:
    """Feeds ids until the detokenizer stops, flushing at the end as the engine does."""
    detokenizer = IncrementalDetokenizer(tokenizer, **kwargs)
    deltas = []
    for token_id in ids:
        deltas.append(detokenizer.add(token_id))
        assert detokenizer.text == "".join(deltas)
        if detokenizer.stopped:
            break
    else:
        deltas.append(detokenizer.flush())
    return detokenizer, deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_reassemble_the_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer, deltas = stream(tokenizer, ids)
    assert "".join(deltas) == detokenizer.text == tokenizer.decode(ids)
    if "\ufffd" not in text:
        assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_deltas_reassemble_random_ids(tokenizer, skip_special_tokens):
    rng = random.Random(1)
    for _ in range(100):
        ids = random_ids(rng, tokenizer, rng.randrange(1, 60))
        _, deltas = stream(tokenizer, ids, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_incomplete_utf8_is_held_back(tokenizer):
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) == 4  # one byte per token in this vocabulary
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.add(token_id) for token_id in ids] == ["", "", "", "😀"]
    assert detokenizer.flush() == ""


def test_flush_releases_incomplete_utf8(tokenizer):
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]
    detokenizer, deltas = stream(tokenizer, ids)
    assert deltas[-1].endswith("\ufffd")
    assert "".join(deltas) == tokenizer.decode(ids) == detokenizer.text


def test_special_tokens_are_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("The end<|im_end|> more", add_special_tokens=False, parse_special=True)
    assert "".join(stream(tokenizer, ids)[1]) == "The end more"
    assert "".join(stream(tokenizer, ids, skip_special_tokens=False)[1]) == "The end<|im_end|> more"


def token_pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    return [tokenizer.decode([i]) for i in tokenizer.encode(text, add_special_tokens=False)]


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("Hello world. Goodbye world.", ["world"], "Hello "),  # the stop string spans two tokens
        ("Hello world. Goodbye world.", [" wor"], "Hello"),  # exactly one token
        ("Hello world. Goodbye world.", ["ell"], "H"),  # inside tokens
        ("Hello world. Goodbye world.", ["Hello"], ""),  # at the very start
        ("Hello world. Goodbye world.", ["."], "Hello world"),
        ("Hello world. Goodbye world.", ["Goodbye", "world"], "Hello "),  # the earliest one wins
        ("Hello world. Goodbye world.", ["world.", "Good"], "Hello "),
        ("The value is returned. Then stop here, please.", ["stop here"], "The value is returned. Then "),
        ("smile 😀 now", ["😀"], "smile "),  # a stop string made of several byte tokens
        ("smile 😀 now", ["\U0001f600 n"], "smile "),
        ("naïve café", ["é"], "naïve caf"),  # at the end, inside an incomplete UTF-8 window
        ("The end<|im_end|> more", [" more"], "The end"),
    ],
)
def test_stop_strings(tokenizer, text, stop, expected):
    ids = tokenizer.encode(text, add_special_tokens=False, parse_special=True)  # as a model's output may hold them
    detokenizer, deltas = stream(tokenizer, ids, stop=stop)
    assert detokenizer.stopped
    assert "".join(deltas) == detokenizer.text == expected
    assert detokenizer.flush() == ""
    with pytest.raises(RuntimeError, match="stop string"):
        detokenizer.add(ids[0])


def test_stop_string_spans_tokens(tokenizer):
    # Guards the cases above: they only test something if the vocabulary splits the text as expected.
    assert token_pieces(tokenizer, "Hello world") == ["He", "l", "lo", " wor", "ld"]
    assert token_pieces(tokenizer, "😀") == ["\ufffd"] * 4


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer):
    ids = tokenizer.encode("Hello world", add_special_tokens=False)  # He|l|lo| wor|ld
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["lo there", "word"])
    assert [detokenizer.add(i) for i in ids] == ["He", "", "l", "lo ", "world"]
    assert not detokenizer.stopped
    assert detokenizer.flush() == ""

    detokenizer = IncrementalDetokenizer(tokenizer, stop=["world!"])
    assert [detokenizer.add(i) for i in ids] == ["He", "l", "lo", " ", ""]
    assert detokenizer.flush() == "world"
    assert detokenizer.text == "Hello world" and not detokenizer.stopped


def test_stop_strings_on_random_ids(tokenizer):
    rng = random.Random(2)
    for _ in range(100):
        ids = random_ids(rng, tokenizer, rng.randrange(2, 40))
        full = tokenizer.decode(ids)
        start = rng.randrange(len(full))
        stop = full[start : start + rng.randrange(1, 8)]
        detokenizer, deltas = stream(tokenizer, ids, stop=[stop])
        assert detokenizer.stopped
        assert "".join(deltas) == detokenizer.text == full[: full.index(stop)]


def test_empty_stop_string_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="empty"):
        IncrementalDetokenizer(tokenizer, stop=[""])
