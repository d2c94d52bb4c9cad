"""An option declared once: on the field of the options dataclass that carries it, with its help text, its
help panel and, where the field's name does not say it, its flag and command-line type, in the field's
metadata. The command line is built from these fields (:mod:`vlmfast.cli.build`), so a default, a help
text or a flag is written in one place, and a library caller gets the command line's defaults."""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import types
import typing
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


def check_types(options) -> None:
    """Each option of the options dataclass ``options`` holds a value of its field's type, else a UsageError
    naming the option as the command line spells it, the value given and its type. The command line
    converts its text itself; this is what a Python caller meets who passes ``"4"`` for a number. An
    ``int`` field takes an int (not a bool), a ``float`` field an int or a float, a ``str`` field text or a
    path, ``X | None`` also None. Two values are taken as meant: a lone str for a list of str becomes a
    one-element list (``images="a.png"``), and a dict for a nested options dataclass becomes that dataclass
    (``generation={"max_new_tokens": 4}``). Called first in each options dataclass's ``__post_init__``, so
    the value checks after it compare numbers with numbers. Frozen dataclasses included."""
    cls = type(options)
    for f, hint in _hints(cls):
        meta, value = f.metadata[KEY], getattr(options, f.name)
        if isinstance(meta, Nested):
            fitted = _nested(cls, f.name, hint, value)
        else:
            fitted = _fit(value, hint)
            if fitted is _WRONG:
                raise _type_error(cls, f, hint, value)
        if fitted is not value:
            object.__setattr__(options, f.name, fitted)


@functools.cache
def _hints(cls) -> tuple:
    """(field, its resolved annotation) of ``cls``'s option fields, nested ones included."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if KEY in f.metadata)


_WRONG = object()  # a value of none of the annotation's types


def _members(hint) -> tuple:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return typing.get_args(hint) if union else (hint,)


def _fit(value, hint):
    """``value`` when it is of type ``hint``, a lone str wrapped where a list or tuple of str is expected,
    else :data:`_WRONG`."""
    members = _members(hint)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy's scalars (np.float32, np.int64, np.bool_) as Python's: JSON writes those
    if any(_is(value, m) for m in members):
        return value
    if isinstance(value, (str, os.PathLike)):
        for m in members:
            origin, args = typing.get_origin(m), typing.get_args(m)
            if origin in (list, tuple) and args and args[0] is str:
                return origin([value])
    return _WRONG


def _is(value, hint) -> bool:
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, (str, os.PathLike))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple):  # either kind of sequence, each item of the item type
        return isinstance(value, (list, tuple)) and (not args or all(_is(item, args[0]) for item in value))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this check does not read (Any, a Callable, …)


def _nested(cls, name: str, hint, value):
    """A nested options dataclass's value: an instance, or a dict of its fields made into one."""
    from vlmfast.errors import UsageError

    if isinstance(value, hint):
        return value
    fields = [f.name for f in dataclasses.fields(hint) if f.init]
    if not isinstance(value, dict):
        raise UsageError(f"{cls.__name__}({name}={value!r}): expected {hint.__name__} or a dict of its fields, got "
                         f"{type(value).__name__}", hint=f"e.g. {name}={hint.__name__}(...) or {name}={{...}} with "
                         f"keys among: {', '.join(fields)}")
    unknown = [key for key in value if key not in fields]
    if unknown:
        raise UsageError(f"{cls.__name__}({name}=...): {hint.__name__} has no field {', '.join(map(repr, unknown))}",
                         hint=f"its fields: {', '.join(fields)}")
    return hint(**value)


_SAID = {type(None): "None", bool: "a bool", int: "an int", float: "a number (int or float)", str: "a str"}


def _said(hint) -> str:
    """An annotation in words: ``int | None`` → "an int or None", ``list[str]`` → "a list of str"."""
    words = []
    for m in _members(hint):
        origin, args = typing.get_origin(m), typing.get_args(m)
        if origin in (list, tuple):
            words.append(f"a list of {getattr(args[0], '__name__', args[0])}" if args else "a list")
        else:
            words.append(_SAID.get(m, getattr(m, "__name__", str(m))))
    return " or ".join(words)


def _type_error(cls, f, hint, value):
    from vlmfast.errors import UsageError

    cli = f.metadata[KEY]
    flag = f.name.upper() if cli.argument else flag_of(cls, f.name)
    example = _parsed(value, hint)
    if example is not None:
        hint_text = f"{f.name}={example!r} (a number, not the text {value!r})"
    elif f.default is not MISSING and f.default is not None:
        hint_text = f"{f.name} takes {_said(hint)}, e.g. {f.name}={f.default!r} (the default)"
    else:  # the help's first sentence says what the value means
        hint_text = f"{f.name} takes {_said(hint)}: {cli.help.split('. ')[0].rstrip('.')}"
    return UsageError(f"{flag} {value!r}: expected {_said(hint)}, got {type(value).__name__}", hint=hint_text)


def _parsed(value, hint):
    """The number a text stands for, where the field takes that kind of number (``"4"`` → 4), else None."""
    if not isinstance(value, str):
        return None
    for kind in (int, float):
        if kind in _members(hint):
            try:
                return kind(value)
            except ValueError:
                pass
    return None
