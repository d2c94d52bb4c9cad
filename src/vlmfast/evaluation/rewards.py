"""A trainer's own reward functions as the scorer: ``--reward path/to/file.py:function`` (repeatable).

Each file is imported by path and its function called exactly the way its trainer calls it (EasyR1
batch / sequential / ≤ 0.3, TRL / VLM-R1, ms-swift, verl: see :mod:`vlmfast.evaluation.reward_calls`), with
the manifest's ground truth untouched and ``--reward-kwargs`` bound as EasyR1's ``reward_function_kwargs``.
Several functions are weighted and summed as TRL's GRPOTrainer does (``reward_weights``; a ``None``, or
from TRL and ms-swift a NaN, is "not applicable": left out of that function's mean and out of the sum, the
row left out entirely when every function says None). The total becomes the row's ``score``; ``correct`` is
``score >= threshold``, or, when a function returns an ``accuracy`` (``acc``) sub-score, that sub-score
``>= threshold`` (a total that also weights the format must not call a right answer wrong). Standard library only at import time: the user's file imports what it needs.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from vlmfast.errors import RewardError, UsageError
from vlmfast.evaluation.reward_calls import (
    BATCH_KINDS,
    FORMS,
    KINDS,
    CallFailed,
    Item,
    call_batch,
    call_one,
    detect_kind,
    reward_value,
)
from vlmfast.evaluation.reward_files import import_file, resolve
from vlmfast.evaluation.scoring import ROW_FIELDS, format_ok
from vlmfast.evaluation.stats import accuracy_key

__all__ = ["FIELDS", "FORMS", "KINDS", "Reward", "RewardError", "RewardSet", "load_reward", "load_rewards",
           "parse_reward_kwargs", "parse_reward_weights"]

# The fields score_rows gives a row: scoring's own (so a rewarded results file has the usual columns),
# each function's reward by name (None: not applicable), the sub-scores, and the error --skip-bad recorded.
FIELDS = (*ROW_FIELDS, "rewards", "reward_scores", "reward_error")


@dataclass(frozen=True)
class Reward:
    """A loaded reward function. ``kind`` is one of :data:`KINDS`; ``keywords`` the parameter names it
    accepts by keyword (``var_keyword``: it also takes ``**kwargs``); ``bound`` the keyword arguments
    bound to every call; ``label`` the file's ``REWARD_NAME`` (EasyR1) when it declares one."""

    fn: Callable
    name: str
    kind: str
    source: Path
    keywords: frozenset[str]
    var_keyword: bool = False
    threshold: float = 1.0
    bound: Mapping = field(default_factory=dict)
    label: str | None = None

    @property
    def scorer(self) -> str:
        """The ``scorer`` field of rewarded rows."""
        return f"reward:{self.name}"

    def score_rows(self, rows: list[dict], truths: dict[str, object], *, skip_bad: bool = False) -> list[dict]:
        """The scoring fields (:data:`FIELDS`) for each of ``rows``, in order: see :meth:`RewardSet.score_rows`."""
        return RewardSet((self,), (1.0,), self.threshold).score_rows(rows, truths, skip_bad=skip_bad)

    def rewards(self, items: list[Item], skip_bad: bool) -> list:
        """(reward or None, sub-scores) per item, or a :class:`CallFailed` for an item that failed
        (only with ``skip_bad``; else a :class:`RewardError`). Batch kinds: one call for all the items;
        a failed batch is retried one item per call to find the items that fail."""
        if not items:
            return []
        batch_failure = None
        if self.kind in BATCH_KINDS:
            try:
                return self._batch(items)
            except CallFailed as failure:
                if len(items) == 1 and not skip_bad:
                    raise self._error(failure) from failure.__cause__
                batch_failure = failure  # one call per item finds the row that fails, to name it
        results = []
        for item in items:
            try:
                results.append(self._batch([item])[0] if self.kind in BATCH_KINDS else self._one(item))
            except CallFailed as failure:
                if not skip_bad:
                    raise self._error(failure) from failure.__cause__
                results.append(failure)
        if batch_failure is not None and not skip_bad:  # every row passes alone: the batch call itself fails
            raise self._error(batch_failure) from batch_failure.__cause__
        return results

    def _batch(self, items: list[Item]) -> list:
        values = call_batch(self.kind, self.fn, items, self.bound, self._accepts)
        key = "overall" if self.kind == "easyr1-batch" else None
        return [reward_value(v, key, item, none_ok=self.kind in ("trl", "swift")) for v, item in zip(values, items)]

    def _one(self, item: Item):
        key = "score" if self.kind == "verl" else "overall"
        return reward_value(call_one(self.kind, self.fn, item, self.bound, self._accepts), key, item)

    def _accepts(self, name: str) -> bool:
        return self.var_keyword or name in self.keywords

    def _error(self, failure: CallFailed) -> RewardError:
        where = f"row {failure.item.id}" if failure.batch == 1 else \
            f"a batch of {failure.batch} rows starting at row {failure.item.id}"
        return RewardError(f"reward function {self.name} ({self.source}) failed on {where}: {failure.what}",
                           hint="fix the function, or pass --skip-bad to record the error in the row's "
                                "reward_error and go on")


