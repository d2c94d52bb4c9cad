"""What the terminal prints of user text (ids, paths, messages): as written, whatever markup or emoji codes it holds."""


def _stderr_of(capsys, fn, *args):
    from vlmfast.report import terminal

    getattr(terminal, fn)(*args)  # its console writes to sys.stderr as it is at each write: pytest's capture
    return capsys.readouterr().err


def test_ids_and_paths_with_emoji_codes_and_markup_stay_as_written(capsys):
    note = "2 of 6 row id(s) are not in val.jsonl (coco:train:000123, q:a:1, [bold]x[/]): left unscored"
    assert _stderr_of(capsys, "render_note", note).strip() == f"note: {note}"


def test_an_error_names_its_file_as_written(capsys):
    from vlmfast.errors import UsageError

    said = _stderr_of(capsys, "render_error", UsageError("cannot read data/cat:dog:1.png", hint="check :car: [/]"))
    assert "data/cat:dog:1.png" in said and "check :car: [/]" in said
