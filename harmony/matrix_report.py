"""The matrix report: the cards of every cell side by side (questions x cells), the answers that
differ between cells one axis apart, links to each cell's own report, and the cells that failed
with their reasons.

The cards are :func:`harmony.analysis.compare.compare`'s, over the cells' directories (each a
suite directory): the same answers, kinds and marks ``harmony compare CELL CELL ...`` gives.
:func:`df_matrix_answers` is the table; :func:`write_report` writes ``report.md``,
``report.html`` (a page that stands alone, one colour per answer) and ``report.json`` in the
matrix directory.
"""

from __future__ import annotations

import hashlib
import html
import itertools
from pathlib import Path

import pandas as pd

from harmony import store

#: the axes a cell is placed on: two cells one axis apart are compared pairwise
AXES = ("kernel", "scheduler", "topology")
#: how an answer's state is marked in a cell of the table
STATE_MARKS = {"decided": "", "varies": " ~", "undecided": " ?", "": ""}
PALETTE = ("#cfe8ff", "#ffe1c4", "#d6f5d6", "#f3d1f4", "#fff3b0", "#d9d9f9", "#ffd6d6",
           "#d0f0ef", "#eadcc8", "#e0e0e0")


def matrix_cells(out: Path) -> tuple[dict, list[dict]]:
    """(matrix.json's record, one dict per cell of the plan: its cell fields, ``state`` and
    ``dir`` (the cell's directory, or None when it did not finish))."""
    record = store.read_json(Path(out) / "matrix.json")
    states = record.get("cells_state") or {}
    cells = []
    for c in record.get("cells", []):
        d = Path(out) / "cells" / c["id"]
        cells.append({**c, "state": states.get(c["id"], "not run"),
                      "dir": d if (d / "cell.json").is_file() else None})
    return record, cells


def df_matrix_answers(out: Path) -> pd.DataFrame:
    """The answers of every finished cell, one row per question and cell. Columns: qid,
    question, thesis, cell (its id), kernel, scheduler, topology (str), label (the answer),
    kind (the label without the number it quotes), decided (bool), state (decided | varies |
    undecided | ""), differs (bool: the cells' answers to this question are not all of one
    kind). Empty when no cell finished."""
    from harmony.analysis import compare, policy

    _, cells = matrix_cells(out)
    done = [c for c in cells if c["dir"] is not None]
    if not done:
        return pd.DataFrame(columns=["qid", "question", "thesis", "cell", "kernel", "scheduler",
                                     "topology", "label", "kind", "decided", "state", "differs"])
    if len(done) > 1:
        df = compare.df_compare(compare.compare([str(c["dir"]) for c in done]))
    else:
        card = policy.infer([done[0]["dir"]])
        cmp = compare.Comparison([str(done[0]["dir"])], [card], [[]], [None])
        df = compare.df_compare(cmp)
    by_dir = {str(c["dir"]): c for c in done}
    df["cell"] = df["source"].map(lambda s: by_dir[s]["id"])
    for axis in AXES:
        df[axis] = df["source"].map(lambda s, a=axis: str(by_dir[s][a]))
    return df[["qid", "question", "thesis", "cell", "kernel", "scheduler", "topology", "label",
               "kind", "decided", "state", "differs"]].reset_index(drop=True)


def pair_differences(df: pd.DataFrame) -> list[dict]:
    """For each pair of cells one axis apart (the same kernel and topology, another scheduler:
    ...), the questions whose answers are of different kinds; ``beyond_noise`` where both are
    decided (what ``harmony compare --fail-on-difference`` fails on)."""
    if df.empty:
        return []
    cells = df.drop_duplicates("cell").set_index("cell")[list(AXES)]
    out = []
    for a, b in itertools.combinations(cells.index, 2):
        apart = [x for x in AXES if cells.at[a, x] != cells.at[b, x]]
        if len(apart) != 1:
            continue
        left = df[df["cell"] == a].set_index("qid")
        right = df[df["cell"] == b].set_index("qid")
        for qid in left.index:
            la, rb = left.loc[qid], right.loc[qid]
            if la["kind"] != rb["kind"]:
                out.append({"a": a, "b": b, "axis": apart[0], "qid": qid, "label_a": la["label"],
                            "label_b": rb["label"],
                            "beyond_noise": bool(la["decided"] and rb["decided"])})
    return out


