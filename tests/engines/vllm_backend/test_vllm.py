"""vlmfast.engines.vllm.backend and vlmfast.checkpoints.overlay end to end on the demo checkpoint, where vLLM imports
(.venv-vllm, built by scripts/setup_vllm.sh). One vLLM instance serves the whole module: it takes
20-50 s to start on 2 CPU cores. The tiny preset's head_dim 16 is not supported by vLLM's CPU attention,
so these tests build the demo preset.

The shared engine runs a GRPO-like copy of the checkpoint that lost its processor config and ``<|im_end|>``
(its overlay takes both from the original), and the last test checks that copy's bytes are untouched."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vlmfast.engines.hf.engine import Engine, GenerationSettings  # noqa: E402
from vlmfast.errors import UsageError  # noqa: E402
from vlmfast.inputs.requests import Request  # noqa: E402
from vlmfast.checkpoints.overlay import OVERLAY_PREFIX, overlay_for_vllm  # noqa: E402
from vlmfast.engines.vllm.backend import VllmBackend  # noqa: E402


def use_settings(engine, settings):
    """Decode later chunks with ``settings`` on the running vLLM (its start-up is the expensive part)."""
    engine.settings = settings
    engine.sampling_params = engine._sampling_params()

MAX_NEW = 32
PROMPT = "Describe the image."
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def _snapshot(d: Path) -> dict:
    """Every file under ``d``: content hash, size and mtime (a rewrite with equal bytes still shows)."""
    return {str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*")) if p.is_file()}


def _overlays() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(OVERLAY_PREFIX)}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from vlmfast.checkpoints.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("vllm") / "demo", preset="demo", like="grpo")


@pytest.fixture(scope="module")
def broken(demo, tmp_path_factory) -> Path:
    """The demo checkpoint as a careless GRPO save: no processor config, EOS list without <|im_end|>."""
    d = Path(shutil.copytree(demo, tmp_path_factory.mktemp("vllm") / "broken",
                             ignore=shutil.ignore_patterns(*PROCESSOR_FILES)))
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = [gen["pad_token_id"]]
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return d


@pytest.fixture(scope="module")
def before(demo, broken) -> tuple[dict, dict]:
    return _snapshot(broken), _snapshot(demo)


@pytest.fixture(scope="module")
def requests(tmp_path_factory) -> list[Request]:
    """8 single-image requests, a truncated PNG fourth (its header is fine) and, last, one request with
    two images and a system prompt."""
    from vlmfast.checkpoints.tiny import make_images

    d = tmp_path_factory.mktemp("vllm-images")
    paths = make_images(d, n=8)
    bad = d / "truncated.png"
    bad.write_bytes(paths[0].read_bytes()[:300])
    reqs = [Request(f"img{i}", (str(p),), PROMPT) for i, p in enumerate(paths)]
    reqs.insert(3, Request("truncated", (str(bad),), PROMPT))
    reqs.append(Request("pair", (str(paths[1]), str(paths[2])), "Compare the two images.", system="Answer briefly."))
    return reqs


@pytest.fixture(scope="module")
def good(requests) -> list[Request]:
    """The 8 single-image requests that decode."""
    return [r for r in requests if r.id not in ("truncated", "pair")]


@pytest.fixture(scope="module")
def engine(broken, demo, before, requests):
    eng = VllmBackend(str(broken), GenerationSettings(max_new_tokens=MAX_NEW), base=str(demo),
                     kv_cache_gib=1, max_model_len=4096)
    eng.start(requests)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def chunks(engine, requests):
    """The greedy run every row test reads: 9 requests in chunks of 3."""
    use_settings(engine, GenerationSettings(max_new_tokens=MAX_NEW))
    return list(engine.run(requests, {}, 3))


@pytest.fixture(scope="module")
def rows(chunks) -> dict:
    return {r.id: r for _, results, _ in chunks for r in results}


@pytest.fixture(scope="module")
def hf_loaded(demo):
    from vlmfast.checkpoints.load import load

    return load(str(demo), device="cpu", dtype="float32")


def _hf_rows(loaded, requests, settings=GenerationSettings(max_new_tokens=MAX_NEW)) -> dict:
    """The HF engine's rows for ``requests`` as one batch (8 here)."""
    results, _ = Engine(loaded, settings).generate_batch(requests)
    return {r.id: r for r in results}


