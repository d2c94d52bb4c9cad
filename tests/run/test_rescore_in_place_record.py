"""``vlmfast score RESULTS --out RESULTS`` (rescoring in place) keeps the run's record beside the file true: a later
``infer`` / ``sweep`` resume with the earlier scoring must stop and name the difference, not add or read back rows
scored another way (a sweep ranked a step rescored with ``contains`` above steps scored with ``auto``)."""

import json

import pytest

from conftest import cli
from vlmfast.errors import UsageError
from vlmfast.run.sweep_record import compare


def _run_files(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"r{i}", "image": "a.png", "prompt": "p", "answer": "e"}) + "\n"
                                for i in range(3)))
    results = tmp_path / "step-100.jsonl"
    results.write_text("".join(json.dumps({"id": f"r{i}", "text": "the answer here", "score": 0.0, "correct": False,
                                           "scorer": "exact"}) + "\n" for i in range(3)))
    settings = {"manifest": str(manifest), "scorer": "auto", "iou": 0.5, "bbox_space": None, "reward": None,
                "reward_weights": None, "reward_kwargs": None, "reward_threshold": 1.0}
    (tmp_path / "step-100.run.json").write_text(json.dumps({"settings": settings, "versions": {}}))
    return manifest, results, settings


def test_rescoring_in_place_with_another_scorer_updates_the_record(tmp_path):
    manifest, results, settings = _run_files(tmp_path)
    out = cli("score", results, "--manifest", manifest, "--scorer", "contains", "--out", results)
    assert out.returncode == 0, out.stderr
    assert all(json.loads(line)["scorer"] == "contains" for line in results.read_text().splitlines())
    record = json.loads((tmp_path / "step-100.run.json").read_text())
    assert record["settings"]["scorer"] == "contains"
    assert "now records this scoring" in out.stderr
    with pytest.raises(UsageError, match='scorer: "contains" then, "auto" now'):  # the earlier run's resume stops
        compare(tmp_path / "step-100.run.json", settings, "holds rows made with other settings", hint="")


def test_rescoring_in_place_with_the_same_scoring_leaves_the_record(tmp_path):
    manifest, results, _ = _run_files(tmp_path)
    before = (tmp_path / "step-100.run.json").read_text()
    out = cli("score", results, "--manifest", manifest, "--out", results)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "step-100.run.json").read_text() == before


def test_rescoring_in_place_while_a_run_writes_the_file_is_refused(tmp_path):
    """A run holds its --out (infer, a sweep's step): rescored in place meanwhile, the file was replaced under the
    run, which went on appending to the deleted one (rows lost), and the record named a scoring its rows lacked."""
    from vlmfast.files import held_alone

    manifest, results, _ = _run_files(tmp_path)
    before = results.read_bytes(), (tmp_path / "step-100.run.json").read_bytes()
    with held_alone(results, "--out"):
        out = cli("score", results, "--manifest", manifest, "--scorer", "contains", "--out", results)
    assert out.returncode == 2 and f"--out {results} is being written by another vlmfast run (process " in out.stderr
    assert (results.read_bytes(), (tmp_path / "step-100.run.json").read_bytes()) == before
    assert cli("score", results, "--manifest", manifest, "--scorer", "contains", "--out", results).returncode == 0


def test_a_sweeps_damaged_record_is_refused_beside_rows_and_passed_over_without_them(tmp_path):
    """An unreadable step record vouches for nothing: beside rows a resume could mix two settings (refused), and
    without rows the step runs afresh and writes its own (a sweep was refused and offered only --overwrite)."""
    from vlmfast.run.sweep_record import check

    _, results, settings = _run_files(tmp_path)
    (tmp_path / "step-100.run.json").write_text("")
    with pytest.raises(UsageError, match=r"step-100\.run\.json: the record .* is unreadable") as err:
        check(tmp_path, settings, overwrite=False)
    assert "--out-dir" in err.value.hint
    results.unlink()
    assert check(tmp_path, settings, overwrite=False) == []
