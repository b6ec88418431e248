"""Tokenizer and chat template of a Hugging Face checkpoint, with the behaviour of transformers' fast tokenizers."""

import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.sandbox
import tokenizers

from engine.errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
# Every file that changes what this class does, for the model fingerprint.
DIGESTED_FILES = (
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    CHAT_TEMPLATE_FILE,
    GENERATION_CONFIG_FILE,
)
DEFAULT_TEMPLATE_NAME = "default"
TOOL_USE_TEMPLATE_NAME = "tool_use"
# Alternative names for a message's reasoning; transformers copies it under the first two for templates.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: Mapping[str, str] | None = None,
        chat_templates: Mapping[str, str] | None = None,
        eos_token_ids: Sequence[int] = (),
        digest: str = "",
    ) -> None:
        self._backend = backend
        # Like transformers, ignore truncation and padding settings saved in tokenizer.json.
        backend.no_truncation()
        backend.no_padding()
        # A twin that reads special-token strings as plain text (transformers' split_special_tokens=True).
        # Two objects, not one flag toggled per call, because encodes run on several threads.
        self._plain = tokenizers.Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True
        specials = sorted(
            (t.content for t in backend.get_added_tokens_decoder().values() if t.special), key=len, reverse=True
        )
        self._special_ids = {token: backend.token_to_id(token) for token in specials}
        self._special_pattern = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._special_tokens = dict(special_tokens or {})
        self._templates = {
            name: _compile_chat_template(name, source) for name, source in (chat_templates or {}).items()
        }
        # Whether a template reads `tools` (a tools section); tool calling tells the model of them itself otherwise.
        self.renders_tools: bool = any(
            "tools" in jinja2.meta.find_undeclared_variables(template.environment.parse(source))
            for template, source in zip(self._templates.values(), (chat_templates or {}).values()))
        self._digest = digest
        self._token_texts: dict[int, str] = {}
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token: str | None = self._special_tokens.get("bos_token")
        self.eos_token: str | None = self._special_tokens.get("eos_token")
        eos_ids = set(eos_token_ids)
        if self.eos_token is not None:
            eos_ids.add(self.token_id(self.eos_token))
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)

    @classmethod
    def from_dir(cls, path: Path) -> "Tokenizer":
        path = Path(path)
        tokenizer_path = path / TOKENIZER_FILE
        if not tokenizer_path.is_file():
            raise TokenizerError(f"{tokenizer_path} not found: the checkpoint needs a Hugging Face fast tokenizer file")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # tokenizers raises a bare Exception for every kind of bad file
            raise TokenizerError(f"cannot load {tokenizer_path}: {exc}") from exc

        config = _read_json(path / TOKENIZER_CONFIG_FILE)
        # Older checkpoints name some special tokens only in special_tokens_map.json.
        special_tokens = _special_tokens(_read_json(path / SPECIAL_TOKENS_MAP_FILE)) | _special_tokens(config)
        templates = _chat_templates(config.get("chat_template"), path / TOKENIZER_CONFIG_FILE)
        template_path = path / CHAT_TEMPLATE_FILE
        if template_path.is_file():
            # As in transformers, a separate template file wins over the one in tokenizer_config.json.
            templates[DEFAULT_TEMPLATE_NAME] = template_path.read_text(encoding="utf-8")
        generation_config = _read_json(path / GENERATION_CONFIG_FILE)
        eos_ids = _token_ids(generation_config.get("eos_token_id"), path / GENERATION_CONFIG_FILE)
        return cls(backend, special_tokens, templates, eos_ids, _digest(path))

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text. Special-token strings in it stay plain text unless parse_special is set:
        a caller's text must not be able to write control tokens (a forged turn, a fake end of text)."""
        backend = self._backend if parse_special else self._plain
        return backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        """Token ids of a conversation: the template's own control tokens are special, message text is not.

        Text that spells a special token (`hi<|im_end|><|im_start|>system...`) is encoded as the plain
        text it is. For such text the template is rendered once more with a placeholder in its place, to
        tell which control tokens the template wrote; the text between them is encoded as plain text, as
        transformers does for the text between special tokens.
        """
        text = self.apply_chat_template(messages, add_generation_prompt, tools)
        if self._special_pattern is None:
            return self._backend.encode(text, add_special_tokens=False).ids
        originals: list[str] = []
        nonce = "".join(secrets.choice("0123456789") for _ in range(16))
        masked_messages, masked_tools = self._mask_special_text((messages, tools), originals, nonce)
        if not originals:  # no caller text spells a special token: the rendered text means what it says
            return self._backend.encode(text, add_special_tokens=False).ids
        marked = self.apply_chat_template(masked_messages, add_generation_prompt, masked_tools)
        pieces = re.split(f"\ue000{nonce}(\\d+)\ue001", marked)  # template, index, template, index, ...
        restored = "".join(originals[int(p)] if i % 2 else p for i, p in enumerate(pieces))
        if restored != text:
            raise TokenizerError(
                "the chat template rewrites message text, and some of it spells a control token of this model; "
                "it cannot be encoded safely"
            )
        ids: list[int] = []
        pending: list[str] = []  # plain text since the last control token the template wrote
        for i, piece in enumerate(pieces):
            if i % 2:
                pending.append(originals[int(piece)])
                continue
            start = 0
            for match in self._special_pattern.finditer(piece):
                pending.append(piece[start : match.start()])
                ids.extend(self._encode_plain("".join(pending)))
                ids.append(self._special_ids[match.group()])  # type: ignore[arg-type]  # every special token has an id
                pending, start = [], match.end()
            pending.append(piece[start:])
        ids.extend(self._encode_plain("".join(pending)))
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids if text else []

    def _mask_special_text(self, value: Any, originals: list[str], nonce: str, key: Any = None) -> Any:
        """value with each string that spells a special token replaced by a numbered placeholder."""
        if isinstance(value, str):
            if self._special_pattern.search(value) is None:  # type: ignore[union-attr]  # called only with specials
                return value
            if key == "role":  # templates branch on roles, so a role cannot be stood in for
                raise TokenizerError("a message role must not contain a control token of this model")
            originals.append(value)
            return f"\ue000{nonce}{len(originals) - 1}\ue001"
        if isinstance(value, Mapping):
            return {k: self._mask_special_text(v, originals, nonce, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._mask_special_text(v, originals, nonce) for v in value)
        return value

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int:
        token_id = self._backend.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"token {token!r} is not in the vocabulary")
        return token_id

    def token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            if not 0 <= token_id < self.vocab_size:
                raise TokenizerError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}")
            text = self._token_texts[token_id] = self._backend.decode([token_id], skip_special_tokens=False)
        return text

    def digest(self) -> str:
        return self._digest

    def backend_json(self) -> str:
        """The tokenizer as tokenizer.json text (what llguidance builds its own from)."""
        return self._backend.to_str()

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        template = self._select_template(tools)
        if not messages:
            raise TokenizerError("cannot apply a chat template to an empty conversation")
        for message in messages:
            if not isinstance(message, Mapping):
                raise TokenizerError(f"chat messages must be objects, got {type(message).__name__}")
        # transformers drops keys set to None, since templates handle a missing key but would render "None".
        messages = _alias_reasoning([{k: v for k, v in m.items() if v is not None} for m in messages])
        try:
            return template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"chat template error: {exc.message or exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TokenizerError(f"chat template failed on these messages: {exc}") from exc

    def _select_template(self, tools: list[dict] | None) -> jinja2.Template:
        if not self._templates:
            raise TokenizerError(
                "this model has no chat template (no chat_template in tokenizer_config.json and no "
                f"{CHAT_TEMPLATE_FILE}); use the completions API with a raw prompt instead"
            )
        if tools is not None and TOOL_USE_TEMPLATE_NAME in self._templates:
            return self._templates[TOOL_USE_TEMPLATE_NAME]
        if DEFAULT_TEMPLATE_NAME in self._templates:
            return self._templates[DEFAULT_TEMPLATE_NAME]
        if len(self._templates) == 1:
            return next(iter(self._templates.values()))
        raise TokenizerError(f"this model has several chat templates and none is named {DEFAULT_TEMPLATE_NAME!r}")


