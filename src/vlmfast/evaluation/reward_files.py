"""A reward file as ``--reward FILE.py:NAME`` reads it: the file imported by path, and what ``NAME`` names in it.

``NAME`` is a function, a ``Class.method`` (a reward kept as a static method, as VLM-R1's Qwen module keeps
its own), or an ms-swift ORM (modelscope/ms-swift ``swift/rewards/orm.py``): a class with a class named
``ORM`` or ``AsyncORM`` among its bases (made with no arguments, as ms-swift's ``orms[name]()``; its
``args`` default None), an instance of one, or a key of the file's ``orms`` registry (a plugin's
``orms['external_r1v_acc'] = MultiModalAccuracyORM``, named as ms-swift's ``--reward_funcs`` names it).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from vlmfast.errors import UsageError

ORM_BASES = ("ORM", "AsyncORM")
_modules = itertools.count()


def resolve(module, name: str, path: Path) -> tuple[Callable, bool]:
    """(the callable ``name`` names in ``module``, whether it is an ms-swift ORM). A module attribute wins over
    an ``orms`` key of the same name. UsageError for a name the file lacks, a value that cannot be called, or an
    ORM class that cannot be made without arguments."""
    owner, _, attribute = name.rpartition(".")
    owner_obj = _attribute(module, owner) if owner else module
    registry = getattr(module, "orms", None)
    registry = registry if isinstance(registry, Mapping) else {}
    if owner_obj is not None and hasattr(owner_obj, attribute):
        value, registered = getattr(owner_obj, attribute), False
    elif not owner and name in registry:
        value, registered = registry[name], True
    else:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        keys = f"; its orms: {', '.join(sorted(map(str, registry)))}" if registry else ""
        raise UsageError(f"--reward: {path} has no {name!r}",
                         hint=f"functions defined there: {', '.join(found) or 'none'}{keys}")
    orm = registered or is_orm(value) or is_orm(type(value))
    if orm and isinstance(value, type):
        try:
            value = value()
        except Exception as exc:  # the user's class: whatever its __init__ raises is theirs to read
            raise UsageError(f"--reward: {path}:{name}: making {value.__name__}() failed: {type(exc).__name__}: {exc}",
                             hint="ms-swift makes an ORM with no arguments: give its __init__'s parameters "
                                  "defaults") from exc
    if not callable(value):
        raise UsageError(f"--reward: {path}:{name} is a {type(value).__name__}, not a function",
                         hint="name the reward function itself")
    return value, orm


def is_orm(cls) -> bool:
    """Whether ``cls`` is a class with ms-swift's ``ORM`` or ``AsyncORM`` (or a copy of either: a plugin that
    defines its own base to run without ms-swift) in its method resolution order."""
    return isinstance(cls, type) and any(base.__name__ in ORM_BASES for base in cls.__mro__)


def _attribute(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def import_file(path: Path):
    """The Python file ``path`` imported under a module name of its own, with its directory first on ``sys.path``
    while it imports (so ``from utils import …`` of a sibling file works, as when the trainer runs it). UsageError
    for a file that is not Python or fails to import."""
    stem = re.sub(r"\W", "_", path.stem)
    module_name = f"vlmfast_reward_{next(_modules)}_{stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"--reward: {path} is not a Python file Python can import", hint="give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    directory = str(path.resolve().parent)
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)  # first, as when the file is run as a script: its siblings win
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise UsageError(f"--reward: importing {path} failed: {type(exc).__name__}: {exc}",
                         hint="run python on the file to see the traceback; install what it imports into this "
                              "environment") from exc
    finally:
        if added and directory in sys.path:
            sys.path.remove(directory)
    return module
