"""How each RL trainer calls a reward function, reproduced call for call (no torch, no trainer import).

Read from the trainers' own sources:

- EasyR1 (hiyouga/EasyR1 ``verl/workers/reward/function.py`` at b44b311b): the file's ``REWARD_TYPE``
  (``"batch"`` by default there) picks one call with the list of all rows, or one call per row; each row
  is ``{"response", "response_length", "ground_truth"}`` (tokens kept, EOS included, as its
  ``response_mask`` counts them; the dataset's answer untouched); ``reward_function_kwargs`` are bound
  with ``functools.partial``; the reward is the result's ``overall``.
- EasyR1 ≤ 0.3 (tag v0.3.0, 7435d3c7, ``FunctionRewardManager``): ``score_fn(response_str, ground_truth)``
  positionally, one row per call, ``score_function_kwargs`` bound; the reward is ``overall``.
- TRL (huggingface/trl ``trl/trainer/grpo_trainer.py`` ``_calculate_rewards`` at f2cd5771):
  ``reward_func(prompts=, completions=, completion_ids=, **every dataset column as a list, trainer_state=,
  log_extra=, log_metric=)``, awaited when it is ``async def``; a ``None`` in the returned list is NaN, and
  a NaN stays NaN: not applicable to that row (``nansum`` over the functions, ``nanmean`` over the rows).
- VLM-R1 (om-ai-lab/VLM-R1 ``src/open-r1-multimodal/src/open_r1/trainer/grpo_trainer.py`` and
  ``grpo_jsonl.py`` at 90052f47): as TRL, with the columns its pipeline adds: ``image_path`` (the row's
  image paths), ``problem``, ``accu_reward_method`` and, from the Qwen module, ``image_grid_thw`` (the
  processor's grid per image: ``[t, height / patch, width / patch]``, patch 14 for Qwen2/2.5-VL, 16 for
  Qwen3-VL and Qwen3.5).
- ms-swift (modelscope/ms-swift ``swift/rl_core/grpo_algorithm.py`` ``compute_rewards_per_func`` and
  ``swift/rl_core/data.py`` at 1ed8be3c): an ORM (:mod:`vlmfast.evaluation.reward_files`) called as
  ``orm(completions, **reward_kwargs)``, ``completions`` the answers' plain texts, the keywords each row's
  reward row batched into lists (every dataset column, ``messages`` ending in the answer, ``images``,
  ``prompt_id``, ``request_id``, ``finish_reason``, ``is_truncated``, ``rollout_infos``) and ``trainer_state``;
  ``async def __call__`` (``AsyncORM``) awaited; None and NaN as TRL's.
- verl (volcengine/verl ``verl/workers/reward_manager/naive.py`` at b178a3cd): one call per row,
  ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` where ``extra_info`` is the
  row's own dict plus ``num_turns`` and ``rollout_reward_scores``; a dict result's ``score`` is the reward.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

from vlmfast.errors import UsageError

KINDS = ("easyr1-batch", "easyr1", "easyr1-legacy", "trl", "swift", "verl")
FORMS = (
    "EasyR1 batch: compute_score(reward_inputs: list[dict]) -> list[dict] (REWARD_TYPE = \"batch\")",
    "EasyR1 sequential: compute_score(reward_input: dict) -> dict with 'overall' (REWARD_TYPE = \"sequential\")",
    "EasyR1 <= 0.3: compute_score(predict_str, ground_truth, **kwargs) -> dict with 'overall'",
    "TRL / VLM-R1: f(completions, solution, **kwargs) -> list[float | None]",
    "ms-swift: a class deriving from ORM or AsyncORM, an instance of one, or a key of the file's orms dict "
    "(__call__(self, completions: list[str], **kwargs) -> list[float | None])",
    "verl: compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict",
)
BATCH_KINDS = ("easyr1-batch", "trl", "swift")
# The patch size a row without the processor's grid (from older vlmfast, from another tool) is read with: Qwen2
# and Qwen2.5-VL's, the models VLM-R1's Qwen module was written for (it maps boxes with grid × 14).
VLMR1_PATCH = 14
_VERL_ARGS = {"data_source", "solution_str", "ground_truth", "extra_info"}
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class Item:
    """One row to reward: the model's text and what the trainer would hold beside it. ``truth`` is the
    manifest's value untouched; ``record`` the manifest line (its dataset columns)."""

    id: str
    text: str
    n_new_tokens: int | None
    truth: object
    prompt: str | None = None
    images: tuple = ()
    record: Mapping | None = None
    data_source: str | None = None
    token_ids: list | None = None
    model_sizes: list | None = None
    finish_reason: str | None = None
    grids: list | None = None


