"""One document, two renderings (harmony.analysis.document): Markdown and HTML say the same."""

from __future__ import annotations

import html
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harmony.analysis import document as D  # noqa: E402


def _figure(path):
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path, dpi=50)
    plt.close(fig)
    return path


def test_markdown_and_html_carry_the_same_words(tmp_path):
    (tmp_path / "figures").mkdir()
    png = _figure(tmp_path / "figures" / "a.png")
    doc = [D.Heading("Title <1>", 1),
           D.Para("the **answer** is `harmony infer` & more"),
           D.Bullets(["one | two", "three"]),
           D.Facts(["tasks / CPUs                 4 / 2",
                    "kernel agreement (nr_running) 18/18 clean samples",
                    "  an indented continuation"]),
           D.Table(["q", "answer", "n"], [["does it?", D.Cell("yes", "answered", "#q-x"), 3]],
                   row_kinds=["differs"], numeric=frozenset({"n"})),
           D.Beside([D.Heading("x", 3, "q-x"), D.Para("beside")], [D.Figure(png, "a figure")])]
    md = D.to_markdown(doc, tmp_path)
    page = D.to_html(doc, "t")
    text = re.sub(r"<[^>]+>", " ", page)
    for words in ("Title <1>", "answer", "harmony infer", "one | two", "4 / 2",
                  "18/18 clean samples", "an indented continuation", "does it?", "beside"):
        assert words in md.replace("\\|", "|")
        assert words in html.unescape(text)
    # Markdown keeps the aligned lines as they are; HTML splits label from value
    assert "kernel agreement (nr_running) 18/18 clean samples" in md
    assert "<td>kernel agreement (nr_running)</td><td>18/18 clean samples</td>" in page
    assert "<td>tasks / CPUs</td><td>4 / 2</td>" in page
    # the link, the kinds, the figure: relative in Markdown, embedded in HTML
    assert "[yes](#q-x)" in md and '<td class="answered"><a href="#q-x">yes</a></td>' in page
    assert '<tr class="differs">' in page and '<td class="num">3</td>' in page
    assert "![a figure](figures/a.png)" in md and 'src="data:image/png;base64,' in page
    assert '<h3 id="q-x">' in page and "<script" not in page
    assert "Title &lt;1&gt;" in page and "<strong>answer</strong>" in page
    assert "<code>harmony infer</code> &amp; more" in page


def test_split_fact():
    assert D.split_fact("lost events                  0") == ("lost events", "0")
    assert D.split_fact("kernel agreement (nr_running) 1/1 clean") == \
        ("kernel agreement (nr_running)", "1/1 clean")
    assert D.split_fact("  - a note") == ("", "- a note")
    assert D.split_fact("short") == ("", "short")
