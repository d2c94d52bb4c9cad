"""vlmfast.checkpoints.fix: fix → doctor is clean, idempotent, backups keep the original bytes, dry-run writes
nothing, refusals are clear; merge_lora writes a checkpoint doctor passes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import cli, edit_json
from vlmfast.checkpoints.doctor import diagnose
from vlmfast.errors import CheckpointError
from vlmfast.checkpoints.fix import FixError, apply_fix, dump_like, merge_lora, plan_fix

FIXED_BY_FIX = {"cache-off", "eos-missing-im-end", "eos-differs-from-base", "processor-missing",
                "tokenizer-missing", "chat-template-missing"}


def _digests(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _broken(base: Path, dst: Path) -> Path:
    """A merged-looking GRPO checkpoint: cache off everywhere, <|im_end|> lost, processor, tokenizer
    and chat template files missing (LlamaFactory#5749, EasyR1 PR#11007)."""
    shutil.copytree(base, dst)
    for name in ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
                 "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.jinja",
                 "special_tokens_map.json", "added_tokens.json"):
        (dst / name).unlink(missing_ok=True)
    edit_json(dst / "config.json", lambda c: (c.update(use_cache=False), c["text_config"].update(use_cache=False)))
    edit_json(dst / "generation_config.json", lambda c: c.update(use_cache=False, eos_token_id=c["pad_token_id"]))
    return dst


def test_fix_makes_doctor_clean_and_the_model_loads(base_ckpt, images, tmp_path):
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    d = _broken(base_ckpt, tmp_path / "c")
    # without tokenizer files <|im_end|>'s id is known only from the base
    assert "eos-missing-im-end" not in {f.code for f in diagnose(d)}
    assert FIXED_BY_FIX - {"eos-differs-from-base"} <= {f.code for f in diagnose(d, base=base_ckpt)}
    result = apply_fix(plan_fix(d, processor_from=base_ckpt))
    assert result.copied and result.written
    assert diagnose(d, base=base_ckpt) == []
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == json.loads((base_ckpt / "generation_config.json").read_text())["eos_token_id"]
    loaded = load(str(d), device="cpu")
    assert loaded.cache.found_off == [] and not any("lacks" in n for n in loaded.notes)
    results, _ = Engine(loaded, GenerationSettings(max_new_tokens=4)).generate_batch([Request("a", (str(images[0]),), "Hi.")])
    assert results[0].n_new_tokens >= 1


@pytest.mark.parametrize("like", ["vlmr1", "easyr1", "swift"])
def test_fix_on_trainer_layouts_clears_cache_and_eos(layouts, like, tmp_path):
    root = tmp_path / like
    shutil.copytree(layouts[like].root, root)
    apply_fix(plan_fix(root))  # no base: <|im_end|>'s id comes from the tokenizer files
    left = {f.code for f in diagnose(root)}
    assert not left & FIXED_BY_FIX
    if like == "easyr1":
        model_dir = root / "global_step_4" / "actor" / "huggingface"
        assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"][0] != \
            json.loads((model_dir / "generation_config.json.orig").read_text())["eos_token_id"]
        assert left == {"fsdp-unmerged", "resolved"}  # fix does not merge shards; doctor still says how


def test_fix_twice_changes_nothing(layouts, base_ckpt, tmp_path):
    root = tmp_path / "easyr1"
    shutil.copytree(layouts["easyr1"].root, root)
    apply_fix(plan_fix(root, processor_from=base_ckpt))
    after_first = _digests(root)
    second = plan_fix(root, processor_from=base_ckpt)
    assert second.empty and second.diff() == "" and second.changes() == []
    result = apply_fix(second)
    assert not (result.written or result.backups or result.copied)
    assert _digests(root) == after_first


