"""Fidelity counts: how many details of each notebook were checked against the paper's code, its
text only, or could not be checked, and how many match.

Each ``reproductions/fidelity/NN_name.md`` opens with a header block the research wrote by hand
(the prose counts below it are free-form, so the header is the one machine-read place):

    ---
    notebook: 22_barfi
    paper_ids: barfi                 catalog ids, '; '-separated (empty for a foundation notebook)
    code_repository:                 owner/name read or linked, '; '-separated (empty: none found)
    items: 10                        rows of the file's Items table
    checked_against_code: 0
    checked_against_text_only: 7
    unverifiable: 2                  items - code - text - unverifiable = n/a (our own design)
    matches: 3
    partly: 3
    differs: 2                       the rest of the items have no verdict (unverifiable or n/a)
    ---

``write_counts`` gathers the headers into ``counts.csv``; the report reads it with ``read_counts``.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

COLUMNS = ["notebook", "paper_ids", "code_repository", "items", "checked_against_code",
           "checked_against_text_only", "unverifiable", "matches", "partly", "differs"]
NUMBERS = COLUMNS[3:]


def parse_header(text: str) -> dict:
    """The header block of one fidelity file as a dict (numbers as int), checked for sense.

    >>> h = parse_header("---\\nnotebook: 01_x\\npaper_ids:\\ncode_repository: a/b\\nitems: 3\\n"
    ...                  "checked_against_code: 1\\nchecked_against_text_only: 1\\n"
    ...                  "unverifiable: 1\\nmatches: 1\\npartly: 1\\ndiffers: 0\\n---\\n# x\\n")
    >>> h["code_repository"], h["items"], h["paper_ids"]
    ('a/b', 3, '')
    """
    m = re.match(r"---\n(.*?)\n---\n", text, flags=re.S)
    if not m:
        raise ValueError("no header block (--- ... ---) at the top")
    head = dict(line.split(":", 1) for line in m.group(1).splitlines())
    row = {k: head[k].strip() for k in COLUMNS}
    row.update({k: int(row[k]) for k in NUMBERS})
    if row["checked_against_code"] + row["checked_against_text_only"] + row["unverifiable"] \
            > row["items"] or row["matches"] + row["partly"] + row["differs"] > row["items"]:
        raise ValueError(f"{row['notebook']}: counts add up to more than its {row['items']} items")
    return row


def table_rows(text: str) -> int:
    """Number of item rows in the file's '## Items' table (the header and rule rows excluded)."""
    body = text.split("## Items", 1)[1].split("\n## ", 1)[0]
    return sum(1 for line in body.splitlines()
               if line.startswith("|") and not line.startswith(("| item", "|---")))


def write_counts(folder: Path | str = "reproductions/fidelity") -> Path:
    """``<folder>/counts.csv``: one row per ``NN_name.md`` header, in notebook order."""
    folder = Path(folder)
    rows = [parse_header(p.read_text(encoding="utf-8"))
            for p in sorted(folder.glob("[0-9][0-9]_*.md"))]
    path = folder / "counts.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_counts(path: Path | str) -> dict[str, dict]:
    """{notebook: row} from ``counts.csv`` (numbers as int); {} when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        return {r["notebook"]: {**r, **{k: int(r[k]) for k in NUMBERS}} for r in csv.DictReader(f)}
