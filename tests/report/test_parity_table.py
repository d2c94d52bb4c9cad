"""The parity table on stderr: one line per setting with same/differs, the adopted values and the notes."""

from vlmfast.report import terminal
from vlmfast.report.parity import render_parity


def test_rows_adopted_values_and_notes_are_printed(capsys, monkeypatch):
    # the console's width was fixed when it was made (COLUMNS then, or the terminal's): pin it for this table
    monkeypatch.setattr(terminal.stderr, "width", 200)
    render_parity({"trainer": "ms-swift", "files": ["/r/args.json"], "adopted": ["--temperature 0.9 (args.json: temperature)"],
                   "not_adopted": [], "notes": ["a note"],
                   "rows": [{"setting": "temperature", "name": "temperature", "training": 0.9, "evaluation": 0.9,
                             "same": True, "source": "args.json: temperature", "evaluation_source": "--temperature"},
                            {"setting": "reward function(s)", "name": "reward", "training": ["accuracy"], "evaluation": None,
                             "same": False, "source": "args.json: reward_funcs",
                             "evaluation_source": "vlmfast's scorer (--scorer auto)"}]})
    err = capsys.readouterr().err
    lines = [" ".join(line.replace("│", " ").split()) for line in err.splitlines()]
    assert "train ↔ eval (ms-swift: /r/args.json)" in lines
    assert "temperature 0.9 0.9 same args.json: temperature" in lines
    assert "reward function(s) [\"accuracy\"] none: vlmfast's scorer (--scorer auto) differs args.json: reward_funcs" in lines
    assert lines[-2:] == ["note: --match-training adopted --temperature 0.9 (args.json: temperature)", "note: a note"]


def test_nothing_found_prints_only_the_note(capsys):
    render_parity({"trainer": None, "files": [], "rows": [], "adopted": [], "not_adopted": [],
                   "notes": ["no training configuration found beside the checkpoint (looked for x in y)"]})
    assert capsys.readouterr().err == "note: no training configuration found beside the checkpoint (looked for x in y)\n"