_ACCURACY_NAME = re.compile(r"(?:^|_)(?:acc|accuracy)(?:_|$)")


@dataclass(frozen=True)
class RewardSet:
    """Several reward functions with their weights, scored together as TRL's GRPOTrainer sums them."""

    rewards: tuple[Reward, ...]
    weights: tuple[float, ...]
    threshold: float = 1.0

    @property
    def scorer(self) -> str:
        """The ``scorer`` field of rewarded rows: ``reward:`` and the functions' names joined by ``+``."""
        return "reward:" + "+".join(r.name for r in self.rewards)

    @property
    def names(self) -> list[str]:
        """Each function's key in a row's ``rewards``: its name, with its file's stem when two share it."""
        plain = [r.name for r in self.rewards]
        return [f"{r.source.stem}:{r.name}" if plain.count(r.name) > 1 else r.name for r in self.rewards]

    @property
    def judge(self) -> int | None:
        """Of several functions, the one whose value says whether an answer is right: the single one named as an
        accuracy (VLM-R1's and TRL's ``accuracy_reward``, ms-swift's ``external_r1v_acc``), as trainers log
        accuracy apart from the format reward summed beside it. None: one function, or no single such name."""
        named = [k for k, r in enumerate(self.rewards) if _ACCURACY_NAME.search(r.name.lower())]
        return named[0] if len(self.rewards) > 1 and len(named) == 1 else None

    @property
    def note(self) -> str | None:
        """How a row's correctness is decided, when several functions are summed."""
        if len(self.rewards) == 1:
            return None
        if self.judge is not None:
            return (f"correct: {self.names[self.judge]} ≥ {self.threshold:g} (the accuracy among {len(self.rewards)} "
                    "reward functions; score is their weighted sum)")
        return (f"correct: the weighted sum of {len(self.rewards)} reward functions ≥ {self.threshold:g}, as none of "
                "them is named as an accuracy (acc, accuracy): a right format alone may count as right; give "
                "--reward-threshold the total a right answer reaches")

    def score_rows(self, rows: list[dict], truths: dict[str, object], *, skip_bad: bool = False) -> list[dict]:
        """The scoring fields (:data:`FIELDS`) for each of ``rows``, in order.

        ``truths`` maps row id → the truth: a record as :func:`vlmfast.inputs.convert.read_reward_truths`
        or ``Request.truth_record`` gives it (``manifest_truth``, ``record``, ``data_source``), a
        ``{"ground_truth": …}`` dict, a ``(truth, scorer)`` pair or the value itself. The function sees the
        manifest's value as it is. Error rows get all nulls, rows without truth only ``format_ok``.
        ``score`` is Σ weight × reward over the functions that did not return None (None when all did);
        ``rewards`` holds each function's own value. User code that raises, or returns no number, is a
        :class:`RewardError` naming the function and the row; with ``skip_bad`` that row gets ``score``
        None and ``reward_error`` instead, and the others are still rewarded."""
        out: list[dict] = []
        todo: list[tuple[dict, Item]] = []
        for row in rows:
            fields = dict.fromkeys(FIELDS)
            out.append(fields)
            if row.get("error") is not None:
                continue
            fields["format_ok"] = format_ok(row.get("text"))
            found, truth, record, source = _truth_record(truths.get(str(row.get("id"))))
            if found:  # and what the engine wrote beside the text: how the answer ended, the processor's grid
                item = replace(_item(row, truth, record, source), finish_reason=row.get("finish_reason"),
                               grids=row.get("image_grid_thw"))
                todo.append((fields, item))
        items = [item for _, item in todo]
        per_function = [reward.rewards(items, skip_bad) for reward in self.rewards]
        for k, (fields, _) in enumerate(todo):
            self._combine(fields, [results[k] for results in per_function])
        return out

    def check(self, requests) -> None:
        """Call every function once, before any model loads, on the first of ``requests`` with ground truth,
        answered with its own truth (``<think>…</think><answer>TRUTH</answer>``; a truth that holds its
        ``<answer>`` tags already is the answer as it is): a function that cannot even be called (a missing
        column, a wrong signature, an import inside it) fails in a second, not after the first batch has
        generated. A RewardError saying so."""
        request = next((r for r in requests if _truth_record(r.truth_record())[0]), None)
        if request is None:
            return
        truth = _truth_record(request.truth_record())[1]
        answer = truth if isinstance(truth, str) else json.dumps(truth)
        answer = answer if "<answer>" in answer else f"<answer>{answer}</answer>"
        sizes = [list(size) for size in request.image_sizes] if request.image_sizes else None
        row = {"id": request.id, "text": f"<think>check</think>{answer}", "prompt": request.prompt,
               "images": list(request.images), "n_new_tokens": 8, "token_ids": [0] * 8, "error": None,
               "model_image_sizes": sizes}  # the images' own sizes stand in for the resized ones
        try:
            self.score_rows([row], {request.id: request.truth_record()})
        except RewardError as exc:
            raise RewardError(f"before loading the model, a check call with the first request's own ground truth as "
                              f"the answer: {exc.message}", hint=exc.hint) from exc.__cause__

    def _combine(self, fields: dict, results: list) -> None:
        fields["scorer"] = self.scorer
        failed = [(name, r) for name, r in zip(self.names, results) if isinstance(r, CallFailed)]
        if failed:
            fields["reward_error"] = "; ".join(r.what if len(self.rewards) == 1 else f"{name}: {r.what}" for name, r in failed)
            return
        values = [value for value, _ in results]
        fields["rewards"] = dict(zip(self.names, values))
        subscores = {}
        for name, (_, subs) in zip(self.names, results):
            subscores.update(subs if len(self.rewards) == 1 else {f"{name}/{k}": v for k, v in subs.items()})
        fields["reward_scores"] = subscores
        if all(v is None for v in values):
            return  # not applicable to this row: no score, left out of every mean
        total = sum(w * v for w, v in zip(self.weights, values) if v is not None)  # TRL's nansum
        # a reward that returns its accuracy beside a total weighting the format (EasyR1: 0.9·accuracy +
        # 0.1·format) says whether the answer is right by that sub-score: a right answer without the format is right
        # several functions summed (VLM-R1, TRL: accuracy + format): the accuracy function's own value decides
        # an accuracy function that returns None (TRL's accuracy_reward when the truth does not parse) does not
        # judge the row: no correctness, left out of accuracy as TRL's nanmean leaves it; the format reward alone
        # must not make it right
        key, judge = accuracy_key(subscores), self.judge
        judged = subscores[key] if key is not None else total if judge is None else values[judge]
        fields.update(score=total, correct=None if judged is None else judged >= self.threshold)


