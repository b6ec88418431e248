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
        ({"logprobs": 21}, "logprobs"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_out_of_range_settings_name_the_field(kwargs, param) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param
    assert str(info.value).startswith(f"{param}:")


def test_valid_edges_are_accepted() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(top_p=1.0, max_tokens=1, logprobs=0, stop=["x"]).stop == ("x",)
