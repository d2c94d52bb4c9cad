"""A checkpoint's repetition penalty (Qwen2-VL and Qwen2.5-VL Instruct ship 1.05 in generation_config.json):
vlmfast's loop applies it as plain ``generate`` does — the same tokens, eager, static, continuous and sampled."""

import pytest

from conftest import generate_tokens, model_inputs

from vlmfast.engines.hf.engine import Engine
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.engines.rows import GenerationSettings
from vlmfast.inputs.requests import Request

PROMPT = "What shapes are in this image? Answer briefly."


def _run(engine, requests, batch_size):
    return {(r.id, r.sample): r.token_ids for _, rs, _ in Scheduler(engine).run(requests, {}, batch_size) for r in rs}


@pytest.fixture
def penalized(loaded, monkeypatch):
    monkeypatch.setattr(loaded.model.generation_config, "repetition_penalty", 1.3)
    return loaded


def test_the_penalty_gives_plain_generate_tokens_eager_static_and_continuous(loaded, images, monkeypatch):
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:4]]
    settings = GenerationSettings(max_new_tokens=20, ignore_eos=True)
    plain = _run(Engine(loaded, settings), reqs, 4)
    monkeypatch.setattr(loaded.model.generation_config, "repetition_penalty", 1.3)
    engine = Engine(loaded, settings)
    # each request alone, as vLLM penalizes it: a batch of generate would count its left padding as seen
    reference = {(r.id, None): generate_tokens(loaded, model_inputs(engine, [r]), 20, [])[0] for r in reqs}
    assert reference != plain  # the penalty changes tokens here, so the equalities below can fail
    assert _run(engine, reqs, 4) == reference  # one batch
    assert _run(engine, reqs, 1) == reference
    assert _run(Engine(loaded, settings), reqs, 2) == reference  # rows refilled as answers end
    static = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)  # static shapes, not compiled
    assert _run(static, reqs, 3) == reference and static._static
    assert any(n.startswith("repetition penalty 1.3 from the checkpoint's generation config") for n in engine.notes)


def test_sampled_answers_under_the_penalty_are_those_of_plain_generate(penalized, images):
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:2]]
    settings = GenerationSettings(max_new_tokens=12, temperature=0.9, n=2, seed=3, ignore_eos=True)
    ours, hf = _run(Engine(penalized, settings), reqs, 4), _run(Engine(penalized, settings, decoder="hf"), reqs, 4)
    assert ours == hf and len(ours) == 4


def test_settings_the_loop_does_not_apply_are_said(loaded, monkeypatch):
    monkeypatch.setattr(loaded.model.generation_config, "no_repeat_ngram_size", 3)
    engine = Engine(loaded, GenerationSettings(max_new_tokens=4))
    assert any("no_repeat_ngram_size=3, which vlmfast's decoder does not apply" in n for n in engine.notes)
    assert not any("repetition penalty" in n for n in engine.notes) and engine.penalty == 1.0


def test_settings_neither_decoder_applies_are_said_for_both(loaded, monkeypatch):
    """min_new_tokens, suppress_tokens …: vlmfast hands generate its own length, stop and ban lists, so
    --decoder hf does not apply them either; the checkpoint's top_k only matters when sampling."""
    config = loaded.model.generation_config
    for name, value in (("min_new_tokens", 6), ("suppress_tokens", [5]), ("top_k", 1)):
        monkeypatch.setattr(config, name, value)
    for decoder in ("vlmfast", "hf"):
        greedy = [n for n in Engine(loaded, GenerationSettings(max_new_tokens=4), decoder=decoder).notes
                  if "which vlmfast does not apply" in n]
        assert len(greedy) == 1 and "min_new_tokens=6, suppress_tokens=[5]" in greedy[0] and "top_k" not in greedy[0]
    sampled = Engine(loaded, GenerationSettings(max_new_tokens=4, temperature=0.8)).notes
    assert any("min_new_tokens=6, suppress_tokens=[5], top_k=1, which vlmfast does not apply" in n for n in sampled)