def test_backups_keep_the_original_bytes_across_repeated_fixes(grpo_ckpt, tmp_path):
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    original = {n: (d / n).read_bytes() for n in ("config.json", "generation_config.json")}
    result = apply_fix(plan_fix(d))
    assert sorted(p.name for p in result.backups) == ["config.json.orig", "generation_config.json.orig"]
    for name, data in original.items():
        assert (d / f"{name}.orig").read_bytes() == data
    # The cache gets switched off again (another save), and fixed again: .orig still holds the first original.
    edit_json(d / "generation_config.json", lambda c: c.update(use_cache=False))
    again = apply_fix(plan_fix(d))
    assert again.written and not again.backups
    assert (d / "generation_config.json.orig").read_bytes() == original["generation_config.json"]
    for name in original:  # restoring is a copy back
        shutil.copyfile(d / f"{name}.orig", d / name)
    assert {f.location for f in diagnose(d) if f.code == "cache-off"} == {
        "config.json: use_cache", "config.json: text_config.use_cache", "generation_config.json: use_cache"}


def test_an_interrupted_fix_names_what_it_wrote_and_a_rerun_finishes_it(grpo_ckpt, tmp_path, monkeypatch):
    import vlmfast.checkpoints.fix as fix
    from vlmfast.errors import Interrupted

    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    real, calls = fix.atomic_write, []

    def cut_at_the_third(path, data, **kw):  # Ctrl-C (or SIGTERM) arrives while the third file is written
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(path, data, **kw)

    monkeypatch.setattr(fix, "atomic_write", cut_at_the_third)
    with pytest.raises(Interrupted, match=r"interrupted after writing config.json.orig, config.json$") as err:
        apply_fix(plan_fix(d))
    assert err.value.exit_code == 130 and "rerun the same command" in err.value.hint
    monkeypatch.setattr(fix, "atomic_write", real)
    apply_fix(plan_fix(d))
    assert not [f for f in diagnose(d) if f.code == "cache-off"]


def test_dry_run_writes_nothing_and_shows_the_diff(base_ckpt, tmp_path):
    d = _broken(base_ckpt, tmp_path / "c")
    before = _digests(d)
    result = apply_fix(plan_fix(d, processor_from=base_ckpt), dry_run=True)
    assert _digests(d) == before and result.dry_run and not result.written
    assert '-  "use_cache": false' in result.diff and '+  "use_cache": true' in result.diff
    assert "eos_token_id" in result.diff and "--- a/config.json" in result.diff
    assert f"# copy {base_ckpt / 'tokenizer.json'} -> {d / 'tokenizer.json'}" in result.diff


def test_dry_run_on_a_run_dir_names_the_checkpoint_it_changes_and_the_ones_it_leaves(grpo_ckpt, tmp_path):
    run = tmp_path / "run"
    for n in (9, 100, 200):
        shutil.copytree(grpo_ckpt, run / f"checkpoint-{n}")
    result = apply_fix(plan_fix(run), dry_run=True)
    assert result.diff.startswith(f"# checkpoint: {run / 'checkpoint-200'}\n")
    # in step order, as the run wrote them: not checkpoint-100 before checkpoint-9
    assert "# not changed, also cache-off: checkpoint-9, checkpoint-100 (run vlmfast fix on each)" in result.diff
    assert "# not changed" not in apply_fix(plan_fix(run / "checkpoint-200"), dry_run=True).diff  # named directly


def test_dry_run_on_an_easyr1_run_names_the_other_steps_it_leaves(grpo_ckpt, tmp_path):
    run = tmp_path / "easy_r1" / "exp"
    for n in (10, 20):  # merged: global_step_N/actor/huggingface holds the model
        shutil.copytree(grpo_ckpt, run / f"global_step_{n}" / "actor" / "huggingface")
    result = apply_fix(plan_fix(run), dry_run=True)
    assert result.diff.startswith(f"# checkpoint: {run / 'global_step_20' / 'actor' / 'huggingface'}\n")
    assert "# not changed, also cache-off: global_step_10 (run vlmfast fix on each)" in result.diff


def test_an_unreadable_config_s_hint_names_a_backup_only_where_there_is_one(grpo_ckpt, tmp_path):
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    (d / "generation_config.json").write_text('{"use_cache": fal')  # cut short
    with pytest.raises(FixError) as err:
        plan_fix(d)
    assert ".orig" not in err.value.hint and "base model" in err.value.hint
    (d / "generation_config.json.orig").write_text("{}")
    with pytest.raises(FixError) as err:
        plan_fix(d)
    assert err.value.hint.startswith("restore it from generation_config.json.orig")


