"""What trainers accept of a reward function beyond the plain call: a NaN for "not applicable" (TRL, ms-swift),
``async def`` functions (TRL, ms-swift), ms-swift's ORM classes and its ``orms`` registry."""

from __future__ import annotations

import textwrap

import pytest

from vlmfast.errors import RewardError
from vlmfast.evaluation.rewards import load_reward, load_rewards

ROWS = [{"id": str(i), "text": text, "n_new_tokens": 5, "prompt": "What is 1+2?", "error": None}
        for i, text in enumerate(["<think>a</think><answer>3</answer>", "<think>a</think><answer>4</answer>", "3"])]
TRUTHS = {"0": "3", "1": "3", "2": "unparsable"}


def _write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_nan_from_a_trl_function_is_not_applicable_as_none_is(tmp_path):
    """TRL turns None into NaN and takes nansum/nanmean: a NaN it is handed is the same "not applicable"."""
    path = _write(tmp_path, "nan_rewards.py", """
        import math

        def accuracy_reward(completions, solution, **kwargs):
            return [math.nan if s == "unparsable" else float(s in c[0]["content"]) for c, s in zip(completions, solution)]

        def format_reward(completions, **kwargs):
            return [float(c[0]["content"].startswith("<think>")) for c in completions]
    """)
    got = load_rewards([f"{path}:accuracy_reward", f"{path}:format_reward"]).score_rows(ROWS, TRUTHS)
    assert [g["rewards"] for g in got] == [{"accuracy_reward": 1.0, "format_reward": 1.0},
                                          {"accuracy_reward": 0.0, "format_reward": 1.0},
                                          {"accuracy_reward": None, "format_reward": 0.0}]
    assert [(g["score"], g["correct"]) for g in got] == [(2.0, True), (1.0, False), (0.0, None)]
    alone = load_reward(f"{path}:accuracy_reward").score_rows(ROWS, TRUTHS)
    assert alone[2]["score"] is None and alone[2]["correct"] is None and alone[2]["reward_error"] is None


def test_a_nan_from_an_easyr1_function_is_still_an_error(tmp_path):
    """EasyR1 has no "not applicable": a NaN there is a broken reward, named."""
    path = _write(tmp_path, "easy.py", "def compute_score(reward_input):\n    return {'overall': float('nan')}\n")
    with pytest.raises(RewardError, match="returned float nan, not a finite number"):
        load_reward(f"{path}:compute_score").score_rows(ROWS[:1], TRUTHS)


def test_an_async_trl_function_is_awaited(tmp_path):
    """TRL runs ``async def`` rewards (an LLM judge) in its event loop: the coroutine's list is the reward."""
    path = _write(tmp_path, "judge.py", """
        import asyncio

        async def judged(completions, solution, **kwargs):
            await asyncio.sleep(0)
            return [float(s in c[0]["content"]) for c, s in zip(completions, solution)]
    """)
    got = load_reward(f"{path}:judged").score_rows(ROWS, TRUTHS)
    assert [g["score"] for g in got] == [1.0, 0.0, 0.0] and [g["correct"] for g in got] == [True, False, False]


@pytest.mark.parametrize("truth, answered", [("<answer> 3 </answer>", "<think>check</think><answer> 3 </answer>"),
                                             ("3", "<think>check</think><answer>3</answer>"),
                                             ([1, 2], "<think>check</think><answer>[1, 2]</answer>")])
def test_the_check_call_answers_with_a_tagged_truth_as_it_is(tmp_path, truth, answered):
    """The call made before the model loads answers with the first request's truth; one that holds its answer
    tags (VLM-R1's ``<answer> 3 </answer>``) is not wrapped in a second pair."""
    from vlmfast.inputs.records import Request

    path = _write(tmp_path, "seen.py", """
        SEEN = []

        def acc(completions, solution, **kwargs):
            SEEN.extend(c[0]["content"] for c in completions)
            return [1.0 for _ in completions]
    """)
    rewards = load_rewards([f"{path}:acc"])
    rewards.check([Request("q0", (), "Count?", truth=truth, manifest_truth=truth, record={"solution": truth})])
    assert rewards.rewards[0].fn.__globals__["SEEN"] == [answered]
