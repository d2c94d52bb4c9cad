"""The vLLM overlay and the fix plan take a checkpoint already located, and never locate it again."""

from __future__ import annotations

import shutil


def test_a_located_checkpoint_travels_down_without_being_located_again(grpo_ckpt, base_ckpt, tmp_path, monkeypatch):
    import vlmfast.checkpoints.locate as locating
    from vlmfast.checkpoints.fix import plan_fix
    from vlmfast.checkpoints.overlay import build_overlay

    run = tmp_path / "run"
    shutil.copytree(grpo_ckpt, run / "checkpoint-3")
    found = locating.locate(run)
    calls = []
    real = locating.locate
    monkeypatch.setattr(locating, "locate", lambda spec, **kw: calls.append(str(spec)) or real(spec, **kw))
    into = tmp_path / "overlay"
    into.mkdir()
    path, _ = build_overlay(found, into, base=base_ckpt)
    plan = plan_fix(found)
    assert calls == [str(base_ckpt)]  # the base, named once; the checkpoint not at all
    assert path.name == "checkpoint-3" and (path / "config.json").is_file()
    assert plan.target == found.path and plan.others == []
