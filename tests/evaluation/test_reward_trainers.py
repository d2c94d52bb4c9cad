"""What trainers accept of a reward function beyond the plain call: a NaN for "not applicable" (TRL, ms-swift),
``async def`` functions (TRL, ms-swift), ms-swift's ORM classes and its ``orms`` registry."""

from __future__ import annotations

import textwrap

import pytest
from conftest import cli

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


# An ms-swift plugin as copied to run without ms-swift: its own ORM / AsyncORM bases (ms-swift's own take
# ``args=None``), MultiModalAccuracyORM's string match on plain-text completions, registered in ``orms``.
SWIFT_PLUGIN = '''
import asyncio
import math
import re

SEEN = []
orms = {}


class ORM:
    def __init__(self, args=None, **kwargs):
        self.args = args


class AsyncORM(ORM):
    pass


class MultiModalAccuracyORM(ORM):
    def __call__(self, completions, solution, **kwargs):
        SEEN.append({"completions": completions, "solution": solution, **kwargs})
        rewards = []
        for content, sol in zip(completions, solution):
            sol_match = re.search(r"<answer>(.*?)</answer>", sol)
            truth = sol_match.group(1).strip() if sol_match else sol.strip()
            said = re.search(r"<answer>(.*?)</answer>", content)
            rewards.append(float((said.group(1).strip() if said else content.strip()) == truth))
        return rewards


class Format(ORM):
    def __call__(self, completions, **kwargs):
        pattern = r"^<think>.*?</think>\\s*<answer>.*?</answer>(?![\\s\\S])"
        return [1.0 if re.match(pattern, content, re.DOTALL | re.MULTILINE) else 0.0 for content in completions]


class Judge(AsyncORM):
    async def __call__(self, completions, solution, **kwargs):
        await asyncio.sleep(0)
        return [math.nan if s == "unparsable" else float(c.count("<") == 4) for c, s in zip(completions, solution)]


class NeedsArgs(ORM):
    def __init__(self, args):
        super().__init__(args)


orms["external_r1v_acc"] = MultiModalAccuracyORM
format_orm = Format()
'''
SWIFT_MANIFEST = [{"id": "0", "image": "a.png", "prompt": "What is 1+2?", "solution": "<answer> 3 </answer>", "level": 1},
                  {"id": "1", "images": ["b.png"], "prompt": "What is 1+2?", "solution": "3",
                   "messages": [{"role": "system", "content": "Think."}, {"role": "user", "content": "<image>1+2?"}]},
                  {"id": "2", "image": "a.png", "prompt": "What is 1+2?", "solution": "unparsable"}]
SWIFT_ROWS = [{**row, "images": images, "finish_reason": reason}
              for row, images, reason in zip(ROWS, [["/data/a.png"], ["/data/b.png"], ["/data/a.png"]], ["eos", "length", None])]


@pytest.fixture
def swift(tmp_path):
    import json

    from conftest import read_jsonl

    from vlmfast.run.rescore import rescore_file

    path = _write(tmp_path, "plugin.py", SWIFT_PLUGIN)
    manifest, results = tmp_path / "m.jsonl", tmp_path / "r.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in SWIFT_MANIFEST))
    results.write_text("".join(json.dumps(row) + "\n" for row in SWIFT_ROWS))

    def score(*names, **options):
        rewards = load_rewards([f"{path}:{name}" for name in names])
        rescore_file(results, str(manifest), reward=rewards, out=tmp_path / "s.jsonl", **options)
        return rewards, read_jsonl(tmp_path / "s.jsonl")

    return path, score


def test_an_orms_entry_is_made_and_called_as_ms_swift_calls_it(swift):
    """``orms['external_r1v_acc'] = MultiModalAccuracyORM``: made with no arguments, handed the answers as plain
    strings and its reward rows' columns batched; a tagged truth's answer is read as the trainer reads it."""
    _, score = swift
    rewards, rows = score("external_r1v_acc")
    reward = rewards.rewards[0]
    assert reward.kind == "swift" and type(reward.fn).__name__ == "MultiModalAccuracyORM"
    assert [row["score"] for row in rows] == [1.0, 0.0, 0.0] and [row["correct"] for row in rows] == [True, False, False]
    seen = type(reward.fn).__call__.__globals__["SEEN"][-1]
    assert seen["completions"] == [row["text"] for row in ROWS]
    assert sorted(seen) == ["completions", "finish_reason", "id", "image", "images", "is_truncated", "level",
                            "messages", "prompt", "prompt_id", "request_id", "rollout_infos", "solution", "trainer_state"]
    assert seen["solution"] == ["<answer> 3 </answer>", "3", "unparsable"] and seen["level"] == [1, None, None]
    assert seen["images"] == [["/data/a.png"], ["/data/b.png"], ["/data/a.png"]]  # the row's, as the sample holds them
    assert seen["messages"][0] == [{"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": ROWS[0]["text"]}]
    assert seen["messages"][1] == [{"role": "system", "content": "Think."}, {"role": "user", "content": "<image>1+2?"},
                                   {"role": "assistant", "content": ROWS[1]["text"]}]
    assert seen["finish_reason"] == ["stop", "length", None] and seen["is_truncated"] == [False, True, False]
    assert seen["prompt_id"] == seen["request_id"] == ["0", "1", "2"]
    assert seen["rollout_infos"] == [{}, {}, {}] and seen["trainer_state"] is None
    path = rewards.rewards[0].source
    r = cli("score", path.parent / "r.jsonl", "--manifest", path.parent / "m.jsonl", "--reward", f"{path}:external_r1v_acc")
    assert r.returncode == 0 and "reward external_r1v_acc: mean 0.333" in r.stderr, r.stderr


def test_orm_classes_and_instances_by_name_and_an_async_orm(swift):
    """An ORM class named in --reward is made with no arguments; an instance is used as it is; an AsyncORM's
    coroutine is awaited; NaN is not applicable, as ms-swift's nansum/nanmean take it."""
    _, score = swift
    rewards, rows = score("Format", "format_orm", "MultiModalAccuracyORM", "Judge")
    assert [r.kind for r in rewards.rewards] == ["swift"] * 4
    assert [row["rewards"] for row in rows] == [
        {"Format": 1.0, "format_orm": 1.0, "MultiModalAccuracyORM": 1.0, "Judge": 1.0},
        {"Format": 1.0, "format_orm": 1.0, "MultiModalAccuracyORM": 0.0, "Judge": 1.0},
        {"Format": 0.0, "format_orm": 0.0, "MultiModalAccuracyORM": 0.0, "Judge": None}]
    assert [row["score"] for row in rows] == [4.0, 3.0, 0.0]


def test_orm_names_that_cannot_be_used_say_why(swift):
    from vlmfast.errors import UsageError

    path, _ = swift
    with pytest.raises(UsageError, match=r"plugin.py:NeedsArgs: making NeedsArgs\(\) failed: TypeError") as err:
        load_reward(f"{path}:NeedsArgs")
    assert "no arguments" in err.value.hint
    with pytest.raises(UsageError, match="has no 'external_r1v'") as err:
        load_reward(f"{path}:external_r1v")
    assert err.value.hint.endswith("; its orms: external_r1v_acc")
