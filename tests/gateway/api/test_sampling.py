"""presence_penalty, frequency_penalty, logit_bias and the top_k / min_p extensions, end to end:
the official openai SDK over real HTTP, the demo engine behind it. Each is accepted on chat and
completions and changes the output as its definition says; out-of-range values are 400s naming
the field. (Their exact arithmetic is tested against HF's processors in tests/engine/test_sampler.py.)"""

from __future__ import annotations

from collections import Counter

import openai
import pytest

from tests.gateway.api.conftest import ALPHA

CHAT = [{"role": "user", "content": "Explain what a gateway checks before it runs a request."}]
PROMPT = "The policy decides whether"


def token_ids_of(gateway, text: str) -> list[int]:
    """Every id the demo tokenizer renders as `text` (logprobs name tokens by text)."""
    tokenizer = gateway.engine.tokenizer
    ids = [i for i in range(gateway.engine.model_config.vocab_size) if tokenizer.token_text(i) == text]
    assert ids, f"no token renders as {text!r}"
    return ids


def first_token(completion) -> str:
    return completion.choices[0].logprobs.tokens[0]


def test_logit_bias_bans_the_greedy_token_and_forces_another(gateway) -> None:
    client = gateway.client(ALPHA)
    greedy = client.completions.create(model="demo", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0)
    best = first_token(greedy)
    banned = client.completions.create(model="demo", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0,
                                       logit_bias={str(i): -100 for i in token_ids_of(gateway, best)})
    assert first_token(banned) != best
    forced_id = gateway.engine.tokenizer.encode(" gateway", add_special_tokens=False)[-1]
    forced_text = gateway.engine.tokenizer.token_text(forced_id)
    for temperature in (0, 1.3):
        chat = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=4, temperature=temperature,
                                              seed=7, logit_bias={str(forced_id): 100})
        assert chat.choices[0].message.content == forced_text * 4 and chat.usage.completion_tokens == 4


def test_penalties_pick_each_token_by_openais_formula_and_stop_the_repeats(gateway) -> None:
    """A bias of 30 makes one token the greedy choice at every step (the demo model's top logit is
    about 20, this token's about -5); the penalties then take it back step by step. At every step
    the chosen token maximises logprob + bias - count * frequency - (count > 0) * presence over the
    tokens generated so far, against all 20 reported alternatives (logprobs are the raw
    distribution: the logits shifted by one constant per step)."""
    client = gateway.client(ALPHA)
    pushed = gateway.engine.tokenizer.encode(" gateway", add_special_tokens=False)[-1]
    pushed_text = gateway.engine.tokenizer.token_text(pushed)
    ask = dict(model="demo", messages=CHAT, max_tokens=30, temperature=0, logprobs=True, top_logprobs=20,
               logit_bias={str(pushed): 30})
    plain = client.chat.completions.create(**ask)
    penalized = client.chat.completions.create(**ask, presence_penalty=1.5, frequency_penalty=2.0)
    counts: Counter[str] = Counter()

    def score(token: str, logprob: float) -> float:
        bias = 30 if token == pushed_text else 0
        return logprob + bias - counts[token] * 2.0 - (counts[token] > 0) * 1.5

    for step, entry in enumerate(penalized.choices[0].logprobs.content):
        chosen = score(entry.token, entry.logprob)
        assert all(chosen >= score(alt.token, alt.logprob) - 1e-4 for alt in entry.top_logprobs), f"step {step}"
        counts[entry.token] += 1

    def tokens(completion) -> list[str]:
        return [e.token for e in completion.choices[0].logprobs.content]

    assert tokens(plain) == [pushed_text] * 30
    assert 1 <= tokens(penalized).count(pushed_text) < 15 and tokens(penalized)[0] == pushed_text


def test_a_negative_presence_penalty_encourages_repeats(gateway) -> None:
    client = gateway.client(ALPHA)
    ask = dict(model="demo", prompt=PROMPT, max_tokens=30, temperature=0, logprobs=0)
    plain = client.completions.create(**ask).choices[0].logprobs.tokens
    looping = client.completions.create(**ask, presence_penalty=-2, frequency_penalty=-2).choices[0].logprobs.tokens
    assert len(set(looping)) < len(set(plain))


def test_top_k_one_and_min_p_one_are_greedy_and_seeds_still_reproduce(gateway) -> None:
    client = gateway.client(ALPHA)
    ask = dict(model="demo", messages=CHAT, max_tokens=12)
    greedy = client.chat.completions.create(**ask, temperature=0).choices[0].message.content
    for extension in ({"top_k": 1}, {"min_p": 1.0}):
        hot = client.chat.completions.create(**ask, temperature=1.8, seed=11, extra_body=extension)
        assert hot.choices[0].message.content == greedy, extension
    every = dict(temperature=1.2, seed=5, presence_penalty=0.6, frequency_penalty=0.3, logit_bias={"3": -100},
                 extra_body={"top_k": 40, "min_p": 0.02})
    runs = {client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, **every).choices[0].text
            for _ in range(2)}
    assert len(runs) == 1
    unfiltered = client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=1.2, seed=5)
    assert unfiltered.choices[0].text not in runs


def test_the_engine_record_carries_the_settings(gateway) -> None:
    completion = gateway.client(ALPHA).chat.completions.create(
        model="demo", messages=CHAT, max_tokens=2, presence_penalty=0.5, frequency_penalty=-0.5,
        logit_bias={"3": 1, "4": -1}, extra_body={"top_k": 0, "min_p": 0.1})
    (record,) = [r for r in gateway.sink.requests if r.request_id == completion.id]
    decode = record.decode
    assert (decode["presence_penalty"], decode["frequency_penalty"], decode["logit_bias_tokens"]) == (0.5, -0.5, 2)
    assert (decode["top_k"], decode["min_p"]) == (0, 0.1)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"five": 1}}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # outside the demo model's vocabulary
        ({"extra_body": {"top_k": -2}}, "top_k"),
        ({"extra_body": {"top_k": 1.5}}, "top_k"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ],
)
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_out_of_range_sampling_fields_are_400_naming_the_field(gateway, extra, param, route) -> None:
    client = gateway.client(ALPHA)
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "chat":
            client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2, **extra)
        else:
            client.completions.create(model="demo", prompt=PROMPT, max_tokens=2, **extra)
    assert caught.value.body["param"] == param
    assert param in caught.value.body["message"]


def test_a_streamed_request_with_an_unknown_token_is_a_400_before_any_chunk(gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        list(gateway.client(ALPHA).chat.completions.create(model="demo", messages=CHAT, max_tokens=2, stream=True,
                                                           logit_bias={"99999999": 1}))
    assert caught.value.body["param"] == "logit_bias"
