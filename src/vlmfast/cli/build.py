"""The one builder of commands' options: Typer parameters made from the fields of an options dataclass
(:mod:`vlmfast.declared`: type, default, help, panel and flag on each field), and the dataclass made from
the parsed values. A field holding another options dataclass (``nested``) brings that dataclass's options
along, so ``sweep`` takes ``infer``'s by reference."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import MISSING, dataclass
from typing import Annotated, Any, Optional

import typer

from vlmfast.declared import KEY, Cli, Nested

REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    """One command-line parameter made from a field: ``path`` is where its value goes (``("generation",
    "max_new_tokens")``), ``default`` the field's (REQUIRED: none)."""

    name: str
    path: tuple[str, ...]
    cli: Cli
    type: Any
    default: Any

    def parameter(self) -> inspect.Parameter:
        cli = self.cli
        if cli.argument:
            info = typer.Argument(help=cli.help, show_default=False)
        else:
            info = typer.Option(*self.flags(), help=cli.help, rich_help_panel=cli.panel)
        annotation = Annotated[self.type, info]
        default = REQUIRED if cli.required else self.default
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)

    def flags(self) -> tuple[str, ...]:
        if self.cli.flag:
            return (self.cli.flag,)
        flag = "--" + self.name.replace("_", "-")
        if self.type is bool and self.default is False:  # an on-switch
            return (flag,)
        if self.type in (bool, Optional[bool]):  # on by default, or unset: both ways
            return (f"{flag}/--no-{flag[2:]}",)
        return ()  # Typer derives --field-name


def params_of(cls, defaults=None, path: tuple[str, ...] = (), nest: Nested | None = None) -> list[Param]:
    """The command-line parameters of ``cls``'s option fields, nested dataclasses' included. ``defaults``:
    an instance whose values are the defaults (a nested field's factory's product), else the fields'."""
    top = defaults is None and not path and nest is None
    if top and cls in _MADE:  # infer's parameters serve infer and the options other commands take from it
        return _MADE[cls]
    hints = typing.get_type_hints(cls)
    nest = nest or Nested()
    unknown = set(nest.without) | {name for name, _ in nest.changes}
    unknown -= {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no option {sorted(unknown)}")
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(KEY)
        if meta is None or f.name in nest.without:
            continue
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        if isinstance(meta, Nested):
            inner = default if default is not REQUIRED else None
            out += params_of(hints[f.name], inner, (*path, f.name), meta)
            continue
        cli = nest.changed(f.name, meta)
        out.append(Param(f.name, (*path, f.name), cli, _cli_type(cli.type or hints[f.name], default), default))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: two options named alike in {names}")
    if top:
        _MADE[cls] = out
    return out


_MADE: dict[type, list[Param]] = {}


def _cli_type(hint, default):
    """The type Typer parses: ``X | None`` → Optional[X]; a ``X | str`` field given as text → its override."""
    args = typing.get_args(hint)
    if type(hint) is type(int | None) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        hint = inner[0] if len(inner) == 1 else hint
        return Optional[hint] if type(None) in args else hint
    return Optional[hint] if default is None else hint


@dataclass
class Parsed:
    """A command's parsed option values, by field path; :meth:`build` makes the options dataclass."""

    cls: type
    params: list[Param]
    values: dict[str, Any]

    def tree(self) -> dict:
        tree: dict = {}
        for p in self.params:
            node = tree
            for part in p.path[:-1]:
                node = node.setdefault(part, {})
            node[p.path[-1]] = self.values[p.name]
        return tree

    def build(self, **given):
        """``cls`` from the parsed values; ``given`` (field → value, or for a nested field a dict of its
        fields) is added and wins."""
        tree = self.tree()
        for name, value in given.items():
            if isinstance(value, dict) and isinstance(tree.get(name), dict):
                tree[name].update(value)
            else:
                tree[name] = value
        return construct(self.cls, tree)


def construct(cls, tree: dict):
    """``cls`` from a tree of values: a nested field's dict becomes its dataclass."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in tree:
            continue
        value = tree[f.name]
        kwargs[f.name] = construct(hints[f.name], value) if isinstance(f.metadata.get(KEY), Nested) else value
    return cls(**kwargs)


def takes(cls):
    """A decorator: the command takes ``cls``'s options (their parameters made from its fields, before the
    command's own) and is called with ``parsed`` (a :class:`Parsed`) in their place."""

    params = params_of(cls)

    def wrap(fn):
        own = [p for name, p in inspect.signature(fn, eval_str=True).parameters.items() if name != "parsed"]
        ctx_params = [p for p in own if p.annotation is typer.Context]
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.annotation is not typer.Context]
        ours = {p.name for p in params}

        def command(**kwargs):
            values = {name: kwargs.pop(name) for name in ours}
            return fn(parsed=Parsed(cls, params, values), **kwargs)

        signature = inspect.Signature([*ctx_params, *(p.parameter() for p in params), *rest])
        command.__signature__ = signature
        command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        command.__name__, command.__doc__, command.__module__ = fn.__name__, fn.__doc__, fn.__module__
        command.params = params  # what the defaults test walks
        return command

    return wrap


def annotated(cls, *names: str) -> tuple:
    """The Typer annotations of ``cls``'s options ``names``, for a command that takes them beside options of
    its own (their defaults: the fields', which the defaults test holds them to)."""
    params = {p.name: p for p in params_of(cls)}
    return tuple(params[name].parameter().annotation for name in names)
