"""Shared fixtures: one tiny GRPO-like and one base-like checkpoint per session, sample images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def grpo_ckpt(tmp_path_factory) -> Path:
    from vlmfast.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "grpo", preset="tiny", like="grpo")


@pytest.fixture(scope="session")
def base_ckpt(tmp_path_factory) -> Path:
    from vlmfast.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "base", preset="tiny", like="base")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> list[Path]:
    from vlmfast.tiny import make_images

    return make_images(tmp_path_factory.mktemp("images"), n=6)


@pytest.fixture(scope="session")
def loaded(grpo_ckpt):
    """The GRPO-like checkpoint loaded by vlmfast (cache forced on). Read-only for tests."""
    from vlmfast.checkpoint import load

    return load(str(grpo_ckpt))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2))