def test_fix_on_a_run_dir_says_which_checkpoint_it_changed_and_which_it_left(grpo_ckpt, tmp_path):
    run = tmp_path / "run"
    for n in (100, 200):
        shutil.copytree(grpo_ckpt, run / f"checkpoint-{n}")
    r = cli("fix", run)
    assert r.returncode == 0, r.stderr
    assert f"checkpoint: {run / 'checkpoint-200'}" in r.stderr and "fixed: config.json" in r.stderr
    assert "not changed, also cache-off: checkpoint-100" in r.stderr
    assert json.loads((run / "checkpoint-100" / "config.json").read_text())["use_cache"] is False  # as it said


def test_fix_says_what_it_could_not_fix(grpo_ckpt, tmp_path):
    """No chat template and no --processor-from to copy one from: the cache is fixed and the template is
    named as left, with doctor's remedy, rather than an exit 0 that looks like everything was done."""
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    for name in ("chat_template.jinja", "chat_template.json"):
        (d / name).unlink(missing_ok=True)
    for name in ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json"):
        if (d / name).exists():
            edit_json(d / name, lambda c: c.pop("chat_template", None))
    r = cli("fix", d)
    assert r.returncode == 0 and "fixed: config.json" in r.stderr
    assert "not fixed: chat-template-missing" in r.stderr and "--processor-from" in r.stderr
    again = cli("fix", d)
    assert "nothing fix can change on its own" in again.stderr and "not fixed: chat-template-missing" in again.stderr
    assert "cache-off" not in again.stderr and again.returncode == 0  # a warning left: the checkpoint runs


def test_fix_exits_1_while_an_error_it_cannot_repair_remains(grpo_ckpt, tmp_path):
    """No processor config and no base to copy one from: nothing fix can do alone, and a `fix && infer`
    script must stop there rather than fail later on the load."""
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    for name in ("processor_config.json", "preprocessor_config.json"):
        (d / name).unlink(missing_ok=True)
    first = cli("fix", d)  # the cache is fixed; the processor is not
    assert first.returncode == 1 and "fixed: config.json" in first.stderr and "not fixed: processor-missing" in first.stderr
    again = cli("fix", d)
    assert again.returncode == 1 and "nothing fix can change on its own" in again.stderr
    assert "1 error(s) remain that fix cannot repair" in again.stderr


def test_edits_keep_formatting_and_key_order():
    original = '{\n    "b": 1,\n    "use_cache": false,\n    "a": {\n        "x": "\\u00e9"\n    }\n}'
    data = json.loads(original)
    data["use_cache"] = True
    assert dump_like(original, data) == original.replace("false", "true")  # no trailing newline added
    assert dump_like(None, {"k": 1}) == '{\n  "k": 1\n}\n'


def test_generation_config_is_created_when_eos_needs_it(base_ckpt, tmp_path):
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    (d / "generation_config.json").unlink()
    pad = json.loads((base_ckpt / "generation_config.json").read_text())["pad_token_id"]
    edit_json(d / "config.json", lambda c: c.update(eos_token_id=pad))
    plan = plan_fix(d)
    assert [e.old for e in plan.edits] == [None] and "--- /dev/null" in plan.diff()
    apply_fix(plan)
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"][1] == pad
    assert not [f for f in diagnose(d) if f.code.startswith("eos")]
    (d / "generation_config.json").unlink()  # with a base: the base's file is copied instead
    plan = plan_fix(d, processor_from=base_ckpt)
    assert [c.dst.name for c in plan.copies] == ["generation_config.json"] and not plan.edits


def test_eos_ids_outside_the_vocabulary_are_dropped_when_the_list_is_completed(base_ckpt, tmp_path):
    """A list copied from a model with another vocabulary (the released Qwen ids on a small test vocabulary):
    doctor and fix propose this tokenizer's stops and drop the ids no step can emit."""
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    own = json.loads((base_ckpt / "generation_config.json").read_text())["eos_token_id"]
    vocab = json.loads((d / "config.json").read_text())
    vocab = vocab.get("vocab_size") or vocab["text_config"]["vocab_size"]
    assert max(own) < vocab < 151643
    edit_json(d / "generation_config.json", lambda g: g.update(eos_token_id=[151643, 151645]))
    eos = [f for f in diagnose(d) if f.code == "eos-missing-im-end"]
    assert len(eos) == 1 and f"(sets it to {own})" in eos[0].fix
    apply_fix(plan_fix(d))
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == own
    assert not [f for f in diagnose(d) if f.code.startswith("eos")]


