"""A VLMEvalKit TSV's cells and prompts as VLMEvalKit prints them (pandas' missing cells and column types),
and what a file that cannot be read says: expected texts are what VLMEvalKit e8e78f0 with pandas 3.1 gives
for the same files (its ImageBaseDataset loading and ImageMCQDataset.build_prompt run on them)."""

import pytest

PNG = ("iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKUlEQVR4nO3NMQEAAAjDMAb+PWMCvlRAk/TUZ/16BwAAAAAAAAAAAIct2"
       "OEARiJ/pmcAAAAASUVORK5CYII=")
TAIL = "Please select the correct answer from the options above. \n"


def _read(tmp_path, lines, name="set.tsv", **kwargs):
    from vlmfast.inputs.requests import read_manifest

    tsv = tmp_path / name
    tsv.write_bytes(lines if isinstance(lines, bytes) else "".join(lines).encode("utf-8"))
    return read_manifest(str(tsv), None, **kwargs)[0]


def test_pandas_missing_spellings_and_column_types_shape_the_prompt(tmp_path):
    head = "index\tquestion\thint\tA\tB\tC\tD\tanswer\timage\n"
    items = _read(tmp_path, [
        head,
        f"1\tNumbers?\t \t1\t007\t3\t4\tC\t{PNG}\n",  # C and D have gaps below: float; A and B do not: int
        f"2\tSpelled missing\tNULL\t5\t6\t#N/A\t<NA>\tA\t{PNG}\n",
        f"3\tNone at all\tn/a\t-1\t+2\tNone\t-nan\tA\t{PNG}\n",
    ])
    assert [r.prompt for r in items] == [
        "Hint:  \nQuestion: Numbers?\nOptions:\nA. 1\nB. 7\nC. 3.0\nD. 4.0\n" + TAIL,  # a blank hint is text to pandas
        "Question: Spelled missing\nOptions:\nA. 5\nB. 6\n" + TAIL,
        "Question: None at all\nOptions:\nA. -1\nB. 2\n" + TAIL,
    ]


def test_a_multiple_choice_file_s_row_without_options_is_still_its_multiple_choice_prompt(tmp_path):
    items = _read(tmp_path, ["index\tquestion\tA\tB\tanswer\timage\n", f"1\tOpen?\tNA\t\tblue\t{PNG}\n",
                             f"2\t\tx\ty\tA\t{PNG}\n"])
    assert [(r.prompt, r.scorer) for r in items] == [
        ("Question: Open?\n", "choice"), ("Question: nan\nOptions:\nA. x\nB. y\n" + TAIL, "choice")]


def test_a_file_without_options_sends_the_question_as_it_is(tmp_path):
    items = _read(tmp_path, ["index\tquestion\tanswer\timage\n", f"1\tWhat colour?\tblue\t{PNG}\n"])
    assert [(r.prompt, r.scorer, r.truth) for r in items] == [("What colour?", None, "blue")]


@pytest.mark.parametrize("cells, printed", [
    (["True", "false"], ["True", "False"]), (["1e3", ".5"], ["1000.0", "0.5"]), (["inf", "2"], ["inf", "2.0"]),
    ([" 4 ", "5"], ["4", "5"]), (["1_000", "2"], ["1_000", "2"]), (["4", "  "], ["4", "  "]),
    (["9223372036854775808", "1"], ["9223372036854775808", "1"]), (["nan", "NaN"], [None, None]),
])
def test_a_column_prints_as_pandas_types_it(cells, printed):
    from vlmfast.inputs.tsv_cells import column_kind, shown

    kind = column_kind(cells)
    assert [shown(c, kind) for c in cells] == printed


def test_an_image_cell_naming_no_row_says_so(tmp_path):
    items = _read(tmp_path, ["index\tquestion\tA\tB\tanswer\timage\n", f"1\tQ1\tx\ty\tA\t{PNG}\n",
                             "2\tQ2\tx\ty\tB\t99\n", "3\tQ3\tx\ty\tB\t2\n"])
    assert [str(p).split(": ", 1)[1] for r in items[1:] for p in r.problems] == [
        "the image cell '99' names no row: no row has index 99 (a cell of up to 64 characters is the index of the row "
        "holding the image, as MMBench writes a repeated one)",
        "the image cell '2' names row 2, which holds no image of its own (VLMEvalKit asserts it does)"]
    assert [r.id for r in _read(tmp_path, ["index\tquestion\tanswer\timage\n", "2\tQ2\tB\t99\n"], "s.tsv",
                                images=False)] == ["2"]  # reading the truths only: no image is looked at


@pytest.mark.parametrize("lines, message, hint", [
    (["index\tquestion\tA\tB\tanswer\timage\n", f"1\tQ1\tx\ty\tA\t{PNG}\n", f"2\tQ2\tx\ty\tB\t{PNG}\textra\n"],
     "set.tsv:3: 7 fields where the header has 6: a tab too many in the row?", "a tab inside a cell splits it"),
    ("index\tquestion\tanswer\timage\n1\tok\tA\tx\n2\tCaf\xe9?\tA\tx\n".encode("latin-1"),
     "set.tsv:3: not UTF-8 text (byte 0xe9 at byte 6 of line 3)", "VLMEvalKit reads TSVs as UTF-8"),
    (["index\tquestion\tanswer\timage_path\n", "1\tQ?\tA\tp.png\n"],
     "names its images by image_path only (no image column)", "write a JSONL manifest instead"),
])
def test_a_file_that_cannot_be_read_says_where_and_why(tmp_path, lines, message, hint):
    from vlmfast.errors import InputError

    with pytest.raises(InputError) as caught:
        _read(tmp_path, lines)
    assert message in str(caught.value) and caught.value.hint.startswith(hint)
    assert "a quote (\") at the start" not in caught.value.hint

