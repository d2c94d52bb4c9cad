"""Model families: the table, a tiny checkpoint of each family, vlmfast's decode loop held to plain
``generate`` for each (batch 1, batch N, rows ending apart), doctor and fix per family, and a model of
a family the table does not know running through plain generate."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil

import pytest

from conftest import edit_json, generate_tokens, model_inputs
from vlmfast.checkpoints.families import BY_KEY, FAMILIES, decoder_for, family_for
from vlmfast.inputs.requests import Request

PROMPT = "What shapes are in this image? Answer briefly."
NEW_FAMILIES = [k for k in BY_KEY if k != "qwen2_5_vl"]  # Qwen2.5-VL: conftest's grpo_ckpt, test_engine


def _has_class(key: str) -> bool:
    import transformers

    return hasattr(transformers, BY_KEY[key].model_class)


NEEDS_QWEN3_5 = pytest.mark.skipif(not _has_class("qwen3_5"), reason="Qwen3.5 is not in this transformers")
WITHOUT_QWEN3_5 = pytest.mark.skipif(_has_class("qwen3_5"), reason="this transformers has Qwen3.5")
ON_THIS_LINE = [pytest.param(k, marks=pytest.mark.skipif(not _has_class(k), reason="not in this transformers"))
                for k in NEW_FAMILIES]


def _run(engine, requests, batch_size):
    from vlmfast.engines.hf.scheduler import Scheduler

    out = {}
    for _, results, _ in Scheduler(engine).run(requests, {}, batch_size):
        out.update({r.id: r for r in results})
    return [out[r.id] for r in requests]


def _eos_ending_rows_apart(tokens):
    """Two or three token ids that, taken as the EOS list, end every row at different steps, none at the first."""
    candidates = sorted({t for row in tokens for t in row[1:]})
    for stop in itertools.chain(itertools.combinations(candidates, 2), itertools.combinations(candidates, 3)):
        ends = [next((i for i, t in enumerate(row) if t in stop), None) for row in tokens]
        if all(e is not None and e > 0 for e in ends) and len(set(ends)) >= 2:
            return list(stop)
    raise AssertionError("no token set ends the rows at different steps")


# -- the table -------------------------------------------------------------------------------------
def test_table_maps_every_model_type_and_nothing_else():
    assert [f.key for f in FAMILIES] == ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"]
    for f in FAMILIES:
        assert all(family_for(t) is f for t in f.model_types)
    assert family_for("glm4v") is None and family_for(None) is None and family_for("qwen3_5_text") is None
    assert {f.key: f.loop for f in FAMILIES} == {"qwen2_vl": "own", "qwen2_5_vl": "own", "qwen3_vl": "own",
                                                "qwen3_vl_moe": "own", "qwen3_5": "own", "qwen3_5_moe": "own"}
    assert {f.key: f.bbox_space for f in FAMILIES if f.bbox_space == "resized"} == {"qwen2_5_vl": "resized"}
    assert decoder_for(BY_KEY["qwen3_5"], "vlmfast") == ("vlmfast", None)
    assert decoder_for(None, "vlmfast")[0] == "hf" and "untested" in decoder_for(None, "vlmfast")[1]
    assert decoder_for(None, "hf") == ("hf", None)


def test_real_vocabulary_ids_differ_by_family():
    assert BY_KEY["qwen2_5_vl"].real_token_id("<|im_end|>", 151936) == 151645
    assert BY_KEY["qwen3_vl"].real_token_id("<|image_pad|>", 151936) == 151655
    q35 = BY_KEY["qwen3_5"]
    assert [q35.real_token_id(t, 248320) for t in ("<|endoftext|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>")] == [
        248044, 248046, 248053, 248056]  # the last two are Qwen3_5Config's defaults
    assert q35.real_token_id("<|im_end|>", 718) is None and q35.real_token_id("<think>", 248320) is None


# -- tiny checkpoints ------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_tiny_checkpoint_is_the_real_class_saved_grpo_like(key, family_ckpts, family_loaded):
    d, loaded, family = family_ckpts(key), family_loaded(key), BY_KEY[key]
    cfg, gen = json.loads((d / "config.json").read_text()), json.loads((d / "generation_config.json").read_text())
    assert cfg["model_type"] in family.model_types and type(loaded.model).__name__ == family.model_class
    assert type(loaded.processor).__name__ == family.processor_class and loaded.family is family
    assert (cfg["use_cache"], cfg["text_config"]["use_cache"], gen["use_cache"]) == (False, False, False)
    tok = loaded.processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in family.special_tokens}
    assert list(ids.values()) == list(range(ids["<|endoftext|>"], ids["<|endoftext|>"] + len(ids)))  # Qwen's order
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]] == loaded.eos_token_ids
    assert cfg["image_token_id"] == ids["<|image_pad|>"] and loaded.suppress_token_ids[0] == ids["<|image_pad|>"]
    assert loaded.processor.image_processor.patch_size == family.patch_size
    layers = loaded.model.model.language_model.layers
    kinds = ["linear" if hasattr(layer, "linear_attn") else "full" for layer in layers]
    assert kinds == (["linear"] * 3 + ["full"] if family.linear_attention else ["full"] * len(layers))
    assert hasattr(layers[0].mlp, "experts") == family.moe
    assert not [n for n in loaded.notes if "tested" in n]
    text = "Count the red boxes in the image."
    assert tok.decode(tok.encode(text)) == text


@NEEDS_QWEN3_5
def test_qwen3_5_has_its_own_vocabulary(family_ckpts, grpo_ckpt):
    from vlmfast.checkpoints.readers import token_id

    assert token_id(family_ckpts("qwen3_5"), "<|im_end|>") != token_id(grpo_ckpt, "<|im_end|>")


@WITHOUT_QWEN3_5
def test_qwen3_5_on_transformers_4_is_a_usage_error_with_a_hint(tmp_path):
    from vlmfast.errors import UsageError
    from vlmfast.checkpoints.tiny import build_checkpoint

    with pytest.raises(UsageError) as err:
        build_checkpoint(tmp_path / "q", family="qwen3_5")
    assert "transformers >= 5" in err.value.hint and not (tmp_path / "q").exists()


def test_unknown_family_or_preset_lists_the_valid_ones(tmp_path):
    from vlmfast.checkpoints.tiny import build_checkpoint

    from vlmfast.errors import UsageError

    with pytest.raises(UsageError, match="--family llava: unknown") as exc:
        build_checkpoint(tmp_path / "x", family="llava")
    assert "qwen3_vl_moe" in exc.value.hint
    with pytest.raises(UsageError, match="valid presets: tiny, demo"):
        build_checkpoint(tmp_path / "x", family="qwen2_vl", preset="3b")


# -- the decode loop against plain generate --------------------------------------------------------
@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_loop_gives_generate_tokens_batch_1_and_n_rows_ending_apart(key, family_loaded, images):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    loaded, reqs = family_loaded(key), [Request(str(p), (str(p),), PROMPT) for p in images[:3]]
    free = [r.token_ids for r in _run(Engine(loaded, GenerationSettings(max_new_tokens=12, ignore_eos=True)), reqs, 3)]
    eos = _eos_ending_rows_apart(free)
    stopping = dataclasses.replace(loaded, eos_token_ids=eos)
    engine = Engine(stopping, GenerationSettings(max_new_tokens=12), sync_every=1)
    batch, single = _run(engine, reqs, 3), _run(engine, reqs, 1)
    reference = generate_tokens(stopping, model_inputs(engine, reqs), 12, eos)
    assert [r.token_ids for r in batch] == [r.token_ids for r in single] == reference
    assert len({len(t) for t in reference}) >= 2 and min(len(t) for t in reference) < 12  # ended apart, early
    assert len({r.n_prompt_tokens for r in batch}) > 1  # images of different sizes: left padding in play


@pytest.mark.parametrize("key", ON_THIS_LINE)
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_rows_freed_and_refilled_mid_run_give_each_requests_generate_tokens(key, static, family_loaded, images):
    """Continuous batching in every family (Qwen3.5: linear-attention states copied into freed rows too):
    three requests × --n 2 through three rows that free at different steps, so the second request's
    second answer waits, prefilled, for a row; each answer is plain generate's for that request alone."""
    from vlmfast.engines.hf.continuous import stream
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    loaded, reqs = family_loaded(key), [Request(str(p), (str(p),), PROMPT) for p in images[:3]]
    free = [r.token_ids for r in _run(Engine(loaded, GenerationSettings(max_new_tokens=12, ignore_eos=True)), reqs, 3)]
    eos = _eos_ending_rows_apart(free)
    stopping = dataclasses.replace(loaded, eos_token_ids=eos)
    engine = Engine(stopping, GenerationSettings(max_new_tokens=12, n=2), sync_every=1,
                    **(dict(compile=True, compiler=lambda fn: fn) if static else {}))
    rows, admissions = {}, []
    for out, timing in stream(engine, reqs, 3, 512):
        rows.update({(r.id, r.sample): r.token_ids for r in out})
        admissions += [timing.size] if timing and timing.size else []
    assert admissions[0] == 2 and len(admissions) >= 2  # 2 prefilled into 3 rows; a freed row took the third
    for r in reqs:
        expected = generate_tokens(stopping, model_inputs(engine, [r]), 12, eos)[0]
        assert rows[(r.id, 0)] == rows[(r.id, 1)] == expected, r.id