def test_a_lost_generation_config_is_said_and_the_base_s_copied_though_eos_stops(base_ckpt, tmp_path):
    """A merge that kept config.json's EOS list but lost generation_config.json: nothing stops wrong, but plain
    generate runs without the base's settings. doctor says so (info); fix with the base copies its file."""
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    (d / "generation_config.json").unlink()
    edit_json(d / "config.json", lambda c: c.update(eos_token_id=json.loads(
        (base_ckpt / "generation_config.json").read_text())["eos_token_id"]))
    (found,) = [f for f in diagnose(d) if f.code == "generation-config-missing"]
    assert found.severity == "info" and "--processor-from BASE" in found.fix
    assert not [f for f in diagnose(d) if f.code.startswith("eos")]
    assert not plan_fix(d).copies  # without a base there is nothing to copy, and nothing to edit
    plan = plan_fix(d, processor_from=base_ckpt)
    assert [c.dst.name for c in plan.copies] == ["generation_config.json"] and not plan.edits
    apply_fix(plan)
    assert not [f for f in diagnose(d) if f.code == "generation-config-missing"]


def test_read_only_dir_is_refused_before_writing(grpo_ckpt, tmp_path, monkeypatch):
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    before = _digests(d)
    plan = plan_fix(d)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK and Path(p) == d else real_access(p, mode))
    with pytest.raises(FixError, match="read-only") as err:
        apply_fix(plan)
    assert "cp -r" in err.value.hint and err.value.exit_code == 2
    assert _digests(d) == before
    assert apply_fix(plan, dry_run=True).diff  # a dry run needs no write access
    cache = next(f for f in diagnose(d) if f.code == "cache-off")  # doctor says to fix a copy, which fix can
    assert cache.fix.startswith(f"cp -r {d} {d}-fixed && vlmfast fix {d}-fixed"), cache.fix


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes; the os.access refusal is tested above")
def test_read_only_dir_by_mode(grpo_ckpt, tmp_path):
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    os.chmod(d, 0o555)
    try:
        with pytest.raises(FixError, match="read-only"):
            apply_fix(plan_fix(d))
    finally:
        os.chmod(d, 0o755)


def test_changed_since_planned_is_refused(grpo_ckpt, tmp_path):
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    plan = plan_fix(d)
    edit_json(d / "config.json", lambda c: c.update(note="edited meanwhile"))
    with pytest.raises(FixError, match="changed since"):
        apply_fix(plan)


def test_hub_ids_and_adapters_are_refused(layouts):
    with pytest.raises(CheckpointError, match="reads local directories only") as err:
        plan_fix("Qwen/Qwen2.5-VL-3B-Instruct")
    assert "huggingface-cli download" in err.value.hint
    with pytest.raises(CheckpointError, match="LoRA adapter") as err:
        plan_fix(layouts["swift-lora"].root)
    assert "--merge-lora" in err.value.hint


def test_merge_lora_writes_a_checkpoint_doctor_passes(layouts, tmp_path):
    info = layouts["swift-lora"]
    out = tmp_path / "merged"
    result = merge_lora(info.model_dir, out)
    assert result.out_dir == out and result.base == str(info.base)
    assert diagnose(out, base=info.base) == []
    assert not list(tmp_path.glob(".merged.merging-*"))
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).read_bytes() == (info.base / name).read_bytes()
    with pytest.raises(FixError, match="not empty"):
        merge_lora(info.model_dir, out)
    from_run = merge_lora(info.root, tmp_path / "from-run")  # the run dir, as doctor and infer take it
    assert (tmp_path / "from-run" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert from_run.base == str(info.base)


def test_a_base_without_im_end_still_gets_it_and_fixing_settles(base_ckpt, grpo_ckpt, tmp_path):
    base = shutil.copytree(base_ckpt, tmp_path / "base")
    eos = json.loads((base / "generation_config.json").read_text())["eos_token_id"]  # [<|im_end|>, <|endoftext|>]
    edit_json(base / "generation_config.json", lambda c: c.update(eos_token_id=eos[1]))
    d = shutil.copytree(grpo_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id=eos[1]))
    apply_fix(plan_fix(d, processor_from=base))
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == [eos[1], eos[0]]
    assert plan_fix(d, processor_from=base).empty and plan_fix(d).empty


