"""What the commands print by default: a screen, not a log.

A screen holds the key numbers, the answer and where the files are; ``-v`` (``--verbose``) prints
the details as well (every parameter, measurement fact, note and metric). The words are the
library's (:mod:`harmony.analysis.report`, :mod:`harmony.analysis.policy`,
:mod:`harmony.analysis.trust`); here they are chosen, laid out for the terminal's width, and
marked for colour (:func:`harmony.cli.common.style`: answers in bold, doubts as warnings).
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

from harmony.cli.common import echo, plural, print_json, style

#: the width a screen is laid out for when the output is not a terminal (a file, a pipe)
PIPED_WIDTH = 120


def width() -> int:
    """The terminal's width, or PIPED_WIDTH when stdout is not a terminal."""
    if not sys.stdout.isatty():
        return PIPED_WIDTH
    return max(60, shutil.get_terminal_size((PIPED_WIDTH, 24)).columns)


def wrap(text: str, indent: str = "", hanging: str = "    ") -> list[str]:
    """``text`` wrapped to the screen (never cut), continuation lines indented by ``hanging``."""
    return textwrap.wrap(text, width() - 1, initial_indent=indent,
                         subsequent_indent=indent + hanging, break_on_hyphens=False) or [indent]


# --- the policy card ------------------------------------------------------------------------

def answer_words(a) -> str:
    """An answer in a few words: its label (bold), how sure the runs' vote is, or what would
    answer it."""
    from harmony.analysis.policy import UNDECIDED, is_varies

    if a.label is None:
        why = a.why_not or (f"{a.needs} would answer it" if a.needs else "")
        return "no evidence" + (f" ({why})" if why else "")
    c = a.confidence or {}
    votes = (f"{c.get('votes')} of {plural(c.get('runs') or 0, 'run')}" if c.get("runs")
             else "")
    if a.label == UNDECIDED:
        agree = ", ".join(f"{k} {v}" for k, v in a.agreement.items())
        return f"{style(a.label, 'warning')} (the runs disagree: {agree})"
    if is_varies(a.label):
        return style(a.label, "warning")
    if a.decided:
        return style(a.label, "answer") + (f" (decided: {votes})" if votes else "")
    more = c.get("more")
    return (style(a.label, "answer") + f" (not decided yet: {votes}"
            + (f"; {plural(more, 'more run')} could settle it" if more else "") + ")")


def card_screen(card, verbose: bool = False) -> str:
    """The card: each question and its answer; ``verbose``: the card's every line (numbers,
    thresholds, runs not used), the answers marked."""
    head = card.head_lines()
    if verbose:
        body = card.text().splitlines()[1:]
        return "\n".join(head + [style(line, "answer") if line.startswith("   answer:") else line
                                 for line in body]).rstrip() + "\n"
    out = head + [""]
    for i, a in enumerate(card.answers, 1):
        out += wrap(f"{i}. {a.question}", hanging="   ")
        out += wrap(answer_words(a), indent="   ")
    if card.skipped:
        out += ["", f"{plural(len(card.skipped), 'run')} not used (-v lists them and why)"]
    return "\n".join(out).rstrip() + "\n"


def answers_of_run(card) -> list[str]:
    """The answers one run gives alone (the questions its experiment informs)."""
    return [line for i, a in enumerate(card.answers, 1) if a.label is not None
            for line in wrap(f"{a.question} {answer_words(a)}", indent="  ")]


# --- a run ----------------------------------------------------------------------------------

def doubts(manifest: dict) -> list[str]:
    """The run's notes that lessen trust in it (:func:`harmony.analysis.trust.is_doubt`)."""
    from harmony.analysis.trust import is_doubt

    kinds = manifest.get("trust_notes") or []
    words = manifest.get("notes") or []
    if len(kinds) != len(words):        # an older run: every note counts
        return list(words)
    # a simulation's recorder is the simulator: its words say what the run is
    simulated = bool(manifest.get("simulated"))
    return [w for n, w in zip(kinds, words)
            if is_doubt(n) and not (simulated and n.get("kind") == "recorder")]


