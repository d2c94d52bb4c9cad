"""A VLMEvalKit TSV's cells as the text its prompts print them with: pandas' ``read_csv(sep="\\t")`` (how
VLMEvalKit loads the file, vlmeval/smp/file.py ``load``) reads some cells as missing and gives each
column a type, and the prompt is then written with f-strings (vlmeval/dataset/image_mcq.py
``ImageMCQDataset.build_prompt``, VLMEvalKit e8e78f0).

- **Missing**: a cell spelled exactly as one of pandas' default NA strings (:data:`NA_VALUES`,
  pandas/_libs/parsers.pyx ``STR_NA_VALUES``, pandas 2.x and 3.x); a blank or whitespace-only cell that is not
  empty is text.
- **Numbers**: a column whose present cells are all integers (spaces around them allowed) is int64 and prints
  them as ``int`` does (``007`` → ``7``); with a missing cell it is float64 and prints ``4.0``. A column of
  integers and decimals (``1e3``, ``.5``, ``inf``) is float64 (``1000.0``, ``0.5``, ``inf``).
- **Booleans**: a column of only ``True``/``TRUE``/``true``/``False``/``FALSE``/``false`` prints ``True``/``False``.
- Any other column is text, printed as it is. Integers beyond int64 are kept as text (pandas makes them
  uint64 or objects, with quirks not reproduced here).

Standard library only: no pandas.
"""

from __future__ import annotations

import re

# pandas/_libs/parsers.pyx STR_NA_VALUES (pandas 2.2 and 3.1 alike)
NA_VALUES = frozenset({
    "-1.#IND", "1.#QNAN", "1.#IND", "-1.#QNAN", "#N/A N/A", "#N/A", "N/A", "n/a", "NA", "<NA>", "#NA", "NULL",
    "null", "NaN", "-NaN", "nan", "-nan", "None", "",
})
TRUE_VALUES = frozenset({"True", "TRUE", "true"})  # pandas/_libs/parsers.pyx _true_values
FALSE_VALUES = frozenset({"False", "FALSE", "false"})

_INT = re.compile(r"[ ]*[+-]?[0-9]+[ ]*")
_FLOAT = re.compile(r"[ ]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ ]*|[+-]?(inf|infinity)", re.IGNORECASE)
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def is_missing(cell: str | None) -> bool:
    """Whether pandas reads the cell as NaN (an absent cell, as in a short row, too)."""
    return cell is None or cell in NA_VALUES


def column_kind(cells) -> str:
    """``"int"``, ``"float"``, ``"bool"`` or ``"text"``: the type pandas gives a column of these cells."""
    present = [c for c in cells if not is_missing(c)]
    gap = len(present) < len(cells)
    if not present:
        return "float"  # all NaN: nothing of it is printed
    if all(_INT.fullmatch(c) and _INT64[0] <= int(c) <= _INT64[1] for c in present):
        return "float" if gap else "int"
    if all(_FLOAT.fullmatch(c) for c in present) and not any(_INT.fullmatch(c) and not _INT64[0] <= int(c) <= _INT64[1]
                                                                 for c in present):
        return "float"
    if all(c in TRUE_VALUES or c in FALSE_VALUES for c in present):
        return "bool"
    return "text"


def shown(cell: str | None, kind: str) -> str | None:
    """The cell as VLMEvalKit's f-strings print it (None: missing)."""
    if is_missing(cell):
        return None
    if kind == "int":
        return str(int(cell))
    if kind == "float":
        return repr(float(cell.strip()))
    if kind == "bool":
        return str(cell in TRUE_VALUES)
    return cell


def printed(rows: list[dict], columns) -> list[dict]:
    """Each row's ``columns`` as VLMEvalKit prints them (None where missing), each column typed over all rows."""
    kinds = {c: column_kind([row.get(c) for row in rows]) for c in columns}
    return [{c: shown(row.get(c), kinds[c]) for c in columns} for row in rows]