def _truth_record(value) -> tuple[bool, object, Mapping | None, str | None]:
    """(has truth, the manifest's truth untouched, the manifest line, verl data source) from a ``truths`` value."""
    if isinstance(value, Mapping) and "manifest_truth" in value:
        truth = value["manifest_truth"]
        return truth is not None, truth, value.get("record"), value.get("data_source")
    if isinstance(value, Mapping) and "ground_truth" in value:
        return value["ground_truth"] is not None, value["ground_truth"], None, value.get("data_source")
    if isinstance(value, tuple) and len(value) == 2 and (value[1] is None or isinstance(value[1], str)):
        value = value[0]  # read_truths' (truth, scorer)
    return value is not None, value, None, None


def _item(row: dict, truth, record: Mapping | None, data_source: str | None) -> Item:
    text, prompt = row.get("text"), row.get("prompt")
    images = row.get("images")
    if not isinstance(images, list):  # a row from another tool: the manifest line's images
        line = record or {}
        images = line.get("images") or ([line["image"]] if isinstance(line.get("image"), str) else [])
    return Item(str(row.get("id")), text if isinstance(text, str) else "", row.get("n_new_tokens"), truth,
                prompt if isinstance(prompt, str) else None, tuple(images or ()), record, data_source,
                row.get("token_ids"), row.get("model_image_sizes"))