@pytest.fixture(scope="module")
def hf_rows(hf_loaded, good) -> dict:
    return _hf_rows(hf_loaded, good)


def test_chunks_keep_input_order_and_a_bad_image_is_an_error_row(chunks, requests, engine):
    from vlmfast.engines.batching import image_tokens
    from PIL import Image

    assert [i for indices, _, _ in chunks for i in indices] == list(range(len(requests)))
    for indices, results, timing in chunks:
        assert len(indices) <= 3
        assert [r.id for r in results] == [requests[i].id for i in indices]
        ok = [r for r in results if r.error is None]
        assert timing.size == len(ok) and timing.new_tokens == sum(r.n_new_tokens for r in ok)
        assert timing.ttft_s > 0 and timing.decode_s > 0 and timing.preprocess_s > 0
        assert timing.steps == max(len(r.token_ids) for r in ok)
    bad = next(r for _, results, _ in chunks for r in results if r.id == "truncated")
    assert "cannot decode image" in bad.error and bad.text is None and bad.n_new_tokens == 0
    for _, results, _ in chunks:
        for r in results:
            if r.error is not None:
                continue
            expected = 0
            for path in r.images:
                with Image.open(path) as im:
                    expected += image_tokens(*im.size, min_pixels=engine.min_pixels, max_pixels=engine.max_pixels)
            assert r.n_image_tokens == expected
            assert r.n_prompt_tokens > r.n_image_tokens
            assert r.finish_reason in ("eos", "length") and r.n_new_tokens == len(r.token_ids) <= MAX_NEW
            assert r.text == engine.tokenizer.decode(r.token_ids, skip_special_tokens=True)
    assert engine.timing_notes == []  # vLLM gave per-request metrics for every chunk


def test_two_images_and_a_system_prompt_build_the_same_prompt_as_the_hf_engine(rows, hf_loaded, requests):
    pair = requests[-1]
    theirs = _hf_rows(hf_loaded, [pair])["pair"]
    mine = rows["pair"]
    assert mine.error is None and mine.n_image_tokens > 0
    assert (mine.n_prompt_tokens, mine.n_image_tokens) == (theirs.n_prompt_tokens, theirs.n_image_tokens)
    assert getattr(mine, "model_image_sizes", None) == getattr(theirs, "model_image_sizes", None)


def test_greedy_tokens_match_the_hf_engine(rows, hf_rows, good):
    same = [r.id for r in good if rows[r.id].token_ids == hf_rows[r.id].token_ids]
    assert len(same) >= 7, {r.id: (rows[r.id].token_ids, hf_rows[r.id].token_ids) for r in good if r.id not in same}
    for rid in same:
        a, b = rows[rid], hf_rows[rid]
        assert (a.text, a.finish_reason, a.n_new_tokens, a.n_prompt_tokens, a.n_image_tokens) == \
               (b.text, b.finish_reason, b.n_new_tokens, b.n_prompt_tokens, b.n_image_tokens)
        assert getattr(a, "model_image_sizes", None) == getattr(b, "model_image_sizes", None)


def test_a_stop_token_is_kept_and_counted_as_the_hf_engine_does(engine, rows, hf_loaded, good):
    """Random weights rarely say <|im_end|>: make a token the first request emits at step 6 an EOS."""
    first = rows[good[0].id].token_ids
    k = next(i for i in range(5, len(first)) if first[i] not in first[:i])
    stop = first[k]
    eos = list(engine.eos_token_ids)
    engine.eos_token_ids = eos + [stop]
    try:
        use_settings(engine, GenerationSettings(max_new_tokens=MAX_NEW))
        mine = {r.id: r for _, results, _ in engine.run(good, {}, 8) for r in results}
    finally:
        engine.eos_token_ids = eos
        use_settings(engine, GenerationSettings(max_new_tokens=MAX_NEW))
    theirs = _hf_rows(dataclasses.replace(hf_loaded, eos_token_ids=hf_loaded.eos_token_ids + [stop]), good)
    a = mine[good[0].id]
    assert a.token_ids == first[:k + 1] and a.finish_reason == "eos" and a.n_new_tokens == k + 1
    same = [r.id for r in good if mine[r.id].token_ids == theirs[r.id].token_ids]
    assert len(same) >= 7
    for rid in same:
        assert (mine[rid].finish_reason, mine[rid].n_new_tokens, mine[rid].text) == \
               (theirs[rid].finish_reason, theirs[rid].n_new_tokens, theirs[rid].text)


