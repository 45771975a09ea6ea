"""How many runs each question of the card took, and how many ended decided or varies, in suites
run with ``harmony suite --until-decided``.

Reads each SUITE directory given (its suite.json's ``until_decided`` record and the card of its
runs, :func:`harmony.analysis.policy.infer`) and prints

- per configuration and question (the loop's unit): the runs the configuration ended with, the
  runs whose vote counted (with a label, on a quiet host), the state and the leading label's votes;
- per question of the suite's card: its state, label, the votes and runs of every
  configuration's runs pooled, and how the card reached it ("pooled", or "per configuration":
  the pooled vote undecided, each configuration's own settled,
  :func:`harmony.analysis.sequential.by_configuration`);
- the share of the questions (those with evidence) that ended decided or varies: on the card, and
  per configuration within the cap; the runs planned, added and the rounds; the wall time.

Target (issue 46): every question decided or varies within the cap. Reads results only: no root,
nothing measured (the suites are, with their own commands).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from harmony import store  # noqa: E402
from harmony.analysis import policy  # noqa: E402


def summarise(suite: Path) -> dict:
    """The figures of one suite (see the module's docstring); RunError for a directory that is not
    a suite run until decided."""
    record = store.read_json(suite / "suite.json")
    ud = record.get("until_decided") or {}
    if not ud.get("configs"):
        raise store.RunError(f"{suite}: not a suite run with --until-decided")
    rows = []
    for config, r in ud["configs"].items():
        for qid, q in ((r or {}).get("questions") or {}).items():
            rows.append({"config": config, "qid": qid, "runs": r["runs"], "counted": q["runs"],
                         "state": q["state"], "label": q["label"], "votes": q["votes"]})
    card = policy.infer([suite])
    answers = [{"qid": a.qid, "state": a.state, "label": a.label,
                "votes": (a.confidence or {}).get("votes"),
                "runs": (a.confidence or {}).get("runs"),
                "path": (a.confidence or {}).get("path")}
               for a in card.answers if a.label is not None]
    settled = [a for a in answers if a["state"] in ("decided", "varies")]
    config_settled = [r for r in rows if r["state"] in ("decided", "varies")]
    host = record.get("under_test") or record.get("host") or {}
    return {"suite": str(suite), "kernel": host.get("kernel"), "scheduler": host.get("scheduler"),
            "cpus": len(record.get("cpus") or []), "wall_s": record.get("wall_s"),
            "runs": record.get("runs"), "added": ud.get("added_runs"), "rounds": ud.get("rounds"),
            "max_repeat": ud.get("max_repeat"), "per_config": rows, "card": answers,
            "card_settled": [len(settled), len(answers)],
            "config_settled": [len(config_settled), len(rows)],
            "skipped": len(card.skipped)}


def show(s: dict) -> None:
    print(f"\n{s['suite']}: {s['kernel']}, {s['scheduler']}, {s['cpus']} CPUs; {s['runs']} runs "
          f"({s['added']} added in {s['rounds']} rounds, at most {s['max_repeat']} a "
          f"configuration; {s['skipped']} not used), {s['wall_s'] or 0:.0f} s wall")
    common.table(["configuration", "question", "runs", "counted", "state", "votes"],
                 [[r["config"], r["qid"], r["runs"], r["counted"], r["state"],
                   f"{r['label']} {r['votes']}/{r['counted']}"] for r in s["per_config"]])
    print()
    common.table(["card: question", "state", "by", "answer", "votes pooled"],
                 [[a["qid"], a["state"] or "", a["path"] or "", (a["label"] or "")[:100],
                   "" if a["votes"] is None else f"{a['votes']}/{a['runs']}"] for a in s["card"]])
    n, of = s["card_settled"]
    m, mof = s["config_settled"]
    print(common.verdict("every question decided or varies within the cap", n == of,
                         f"card {n} of {of}; per configuration {m} of {mof}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suites", nargs="+", metavar="SUITE", type=Path,
                    help="suite directories run with --until-decided")
    ap.add_argument("--json", help="write the results as JSON (- = stdout)")
    args = ap.parse_args()
    out = []
    for suite in args.suites:
        try:
            out.append(summarise(suite))
        except store.RunError as exc:
            ap.exit(2, f"{ap.prog}: error: {exc}\n")
        show(out[-1])
    common.emit_json(args.json, {"suites": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