# -- loading -------------------------------------------------------------------------------------
def check_reward_options(reward, *, weights=None, kwargs=None, threshold: float = 1.0,
                         reward_may_follow: bool = False) -> None:
    """A UsageError when a weight or the threshold is not a finite number (a NaN total is never at the
    threshold: every row would be wrong, whatever its rewards), or when options that shape reward functions
    come without any (``--reward``; unless one may follow, ``reward_may_follow``: from the trainer's config):
    they would be ignored, and the scores would not be what the command line says."""
    if not isinstance(threshold, numbers.Real) or isinstance(threshold, bool) or not math.isfinite(threshold):
        raise UsageError(f"--reward-threshold {threshold}: expected a finite number",
                         hint="e.g. --reward-threshold 0.5 (a row is correct when its weighted reward reaches it)")
    if reward:
        parse_reward_weights(weights, len([reward] if isinstance(reward, str) else list(reward)))
        return
    if weights is not None:
        parse_reward_weights(weights, None)
    if reward_may_follow:
        return
    given = [flag for flag, unset in (("--reward-weights", weights is None), ("--reward-kwargs", kwargs is None),
                                      ("--reward-threshold", threshold == 1.0)) if not unset]
    if given:
        raise UsageError(f"{', '.join(given)} without --reward: {'they apply' if len(given) > 1 else 'it applies'} "
                         "to reward functions", hint="add --reward FILE.py:FUNCTION, or drop "
                         + ("them" if len(given) > 1 else given[0]))


def load_rewards(specs, *, weights=None, kwargs=None, threshold: float = 1.0) -> RewardSet:
    """The reward functions ``specs`` names (one ``FILE.py:FUNCTION`` or a list), weighted by ``weights``
    (a list of numbers or ``"1,0.5"``; default 1 each) and with ``kwargs`` (a dict or its JSON text) bound
    to every call. UsageError for a bad spec, weights that do not match, or kwargs that are not a JSON object."""
    specs = [specs] if isinstance(specs, str) else list(specs or ())
    if not specs:
        raise UsageError("no reward function given", hint="pass --reward FILE.py:FUNCTION")
    bound = parse_reward_kwargs(kwargs)
    imported: dict[Path, object] = {}  # two functions of one file share its module, as in the trainer's process
    rewards = tuple(load_reward(spec, threshold=threshold, kwargs=bound, _imported=imported) for spec in specs)
    return RewardSet(rewards, parse_reward_weights(weights, len(rewards)), float(threshold))