def test_vision_placeholders_are_never_emitted(engine, good):
    """Hot sampling reaches them without the ban (the control run), never with it. Seeded sampling
    gives each request the same tokens whatever chunk it is in."""
    banned = set(engine.suppress_token_ids)
    assert engine.ban_mechanism == "bad_words" and len(banned) == 4
    hot = GenerationSettings(max_new_tokens=128, temperature=2.0, seed=1, ignore_eos=True)
    use_settings(engine, hot)
    ban = engine.ban_kwargs
    try:
        by8 = {r.id: r.token_ids for _, results, _ in engine.run(good, {}, 8) for r in results}
        by3 = {r.id: r.token_ids for _, results, _ in engine.run(good, {}, 3) for r in results}
        engine.ban_kwargs = {}
        use_settings(engine, hot)
        control = [t for _, results, _ in engine.run(good, {}, 8) for r in results for t in r.token_ids]
    finally:
        engine.ban_kwargs = ban
        use_settings(engine, GenerationSettings(max_new_tokens=MAX_NEW))
    assert by8 == by3
    assert all(len(ids) == 128 for ids in by8.values())
    assert not banned & {t for ids in by8.values() for t in ids}
    assert banned & set(control), "the control run without the ban should have sampled a placeholder"


def test_ignore_eos_decodes_exactly_max_new_tokens(engine, good):
    use_settings(engine, GenerationSettings(max_new_tokens=16, ignore_eos=True))
    try:
        out = list(engine.run(good, {}, 8))
    finally:
        use_settings(engine, GenerationSettings(max_new_tokens=MAX_NEW))
    (_, results, timing), = out
    assert all(r.finish_reason == "length" and r.n_new_tokens == 16 for r in results)
    assert timing.steps == 16 and timing.new_tokens == 16 * len(good)


def test_describe_names_the_engine_and_its_settings(engine):
    d = engine.describe()
    assert d["engine"] == "vllm" and d["vllm_version"][0].isdigit()
    assert d["device"] == "cpu" and d["dtype"] == "float32" and d["enforce_eager"] is True
    assert d["vision_ban"] == "bad_words" and d["startup_s"] > 0 and engine.startup_s > 0
    assert d["tensor_parallel_size"] == 1 and d["kv_cache_gib"] == 1
    assert any("processor_config.json" in n for n in d["notes"])
    assert engine.facts().repetition_penalty == engine.sampling_params.repetition_penalty == 1.0  # the demo ships none


def test_without_vllm_the_engine_is_a_usage_error(monkeypatch, demo):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(UsageError) as err:
        VllmBackend(str(demo))
    assert err.value.exit_code == 2
    assert "pip install 'vlmfast[vllm]'" in err.value.hint and "scripts/setup_vllm.sh" in err.value.hint


def test_settings_vllm_refuses_are_usage_errors_and_leave_no_overlay(demo):
    left = _overlays()
    with pytest.raises(UsageError, match="temperature"):
        VllmBackend(str(demo), GenerationSettings(temperature=5.0))
    assert _overlays() == left


def test_a_generation_config_transformers_refuses_is_said_at_the_users_file_before_an_overlay(demo, tmp_path):
    """The overlay repaired early_stopping "true" unsaid and named its own temporary copy for the rest; vLLM's
    engine refuses as the HF engine does, naming the checkpoint's own file, and leaves no overlay."""
    from vlmfast.errors import CheckpointError

    d = shutil.copytree(demo, tmp_path / "c")
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**gen, "early_stopping": "true",
                                                          "watermarking_config": {"strength": 1}}))
    left = _overlays()
    with pytest.raises(CheckpointError) as err:
        VllmBackend(str(d))
    assert str(err.value).startswith(f"{d / 'generation_config.json'}: early_stopping 'true', watermarking_config")
    assert f"edit {d / 'generation_config.json'}" in err.value.hint and _overlays() == left