@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_static_shapes_give_the_eager_tokens(key, family_loaded, images):
    """The CUDA-graph / compile path (whole cache + mask, device-side positions, a reused shape), here
    without compiling on the CPU: twice over, so states left from the first batch must not leak."""
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    loaded, reqs = family_loaded(key), [Request(str(p), (str(p),), PROMPT) for p in images[:3]]
    settings = GenerationSettings(max_new_tokens=10, ignore_eos=True)
    eager = [r.token_ids for r in _run(Engine(loaded, settings), reqs, 3)]
    static = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)  # static shapes, not compiled
    assert [r.token_ids for r in _run(static, reqs, 3)] == eager == [r.token_ids for r in _run(static, reqs[::-1], 3)][::-1]


@NEEDS_QWEN3_5
def test_qwen3_5_loop_reads_the_prompts_linear_attention_states(family_loaded, images, monkeypatch):
    """Without the prompt's conv or recurrent states the tokens change: the equality above proves the
    states are carried over, not that they do not matter."""
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.engines.hf.linear_states import LinearStateCache

    loaded, reqs = family_loaded("qwen3_5"), [Request(str(p), (str(p),), PROMPT) for p in images[:3]]
    settings = GenerationSettings(max_new_tokens=10, ignore_eos=True)
    kept = [r.token_ids for r in _run(Engine(loaded, settings), reqs, 3)]
    fill = LinearStateCache.admit_linear_states
    for states in ("conv_states", "recurrent_states"):
        def forget(self, rows, cache, repeat=1, states=states):
            fill(self, rows, cache, repeat)
            for t in getattr(self, states).values():
                t.zero_()
        monkeypatch.setattr(LinearStateCache, "admit_linear_states", forget)
        assert [r.token_ids for r in _run(Engine(loaded, settings), reqs, 3)] != kept, states