class CallFailed(Exception):
    """User code failed on ``item``: ``what`` is ``Type: message`` or a description of a bad value."""

    def __init__(self, item: Item, what: str, batch: int = 1):
        super().__init__(what)
        self.item, self.what, self.batch = item, what, batch


def detect_kind(fn, module, bound: Mapping) -> str | None:
    """The calling convention of ``fn`` (one of :data:`KINDS`), None when none fits. A TRL (``completions``)
    or verl (``solution_str`` + ``ground_truth``) signature wins; else EasyR1's ``REWARD_TYPE`` in the file
    decides, as its reward manager does; else the first parameter (``reward_inputs``/a list → batch,
    ``reward_input``/a dict → sequential) or two positional ones (EasyR1 ≤ 0.3). Parameters bound by
    ``bound`` (``--reward-kwargs``) count as given."""
    params = list(inspect.signature(fn).parameters.values())
    names = {p.name for p in params if p.kind in _BY_KEYWORD}
    required = {p.name for p in params if p.default is p.empty and p.kind in (*_BY_KEYWORD, p.POSITIONAL_ONLY)}
    required -= set(bound)
    if "completions" in names:
        return "trl"  # TRL hands every dataset column over: what is missing fails at the call, as in TRL
    if {"solution_str", "ground_truth"} <= names:
        return "verl" if required <= _VERL_ARGS else None
    positional = [p for p in params if p.kind in _POSITIONAL and p.name not in bound]
    declared = getattr(module, "REWARD_TYPE", None)
    if declared is not None:
        if declared not in ("batch", "sequential"):
            raise UsageError(f"--reward: REWARD_TYPE = {declared!r} in {getattr(module, '__file__', 'the file')}",
                             hint='EasyR1 knows REWARD_TYPE = "batch" or "sequential"')
        fits = positional and required <= {positional[0].name}
        return ("easyr1-batch" if declared == "batch" else "easyr1") if fits else None
    if not positional:
        return None
    first = positional[0]
    if not required - {first.name}:
        annotation = _annotation_text(first.annotation)
        if first.name == "reward_inputs" or (first.name != "reward_input" and annotation.startswith(("list", "sequence"))):
            return "easyr1-batch"
        if first.name == "reward_input" or annotation.startswith(("dict", "mapping")):
            return "easyr1"
    if len(positional) >= 2 and required <= {positional[0].name, positional[1].name}:
        return "easyr1-legacy"
    return None


def _annotation_text(annotation) -> str:
    """``list[dict]``, ``List[Dict]``, ``list`` or the string form of any of them, lower case, unqualified."""
    if isinstance(annotation, type):
        annotation = annotation.__name__
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.replace("typing.", "").replace("collections.abc.", "").lower()


# -- the calls ----------------------------------------------------------------------------------------
def call_batch(kind: str, fn, items: list[Item], bound: Mapping, accepts) -> list:
    """One call for ``items`` (a batch kind); the returned values, one per item (None allowed for TRL)."""
    if kind == "easyr1-batch":
        values = invoke(fn, items, [easyr1_input(i) for i in items], **bound)
    elif kind == "swift":
        kwargs = {**swift_kwargs(items), **bound}
        values = invoke(fn, items, [item.text for item in items], **{k: v for k, v in kwargs.items() if accepts(k)},
                        awaited=True)
    else:
        kwargs = {**trl_kwargs(items), **bound}
        values = invoke(fn, items, **{k: v for k, v in kwargs.items() if accepts(k)}, awaited=True)
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise CallFailed(items[0], f"returned {type(values).__name__}, expected a list of {len(items)}", len(items))
    values = list(values)
    if len(values) != len(items):
        raise CallFailed(items[0], f"returned {len(values)} values for {len(items)} rows", len(items))
    return values