def test_a_seed_past_2_32_and_a_temperature_under_vllms_floor_are_handled_and_said(demo):
    """vLLM seeds numpy with its engine seed (below 2**32, else its start fails); a temperature under 0.01 it
    raises to 0.01 quietly: said. Neither starts the engine."""
    backend = VllmBackend(str(demo), GenerationSettings(temperature=0.005, seed=2**40 + 3, max_new_tokens=4), dtype="bf16")
    try:
        assert backend.engine_args()["seed"] == 3 and backend.seed == 2**40 + 3  # draws keyed by the whole seed
        assert backend.engine_args()["dtype"] == "bfloat16"  # --dtype's aliases, in the name vLLM knows
        assert any("--temperature 0.005: vLLM samples at 0.01 at least" in n for n in backend.notes)
    finally:
        backend.close()


def test_the_generation_configs_notes_are_the_hf_engines(demo, tmp_path):
    """The checkpoint's repetition penalty (which vLLM applies, as vlmfast passes it) and the settings vLLM does not
    apply as vlmfast runs it are said, as the HF engine says them. Does not start the engine."""
    import json
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(demo, ckpt)
    config = json.loads((ckpt / "generation_config.json").read_text())
    config.update(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=5)
    (ckpt / "generation_config.json").write_text(json.dumps(config))
    backend = VllmBackend(str(ckpt), GenerationSettings(max_new_tokens=4))
    try:
        notes = " | ".join(backend.notes)
        assert backend.sampling_params.repetition_penalty == 1.3 and "repetition penalty 1.3 from the checkpoint's" in notes
        assert "no_repeat_ngram_size=3, which vLLM does not apply" in notes and "min_new_tokens=5" in notes
    finally:
        backend.close()


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@pytest.mark.skipif(not _vllm_on_cpu(), reason="a limit of vLLM's CPU attention")
def test_a_head_size_vllms_cpu_attention_lacks_is_a_usage_error(tmp_path):
    from vlmfast.checkpoints.tiny import build_checkpoint

    tiny = build_checkpoint(tmp_path / "tiny", preset="tiny", like="grpo")  # head_dim 16
    left = _overlays()
    with pytest.raises(UsageError, match="head sizes") as err:
        VllmBackend(str(tiny))
    assert "--preset demo" in err.value.hint and _overlays() == left


def test_a_lora_adapter_is_merged_into_a_temporary_copy(demo, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(demo), dtype=torch.float32)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(str(adapter))
    snap = _snapshot(adapter)
    with overlay_for_vllm(adapter, base=demo) as (path, notes):
        assert (path / "config.json").is_file() and any("merged into" in n for n in notes)
        merged, original = load_file(next(path.glob("*.safetensors"))), load_file(demo / "model.safetensors")
        q = next(k for k in original if k.endswith("layers.0.self_attn.q_proj.weight"))
        assert not torch.equal(merged[q], original[q])
    assert not path.exists() and _snapshot(adapter) == snap


def test_the_overlay_supplies_a_missing_processor_and_never_touches_the_checkpoint(engine, rows, broken, demo, before):
    from transformers import AutoProcessor

    assert not any((broken / f).exists() for f in PROCESSOR_FILES)
    with overlay_for_vllm(broken, base=demo) as (path, notes):
        supplied = [path / f for f in PROCESSOR_FILES if (path / f).exists()]
        assert supplied and all(p.is_symlink() and Path(os.readlink(p)).parent == demo.absolute() for p in supplied)
        assert AutoProcessor.from_pretrained(str(path)).image_processor is not None
        gen = json.loads((path / "generation_config.json").read_text())
        assert engine.tokenizer.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]
        assert not (path / "generation_config.json").is_symlink() and (path / "model.safetensors").is_symlink()
        assert any("processor_config.json" in n for n in notes)
    assert not path.exists()
    with overlay_for_vllm(broken) as (_, notes):  # no base: said, not guessed
        assert any("no processor config" in n for n in notes)
    # the shared engine has loaded and run the broken copy through its own overlay meanwhile
    assert Path(engine.model_dir).parent.name.startswith(OVERLAY_PREFIX) and rows
    assert (_snapshot(broken), _snapshot(demo)) == before


