"""The fidelity files (reproductions/fidelity/NN_name.md), their counts.csv, the report's table."""

import json
from pathlib import Path

import pytest

from agentrl_lib.pipeline.fidelity import (
    COLUMNS, parse_header, read_counts, table_rows, write_counts)
from agentrl_lib.pipeline.report import build_report

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "reproductions" / "fidelity"
HEAD = ("---\nnotebook: 99_x\npaper_ids: x\ncode_repository:\nitems: 3\n"
        "checked_against_code: 1\nchecked_against_text_only: 1\nunverifiable: 0\n"
        "matches: 1\npartly: 1\ndiffers: 1\n---\n# Fidelity: 99_x\n\n## Items\n\n"
        "| item | ours | source | matches? | impact |\n|---|---|---|---|---|\n"
        "| 1. a | b | c | yes | – |\n| 2. a \\| b | b | c | partly | – |\n| 3. a | b | c | no | – |\n"
        "\n## Counts\n3 items.\n")


def test_parse_header_and_table_rows():
    h = parse_header(HEAD)
    assert h["notebook"] == "99_x" and h["code_repository"] == "" and h["differs"] == 1
    assert table_rows(HEAD) == h["items"] == 3
    with pytest.raises(ValueError, match="more than"):
        parse_header(HEAD.replace("matches: 1", "matches: 2"))
    with pytest.raises(ValueError, match="header"):
        parse_header("# no header\n")


def test_write_and_read_counts(tmp_path):
    (tmp_path / "99_x.md").write_text(HEAD)
    (tmp_path / "README.md").write_text("not a notebook's file")
    rows = read_counts(write_counts(tmp_path))
    assert list(rows) == ["99_x"] and rows["99_x"]["items"] == 3
    assert (tmp_path / "counts.csv").read_text().splitlines()[0] == ",".join(COLUMNS)
    assert read_counts(tmp_path / "missing.csv") == {}


def test_committed_files_agree(tmp_path):
    """Every notebook has a fidelity file whose header counts its Items table, and the committed
    counts.csv is what write_counts makes of the files (regenerate it after an edit)."""
    files = sorted(FOLDER.glob("[0-9][0-9]_*.md"))
    assert [p.stem for p in files] == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    for p in files:
        text = p.read_text(encoding="utf-8")
        assert parse_header(text)["notebook"] == p.stem
        assert table_rows(text) == parse_header(text)["items"], p.name
    for p in files:
        (tmp_path / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    assert write_counts(tmp_path).read_text() == (FOLDER / "counts.csv").read_text()


def test_report_shows_fidelity_counts(tmp_path):
    run = tmp_path / "runs" / "cpu" / "22_barfi" / "seed0"
    run.mkdir(parents=True)
    claim = {"id": "c", "statement": "s", "metric": "m", "ours": 2.0, "baseline": 1.0,
             "direction": ">", "paper_value": None, "holds": True}
    (run / "results.json").write_text(json.dumps(
        {"notebook": "22_barfi", "profile": "cpu", "seed": 0, "title": "BARFI", "paper": {},
         "claims": [claim]}))
    info = build_report(tmp_path / "runs", tmp_path / "report", notebooks=False,
                        fidelity_csv=FOLDER / "counts.csv")
    page = info["html"].read_text()
    line = "fidelity: checked against code 5 / text 5 / unverifiable 0 / differs 0 (of 11 items)"
    assert line in page and "<h2>Fidelity to the papers</h2>" in page
    assert "<tr><td>71_bcoder</td><td>11</td><td>1</td><td>10</td>" in page
    md = info["markdown"].read_text()
    assert "| 22_barfi | 11 | 5 | 5 | 0 | 6 | 4 | 0 |" in md
    plain = build_report(tmp_path / "runs", tmp_path / "r2", notebooks=False)
    assert "Fidelity" not in plain["html"].read_text()


def test_every_notebook_has_its_fidelity_cell():
    """One cell 'Fidelity: taken from the paper, from the code, inferred' before the exercises,
    with the counts of counts.csv and a link to the notebook's fidelity file."""
    counts = read_counts(FOLDER / "counts.csv")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        texts = ["".join(c["source"]) for c in cells]
        (i,) = [k for k, t in enumerate(texts)
                if t.startswith("## Fidelity: taken from the paper, from the code, inferred")]
        assert "Exercises" in texts[i + 1].splitlines()[0], path.name
        f = counts[path.stem]
        assert f"matches {f['matches']}, partly {f['partly']}, differs {f['differs']}" in texts[i]
        assert f"(../reproductions/fidelity/{path.stem}.md)" in texts[i]