def call_one(kind: str, fn, item: Item, bound: Mapping, accepts):
    """One call for one row (EasyR1 sequential or ≤ 0.3, verl); the returned value."""
    if kind == "easyr1":
        return invoke(fn, [item], easyr1_input(item), **bound)
    if kind == "easyr1-legacy":
        return invoke(fn, [item], item.text, item.truth, **bound)
    extra = dict(item.record["extra_info"]) if isinstance((item.record or {}).get("extra_info"), Mapping) else {}
    extra.update(num_turns=None, rollout_reward_scores={})  # what verl's NaiveRewardManager adds
    kwargs = {"data_source": item.data_source, "solution_str": item.text, "ground_truth": item.truth,
              "extra_info": extra, **bound}
    return invoke(fn, [item], **{k: v for k, v in kwargs.items() if accepts(k)})


def invoke(fn, items: list[Item], *args, awaited: bool = False, **kwargs):
    """``fn(*args, **kwargs)``; ``awaited`` (TRL, ms-swift: trainers that run ``async def`` rewards in an event
    loop): a coroutine it returns is run to its result, one event loop per call."""
    try:
        result = fn(*args, **kwargs)
        return asyncio.run(result) if awaited and inspect.iscoroutine(result) else result
    except Exception as exc:  # the user's code: any exception is theirs to report, with the row
        raise CallFailed(items[0], f"{type(exc).__name__}: {exc}", len(items)) from exc


def easyr1_input(item: Item) -> dict:
    """EasyR1's RewardInput, exactly its three keys."""
    return {"response": item.text, "response_length": item.n_new_tokens, "ground_truth": item.truth}


def trl_kwargs(items: list[Item]) -> dict:
    """The keyword arguments TRL's GRPOTrainer (and VLM-R1's) give a reward function for ``items``: every
    column of the manifest lines as a list (a line without it: None, as a dataset column holds it), then
    ``prompts``, ``completions`` (conversational), ``completion_ids`` (the row's ids when it kept them),
    ``trainer_state`` (None: nothing is training), ``log_extra``/``log_metric`` (no-ops), and VLM-R1's
    ``image_path``, ``image_grid_thw``, ``problem``, ``accu_reward_method`` and ``solution`` where the
    lines have no such column."""
    kwargs = _columns(items, ("prompt", "completion", "completion_ids"))
    added = {
        "solution": [item.truth for item in items],
        "image_path": [list(item.images) for item in items],
        "image_grid_thw": [image_grid_thw(item) for item in items],
        "problem": [_problem(item) for item in items],
        "accu_reward_method": ["default" for _ in items],  # VLM-R1's value when the data names none
    }
    kwargs.update({k: v for k, v in added.items() if k not in kwargs})
    kwargs.update(prompts=[_chat_prompt(item) for item in items],
                  completions=[[{"role": "assistant", "content": item.text}] for item in items],
                  completion_ids=[item.token_ids for item in items], trainer_state=None,
                  log_extra=_ignore, log_metric=_ignore)
    return kwargs


def swift_kwargs(items: list[Item]) -> dict:
    """The keyword arguments ms-swift's GRPO trainer gives an ORM beside the completions for ``items``: each
    row's reward row (``to_reward_row``) batched into lists, a row without a key giving None there — every
    column of the manifest line, ``solution`` (the truth) where the line has no such column, ``messages`` (the
    line's conversation, its assistant turns left out, or one user turn of the prompt, then the answer as the
    assistant's turn), ``images`` (the row's image paths, as the sample holds them; None without), ``prompt_id`` and
    ``request_id`` (the row's id), ``finish_reason`` (vLLM's words: ``stop`` or ``length``), ``is_truncated``,
    ``rollout_infos`` ({}: no rollout scheduler) — and ``trainer_state`` (None: nothing is training)."""
    kwargs = _columns(items, ())
    kwargs.setdefault("solution", [item.truth for item in items])
    kwargs.update(messages=[_swift_messages(item) for item in items], images=[list(i.images) or None for i in items],
                  prompt_id=[item.id for item in items],
                  request_id=[item.id for item in items], finish_reason=[_VLLM_FINISH.get(i.finish_reason) for i in items],
                  is_truncated=[item.finish_reason == "length" for item in items],
                  rollout_infos=[{} for _ in items], trainer_state=None)
    return kwargs


