"""vlmfast.evaluation.rewards: a trainer's reward function (EasyR1, TRL / VLM-R1, verl) scores result rows."""

from __future__ import annotations

import sys
import textwrap

import pytest

from vlmfast.errors import RewardError, UsageError
from vlmfast.evaluation.rewards import FIELDS, FORMS, load_reward
from vlmfast.evaluation.scoring import ROW_FIELDS

GOOD = "<think>2+2</think><answer>4</answer>"
PLAIN = "the answer is <answer>4</answer>"
WRONG = "<think>hm</think><answer>5</answer>"
ROWS = [
    {"id": "good", "text": GOOD, "n_new_tokens": 12, "prompt": "What is 2+2?", "error": None},
    {"id": "plain", "text": PLAIN, "n_new_tokens": 7, "prompt": "What is 2+2?", "error": None},
    {"id": "wrong", "text": WRONG, "n_new_tokens": 9, "prompt": "What is 2+2?", "error": None},
    {"id": "failed", "text": None, "n_new_tokens": 0, "error": "CUDA out of memory"},
    {"id": "untrue", "text": GOOD, "n_new_tokens": 12, "error": None},
]
TRUTHS = {"good": "4", "plain": ("<answer>4</answer>", None), "wrong": "4", "failed": "4"}

# EasyR1 r1v-style; the answer extraction lives in a sibling module, as trainers' reward files often do.
HELPER = '''
import re

def extract(text):
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    return m.group(1).strip() if m else None
'''
SEQUENTIAL = '''
import re
from reward_helpers import extract

def compute_score(reward_input: dict, format_weight: float = 0.5) -> dict:
    response = reward_input["response"]
    if response == "boom":
        raise ZeroDivisionError("division by zero")
    fmt = 1.0 if re.fullmatch(r"<think>.*</think>\\s*<answer>.*</answer>", response, re.S) else 0.0
    acc = 1.0 if extract(response) == reward_input["ground_truth"] else 0.0
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc,
            "length": reward_input["response_length"], "note": "ignored, not a number"}
'''
BATCH = '''
CALLS = []

def compute_score(reward_inputs, format_weight=0.1):
    CALLS.append(len(reward_inputs))
    if any(x["response"] == "boom" for x in reward_inputs):
        raise KeyError("boom")
    return [{"overall": 1.0 if x["ground_truth"] in x["response"] else 0.0} for x in reward_inputs]
'''
TRL = '''
SEEN = []

def accuracy_reward(completions, solution, **kwargs):
    SEEN.append(sorted(kwargs))
    contents = [c[0]["content"] for c in completions]
    return [1.0 if "<answer>" + s + "</answer>" in c else 0.0 for c, s in zip(contents, solution)]

def strict(completions, solution, prompts):
    return [float(len(p)) for p in prompts]

def short(completions, **kwargs):
    return [1.0]

def words(completions, solution, **kwargs):
    return ["high" for _ in completions]
'''
VERL = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    acc = 1.0 if "<answer>" + ground_truth + "</answer>" in solution_str else 0.0
    if extra_info.get("split") == "test":
        return acc * 0.25
    return {"score": acc, "geo": 1.0 if data_source == "geo" else 0.0, "pred": "a string is not a sub-score"}
