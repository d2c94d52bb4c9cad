"""A checkpoint saved by transformers 5 on either line: loaded with its own tokens (on 4.x through a rewritten
temporary copy), diagnosed, and fixed into the form 4.x and 5.x both read. On 5.x the tiny builder saves
that form itself; on 4.x it is made here from a 4.x checkpoint, as 5.x writes it."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from vlmfast.checkpoints import portable
from vlmfast.checkpoints.doctor import diagnose
from vlmfast.checkpoints.fix import apply_fix, plan_fix
from vlmfast.checkpoints.load import load
from vlmfast.engines.hf.engine import Engine, GenerationSettings
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.errors import CheckpointError
from vlmfast.inputs.requests import Request

ON_V4 = portable.transformers_major() < 5


def as_saved_by_v5(src: Path, dst: Path) -> Path:
    """A copy of ``src`` with its special tokens and rotary settings as transformers 5 saves them."""
    shutil.copytree(src, dst)
    tok = json.loads((dst / "tokenizer_config.json").read_text())
    if isinstance(tok.get("additional_special_tokens"), list):  # (4.57 also writes an empty extra_special_tokens dict)
        tok = {("extra_special_tokens" if k == "additional_special_tokens" else k): v for k, v in tok.items()
               if k != "extra_special_tokens"}
    (dst / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    config = json.loads((dst / "config.json").read_text())
    for section in (config, config.get("text_config") or {}):
        if isinstance(section.get("rope_scaling"), dict):
            theta = section.pop("rope_theta", None)
            section["rope_parameters"] = {**section.pop("rope_scaling"), **({"rope_theta": theta} if theta else {})}
    config["transformers_version"] = "5.24.0"
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def greedy(path: Path, images) -> tuple[dict, list[str]]:
    loaded = load(str(path), device="cpu", dtype="float32")
    requests = [Request(p.name, (str(p),), "What shapes are in this image?") for p in images[:2]]
    batches = Scheduler(Engine(loaded, GenerationSettings(max_new_tokens=12))).run(requests, {}, 2)
    return {r.id: r.token_ids for _, rows, _ in batches for r in rows}, loaded.notes


@pytest.fixture(scope="module")
def saved_by_v5(grpo_ckpt, tmp_path_factory):
    return as_saved_by_v5(grpo_ckpt, tmp_path_factory.mktemp("v5") / "ckpt")


def diagnose_weights(d: Path):
    from vlmfast.checkpoints.doctor import _saved_by_v5

    return _saved_by_v5(d)


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("vlmfast-v4-form-*")}


def test_the_two_settings_4x_cannot_read_are_named(saved_by_v5, grpo_ckpt):
    lines = portable.unreadable_by_v4(saved_by_v5)
    assert [line.split(":")[0] for line in lines] == ["tokenizer_config.json", "config.json"]
    assert "text_config.rope_scaling" in lines[1]
    assert (portable.unreadable_by_v4(grpo_ckpt) == []) == ON_V4  # the builder saves the installed line's form


def test_a_checkpoint_saved_by_transformers_5_decodes_the_tokens_of_the_original(saved_by_v5, grpo_ckpt, images):
    before, leftovers = {p.name: p.read_bytes() for p in saved_by_v5.iterdir()}, _leftovers()
    tokens, notes = greedy(saved_by_v5, images)
    assert tokens == greedy(grpo_ckpt, images)[0] and all(tokens.values())
    said = [n for n in notes if "was saved by transformers 5" in n]
    assert len(said) == (1 if ON_V4 else 0)
    if ON_V4:
        assert "config.json, tokenizer_config.json rewritten in a temporary copy; the checkpoint is untouched" in said[0]
    assert {p.name: p.read_bytes() for p in saved_by_v5.iterdir()} == before and _leftovers() == leftovers


def test_on_4x_doctor_names_it_and_fix_writes_the_form_both_lines_read(saved_by_v5, tmp_path, images, grpo_ckpt,
                                                                       monkeypatch):
    """On 5.x, which reads either form, doctor says nothing of it and fix leaves it; on 4.x both act. The fix
    itself is planned as on 4.x on either line (the plan reads files only), and its result loads on both."""
    ckpt = Path(shutil.copytree(saved_by_v5, tmp_path / "ckpt"))
    finding = [f for f in diagnose(ckpt) if f.code == "saved-by-transformers-5"]
    assert [(f.severity, f.location) for f in finding] == ([("warning", "tokenizer_config.json, config.json")] if ON_V4 else [])
    assert not ON_V4 or f"vlmfast fix {ckpt}" in finding[0].fix
    assert ON_V4 or not any("extra_special_tokens" in c for c in plan_fix(ckpt).changes())
    monkeypatch.setattr(portable, "transformers_major", lambda: 4)
    plan = plan_fix(ckpt)
    changes = plan.changes()
    assert any("extra_special_tokens" in c for c in changes) and any("text_config.rope_scaling" in c for c in changes)
    assert any("use_cache false -> true" in c for c in changes)  # one edit of config.json carries both
    assert len([e for e in plan.edits if e.path.name == "config.json"]) == 1
    apply_fix(plan)
    assert portable.unreadable_by_v4(ckpt) == [] and plan_fix(ckpt).empty
    config = json.loads((ckpt / "config.json").read_text())["text_config"]
    assert config["rope_scaling"]["mrope_section"] == config["rope_parameters"]["mrope_section"]  # 5.x's own stays
    monkeypatch.undo()
    assert "saved-by-transformers-5" not in {f.code for f in diagnose(ckpt)}
    tokens, notes = greedy(ckpt, images)
    assert tokens == greedy(grpo_ckpt, images)[0] and not any("saved by transformers 5" in n for n in notes)


def test_the_forms_keep_order_and_merge_what_was_there():
    tok, changes = portable.tokenizer_form({"a": 1, "extra_special_tokens": ["<x>", "<y>"], "additional_special_tokens": ["<y>"],
                                            "z": 2})
    assert list(tok) == ["a", "additional_special_tokens", "z"] and tok["additional_special_tokens"] == ["<y>", "<x>"]
    assert len(changes) == 1 and portable.tokenizer_form({"extra_special_tokens": {"image": "<i>"}})[1] == []  # 4.x's dict
    config, changes = portable.config_form({"rope_parameters": {"rope_theta": 5.0, "mrope_section": [1, 2]},
                                            "text_config": {"rope_scaling": {"type": "mrope"}}})
    assert config["rope_scaling"] == {"mrope_section": [1, 2]} and config["rope_theta"] == 5.0 and len(changes) == 1
    assert portable.config_form({"rope_parameters": {"rope_theta": 5.0, "rope_type": "default"}})[1] == []  # no mrope


def test_a_qwen3_vl_moe_saved_by_5x_is_refused_on_4x_with_what_to_install(tmp_path, monkeypatch):
    """Its experts' weights are in 5.x's layout: no rewrite of files helps 4.x, so it says what to install."""
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe", "transformers_version": "5.24.0"}))
    assert "experts' weights are stored in another layout" in portable.v4_cannot_read(d)
    monkeypatch.setattr(portable, "transformers_major", lambda: 4)
    with pytest.raises(CheckpointError) as err:
        with portable.readable_here(d):
            pass
    assert "cannot load this checkpoint" in err.value.message and "transformers>=5" in err.value.hint
    if ON_V4:
        assert [(f.severity, f.location) for f in diagnose_weights(d)] == [("error", "*.safetensors")]
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe", "transformers_version": "4.57.6"}))
    assert portable.v4_cannot_read(d) is None
    with portable.readable_here(d) as (here, notes):
        assert here == d and notes == []