def measurement_line(m: dict) -> str:
    """How far the run can be trusted, in one line."""
    host = m.get("under_test") or m.get("host") or {}
    lost = m.get("lost_events", -1)
    fl = (m.get("foreign_load") or {}).get("max_frac")
    parts = [f"{host.get('kernel', '?')} / {host.get('scheduler', '?')}",
             f"{m.get('probe')} probe",
             "lost events unknown" if lost is None or lost < 0 else
             style(plural(lost, "event") + " lost", "warning") if lost else "no event lost"]
    if fl is not None:
        parts.append(f"foreign load {fl:.1%} at most")
    return "measurement: " + ", ".join(parts)


def files_lines(path: Path, report: Path | None, figures: list[Path],
                deferred: bool = False) -> list[str]:
    """Where the run's files are: the run, its report (``report``: the directory report.md is
    in, None if there is none), its figures (``deferred``: not drawn yet, and how to)."""
    out = [f"run: {path}"]
    if report is not None:
        out.append(f"report: {report / 'report.md'} and {report / 'report.html'}")
    if deferred:
        out.append(f"figures: not drawn (`harmony report {path}` draws them)")
    elif figures:
        parents = {p.parent for p in figures}
        out += wrap(f"figures: {parents.pop()}/ " + ", ".join(p.name for p in figures)
                    if len(parents) == 1 else "figures: " + ", ".join(map(str, figures)),
                    hanging="  ")
    return out


def run_screen(run, verbose: bool = False, report: Path | None = None,
               figures: list[Path] | None = None) -> str:
    """A complete run: its question and key numbers, the answers it gives alone, its doubts,
    and where its files are (``report``: the directory report.md was written in, None if none
    was; ``figures``: those on disk); ``verbose``: every parameter, measurement fact and note
    (:func:`harmony.analysis.report.summary_text`)."""
    from harmony.analysis.policy import infer
    from harmony.analysis.report import figures_on_disk, summary_text
    from harmony.experiments import experiment_of

    figures = figures if figures is not None else [run.path / f for f in figures_on_disk(run)[0]]
    deferred = bool(run.manifest.get("figures_deferred"))
    if verbose:
        text = summary_text(run).split("\nfigures\n")[0]
        return "\n".join([text, ""] + files_lines(run.path, report, figures, deferred))
    m = run.manifest
    exp = experiment_of(run)
    out = [style(f"{exp.name}: {exp.question}", "heading")]
    out += ["  " + line for line in exp.describe(run.summary)]
    answers = answers_of_run(infer([run.path]))
    if answers:
        out += ["", "answers of this run alone (harmony infer pools runs):"] + answers
    out += ["", measurement_line(m)]
    warned = doubts(m)
    for line in warned:
        out += wrap(f"{style('warning:', 'warning')} {line}", hanging="  ")
    more = len(m.get("notes") or []) - len(warned)
    if more > 0:
        out.append(f"({plural(more, 'more note')}: harmony report {run.path})")
    return "\n".join(out + [""] + files_lines(run.path, report, figures, deferred))


