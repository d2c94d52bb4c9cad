"""The README's Python: every import it shows works, and every ``vlmfast.NAME`` it names exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_shows_python():
    assert _python_blocks()


def test_every_import_the_readme_shows_works():
    imported = 0
    for block in _python_blocks():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("vlmfast"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"README: from {node.module} import {alias.name}"
                    imported += 1
    assert imported


def test_every_public_name_the_readme_mentions_exists():
    import vlmfast

    text = README.read_text(encoding="utf-8")
    names = set(re.findall(r"`vlmfast\.([A-Za-z_]\w*)", text)) | set(re.findall(r"\bvlmfast\.([A-Za-z_]\w*)\(", text))
    assert {"infer", "load", "InferOptions"} <= names
    for name in sorted(names):
        try:
            getattr(vlmfast, name)
        except AttributeError:
            importlib.import_module(f"vlmfast.{name}")  # a wing named in the text (vlmfast.run …)
    for name in vlmfast.__all__:
        assert getattr(vlmfast, name) is not None
