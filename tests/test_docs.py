"""The README is a front page and the reference lives in docs/: every docs page is linked from the README,
every link resolves, and the architecture map names every module under src/vlmfast and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "vlmfast"


def _modules_on_disk() -> set[str]:
    """Every module as the map writes it: its path under src/vlmfast without .py; a package's
    ``__init__`` only at the top (the others hold a docstring)."""
    names = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("").as_posix()
        if path.name != "__init__.py" or path.parent == SRC:
            names.add(rel)
    return names


def _modules_in_map() -> list[str]:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Every module", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([\w/]+)` — ", section, flags=re.M)


def test_the_map_names_every_module_and_only_modules_that_exist():
    named = _modules_in_map()
    on_disk = _modules_on_disk()
    assert len(named) == len(set(named)), "a module named twice"
    assert sorted(on_disk - set(named)) == [], "modules the map does not name"
    assert sorted(set(named) - on_disk) == [], "names in the map that are not modules"


def test_the_map_check_can_fail(tmp_path, monkeypatch):
    """A map missing a module, or naming one that does not exist, is caught."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    fake = tmp_path / "docs"
    fake.mkdir()
    (fake / "architecture.md").write_text(text.replace("- `run/search` — ", "- `run/searches` — "), encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.DOCS", fake)
    named = set(_modules_in_map())
    assert "run/search" in _modules_on_disk() - named and "run/searches" in named - _modules_on_disk()


def test_the_readme_is_a_front_page_that_links_every_docs_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)(?:#[\w-]+)?\)", text))
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md")}
    assert pages and linked == pages


def test_every_relative_link_in_the_readme_and_docs_resolves():
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
