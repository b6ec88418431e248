from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams, SamplingParamsError


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": "7"}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": 2.5}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"stop": ("",)}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"logit_bias": {"a": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {5: 100.5}}, "logit_bias"),
        ({"logit_bias": {5: True}}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"logit_bias": "5"}, "logit_bias"),
    ],
)
def test_out_of_range_settings_name_the_field(kwargs, param) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param
    assert str(info.value).startswith(f"{param}:")


def test_valid_edges_are_accepted() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=1e-40).greedy  # would overflow the logits otherwise
    assert SamplingParams(stop="END").stop == ("END",)  # one string, not its characters
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    assert SamplingParams(top_p=1.0, max_tokens=1, logprobs=0, stop=["x"]).stop == ("x",)


def test_logit_bias_takes_openais_json_keys_and_remote_pairs() -> None:
    params = SamplingParams(logit_bias={"42": -100, "7": 2.5}, presence_penalty=-2, frequency_penalty=2, min_p=1)
    assert params.logit_bias == ((7, 2.5), (42, -100.0))
    assert SamplingParams(logit_bias=[[42, -100], [7, 2.5]]).logit_bias == params.logit_bias  # as JSON carries it
    assert SamplingParams(logit_bias={str(i): 100 for i in range(300)}).logit_bias[-1] == (299, 100.0)
    assert params.penalized and not SamplingParams(logit_bias={"1": 1}).penalized


def test_every_setting_survives_the_replica_wire() -> None:
    import json

    from engine.remote import params_from_json, params_to_json

    params = SamplingParams(max_tokens=7, temperature=0.8, top_p=0.9, top_k=4, min_p=0.1, presence_penalty=0.5,
                            frequency_penalty=-1.0, logit_bias={"5": -100, "9": 2.5}, seed=3, stop=("x",),
                            json_schema='{"type":"object"}')
    assert params_from_json(json.loads(json.dumps(params_to_json(params)))) == params


def test_n_crosses_the_replica_wire_only_when_it_is_more_than_one() -> None:
    from engine.remote import params_from_json, params_to_json

    assert "n" not in params_to_json(SamplingParams())  # what a replica from before n > 1 still reads
    assert params_from_json(params_to_json(SamplingParams(n=3, seed=1))) == SamplingParams(n=3, seed=1)
    one_seed = SamplingParams(n=3, seed=2**63 - 1).for_choice(2)
    assert (one_seed.n, one_seed.seed) == (1, 1)  # seed + choice wraps within [0, 2**63)


@pytest.mark.parametrize("schema", ["", 3, {"type": "object"}])
def test_json_schema_must_be_json_text(schema) -> None:
    with pytest.raises(SamplingParamsError, match="json_schema"):
        SamplingParams(json_schema=schema)