def test_the_option_overrides_the_checkpoint_both_ways_in_both_decoders(loaded, images, monkeypatch):
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:2]]
    settings = GenerationSettings(max_new_tokens=16, ignore_eos=True)
    plain = _run(Engine(loaded, settings), reqs, 2)
    asked = GenerationSettings(max_new_tokens=16, ignore_eos=True, repetition_penalty=1.3)
    penalized = _run(Engine(loaded, asked), reqs, 2)
    assert penalized != plain and _run(Engine(loaded, asked, decoder="hf"), reqs, 2) == penalized
    monkeypatch.setattr(loaded.model.generation_config, "repetition_penalty", 1.3)
    assert _run(Engine(loaded, settings), reqs, 2) == penalized  # the checkpoint's, by default
    off = GenerationSettings(max_new_tokens=16, ignore_eos=True, repetition_penalty=1.0)
    engine = Engine(loaded, off)
    assert _run(engine, reqs, 2) == plain == _run(Engine(loaded, off, decoder="hf"), reqs, 2)
    assert "--repetition-penalty 1 over the checkpoint's generation config (1.3)" in engine.notes
    with pytest.raises(Exception, match="--repetition-penalty 0.0: expected a finite number above 0"):
        GenerationSettings(repetition_penalty=0.0)


def test_plain_generate_in_a_padded_batch_counts_each_row_s_own_tokens(loaded, images, monkeypatch):
    """--decoder hf runs a padded batch: transformers 4.57's own penalty counts the left padding (its pad token
    is an EOS id) as seen, so a padded row's tokens would change with the batch. A penalty below 1 rewards seen
    tokens, which brings the pad/EOS token to the top where it matters."""
    monkeypatch.setattr(loaded.model.generation_config, "repetition_penalty", 0.3)
    reqs = [Request("long", (str(images[0]),), PROMPT + " Say it with many words, please."),
            Request("short", (str(images[1]),), "Hi"), Request("text", (), "Count to three."),
            Request("other", (str(images[2]),), PROMPT)]
    settings = GenerationSettings(max_new_tokens=16, ignore_eos=True)
    engine = Engine(loaded, settings, decoder="hf")
    reference = {(r.id, None): generate_tokens(loaded, model_inputs(engine, [r]), 16, [])[0] for r in reqs}
    assert _run(engine, reqs, 4) == reference == _run(Engine(loaded, settings), reqs, 4)


@pytest.mark.parametrize("decoder", ["vlmfast", "hf"])
def test_a_saved_sampling_at_temperature_zero_or_short_max_length_changes_no_token(loaded, images, monkeypatch, decoder):
    """Plain generate raises on do_sample with temperature 0, and stops at a saved max_length 20 (doctor says so);
    vlmfast's loop and --decoder hf decode greedily at --temperature 0 for --max-new-tokens, whatever they say."""
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:2]]
    settings = GenerationSettings(max_new_tokens=24, ignore_eos=True)
    before = _run(Engine(loaded, settings, decoder=decoder), reqs, 2)
    for name, value in (("do_sample", True), ("temperature", 0.0), ("max_length", 20)):
        monkeypatch.setattr(loaded.model.generation_config, name, value)
    after = _run(Engine(loaded, settings, decoder=decoder), reqs, 2)
    assert after == before and all(len(tokens) == 24 for tokens in after.values())


def test_the_penalty_in_force_is_recorded_beside_the_results(grpo_ckpt, images, tmp_path):
    """The penalty a run applied is one of the engine's facts, written into the settings record beside
    ``--out``: a later resume compares its own with it."""
    import json

    from conftest import cli

    out = tmp_path / "r.jsonl"
    result = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--max-new-tokens", 2, "--device", "cpu",
                 "--repetition-penalty", 1.3, "--prompt", PROMPT, "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "r.run.json").read_text())["runtime"]["repetition_penalty"] == 1.3
