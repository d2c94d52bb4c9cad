"""A trainer's own reward function as the scorer: ``--reward path/to/file.py:function``.

The file is imported by path and the function is called the way its trainer calls it (EasyR1
sequential or batch, TRL / VLM-R1, verl), recognised from its parameter names. Its reward becomes
the row's ``score``; ``correct`` is ``score >= threshold``. Standard library only at import time: the
user's file imports what it needs.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import numbers
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vlmfast.errors import RewardError, UsageError
from vlmfast.evaluation.scoring import ROW_FIELDS, format_ok, truth_text

__all__ = ["FIELDS", "FORMS", "KINDS", "Reward", "RewardError", "load_reward"]

# The fields score_rows gives a row: scoring's own (so a rewarded results file has the usual
# columns), the reward's sub-scores, and the error --skip-bad recorded instead of a reward.
FIELDS = (*ROW_FIELDS, "reward_scores", "reward_error")
KINDS = ("easyr1", "easyr1-batch", "trl", "verl")
FORMS = (
    "EasyR1 sequential: compute_score(reward_input: dict) -> dict with 'overall'",
    "EasyR1 batch: compute_score(reward_inputs: list[dict]) -> list[dict]",
    "TRL / VLM-R1: f(completions, solution, **kwargs) -> list[float]",
    "verl: compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict",
)
# Arguments vlmfast can supply, per kind; a required parameter outside these cannot be called.
_SUPPLIED = {"trl": {"completions", "solution", "prompts", "ids"},
             "verl": {"data_source", "solution_str", "ground_truth", "extra_info"}}
_BATCH_KINDS = ("easyr1-batch", "trl")
_modules = itertools.count()


@dataclass(frozen=True)
class _Item:
    """One row to reward: its id, response text and length, truth text, prompt, verl data source."""

    id: str
    text: str
    n_new_tokens: int | None
    truth: str
    prompt: str | None
    data_source: str


class _Failure(Exception):
    """User code failed on ``item``; ``what`` is ``Type: message`` or a description of a bad value."""

    def __init__(self, item: _Item, what: str, batch: int = 1):
        super().__init__(what)
        self.item, self.what, self.batch = item, what, batch


@dataclass(frozen=True)
class Reward:
    """A loaded reward function. ``kind`` is one of :data:`KINDS`; ``keywords`` the parameter names it
    accepts by keyword (``var_keyword``: it also takes ``**kwargs``)."""

    fn: Callable
    name: str
    kind: str
    source: Path
    keywords: frozenset[str]
    var_keyword: bool = False
    threshold: float = 1.0

    @property
    def scorer(self) -> str:
        """The ``scorer`` field of rewarded rows."""
        return f"reward:{self.name}"

    def score_rows(self, rows: list[dict], truths: dict[str, object], *, skip_bad: bool = False) -> list[dict]:
        """The scoring fields (:data:`FIELDS`) for each of ``rows``, in order.

        ``truths`` maps row id → the truth: a value, a ``(truth, scorer)`` pair as
        :func:`vlmfast.inputs.convert.read_truths` gives, or a record ``{"ground_truth": …, "data_source": …}``.
        Error rows get all nulls and rows without truth only ``format_ok``, as
        :func:`vlmfast.evaluation.scoring.score_row` does. Batch kinds get one call for all the rows to reward.
        User code that raises, or returns no number, is a :class:`RewardError` naming the function and
        the row (the batch's first row when the batch call raised); with ``skip_bad`` that row instead
        gets ``score``/``correct`` None and ``reward_error`` set, and the others are still rewarded (a
        failed batch is retried one row per call to find the rows that fail)."""
        out: list[dict] = []
        todo: list[tuple[dict, _Item]] = []
        for row in rows:
            fields = dict.fromkeys(FIELDS)
            out.append(fields)
            if row.get("error") is not None:
                continue
            fields["format_ok"] = format_ok(row.get("text"))
            truth, data_source = _truth_record(truths.get(str(row.get("id"))))
            if truth is not None:
                todo.append((fields, _item(row, truth, data_source)))
        for (fields, _), result in zip(todo, self._reward_all([item for _, item in todo], skip_bad)):
            if isinstance(result, _Failure):
                fields.update(scorer=self.scorer, reward_error=result.what)
            else:
                score, subscores = result
                fields.update(score=score, correct=score >= self.threshold, scorer=self.scorer,
                              reward_scores=subscores)
        return out

    # -- calling the user's function -------------------------------------------------------------
    def _reward_all(self, items: list[_Item], skip_bad: bool) -> list:
        if not items:
            return []
        if self.kind in _BATCH_KINDS:
            try:
                return self._call_batch(items)
            except _Failure as failure:
                if not skip_bad:
                    raise self._error(failure) from failure.__cause__
        results = []
        for item in items:
            try:
                results.append(self._call_batch([item])[0] if self.kind in _BATCH_KINDS else self._call_one(item))
            except _Failure as failure:
                if not skip_bad:
                    raise self._error(failure) from failure.__cause__
                results.append(failure)
        return results

    def _call_batch(self, items: list[_Item]) -> list[tuple[float, dict]]:
        if self.kind == "easyr1-batch":
            values = _invoke(self.fn, items, [_easyr1_input(i) for i in items])
        else:
            kwargs = {"completions": [[{"role": "assistant", "content": i.text}] for i in items],
                      "solution": [i.truth for i in items], "prompts": [i.prompt for i in items],
                      "ids": [i.id for i in items]}
            values = _invoke(self.fn, items, **{k: v for k, v in kwargs.items() if self._accepts(k)})
        if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
            raise _Failure(items[0], f"returned {type(values).__name__}, expected a list of {len(items)}", len(items))
        values = list(values)
        if len(values) != len(items):
            raise _Failure(items[0], f"returned {len(values)} values for {len(items)} rows", len(items))
        key = "overall" if self.kind == "easyr1-batch" else None
        return [_reward_value(v, key, item) for v, item in zip(values, items)]

    def _call_one(self, item: _Item) -> tuple[float, dict]:
        if self.kind == "easyr1":
            return _reward_value(_invoke(self.fn, [item], _easyr1_input(item)), "overall", item)
        kwargs = {"data_source": item.data_source, "solution_str": item.text, "ground_truth": item.truth,
                  "extra_info": {"id": item.id}}
        return _reward_value(_invoke(self.fn, [item], **{k: v for k, v in kwargs.items() if self._accepts(k)}),
                             "score", item)

    def _accepts(self, name: str) -> bool:
        return self.var_keyword or name in self.keywords

    def _error(self, failure: _Failure) -> RewardError:
        where = f"row {failure.item.id}" if failure.batch == 1 else \
            f"a batch of {failure.batch} rows starting at row {failure.item.id}"
        return RewardError(f"reward function {self.name} ({self.source}) failed on {where}: {failure.what}",
                           hint="fix the function, or pass --skip-bad to record the error in the row's "
                                "reward_error and go on")


def _invoke(fn: Callable, items: list[_Item], *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # the user's code: any exception is theirs to report, with the row
        raise _Failure(items[0], f"{type(exc).__name__}: {exc}", len(items)) from exc


def _easyr1_input(item: _Item) -> dict:
    data = {"response": item.text, "response_length": item.n_new_tokens, "ground_truth": item.truth}
    if item.prompt is not None:
        data["prompt"] = item.prompt
    return data


def _reward_value(value, key: str | None, item: _Item) -> tuple[float, dict]:
    """(reward, sub-scores) from a returned number, or from a dict's ``key`` plus its other numbers."""
    if key is not None and isinstance(value, Mapping):
        if key not in value:
            raise _Failure(item, f"returned a dict without {key!r} (keys: {', '.join(map(str, value))})")
        subscores = {str(k): n for k, v in value.items() if k != key and (n := _number(v)) is not None}
        value = value[key]
    else:
        subscores = {}
    number = _number(value)
    if number is None:
        raise _Failure(item, f"returned {type(value).__name__} {value!r:.60}, not a finite number")
    return number, subscores


def _number(value) -> float | None:
    if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # a 0-d numpy array or torch tensor
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if number == number and abs(number) != float("inf") else None
    return None


def _truth_record(value) -> tuple[str | None, str]:
    """(truth text, verl data source) from a ``truths`` value; truth None when there is none."""
    data_source = "vlmfast"
    if isinstance(value, tuple) and len(value) == 2 and (value[1] is None or isinstance(value[1], str)):
        value = value[0]  # read_truths' (truth, scorer)
    elif isinstance(value, Mapping) and "ground_truth" in value:
        data_source = str(value.get("data_source") or data_source)
        value = value["ground_truth"]
    truth = truth_text(value)
    if truth is not None and not isinstance(truth, str):
        truth = json.dumps(truth, ensure_ascii=False)  # reward functions take text; a box is its JSON
    return truth, data_source


def _item(row: dict, truth: str, data_source: str) -> _Item:
    text = row.get("text")
    prompt = row.get("prompt")
    return _Item(str(row.get("id")), text if isinstance(text, str) else "", row.get("n_new_tokens"), truth,
                 prompt if isinstance(prompt, str) else None, data_source)


# -- loading -------------------------------------------------------------------------------------
def load_reward(spec: str, *, threshold: float = 1.0) -> Reward:
    """The reward function ``spec`` names (``path/to/file.py:function_name``), ready to score rows.

    The file is imported under a module name of its own, with its directory first on ``sys.path``
    while it imports (so ``from utils import …`` of a sibling file works, as when the trainer runs it).
    The calling form is recognised from the parameter names, in this order:

    - a parameter ``completions`` → TRL / VLM-R1: keyword call with ``completions`` (conversational
      form), ``solution``, and ``prompts``/``ids`` where the function accepts them;
    - parameters ``solution_str`` and ``ground_truth`` → verl: keyword call per row, ``data_source``
      and ``extra_info`` where accepted; a dict result's ``score`` is the reward;
    - first parameter ``reward_inputs`` (or annotated as a list) → EasyR1 batch: one list of dicts;
    - first parameter ``reward_input`` (or annotated as a dict) → EasyR1 sequential: one dict per row.

    EasyR1 dicts hold ``response``, ``response_length`` (n_new_tokens), ``ground_truth`` (and the
    row's ``prompt``); a result dict's ``overall`` is the reward and its other numbers sub-scores.
    Other required parameters make the signature unrecognised. Raises UsageError (with a hint) for
    a bad spec, a file that fails to import, or a name that is not such a function."""
    path_text, sep, name = str(spec).rpartition(":")
    forms = "accepted forms: " + "; ".join(FORMS)
    if not sep or not path_text or not name:
        raise UsageError(f"--reward {spec!r}: expected FILE.py:FUNCTION",
                         hint="name the file and the function, e.g. --reward rewards/r1v.py:compute_score")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise UsageError(f"--reward: {path}: no such file",
                         hint="give the path of the Python file holding the reward function")
    module = _import(path)
    if not hasattr(module, name):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise UsageError(f"--reward: {path} has no {name!r}",
                         hint=f"functions defined there: {', '.join(found) or 'none'}")
    fn = getattr(module, name)
    if not callable(fn):
        raise UsageError(f"--reward: {path}:{name} is a {type(fn).__name__}, not a function",
                         hint="name the reward function itself")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--reward: cannot read the signature of {name} ({exc})", hint=forms) from exc
    kind = _kind(params)
    if kind is None:
        shown = ", ".join(str(p) for p in params)
        raise UsageError(f"--reward: {name}({shown}) is not a reward function signature vlmfast knows", hint=forms)
    return Reward(fn, name, kind, path, frozenset(p.name for p in params if p.kind in _BY_KEYWORD),
                  any(p.kind is p.VAR_KEYWORD for p in params), float(threshold))


_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _import(path: Path):
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


def _kind(params: list[inspect.Parameter]) -> str | None:
    names = {p.name for p in params if p.kind in _BY_KEYWORD}
    required = {p.name for p in params if p.default is p.empty and p.kind in (*_BY_KEYWORD, p.POSITIONAL_ONLY)}
    if "completions" in names:
        return "trl" if required <= _SUPPLIED["trl"] else None
    if {"solution_str", "ground_truth"} <= names:
        return "verl" if required <= _SUPPLIED["verl"] else None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional or required - {positional[0].name}:
        return None
    first = positional[0]
    annotation = _annotation_text(first.annotation)
    if first.name == "reward_inputs" or (first.name != "reward_input" and annotation.startswith(("list", "sequence"))):
        return "easyr1-batch"
    if first.name == "reward_input" or annotation.startswith(("dict", "mapping")):
        return "easyr1"
    return None


def _annotation_text(annotation) -> str:
    """``list[dict]``, ``List[Dict]``, ``list`` or the string form of any of them, lower case, unqualified."""
    if isinstance(annotation, type):
        annotation = annotation.__name__
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.replace("typing.", "").replace("collections.abc.", "").lower()