# -- doctor and fix per family ---------------------------------------------------------------------
@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_doctor_finds_every_cache_off_place_and_fix_turns_them_on(key, family_ckpts, tmp_path):
    from vlmfast.checkpoints.doctor import diagnose
    from vlmfast.checkpoints.fix import apply_fix, plan_fix

    d = shutil.copytree(family_ckpts(key), tmp_path / key)
    assert sorted(f.location for f in diagnose(d) if f.code == "cache-off") == [
        "config.json: text_config.use_cache", "config.json: use_cache", "generation_config.json: use_cache"]
    assert {f.code for f in diagnose(d)} == {"cache-off"}  # processor, template, EOS, classes: all as the family wants
    apply_fix(plan_fix(d))
    cfg, gen = json.loads((d / "config.json").read_text()), json.loads((d / "generation_config.json").read_text())
    assert (cfg["use_cache"], cfg["text_config"]["use_cache"], gen["use_cache"]) == (True, True, True)
    assert diagnose(d) == []


@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_lost_im_end_is_found_and_restored_with_the_familys_ids(key, family_ckpts, tmp_path):
    from vlmfast.checkpoints.readers import token_id
    from vlmfast.checkpoints.doctor import diagnose
    from vlmfast.checkpoints.fix import apply_fix, plan_fix

    d = shutil.copytree(family_ckpts(key), tmp_path / key)
    im_end, eot = token_id(d, "<|im_end|>"), token_id(d, "<|endoftext|>")
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id=eot))  # EasyR1's merger lost <|im_end|>
    (found,) = [f for f in diagnose(d) if f.code == "eos-missing-im-end"]
    assert f"(id {im_end})" in found.message and f"sets it to {[im_end, eot]}" in found.fix
    apply_fix(plan_fix(d))
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == [im_end, eot]


