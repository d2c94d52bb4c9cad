"""An option declared once: on the field of the options dataclass that carries it, with its help text, its
help panel and, where the field's name does not say it, its flag and command-line type, in the field's
metadata. The command line is built from these fields (:mod:`vlmfast.cli.build`), so a default, a help
text or a flag is written in one place, and a library caller gets the command line's defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, field
from typing import Any

# the help panels of ``--help``
MODEL, INPUT, GEN, FAST, SCORE, OUTPUT, SCALE, GATES = (
    "Model", "Inputs", "Generation", "Speed", "Scoring", "Output", "vLLM engine", "Gates")

KEY = "vlmfast.cli"  # the metadata key the command-line builder reads


@dataclass(frozen=True)
class Cli:
    """How a field appears on the command line."""

    help: str
    panel: str
    flag: str | None = None  # None: --field-name (--field-name/--no-field-name for a bool that is on or unset)
    type: Any = None  # the command line's type where the field's differs (e.g. str for "auto" | a number)
    argument: bool = False  # a positional argument (its name upper-cased), not an option
    required: bool = False  # required on this command although the field has a default


@dataclass(frozen=True)
class Nested:
    """A field holding another options dataclass: the command takes that dataclass's options as its own,
    except ``without`` (set by the command itself), with ``changes`` to some of them (name → Cli fields)."""

    without: tuple[str, ...] = ()
    changes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def changed(self, name: str, cli: Cli) -> Cli:
        for changed_name, items in self.changes:
            if changed_name == name:
                return dataclasses.replace(cli, **dict(items))
        return cli


def option(default=MISSING, *, help: str, panel: str, flag: str | None = None, type: Any = None,
           argument: bool = False, default_factory=MISSING):
    """A dataclass field that is also a command-line option (``default`` MISSING: a required one)."""
    return field(default=default, default_factory=default_factory,
                 metadata={KEY: Cli(help=help, panel=panel, flag=flag, type=type, argument=argument)})


def nested(default_factory=MISSING, *, without: tuple[str, ...] = (), changes: dict[str, dict] | None = None):
    """A field holding another options dataclass whose options the command takes (see :class:`Nested`)."""
    frozen = tuple((name, tuple(items.items())) for name, items in (changes or {}).items())
    return field(default_factory=default_factory, metadata={KEY: Nested(tuple(without), frozen)})


def like(cls, name: str, **changes):
    """``cls``'s field ``name`` declared again on another dataclass, by reference: the same default, help,
    panel and flag (``changes``: the :class:`Cli` items that differ on this one)."""
    f = cls.__dataclass_fields__[name]
    cli = f.metadata[KEY]
    return field(default=f.default, default_factory=f.default_factory,
                 metadata={KEY: dataclasses.replace(cli, **changes) if changes else cli})


def default_of(cls, name: str):
    """The default of ``cls``'s field ``name`` (a factory's product for a dataclass-valued field)."""
    f = cls.__dataclass_fields__[name]
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise KeyError(f"{cls.__name__}.{name} has no default")


def flag_of(cls, name: str) -> str:
    """The flag of ``cls``'s field ``name`` as a user types it (``--top-p``; ``--compile`` for an on/off pair)."""
    cli = cls.__dataclass_fields__[name].metadata.get(KEY)
    flag = cli.flag if isinstance(cli, Cli) and cli.flag else "--" + name.replace("_", "-")
    return flag.split("/")[0]