def test_an_eos_list_short_of_the_familys_is_said_and_completed_without_a_base(base_ckpt, tmp_path):
    """<|im_end|> kept, <|endoftext|> lost: no base to compare with, the family's released list says what is
    missing (an answer ending with <|endoftext|> ran on to the cap); fix completes it."""
    d = tmp_path / "c"
    shutil.copytree(base_ckpt, d)
    full = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id=[full[0]]))
    (found,) = [f for f in diagnose(d) if f.code == "eos-short-of-family"]
    assert f"lacks {full[1:]}" in found.message
    apply_fix(plan_fix(d))
    assert set(json.loads((d / "generation_config.json").read_text())["eos_token_id"]) == set(full)
    assert "eos-short-of-family" not in {f.code for f in diagnose(d)}
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id=full + [10 ** 6]))  # copied from elsewhere
    (found,) = [f for f in diagnose(d) if f.code == "eos-short-of-family"]
    assert f"holds {[10 ** 6]}, outside the vocabulary" in found.message  # what fix then drops is said first


def test_an_eos_written_as_text_is_said_and_replaced_not_a_traceback(base_ckpt, tmp_path):
    """"eos_token_id": "<|im_end|>" (a token, not its id): doctor and fix crashed in list("<|im_end|>");
    it is no id, so the list lacks <|im_end|> (an error: answers run to the cap), and fix writes the ids."""
    d = tmp_path / "c"
    shutil.copytree(base_ckpt, d)
    full = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id="<|im_end|>"))
    found = {f.code: f for f in diagnose(d)}["eos-missing-im-end"]
    assert found.message.startswith("EOS list [] (and '<|im_end|>', which is no token id) lacks <|im_end|>")
    apply_fix(plan_fix(d))
    assert set(json.loads((d / "generation_config.json").read_text())["eos_token_id"]) == set(full)