def _table(df: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
    """Questions x cells: each answer with its state's mark."""
    marked = df.assign(text=df["label"] + df["state"].map(lambda s: STATE_MARKS.get(s, "")))
    t = marked.pivot(index="qid", columns="cell", values="text")
    return t.loc[list(dict.fromkeys(df["qid"])), ids]


def report_dict(out: Path, df: pd.DataFrame | None = None) -> dict:
    """What the report says, as data (report.json); ``df``: :func:`df_matrix_answers`'s table,
    if it was made already."""
    record, cells = matrix_cells(out)
    df = df_matrix_answers(out) if df is None else df
    questions = []
    for qid, rows in df.groupby("qid", sort=False):
        questions.append({"qid": qid, "question": rows["question"].iloc[0],
                          "differs": bool(rows["differs"].iloc[0]),
                          "answers": {r.cell: {"label": r.label, "kind": r.kind,
                                               "state": r.state, "decided": bool(r.decided)}
                                      for r in rows.itertuples()}})
    return {"name": record.get("name"), "status": record.get("status"),
            "cells": [{k: (str(v) if k == "dir" and v is not None else v) for k, v in c.items()}
                      | {"report": f"cells/{c['id']}/report.html" if c["dir"] else None}
                      for c in cells],
            "questions": questions, "differences": pair_differences(df),
            "failures": record.get("failures", [])}


def _markdown(rep: dict, df: pd.DataFrame) -> str:
    done = [c for c in rep["cells"] if c["dir"]]
    ids = [c["id"] for c in done]
    lines = [f"# Matrix {rep['name']}: {len(done)} of {len(rep['cells'])} cells complete", "",
             "| cell | kernel | scheduler | topology | state | report |",
             "|---|---|---|---|---|---|"]
    for c in rep["cells"]:
        link = f"[report](cells/{c['id']}/report.md)" if c["dir"] else ""
        lines.append(f"| {c['id']} | {c['kernel']} | {c['scheduler']} | {c['topology']} | "
                     f"{c['state']} | {link} |")
    if ids:
        t = _table(df, ids)
        lines += ["", "## The cards side by side", "",
                  "Each cell's answer; ` ?` not decided yet, ` ~` the runs vary; * the cells' "
                  "answers are of different kinds.", "",
                  "| question | " + " | ".join(ids) + " |", "|---|" + "---|" * len(ids)]
        differs = df.groupby("qid", sort=False)["differs"].first()
        for qid in t.index:
            lines.append(f"| {qid}{' *' if differs[qid] else ''} | "
                         + " | ".join(str(t.at[qid, i]) for i in ids) + " |")
    if rep["differences"]:
        lines += ["", "## Cells one axis apart whose answers differ", "",
                  "| cells | apart in | question | answers | beyond noise |",
                  "|---|---|---|---|---|"]
        for d in rep["differences"]:
            lines.append(f"| {d['a']} / {d['b']} | {d['axis']} | {d['qid']} | {d['label_a']} / "
                         f"{d['label_b']} | {'yes' if d['beyond_noise'] else 'no'} |")
        lines += ["", "`harmony compare cells/A cells/B` sets their metrics side by side, with "
                      "their noise."]
    if rep["failures"]:
        lines += ["", "## Cells that did not finish", ""]
        lines += [f"- {f['cell']}: {f['error']}" for f in rep["failures"]]
    return "\n".join(lines) + "\n"


def _colour(kind: str) -> str:
    return PALETTE[int(hashlib.sha1(kind.encode()).hexdigest(), 16) % len(PALETTE)]


def _html(rep: dict, df: pd.DataFrame) -> str:
    done = [c for c in rep["cells"] if c["dir"]]
    e = html.escape
    head = "".join(f"<th><a href='cells/{e(c['id'])}/report.html'>{e(c['id'])}</a></th>"
                   for c in done)
    rows = []
    for q in rep["questions"]:
        tds = []
        for c in done:
            a = q["answers"].get(c["id"])
            if a is None:
                tds.append("<td></td>")
                continue
            mark = STATE_MARKS.get(a["state"], "")
            tds.append(f"<td style='background:{_colour(a['kind'])}'>{e(a['label'] + mark)}</td>")
        rows.append(f"<tr><th title='{e(q['question'])}'>{e(q['qid'])}"
                    f"{' *' if q['differs'] else ''}</th>{''.join(tds)}</tr>")
    fails = "".join(f"<li>{e(f['cell'])}: {e(f['error'])}</li>" for f in rep["failures"])
    return ("<!doctype html><meta charset='utf-8'><title>Matrix " + e(str(rep["name"]))
            + "</title><style>body{font-family:sans-serif}td,th{border:1px solid #aaa;"
            "padding:4px 8px;text-align:left}table{border-collapse:collapse}</style>"
            f"<h1>Matrix {e(str(rep['name']))}: {len(done)} of {len(rep['cells'])} cells "
            "complete</h1><p>One colour per kind of answer; ? not decided yet, ~ the runs vary, "
            "* the cells' answers differ in kind.</p>"
            f"<table><tr><th>question</th>{head}</tr>{''.join(rows)}</table>"
            + (f"<h2>Cells that did not finish</h2><ul>{fails}</ul>" if fails else ""))


def write_report(out: Path) -> list[Path]:
    """Write report.md, report.html and report.json in the matrix directory ``out``; returns
    their paths."""
    out = Path(out)
    df = df_matrix_answers(out)
    rep = report_dict(out, df)
    paths = [out / "report.md", out / "report.html", out / "report.json"]
    store.atomic_write(paths[0], _markdown(rep, df))
    store.atomic_write(paths[1], _html(rep, df))
    store.write_json(paths[2], rep)
    return paths