_VLLM_FINISH = {"eos": "stop", "length": "length"}


def _swift_messages(item: Item) -> list:
    record = item.record or {}
    if isinstance(record.get("messages"), list):
        turns = [m for m in record["messages"] if not (isinstance(m, Mapping) and m.get("role") == "assistant")]
    else:
        system = [{"role": "system", "content": record["system"]}] if isinstance(record.get("system"), str) else []
        turns = [*system, {"role": "user", "content": item.prompt}]
    return [*turns, {"role": "assistant", "content": item.text}]


def _columns(items: list[Item], left_out: tuple) -> dict:
    """Every column of the items' manifest lines but ``left_out``, as a list over the items (None where a line
    lacks it, as a dataset column holds it)."""
    columns: list[str] = []
    for item in items:
        columns += [k for k in (item.record or {}) if k not in columns and k not in left_out]
    return {key: [(item.record or {}).get(key) for item in items] for key in columns}


def _ignore(*args, **kwargs) -> None:
    """TRL's log_extra / log_metric: nothing to log outside training."""


def image_grid_thw(item: Item) -> list[int] | None:
    """The first image's ``[t, h, w]`` patch grid, as VLM-R1's Qwen module hands the processor's
    ``image_grid_thw``: the row's own (engines write the processor's, size / 16 for Qwen3-VL and Qwen3.5), else,
    for a row written without it, from the ``[width, height]`` the model saw over :data:`VLMR1_PATCH`; None
    without either."""
    try:
        if item.grids:
            return [int(n) for n in item.grids[0]]
        width, height = item.model_sizes[0]
        return [1, int(height) // VLMR1_PATCH, int(width) // VLMR1_PATCH]
    except (TypeError, ValueError, IndexError):
        return None


def _problem(item: Item):
    record = item.record or {}
    return record.get("problem", record.get("prompt") if isinstance(record.get("prompt"), str) else item.prompt)


def _chat_prompt(item: Item):
    """The line's own chat prompt when it holds one; else one user turn as VLM-R1's jsonl pipeline builds it
    (an image part per image, then the text), after the line's system prompt if any."""
    record = item.record or {}
    if isinstance(record.get("prompt"), list):
        return record["prompt"]
    if isinstance(record.get("messages"), list):
        return [m for m in record["messages"] if not (isinstance(m, Mapping) and m.get("role") == "assistant")]
    content = [*({"type": "image", "text": None} for _ in item.images), {"type": "text", "text": item.prompt}]
    system = [{"role": "system", "content": record["system"]}] if isinstance(record.get("system"), str) else []
    return [*system, {"role": "user", "content": content}]


# -- reading what came back ---------------------------------------------------------------------------
def reward_value(value, key: str | None, item: Item, *, none_ok: bool = False) -> tuple[float | None, dict]:
    """(reward, sub-scores) from a returned number, or from a dict's ``key`` plus its other numbers.
    ``none_ok`` (TRL, ms-swift): None or NaN is "not applicable" and comes back as None (both trainers turn
    None into NaN and take nansum / nanmean)."""
    if none_ok and (value is None or _is_nan(value)):
        return None, {}
    if key is not None and isinstance(value, Mapping):
        if key not in value:
            raise CallFailed(item, f"returned a dict without {key!r} (keys: {', '.join(map(str, value))})")
        subscores = {str(k): n for k, v in value.items() if k != key and (n := number(v)) is not None}
        value = value[key]
    else:
        subscores = {}
    got = number(value)
    if got is None:
        raise CallFailed(item, f"returned {type(value).__name__} {value!r:.60}, not a finite number")
    return got, subscores


def number(value) -> float | None:
    """A finite float from a number, a 0-d numpy array or torch tensor; else None."""
    got = _real(value)
    return got if got is not None and math.isfinite(got) else None


def _is_nan(value) -> bool:
    got = _real(value)
    return got is not None and math.isnan(got)


def _real(value) -> float | None:
    """The float of a number, a 0-d numpy array or torch tensor (NaN and infinities included); else None."""
    if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    return float(value) if isinstance(value, numbers.Real) else None
