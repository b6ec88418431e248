from __future__ import annotations

import json

import pytest
import torch

from engine.llm_engine import RequestError
from engine.sampling_params import SamplingParams
from tests.utils.envelopes import ENV

PROMPT = "The gateway verifies every token"


def sampled(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 24)
    kw.setdefault("ignore_eos", True)
    return SamplingParams(**kw)


def test_same_seed_same_tokens_whatever_else_is_in_the_batch(tiny_dir, make_engine) -> None:
    params = sampled(temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    engine = make_engine(model=str(tiny_dir))
    alone = engine.generate([PROMPT], params, envelopes=ENV)[0].token_ids
    others = [sampled(temperature=0.8, seed=i) for i in range(15)]
    crowd = engine.generate([PROMPT] + [f"{PROMPT} {i} " * (i + 1) for i in range(15)], [params] + others,
                            envelopes=ENV)
    assert crowd[0].token_ids == alone
    # The seed matters: another seed gives another continuation.
    other_seed = engine.generate([PROMPT], sampled(temperature=1.0, top_p=0.9, top_k=50, seed=4321), envelopes=ENV)
    assert other_seed[0].token_ids != alone


def test_unseeded_requests_differ_from_each_other(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    a, b = engine.generate([PROMPT, PROMPT], sampled(temperature=1.0), envelopes=ENV)
    assert a.token_ids != b.token_ids


def test_top_k_one_and_tiny_top_p_are_greedy(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    greedy = engine.generate([PROMPT], sampled(temperature=0), envelopes=ENV)[0].token_ids
    assert engine.generate([PROMPT], sampled(temperature=1.5, top_k=1, seed=1), envelopes=ENV)[0].token_ids == greedy
    assert engine.generate([PROMPT], sampled(temperature=1.5, top_p=1e-6, seed=2), envelopes=ENV)[0].token_ids == greedy


def test_sampled_tokens_stay_inside_top_k_and_top_p(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    for seed in range(4):
        top_k = engine.generate([PROMPT], sampled(temperature=2.0, top_k=3, seed=seed, keep_logits=True),
                                envelopes=ENV)[0]
        for token, logits in zip(top_k.token_ids, top_k.logits):
            assert token in logits.topk(3).indices.tolist()
        top_p = engine.generate([PROMPT], sampled(temperature=1.0, top_p=0.5, seed=seed, keep_logits=True),
                                envelopes=ENV)[0]
        for token, logits in zip(top_p.token_ids, top_p.logits):
            probs, order = logits.softmax(-1).sort(descending=True)
            nucleus = int((probs.cumsum(-1) - probs < 0.5).sum())
            assert token in order[:nucleus].tolist()


def test_greedy_steps_follow_openais_penalties_over_the_tokens_generated_so_far(tiny_dir, make_engine) -> None:
    from tests.engine.test_sampler import openai_penalties

    engine = make_engine(model=str(tiny_dir))
    plain = engine.generate([PROMPT], sampled(temperature=0, keep_logits=True), envelopes=ENV)[0]
    penalized = sampled(temperature=0, presence_penalty=1.5, frequency_penalty=2.0, keep_logits=True)
    result = engine.generate([PROMPT], penalized, envelopes=ENV)[0]
    assert result.token_ids != plain.token_ids
    for step, (token, raw) in enumerate(zip(result.token_ids, result.logits)):
        expected = openai_penalties(raw.numpy(), result.token_ids[:step], 1.5, 2.0)
        assert token == int(expected.argmax()), f"step {step}"


def test_logit_bias_forces_and_bans_tokens_in_the_engine(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    greedy = engine.generate([PROMPT], sampled(temperature=0, max_tokens=4), envelopes=ENV)[0].token_ids
    banned = engine.generate([PROMPT], sampled(temperature=0, max_tokens=4, logit_bias={greedy[0]: -100}),
                             envelopes=ENV)[0].token_ids
    assert greedy[0] not in banned
    forced = engine.generate([PROMPT], sampled(temperature=0.9, seed=5, max_tokens=4, logit_bias={"77": 100}),
                             envelopes=ENV)[0].token_ids
    assert forced == [77] * 4
    with pytest.raises(RequestError, match="not in this model's vocabulary") as caught:
        engine.generate([PROMPT], sampled(logit_bias={"512": 1}), envelopes=ENV)
    assert caught.value.param == "logit_bias"


def test_logprobs_are_the_raw_distribution(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    result = engine.generate([PROMPT], sampled(temperature=0.7, seed=3, logprobs=5, keep_logits=True), envelopes=ENV)[0]
    assert len(result.logprobs) == len(result.token_ids)
    for token, lp, logits in zip(result.token_ids, result.logprobs, result.logits):
        expected = torch.log_softmax(logits, -1)
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(expected[token].item(), abs=1e-5)
        assert len(lp.top) == 5
        assert [t for t, _ in lp.top] == expected.topk(5).indices.tolist()
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:]))
    assert engine.generate([PROMPT], sampled(max_tokens=3), envelopes=ENV)[0].logprobs == []


def test_max_tokens_and_context_length_finish_with_length(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_model_len=40)
    result = engine.generate([PROMPT], sampled(temperature=0, max_tokens=7), envelopes=ENV)[0]
    assert (len(result.token_ids), result.finish_reason) == (7, "length")
    prompt = list(range(2, 32))  # 30 tokens: 10 more fit in the context
    result = engine.generate([prompt], sampled(temperature=0, max_tokens=100), envelopes=ENV)[0]
    assert (len(result.token_ids), result.finish_reason) == (10, "length")


def test_stop_token_ids_and_eos_stop(tiny_dir, tmp_path, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    greedy = engine.generate([PROMPT], sampled(temperature=0), envelopes=ENV)[0].token_ids
    stop_at = greedy[5]
    first = greedy.index(stop_at)
    result = engine.generate([PROMPT], sampled(temperature=0, stop_token_ids=(stop_at,)), envelopes=ENV)[0]
    assert result.token_ids == greedy[: first + 1]
    assert result.finish_reason == "stop"

    # The same token declared as EOS in generation_config.json stops unless ignore_eos.
    eos_dir = tmp_path / "eos"
    eos_dir.mkdir()
    for f in tiny_dir.iterdir():
        (eos_dir / f.name).write_bytes(f.read_bytes())
    (eos_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop_at]}))
    eos_engine = make_engine(model=str(eos_dir))
    stopped = eos_engine.generate([PROMPT], sampled(temperature=0, ignore_eos=False), envelopes=ENV)[0]
    assert stopped.token_ids == greedy[: first + 1]
    assert eos_engine.generate([PROMPT], sampled(temperature=0), envelopes=ENV)[0].token_ids == greedy


def test_stop_strings_truncate_text_and_stop(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    full = engine.generate([PROMPT], sampled(temperature=0), envelopes=ENV)[0]
    assert len(full.text) > 12
    stop = full.text[6:10]
    result = engine.generate([PROMPT], sampled(temperature=0, stop=(stop,)), envelopes=ENV)[0]
    assert result.finish_reason == "stop"
    assert result.text == full.text[: full.text.index(stop)]
    assert len(result.token_ids) < len(full.token_ids)


def test_abort_frees_blocks_at_once(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    engine.add_request("a", PROMPT, sampled(max_tokens=50), envelope=ENV)
    engine.add_request("b", PROMPT * 3, sampled(max_tokens=50), envelope=ENV)
    engine.step()
    engine.step()
    assert engine.kv_stats().num_used_blocks > 0
    assert engine.abort_request("a")
    assert engine.abort_request("b")
    assert engine.kv_stats().num_used_blocks == 0
    assert not engine.abort_request("a")
    assert not engine.has_unfinished_requests()
    assert engine.step() == []


def test_abort_of_a_waiting_request(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_num_seqs=1)
    engine.add_request("a", PROMPT, sampled(), envelope=ENV)
    engine.add_request("b", PROMPT, sampled(), envelope=ENV)
    engine.step()
    final = engine.abort_request("b")
    assert final is not None and final.finish_reason == "abort" and final.num_output_tokens == 0
    assert "b" not in engine.runner.sampler._generators
    produced = [out.request_id for out in engine.step()]
    assert "b" not in produced


def test_bad_requests_are_refused_with_clear_errors(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_model_len=32)
    with pytest.raises(RequestError, match="context is 32 tokens"):
        engine.add_request("long", list(range(2, 40)), sampled(), envelope=ENV)
    with pytest.raises(RequestError, match="empty"):
        engine.add_request("empty", [], sampled(), envelope=ENV)
    with pytest.raises(RequestError, match=r"integers in \[0, 512\)"):
        engine.add_request("range", [1, 2, 9999], sampled(), envelope=ENV)
    engine.add_request("dup", PROMPT, sampled(), envelope=ENV)
    with pytest.raises(RequestError, match="already in flight"):
        engine.add_request("dup", PROMPT, sampled(), envelope=ENV)
    assert engine.abort_request("dup")


def test_generate_validates_every_prompt_before_queueing_any(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    with pytest.raises(RequestError, match="empty"):
        engine.generate([PROMPT, ""], sampled(), envelopes=ENV)
    assert not engine.has_unfinished_requests()
    with pytest.raises(RequestError, match="2 prompts, 1 sampling params, 2 envelopes"):
        engine.generate([PROMPT, PROMPT], [sampled()], envelopes=ENV)


def test_kv_waste_is_reported(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), block_size=16)
    engine.generate([list(range(2, 30))], sampled(max_tokens=3), envelopes=ENV)
    peak = engine.peak_kv_stats()
    assert peak.allocated_slots == 32  # 28 prompt + up to 3 decoded tokens in two blocks
    assert 0 < peak.waste < 0.2


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        if name not in ("mallopt", "malloc_trim"):  # a C library without them (musl, macOS)
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, args)) or 1


def test_a_cpu_engine_hands_back_what_loading_freed_once_it_is_loaded(tiny_dir, make_engine, monkeypatch) -> None:
    import engine.model_runner as runner_module

    libc = _FakeLibc()
    monkeypatch.setattr(runner_module, "_libc", lambda: libc)
    make_engine(model=str(tiny_dir))
    # The allocator tuned when the runner starts, its free pages handed back once the engine is loaded.
    assert [name for name, _ in libc.calls] == ["mallopt", "mallopt", "malloc_trim"]
    assert libc.calls[-1] == ("malloc_trim", (0,))


def test_a_c_library_without_the_glibc_calls_is_left_alone(monkeypatch) -> None:
    import engine.model_runner as runner_module

    monkeypatch.setattr(runner_module, "_libc", lambda: object())  # no mallopt, no malloc_trim
    assert runner_module.keep_cpu_memory_mapped() is False
    runner_module.return_freed_memory()  # no error
    monkeypatch.setattr(runner_module, "_libc", lambda: None)
    assert runner_module.keep_cpu_memory_mapped() is False
    runner_module.return_freed_memory()