def test_n_answers_map_to_vllms_n(engine, good):
    """--n 3 with sampling: vLLM's own n, three rows per request (sample 0, 1, 2), reproducible with a seed;
    greedy: one completion, three identical rows."""
    def run(settings):
        use_settings(engine, settings)
        return [(r.id, r.sample, tuple(r.token_ids)) for _, results, _ in engine.run(good[:3], {}, 8) for r in results]

    try:
        sampled = run(GenerationSettings(max_new_tokens=8, temperature=1.0, n=3, seed=4, ignore_eos=True))
        again = run(GenerationSettings(max_new_tokens=8, temperature=1.0, n=3, seed=4, ignore_eos=True))
        greedy = run(GenerationSettings(max_new_tokens=8, n=3))
    finally:
        use_settings(engine, GenerationSettings(max_new_tokens=MAX_NEW))
    assert [(rid, k) for rid, k, _ in sampled] == [(r.id, k) for r in good[:3] for k in range(3)]
    assert sampled == again and len({tokens for _, _, tokens in sampled}) > 3
    assert all(len({t for rid, _, t in greedy if rid == r.id}) == 1 for r in good[:3]) and len(greedy) == 9


def test_engine_vllm_locates_the_checkpoint_once(demo, requests, tmp_path, monkeypatch):
    """From a run directory, `infer --engine vllm` locates the checkpoint once, in the runner; the backend,
    its overlay and the fix plan take the Located it hands down (vLLM is stopped before it starts)."""
    import vlmfast.checkpoints.locate as locating
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer

    run = tmp_path / "run"
    shutil.copytree(demo, run / "checkpoint-5")
    calls = []
    real = locating.locate
    monkeypatch.setattr(locating, "locate", lambda spec, **kw: calls.append(str(spec)) or real(spec, **kw))

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(VllmBackend, "ready", stop)
    image = requests[0].images[0]
    with pytest.raises(Stop):
        infer(InferOptions(ckpt=str(run), images=[image], prompt=PROMPT, engine="vllm"))
    assert calls == [str(run)]


def test_vllms_image_parser_keeps_the_pixels_vlmfast_prepared(demo, tmp_path):
    """vLLM turns every PIL image a prompt carries by its EXIF orientation and, from 0.33, lays a PNG colour key
    on white (vllm.multimodal.parse: convert_image_mode(normalize_image(image))). The images vlmfast hands it carry
    neither, so vLLM keeps the pixels the HF engine gets."""
    import numpy as np
    from PIL import Image
    from vllm.multimodal.image import convert_image_mode, normalize_image

    pixels = np.full((56, 84, 3), 200, dtype=np.uint8)
    pixels[:28, :28] = (10, 20, 30)
    Image.fromarray(pixels).save(tmp_path / "key.png", transparency=(10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned a quarter, as phones save photos
    Image.new("RGB", (84, 56), (90, 140, 60)).save(tmp_path / "phone.jpg", exif=exif)
    backend = VllmBackend(str(demo), GenerationSettings(max_new_tokens=4))
    try:
        images, _ = backend.load_images([Request("k", (str(tmp_path / "key.png"), str(tmp_path / "phone.jpg")), PROMPT)])
    finally:
        backend.close()
    for image in images["k"]:
        seen = convert_image_mode(normalize_image(image), "RGB")
        assert seen.size == image.size and np.array_equal(np.asarray(seen), np.asarray(image))


def test_the_canarys_fresh_engine_is_started_for_the_sweeps_own_settings(demo, good, monkeypatch):
    """After the first in-place reload the canary's fresh engine takes over the sweep's rows: its engine arguments
    are the run's (a sampled run on a CPU takes whole prefills; vLLM's sampler dies on a CPU generator after a
    partial one), not those of the canary's greedy check. No engine starts here: ``start`` records its arguments."""
    from vlmfast.engines.vllm.reload import run_canary

    started = []

    def start(self, requests=()):
        started.append(self.engine_args())
        self.llm = object()
        return 0.0

    monkeypatch.setattr(VllmBackend, "start", start)
    monkeypatch.setattr(VllmBackend, "generate_batch", lambda self, batch: ([], None))
    backend = VllmBackend(str(demo), GenerationSettings(max_new_tokens=8, temperature=1.0, n=2, seed=5))
    try:
        backend.start(good)
        run_canary(backend, good)
    finally:
        backend.close()
    own, fresh = started
    assert fresh.get("enable_chunked_prefill") == own.get("enable_chunked_prefill")
    assert fresh["seed"] == own["seed"]
    if backend.on_cpu:
        assert fresh["enable_chunked_prefill"] is False