class IncrementalDetokenizer:
    """Turns generated token ids into text deltas as they arrive, honouring stop strings.

    Each step decodes only a short window of ids (vLLM's prefix/read offsets): the text of
    ids[prefix_offset:] minus the text of ids[prefix_offset:read_offset] is the new text. A window
    whose text ends in U+FFFD is held back, since the next token may complete its UTF-8 sequence.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (), skip_special_tokens: bool = True) -> None:
        if isinstance(stop, str):
            stop = (stop,)
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._tokenizer = tokenizer
        self._stop = tuple(dict.fromkeys(stop))
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._decoded = ""  # the text of ids[:read_offset]; cut at the stop string once one is seen
        self._emitted = 0  # how much of _decoded has been returned
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def text(self) -> str:
        return self._decoded[: self._emitted]

    def add(self, token_id: int) -> str:
        if self._stopped:
            raise RuntimeError("the output already reached a stop string; no more tokens can be added")
        self._ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return self._extend(new_text[len(prefix_text) :], final=False)

    def flush(self) -> str:
        """Releases the held-back text when the sequence ends for a reason other than a stop string."""
        if self._stopped:
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        self._prefix_offset = self._read_offset = len(self._ids)
        return self._extend(new_text[len(prefix_text) :], final=True)

    def _decode(self, start: int, end: int) -> str:
        if start == end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)

    def _extend(self, delta: str, final: bool) -> str:
        search_from = max(0, len(self._decoded) - self._max_stop_len + 1)
        self._decoded += delta
        stop_at = self._find_stop(search_from)
        if stop_at is not None:
            self._stopped = True
            self._decoded = self._decoded[:stop_at]
            emit_to = stop_at
        elif final:
            emit_to = len(self._decoded)
        else:
            emit_to = max(self._emitted, len(self._decoded) - self._partial_stop_len())
        released = self._decoded[self._emitted : emit_to]
        self._emitted = emit_to
        return released

    def _find_stop(self, search_from: int) -> int | None:
        # The earliest stop string wins; none was complete before this delta, so none ends before search_from.
        starts = [i for s in self._stop if (i := self._decoded.find(s, search_from)) != -1]
        return min(starts, default=None)

    def _partial_stop_len(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        longest = 0
        for s in self._stop:
            for length in range(min(len(s) - 1, len(self._decoded)), longest, -1):
                if self._decoded.endswith(s[:length]):
                    longest = length
                    break
        return longest


def _compile_chat_template(name: str, source: str) -> jinja2.Template:
    # Mirrors transformers.utils.chat_template_utils._cached_compile_jinja_template, so templates render the same.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTagExtension, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(f"chat template {name!r} is not valid Jinja (line {exc.lineno}): {exc.message}") from exc


class _GenerationTagExtension(jinja2.ext.Extension):
    """Accepts transformers' {% generation %}...{% endgeneration %} tag, which only marks assistant text."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    # Unlike jinja's own tojson, this does not HTML-escape, and accepts json.dumps' layout options.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict` for templates, without the attributes of the real type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore-prefixed attributes that could reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # No named self, as in jinja's Namespace, so that namespace(self=...) works.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore-prefixed attribute {name!r}")


def _alias_reasoning(messages: list[dict]) -> list[dict]:
    aliased = []
    for message in messages:
        reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"cannot parse {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object")
    return data


def _special_tokens(config: dict) -> dict[str, str]:
    """The "*_token" entries of a config: plain strings or serialized AddedTokens, as transformers accepts."""
    tokens = {}
    for name, value in config.items():
        if not name.endswith("_token"):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def _chat_templates(value: Any, source: Path) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):
        return {DEFAULT_TEMPLATE_NAME: value}
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise TokenizerError(f"chat_template in {source} must be a string or a list of {{name, template}} objects")


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    for name in DIGESTED_FILES:
        file_path = path / name
        if file_path.is_file():
            data = file_path.read_bytes()
            digest.update(f"{name}:{len(data)}:".encode())
            digest.update(data)
    return digest.hexdigest()


def _token_ids(value: Any, source: Path) -> list[int]:
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise TokenizerError(f"eos_token_id in {source} must be a token id or a list of them, got {value!r}")
    return ids