def incomplete_screen(facts: dict) -> str:
    """What an incomplete run captured (:func:`harmony.results.captured`), marked as such."""
    from harmony.cli.common import what_can_be_done
    from harmony.core.errors import IncompleteRun

    out = [style(f"INCOMPLETE RUN {facts['path']}: {facts['why']}", "warning"),
           "what it captured, not a result of the experiment:", "",
           f"experiment: {facts['experiment']}"]
    out += wrap("parameters: " + ", ".join(f"{k}={v}" for k, v in facts["params"].items()),
                hanging="  ")
    if facts.get("vm"):             # the VM's facts, its death among them
        from harmony.analysis.report import vm_lines

        for line in vm_lines({"vm": facts["vm"], "host": facts.get("host")}):
            out += wrap(line, hanging="  ")
    cap = facts.get("capture")
    if cap is None:
        out.append("capture: none kept (no raw capture in the directory)")
    elif not cap["decoded"]:
        out += wrap(f"capture: {cap['raw']} ({cap['bytes']:,} bytes) does not decode: "
                    f"{cap['error']}", hanging="  ")
    else:
        lost = cap.get("lost_events")
        out.append(f"capture: {cap['raw']} ({cap['bytes']:,} bytes): "
                   f"{plural(cap['events'], 'event')} decoded, "
                   + ("lost events unknown" if lost is None or lost < 0 else
                      plural(lost, "event") + " lost"))
        if cap["t0"]:
            after = cap.get("recorded_after_t0_s")
            asked = cap.get("asked_s")
            out.append("  recorded after t0: "
                       + ("nothing" if after is None else f"{after:.3f} s")
                       + (f" of the {float(asked):g} s asked" if asked is not None else "")
                       + ("" if cap["end"] else " (no end marker: cut short)"))
        else:
            out.append("  no t0 marker: stopped before the release")
        if "migrations_after_t0" in cap:
            causes = ", ".join(f"{k} {v}" for k, v in cap["by_cause"].items() if k != "inferred")
            out.append(f"  migrations of its tasks after t0: {cap['migrations_after_t0']}"
                       + (f" ({causes})" if causes else ""))
    out.append("tables: " + (", ".join(facts["tables"]) or "none"))
    exc = IncompleteRun("", facts["path"], facts["status"])
    out += [""] + wrap(what_can_be_done(exc).replace(
        f"`harmony report --allow-incomplete {facts['path']}`, ", ""))
    return "\n".join(out)


# --- a batch --------------------------------------------------------------------------------

def batch_screen(record: dict, path: Path, verbose: bool = False) -> str:
    """A batch: how many runs are complete, the aggregates of the metrics the card reads (every
    metric with ``verbose``), the answers its runs give, where batch.json and its figures are."""
    from harmony.analysis.compare import CARD_METRICS
    from harmony.analysis.policy import infer
    from harmony.batch import batch_text

    shown = record
    hidden = 0
    if not verbose:
        keys = {k for e, k in CARD_METRICS if e == record.get("experiment")} | {"migrations"}
        kept = [a for a in record.get("aggregates") or [] if a["metric"] in keys]
        hidden = len(record.get("aggregates") or []) - len(kept)
        shown = {**record, "aggregates": kept}
    lines = batch_text(shown).splitlines()
    if hidden:      # under the table
        lines.insert(3 + len(shown["aggregates"]),
                     f"({plural(hidden, 'more metric')}: -v, or {path / 'batch.json'})")
    out = lines
    card = infer([path])
    answers = answers_of_run(card)
    if answers:
        out += ["", f"answers of these {plural(card.runs, 'run')}:"] + answers
    out += ["", f"batch: {path / 'batch.json'}"]
    figs = [path / f for f in record.get("figures") or []]
    if figs:
        out.append("figures: " + ", ".join(map(str, figs)))
    return "\n".join(out)


class Shown:
    """What a measuring command prints when it is done: ``as_json`` what ``harmony report --json
    OUT`` prints, else a screen (``verbose``: every detail)."""

    def __init__(self, as_json: bool, verbose: bool):
        self.as_json, self.verbose = as_json, verbose

    def run(self, run) -> None:
        if self.as_json:
            print_json({"manifest": {k: v for k, v in run.manifest.items() if k != "host"},
                        "summary": run.summary})
        else:
            echo(run_screen(run, self.verbose, report=run.path))

    def suite(self, out: Path, facts: str, record: dict | None = None) -> None:
        """The suite's card (what ``harmony report --json OUT`` prints, with ``as_json``), a line
        of ``facts`` (runs, time), what --until-decided added (``record``: the suite's) and where
        its report is."""
        from harmony.analysis.policy import infer
        from harmony.cli.common import say_until_decided

        card = infer([out])
        if self.as_json:
            print_json(card.to_dict())
            return
        echo(card_screen(card, self.verbose).rstrip())
        echo(f"\n{facts}")
        if record:
            say_until_decided(record)
        echo(f"report: {out / 'report.md'} and {out / 'report.html'}")

    def batch(self, record: dict, out: Path) -> None:
        if self.as_json:
            print_json(record)
        else:
            echo(batch_screen(record, out, self.verbose))