def test_a_base_of_another_family_is_refused_before_anything_is_written(family_ckpts, tmp_path):
    """A Qwen2.5-VL base for a Qwen3.5 checkpoint: fix replaced its right EOS list with ids that are plain tokens
    in Qwen3.5's vocabulary and copied a processor that cuts 14-pixel patches for a 16-pixel tower; doctor then
    passed and infer crashed. An MoE model and its dense kin share processor and vocabulary: taken."""
    from vlmfast.checkpoints.config_family import refuse_other_family

    d = tmp_path / "c"
    shutil.copytree(family_ckpts("qwen3_vl"), d)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / name).unlink(missing_ok=True)
    before = _digests(d)
    with pytest.raises(CheckpointError, match=r"--processor-from .*: a Qwen2\.5-VL model, but .* is Qwen3-VL") as err:
        plan_fix(d, processor_from=family_ckpts("qwen2_5_vl"))
    assert "Qwen3-VL base model" in err.value.hint and _digests(d) == before
    r = cli("fix", d, "--processor-from", family_ckpts("qwen2_5_vl"))
    assert r.returncode == 2 and "a Qwen2.5-VL model, but" in r.stderr and _digests(d) == before
    plan = plan_fix(d, processor_from=family_ckpts("qwen3_vl_moe"))
    assert {c.dst.name for c in plan.copies} >= {"tokenizer.json", "tokenizer_config.json"}
    qwen3_5 = tmp_path / "qwen3_5"  # Qwen3-VL's processor class, another vocabulary (read from config.json alone)
    qwen3_5.mkdir()
    (qwen3_5 / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    with pytest.raises(CheckpointError, match="a Qwen3.5 model, but"):
        refuse_other_family({"model_type": "qwen3_vl"}, d, qwen3_5)


def test_a_processor_of_another_patch_size_is_refused_at_load(family_ckpts, tmp_path):
    """Copied by hand from another family: the run crashed inside the vision tower with a reshape error."""
    from vlmfast.checkpoints.load import load

    d = tmp_path / "c"
    shutil.copytree(family_ckpts("qwen3_vl"), d)
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (d / name).is_file():
            edit_json(d / name, lambda c: c.update(patch_size=14) if "patch_size" in c else
                      c.get("image_processor", {}).update(patch_size=14))
    with pytest.raises(CheckpointError, match="cuts 14-pixel patches but the vision tower takes 16"):
        load(str(d), device="cpu")


def _plain_generate(d: Path, **kwargs) -> int | str:
    """New tokens from plain ``model.generate`` on a 50-token prompt (longer than 20), as a user checks a checkpoint;
    the ValueError's first words when it raises."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(d))
    ids = torch.tensor([[1, 2, 3, 4, 5] * 10])
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), eos_token_id=None, **kwargs)
    except ValueError as exc:
        return str(exc)[:13]
    return out.shape[1] - ids.shape[1]


def test_sampling_at_temperature_zero_is_fixed_to_greedy(base_ckpt, tmp_path):
    """do_sample true with temperature 0: plain generate raises before the first token (4.57.6 and 5.24); fix makes
    it greedy, drops the sampling-only settings (beside do_sample false save_pretrained refuses them) and keeps
    the rest, and plain generate then gives greedy's tokens."""
    from transformers import GenerationConfig

    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(do_sample=True, temperature=0.0, top_p=0.9, top_k=20))
    assert _plain_generate(d, max_new_tokens=4) == "`temperature`"
    r = cli("fix", d)
    assert r.returncode == 0, r.stderr
    assert "fixed: generation_config.json: do_sample true -> false (temperature 0: greedy)" in r.stderr
    gen = json.loads((d / "generation_config.json").read_text())
    before = json.loads((d / "generation_config.json.orig").read_text())
    assert gen == {**{k: v for k, v in before.items() if k not in ("temperature", "top_p", "top_k")}, "do_sample": False}
    assert "sampling-temperature-zero" not in {f.code for f in diagnose(d)}
    GenerationConfig.from_pretrained(str(d)).save_pretrained(str(tmp_path / "saved"))  # no validation error
    assert _plain_generate(d, max_new_tokens=4) == 4
    assert plan_fix(d).empty


def test_several_samples_at_temperature_zero_are_fixed_to_one_greedy_answer(base_ckpt, tmp_path):
    """num_return_sequences 4 beside do_sample true loads; beside do_sample false (without beams) transformers
    refuses to load the config at all: fix drops it with the sampling settings, and the fixed config loads."""
    from transformers import GenerationConfig

    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(do_sample=True, temperature=0, num_return_sequences=4))
    plan = plan_fix(d)
    assert "generation_config.json: num_return_sequences 4 dropped (greedy decoding gives one answer)" in plan.changes()
    apply_fix(plan)
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["do_sample"] is False and "num_return_sequences" not in gen and "temperature" not in gen
    GenerationConfig.from_pretrained(str(d))  # loads: no "Greedy methods ... num_return_sequences" ValueError
    assert _plain_generate(d, max_new_tokens=4) == 4


@pytest.mark.filterwarnings("ignore:Using the model-agnostic default")  # transformers' own, on the case it names
def test_a_short_max_length_is_dropped(base_ckpt, tmp_path):
    """max_length 20 with no max_new_tokens: plain generate raises for a 50-token prompt on transformers 5 and
    stops after 20 new tokens on 4.57; fix drops it, and generate's own max_new_tokens decides."""
    import transformers

    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(max_length=20))
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    assert _plain_generate(d) == ("Input length " if v5 else 20)
    plan = plan_fix(d)
    assert plan.changes() == ["generation_config.json: max_length 20 dropped (shorter than a prompt and answer need; "
                              "generate's max_new_tokens decides)"]
    apply_fix(plan)
    assert "max_length" not in json.loads((d / "generation_config.json").read_text())
    assert "max-length-short" not in {f.code for f in diagnose(d)}
    assert _plain_generate(d, max_new_tokens=30) == 30 and _plain_generate(d) == 20  # transformers' default: 20 new
    long_enough = shutil.copytree(base_ckpt, tmp_path / "long")
    edit_json(long_enough / "generation_config.json", lambda c: c.update(max_length=32768))
    assert plan_fix(long_enough).empty