def parse_reward_weights(weights, count: int | None) -> tuple[float, ...]:
    """``count`` weights from ``"1,0.5"`` or a list (TRL's ``reward_weights``); None → 1 each. ``count`` None:
    as many as given (the functions are not known yet)."""
    if weights is None:
        return (1.0,) * (count or 0)
    parts = [w for w in weights.split(",") if w.strip()] if isinstance(weights, str) else list(weights)
    try:
        values = tuple(float(w) for w in parts)
    except (TypeError, ValueError):
        raise UsageError(f"--reward-weights {weights!r}: expected numbers", hint="e.g. --reward-weights 1,0.5") from None
    if not all(math.isfinite(v) for v in values):
        raise UsageError(f"--reward-weights {weights!r}: expected finite numbers", hint="e.g. --reward-weights 1,0.5")
    if count is not None and len(values) != count:
        raise UsageError(f"--reward-weights gives {len(values)} weight(s) for {count} reward function(s)",
                         hint="one weight per --reward, in the same order")
    return values


def parse_reward_kwargs(kwargs) -> dict:
    """The keyword arguments bound to every reward call, from a dict or its JSON text (None → none)."""
    if kwargs is None or isinstance(kwargs, Mapping):
        return dict(kwargs or {})
    try:
        value = json.loads(kwargs)
    except ValueError as exc:
        raise UsageError(f"--reward-kwargs: not JSON ({exc})", hint='e.g. --reward-kwargs \'{"max_response_length": 4096}\'') from None
    if not isinstance(value, dict):
        raise UsageError("--reward-kwargs: expected a JSON object", hint='e.g. --reward-kwargs \'{"format_weight": 0.1}\'')
    return value


def load_reward(spec: str, *, threshold: float = 1.0, kwargs: Mapping | None = None, _imported=None) -> Reward:
    """The reward function ``spec`` names (``path/to/file.py:function_name``), ready to score rows.

    The file is imported and the name looked up by :mod:`vlmfast.evaluation.reward_files` (a function, a
    ``Class.method``, an ms-swift ORM class or instance, a key of the file's ``orms``). An ORM is called as
    ms-swift calls it; any other form is recognised by :func:`vlmfast.evaluation.reward_calls.detect_kind`.
    ``kwargs`` are bound to every call (EasyR1's ``reward_function_kwargs``). Raises UsageError (with a
    hint) for a bad spec, a file that fails to import, or a name that is not such a function."""
    path_text, sep, name = str(spec).rpartition(":")
    forms = "accepted forms: " + "; ".join(FORMS)
    if not sep or not path_text or not name:
        raise UsageError(f"--reward {spec!r}: expected FILE.py:FUNCTION",
                         hint="name the file and the function, e.g. --reward rewards/r1v.py:compute_score")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise UsageError(f"--reward: {path}: no such file",
                         hint="give the path of the Python file holding the reward function")
    key = path.resolve()
    module = _imported[key] if _imported is not None and key in _imported else import_file(path)
    if _imported is not None:
        _imported[key] = module
    fn, orm = resolve(module, name, path)
    bound = dict(kwargs or {})
    try:
        params = list(inspect.signature(fn).parameters.values())
        kind = "swift" if orm else detect_kind(fn, module, bound)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--reward: cannot read the signature of {name} ({exc})", hint=forms) from exc
    if kind is None:
        shown = ", ".join(str(p) for p in params)
        unbound = [p.name for p in params[1:] if p.default is p.empty and p.name not in bound
                   and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        hint = forms + (f"; bind {', '.join(unbound)} with --reward-kwargs '{{\"{unbound[0]}\": …}}' as the trainer's "
                        "config does" if unbound else "")
        raise UsageError(f"--reward: {name}({shown}) is not a reward function signature vlmfast knows", hint=hint)
    keywords = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    label = getattr(module, "REWARD_NAME", None)
    return Reward(fn, name, kind, path, keywords, any(p.kind is p.VAR_KEYWORD for p in params), float(threshold),
                  bound, label if isinstance(label, str) else None)

