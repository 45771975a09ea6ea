"""The report pages as a person sees them: each kind (a suite's report.html, one run's report.html,
compare.html) opened in headless Chromium (tests/browser.py), in a window 1280 px wide.

Each page must show its tables (the card's answers, styled by kind), decode every image, have
nothing wider than the window (no sideways scrolling, neither of the page nor inside it) and
raise no script error; it must stand alone (no script of its own, nothing fetched). The pages are
made from simulated suites (no root, no kernel), figures drawn as a run draws them.
"""

from __future__ import annotations

import base64
import re
import struct

import pytest
from click.testing import CliRunner

import browser
import harmony
from harmony.analysis import document as D
from harmony.analysis.compare import compare, compare_document
from harmony.analysis.report import report_document
from harmony.analysis import policy
from harmony.cli import main

pytestmark = pytest.mark.needs_tool("chromium")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{"suite", "run", "compare"}: the report pages of two simulated quick suites (pairwise-random
    and poly-balance on 4 CPUs), one of their runs, and the comparison of the two."""
    root = tmp_path_factory.mktemp("pages")
    cli = CliRunner()
    for policy_name in ("pairwise-random", "poly-balance"):
        r = cli.invoke(main, ["simulate", "--policy", policy_name, "--ncpus", "4", "--suite",
                              "--quick", "--repeat", "2", "--out", str(root / policy_name)])
        assert r.exit_code == 0, r.output
    run = root / "pairwise-random" / "single-source" / "rep-01"
    r = cli.invoke(main, ["report", str(run)])
    assert r.exit_code == 0, r.output
    r = cli.invoke(main, ["compare", str(root / "poly-balance"), str(root / "pairwise-random"),
                          "--out", str(root / "cmp")])
    assert r.exit_code == 0, r.output
    return {"suite": root / "pairwise-random" / "report.html", "run": run / "report.html",
            "compare": root / "cmp" / "compare.html", "root": root}


def seen_whole(seen: dict) -> None:
    """What every page must be, seen in the window: no error, every image decoded, nothing
    wider than the window."""
    assert seen["errors"] == []
    assert seen["images"] and all(i["complete"] and i["width"] > 0 for i in seen["images"]), \
        seen["images"]
    assert seen["window"] == browser.WIDTH
    assert seen["scroll_width"] <= browser.WIDTH and seen["wide"] == [], seen["wide"]
    assert set(seen["links"]) <= {f"#{a}" for a in seen["anchors"]}   # every link lands


def stands_alone(page) -> None:
    text = page.read_text()
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", text)
    assert not re.search(r"""src=["'](?!data:)""", text)      # every image embedded


def test_suite_page_shows_the_card_as_a_table(pages):
    seen = browser.look(pages["suite"])
    seen_whole(seen)
    stands_alone(pages["suite"])
    card = policy.infer([pages["suite"].parent])
    kinds = [policy.answer_kind(a) for a in card.answers]
    # one styled answer cell per question, of the kind the card gives
    assert sum(seen["cell_kinds"].get(k, 0) for k in policy.ANSWER_KINDS) == len(card.answers)
    for kind in set(kinds):
        assert seen["cell_kinds"][kind] == kinds.count(kind)
    # the card links each answer to its evidence
    assert {f"#q-{a.qid}" for a in card.answers} <= set(seen["links"])
    # the card's table (a row per question) and the measurement table (a row per run)
    assert len(card.answers) + 1 in seen["tables"] and card.runs + 1 in seen["tables"]


def test_run_page(pages):
    seen = browser.look(pages["run"])
    seen_whole(seen)
    stands_alone(pages["run"])
    assert len(seen["images"]) >= 2          # the run's own figures, all drawn
    # every table of the page's document (results, what the policy cost, the machine, the
    # measurement...) is seen as one
    doc = report_document(harmony.load(pages["run"].parent))
    assert len(seen["tables"]) == sum(isinstance(b, (D.Table, D.Facts)) for b in doc)


def test_compare_page_highlights_the_answers_that_differ(pages):
    seen = browser.look(pages["compare"])
    seen_whole(seen)
    stands_alone(pages["compare"])
    assert len(seen["images"]) == 2
    # one answer cell per question and source (and per level the runs were placed at);
    # poly-balance and pairwise differ in how many move
    doc = compare_document(compare([pages["root"] / "poly-balance",
                                    pages["root"] / "pairwise-random"]))
    cells = [c for b in doc if isinstance(b, D.Table) for row in b.rows for c in row
             if isinstance(c, D.Cell) and c.kind in policy.ANSWER_KINDS]
    assert len(cells) >= 2 * 9
    assert sum(seen["cell_kinds"].get(k, 0) for k in policy.ANSWER_KINDS) == len(cells)
    text = pages["compare"].read_text()
    assert re.search(r'<tr class="differs">.*?\(how_many\)', text)


def test_screenshots_are_what_a_person_sees(pages):
    """The picture of each page, 1280 px wide (where a person looks at it: kept beside the page)."""
    for kind in ("suite", "run", "compare"):
        png = browser.screenshot(pages[kind], pages["root"] / f"{kind}.png")
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", head[16:24]) == (browser.WIDTH, 2400)


def test_the_look_sees_what_is_wrong(tmp_path):
    """The browser check can fail: a page too wide, an image that does not decode and a script
    error are each seen."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nnot a png").decode()
    doc = [D.Heading("bad", 1), D.Para("x")]
    page = tmp_path / "bad.html"
    page.write_text(D.to_html(doc, "bad").replace(
        "<p>x</p>", '<div style="width:2000px">wide</div>'
                    f'<img alt="broken" src="data:image/png;base64,{png}">'
                    "<pre style='white-space:pre;overflow-x:auto'>" + "y" * 400 + "</pre>"
                    "<script>no_such_function()</script>"))
    seen = browser.look(page)
    assert seen["scroll_width"] > browser.WIDTH
    assert any(w.startswith("DIV") for w in seen["wide"]) \
        and any(w.startswith("PRE") for w in seen["wide"])
    assert seen["images"] == [{"alt": "broken", "complete": True, "width": 0}]
    assert any("no_such_function" in e for e in seen["errors"])