'''


@pytest.fixture
def reward_file(tmp_path):
    (tmp_path / "reward_helpers.py").write_text(HELPER)

    def write(name, source):
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


def _check_nulls(fields):
    assert fields["failed"] == dict.fromkeys(FIELDS)  # an error row: all null, as score_row gives it
    assert fields["untrue"] == {**dict.fromkeys(FIELDS), "format_ok": True}  # no truth: format only


def _by_id(rows, fields):
    return {r["id"]: f for r, f in zip(rows, fields)}


def test_easyr1_sequential_scores_subscores_and_threshold(reward_file):
    path = reward_file("r1v.py", SEQUENTIAL)
    before = list(sys.path)
    reward = load_reward(f"{path}:compute_score")
    assert sys.path == before  # the file's directory was on sys.path only while importing
    assert reward.kind == "easyr1" and set(FIELDS) >= set(ROW_FIELDS)
    got = _by_id(ROWS, reward.score_rows(ROWS, TRUTHS))
    assert got["good"] == {**dict.fromkeys(FIELDS), "score": 1.0, "correct": True, "scorer": "reward:compute_score",
                           "format_ok": True, "reward_scores": {"format": 1.0, "accuracy": 1.0, "length": 12.0},
                           "rewards": {"compute_score": 1.0}}
    # "plain"'s truth is "<answer>4</answer>" as the manifest holds it: EasyR1 hands it over unstripped
    assert (got["plain"]["score"], got["plain"]["correct"], got["plain"]["format_ok"]) == (0.0, False, False)
    assert got["plain"]["reward_scores"] == {"format": 0.0, "accuracy": 0.0, "length": 7.0}
    assert (got["wrong"]["score"], got["wrong"]["correct"]) == (0.5, False)
    _check_nulls(got)
    lenient = _by_id(ROWS, load_reward(f"{path}:compute_score", threshold=0.5).score_rows(ROWS, TRUTHS))
    # "wrong" reaches 0.5 on its format alone: its accuracy sub-score (0) decides, whatever the threshold
    assert [lenient[i]["correct"] for i in ("good", "plain", "wrong")] == [True, False, False]


def test_easyr1_batch_is_one_call(reward_file):
    reward = load_reward(f"{reward_file('math.py', BATCH)}:compute_score")
    assert reward.kind == "easyr1-batch"
    got = _by_id(ROWS, reward.score_rows(ROWS, TRUTHS))
    assert reward.fn.__globals__["CALLS"] == [3]  # good, plain, wrong: not the error row, not the untrue one
    assert [got[i]["score"] for i in ("good", "plain", "wrong")] == [1.0, 1.0, 0.0]
    assert got["good"]["reward_scores"] == {} and got["good"]["scorer"] == "reward:compute_score"
    _check_nulls(got)


def test_trl_reward_gets_conversational_completions_and_only_accepted_kwargs(reward_file):
    path = reward_file("vlm_r1.py", TRL)
    reward = load_reward(f"{path}:accuracy_reward")
    assert reward.kind == "trl"
    got = _by_id(ROWS, reward.score_rows(ROWS, TRUTHS))
    assert [got[i]["score"] for i in ("good", "plain", "wrong")] == [1.0, 0.0, 0.0]  # "plain": truth kept tagged
    assert [got[i]["correct"] for i in ("good", "plain", "wrong")] == [True, False, False]
    assert reward.fn.__globals__["SEEN"] == [["accu_reward_method", "completion_ids", "image_grid_thw", "image_path",
                                              "log_extra", "log_metric", "problem", "prompts", "trainer_state"]]
    _check_nulls(got)
    strict = load_reward(f"{path}:strict")  # no **kwargs: gets prompts (one user turn each), nothing else
    assert [f["score"] for f in strict.score_rows(ROWS[:2], TRUTHS)] == [1.0, 1.0]
    assert load_reward(f"{path}:short").kind == "trl"  # VLM-R1's format_reward(completions, **kwargs)


def test_verl_score_dict_and_data_source(reward_file):
    reward = load_reward(f"{reward_file('verl_reward.py', VERL)}:compute_score")
    assert reward.kind == "verl"
    truths = {**TRUTHS, "good": {"ground_truth": "4", "data_source": "geo"},
              "plain": {"manifest_truth": "4", "data_source": None, "record": {"extra_info": {"split": "test"}}}}
    got = _by_id(ROWS, reward.score_rows(ROWS, truths))
    assert (got["good"]["score"], got["good"]["correct"], got["good"]["reward_scores"]) == (1.0, True, {"geo": 1.0})
    assert (got["plain"]["score"], got["plain"]["correct"], got["plain"]["reward_scores"]) == (0.25, False, {})
    assert got["wrong"]["reward_scores"] == {"geo": 0.0}  # data_source None when the record has none
    _check_nulls(got)


def test_bbox_truth_is_passed_as_the_manifest_holds_it(reward_file):
    path = reward_file("verl_box.py", 'def compute_score(solution_str, ground_truth):\n'
                                      '    return float(ground_truth == [1, 2, 3, 4]) + 2 * (ground_truth == "[1,2,3,4]")\n')
    reward = load_reward(f"{path}:compute_score")
    assert reward.score_rows([{"id": "b", "text": "x"}], {"b": [1, 2, 3, 4]})[0]["score"] == 1.0
    assert reward.score_rows([{"id": "b", "text": "x"}], {"b": "[1,2,3,4]"})[0]["score"] == 2.0


def test_user_exception_names_function_and_row(reward_file):
    reward = load_reward(f"{reward_file('r1v.py', SEQUENTIAL)}:compute_score")
    rows = [ROWS[0], {"id": "bad", "text": "boom"}, ROWS[2]]
    with pytest.raises(RewardError) as err:
        reward.score_rows(rows, {"good": "4", "bad": "4", "wrong": "4"})
    assert "compute_score" in err.value.message and "row bad" in err.value.message
    assert "ZeroDivisionError: division by zero" in err.value.message and "--skip-bad" in err.value.hint
    assert err.value.exit_code == 1
    got = reward.score_rows(rows, {"good": "4", "bad": "4", "wrong": "4"}, skip_bad=True)
    assert got[1] == {**dict.fromkeys(FIELDS), "format_ok": False, "scorer": "reward:compute_score",
                      "reward_error": "ZeroDivisionError: division by zero"}
    assert [got[0]["score"], got[2]["score"]] == [1.0, 0.5]


def test_a_failed_batch_is_retried_row_by_row_to_name_the_row_that_fails(reward_file):
    reward = load_reward(f"{reward_file('math.py', BATCH)}:compute_score")
    rows = [ROWS[0], {"id": "bad", "text": "boom"}, ROWS[2]]
    truths = {"good": "4", "bad": "4", "wrong": "4"}
    with pytest.raises(RewardError, match=r"failed on row bad: KeyError: 'boom'"):
        reward.score_rows(rows, truths)
    assert reward.fn.__globals__["CALLS"] == [3, 1, 1]  # the failed batch, then one row per call up to the bad one
    got = reward.score_rows(rows, truths, skip_bad=True)
    assert reward.fn.__globals__["CALLS"] == [3, 1, 1, 3, 1, 1, 1]
    assert [g["score"] for g in got] == [1.0, None, 0.0]
    assert got[1]["reward_error"] == "KeyError: 'boom'" and got[1]["correct"] is None


def test_non_numeric_reward_is_an_error(reward_file):
    path = reward_file("vlm_r1.py", TRL)
    with pytest.raises(RewardError, match=r"words .*row good: returned str 'high', not a finite number"):
        load_reward(f"{path}:words").score_rows(ROWS, TRUTHS)
    with pytest.raises(RewardError, match=r"returned 1 values for 3 rows"):
        load_reward(f"{path}:short").score_rows(ROWS, TRUTHS)
    nan = reward_file("nan.py", "def compute_score(reward_input):\n    return {'overall': float('nan')}\n")
    got = load_reward(f"{nan}:compute_score").score_rows(ROWS[:1], TRUTHS, skip_bad=True)
    assert got[0]["score"] is None and "not a finite number" in got[0]["reward_error"]
    missing = reward_file("nokey.py", "def compute_score(reward_input):\n    return {'accuracy': 1.0}\n")
    with pytest.raises(RewardError, match=r"without 'overall' \(keys: accuracy\)"):
        load_reward(f"{missing}:compute_score").score_rows(ROWS[:1], TRUTHS)


def test_kind_from_annotations(reward_file):
    path = reward_file("annotated.py", """
        from typing import Dict, List
        def batch(items: List[Dict]) -> list: ...
        def one(item: "dict[str, object]") -> dict: ...
        def typed(item: dict) -> dict: ...
        def two(a, b): ...
        def needs_more(completions, solution, image_path): ...
    """)
    assert load_reward(f"{path}:batch").kind == "easyr1-batch"
    assert load_reward(f"{path}:one").kind == "easyr1"
    assert load_reward(f"{path}:typed").kind == "easyr1"
    assert load_reward(f"{path}:two").kind == "easyr1-legacy"  # EasyR1 <= 0.3: (predict_str, ground_truth)
    assert load_reward(f"{path}:needs_more").kind == "trl"  # VLM-R1 hands image_path over
    odd = reward_file("odd.py", "def three(a, b, c): ...\ndef nothing(): ...\n")
    for name in ("three", "nothing"):
        with pytest.raises(UsageError, match="not a reward function signature") as err:
            load_reward(f"{odd}:{name}")
        assert all(form in err.value.hint for form in FORMS)


def test_bad_specs(reward_file, tmp_path):
    path = reward_file("r1v.py", SEQUENTIAL + "\nTHRESHOLD = 3\n")
    with pytest.raises(UsageError, match="expected FILE.py:FUNCTION") as err:
        load_reward(str(path))
    assert "--reward rewards/r1v.py:compute_score" in err.value.hint
    with pytest.raises(UsageError, match="expected FILE.py:FUNCTION"):
        load_reward(f"{path}:")
    with pytest.raises(UsageError, match="no such file"):
        load_reward(f"{tmp_path / 'nope.py'}:compute_score")
    with pytest.raises(UsageError, match="has no 'score'") as err:
        load_reward(f"{path}:score")
    assert err.value.hint == "functions defined there: compute_score"
    with pytest.raises(UsageError, match="THRESHOLD is a int, not a function"):
        load_reward(f"{path}:THRESHOLD")
    broken = reward_file("broken.py", "import not_a_module_vlmfast_knows\n")
    with pytest.raises(UsageError, match="importing .*broken.py failed: ModuleNotFoundError: No module named "
                                         "'not_a_module_vlmfast_knows'") as err:
        load_reward(f"{broken}:compute_score")
    assert "install" in err.value.hint
    exits = reward_file("exits.py", "raise SystemExit(3)\n")
    with pytest.raises(UsageError, match="SystemExit: 3"):
        load_reward(f"{exits}:compute_score")