@NEEDS_QWEN3_5
def test_without_tokenizer_files_a_real_vocabulary_gives_the_familys_id(family_ckpts, tmp_path):
    """Qwen3.5's <|im_end|> is 248046, not Qwen2.5's 151645: known from the family when only the
    vocabulary size is left to go by."""
    from vlmfast.checkpoints.doctor import diagnose

    d = shutil.copytree(family_ckpts("qwen3_5"), tmp_path / "q")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        (d / name).unlink(missing_ok=True)
    edit_json(d / "config.json", lambda c: c["text_config"].update(vocab_size=248320))
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id=248044))
    (found,) = [f for f in diagnose(d) if f.code == "eos-missing-im-end"]
    assert "(id 248046)" in found.message and "[248046, 248044]" in found.fix


# -- a family the table does not know --------------------------------------------------------------
@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    from foreign import build_glm4v
    from vlmfast.checkpoints.load import load

    d = build_glm4v(tmp_path_factory.mktemp("glm4v") / "glm")
    return d, load(str(d), device="cpu")


def test_untested_family_runs_through_plain_generate_with_a_note(glm, images):
    from vlmfast.checkpoints.doctor import diagnose
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    d, loaded = glm
    assert loaded.family is None and type(loaded.model).__name__ == "Glm4vForConditionalGeneration"
    (note,) = [n for n in loaded.notes if "not tested" in n]
    assert "'glm4v'" in note and "--decoder hf" in note
    decoder, why = decoder_for(loaded.family, "vlmfast")
    assert decoder == "hf" and "untested" in why
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:3]]
    engine = Engine(loaded, GenerationSettings(max_new_tokens=8))  # the engine itself turns to plain generate
    assert engine.decoder_name == "hf" and any("untested" in n for n in engine.notes)
    results = _run(engine, reqs, 3)
    assert [r.token_ids for r in results] == generate_tokens(loaded, model_inputs(engine, reqs), 8, loaded.eos_token_ids)
    assert all(r.error is None and r.n_new_tokens > 0 and r.n_image_tokens > 0 for r in results)
    tok = loaded.processor.tokenizer
    assert loaded.eos_token_ids == [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    assert set(loaded.suppress_token_ids) >= {tok.convert_tokens_to_ids(t) for t in ("<|image|>", "<|begin_of_image|>")}
    assert {f.code for f in diagnose(d)} == {"cache-off", "untested-family"}  # saved GRPO-like, cache off


def test_rel1000_boxes_are_mapped_to_the_images_pixels():
    """Qwen2-VL, Qwen3-VL and Qwen3.5 answer in thousandths of the image (the family's bbox_space)."""
    from vlmfast.evaluation.scoring import score_answer

    assert BY_KEY["qwen3_vl"].bbox_space == "rel1000"
    exact = score_answer("[100, 100, 500, 500]", [100, 60, 500, 300], "bbox", bbox_space="rel1000",
                         image_size=(1000, 600), model_size=(448, 280))
    assert (exact.iou, exact.correct, exact.bbox_unmapped) == (pytest.approx(1.0), True, False)
    as_pixels = score_answer("[100, 100, 500, 500]", [100, 60, 500, 300], "bbox", bbox_space="resized",
                             image_size=(1000, 600), model_size=(1000, 600))
    assert as_pixels.iou < 0.6  # the same numbers read as pixels miss
    assert score_answer("[100, 100, 500, 500]", [100, 60, 500, 300], "bbox", bbox_space="rel1000").bbox_unmapped


@NEEDS_QWEN3_5
def test_capacity_counts_keys_and_values_of_full_attention_layers_only(family_loaded):
    from vlmfast.engines.bandwidth import shape_from_model

    shape = shape_from_model(family_loaded("qwen3_5").model, "float32")
    assert shape.layers == 1 and shape.kv_bytes_per_token == 1 * 2 * 32 * 2 * 4  # 1 of 4 layers, 2 kv heads of 32
    assert shape_from_model(family_loaded("qwen3_vl").model, "float32").layers == 2


@pytest.mark.parametrize("max_new", [1, 2])
@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_one_or_two_new_tokens_on_the_static_path_equal_plain_generate(key, max_new, family_loaded, images):
    """A multiple-choice evaluation asks for one or two tokens: the static (graph / compile) path builds no
    decode state for one, and its warm-up stays inside the output buffer for two."""
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    loaded, reqs = family_loaded(key), [Request(str(p), (str(p),), PROMPT) for p in images[:2]]
    settings = GenerationSettings(max_new_tokens=max_new, ignore_eos=True)
    reference = [r.token_ids for r in _run(Engine(loaded, settings, decoder="hf"), reqs, 2)]
    static = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    assert [r.token_ids for r in _run(static, reqs, 2)] == reference
    assert all(len(tokens) == max_new for tokens in reference)


def _tensor_bytes(*objects) -> int:
    """Bytes of every distinct tensor reachable from the objects' lists, dicts and attributes (one level)."""
    import torch

    seen, total = set(), 0

    def visit(value):
        nonlocal total
        if isinstance(value, torch.Tensor):
            if value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    for obj in objects:
        for v in vars(obj).values():
            visit(v)
    return total


@pytest.mark.parametrize("key", ["qwen2_5_vl", *ON_THIS_LINE])
def test_planned_cache_bytes_are_the_bytes_the_caches_hold(key, family_loaded, grpo_ckpt, images):
    """The auto batch size's arithmetic against what is really allocated: a static decode state's keys,
    values and linear-attention states (per family), and the prefill caches of a batch split into
    several prefill groups, all alive until decode copies them in."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.bandwidth import shape_from_model
    from vlmfast.engines.hf.capacity import batch_memory
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    loaded = load(str(grpo_ckpt), device="cpu") if key == "qwen2_5_vl" else family_loaded(key)
    shape = shape_from_model(loaded.model, "float32")
    engine = Engine(loaded, GenerationSettings(max_new_tokens=4), max_batch_tokens=1)  # one prompt per prefill group
    state = engine._new_state(3, 512, static=True)
    planned = batch_memory(shape, 3, 512, logits_bytes=0)
    assert _tensor_bytes(state.cache) - 2 * 8 * 3 == planned.static_bytes  # each row's int64 write index and number
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:3]]
    prefilled = engine.prefill(engine.prepare(reqs))
    assert len(prefilled.groups) == 3  # three groups, every cache still held
    held = sum(_tensor_bytes(layer) for g in prefilled.groups for layer in g.cache.layers)
    widest = max(g.key_valid.shape[1] for g in prefilled.groups)
    assert held <= batch_memory(shape, 3, 512, prompt_tokens=widest).prefill_cache_bytes
    assert held > batch_memory(shape, 1, 512, prompt_tokens=widest).prefill_cache_bytes  # more than one group's


@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_every_familys_vision_tower_runs_one_attention_call_per_layer(key, family_loaded, monkeypatch):
    """Merged vision attention covers each family's tower: images of one size, one SDPA call per layer over all
    of them; of two sizes, one call per size; the same features, bit for bit, as transformers' call per image."""
    import torch

    from vlmfast.engines.hf.vision_attention import use_merged_vision_attention, vision_attention_modules

    model = family_loaded(key).model
    tower = model.model.visual
    assert vision_attention_modules(model)
    config = tower.config
    def forward(grid):
        torch.manual_seed(0)
        pixels = torch.randn(int(grid.prod(-1).sum()), config.in_channels * config.temporal_patch_size * config.patch_size ** 2)
        with torch.inference_mode():
            out = tower(pixels, grid_thw=grid)
        out = getattr(out, "pooler_output", out)
        return out[0] if isinstance(out, tuple) else out

    one_size, two_sizes = torch.tensor([[1, 8, 8], [1, 8, 8]]), torch.tensor([[1, 8, 8], [1, 4, 8]])
    per_image = [forward(one_size), forward(two_sizes)]
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(a[0].shape[0]) or original(*a, **k))
    with use_merged_vision_attention(model) as merged:
        got = forward(one_size)
        assert merged and calls == [2] * len(tower.blocks)  # each layer: one call over the two images
        assert got.equal(per_image[0])
        calls.clear()
        got = forward(two_sizes)
    assert calls == [1, 1] * len(tower.blocks) and got.equal(per_image[1])  # each layer: one call per size


@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_every_family_has_a_demo_preset_whose_loop_tokens_are_generates(key, tmp_path, images):
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    loaded = load(str(build_checkpoint(tmp_path / key, preset="demo", family=key)), device="cpu")
    assert sum(p.numel() for p in loaded.model.parameters()) > 5_000_000
    reqs = [Request(str(p), (str(p),), PROMPT) for p in images[:2]]
    settings = GenerationSettings(max_new_tokens=12, ignore_eos=True)
    reference = [r.token_ids for r in _run(Engine(loaded, settings, decoder="hf"), reqs, 2)]
    assert [r.token_ids for r in _run(Engine(loaded, settings), reqs, 2)] == reference
