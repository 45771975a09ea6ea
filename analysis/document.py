"""A report as a small document, built once and rendered twice: Markdown for terminals and diffs,
HTML for a browser. The wording lives where the document is built (report, report_suite,
compare); this module only lays it out, so the two renderings never say different things.

A document is a list of blocks:

- :class:`Heading` (level 1-3, with an anchor other blocks link to),
- :class:`Para` (text; ```code``` and ``**bold**`` spans, as in Markdown),
- :class:`Bullets`, :class:`Pre` (text kept as it is),
- :class:`Facts` (the aligned "label   value" lines of a run's report: the same lines in
  Markdown, a two-column table in HTML),
- :class:`Table` (columns and rows of :class:`Cell`; a cell or a row may have a *kind* that the
  HTML styles, e.g. an answer that is undecided, or a row whose sources differ),
- :class:`Figure` (a PNG: a relative link in Markdown, a data: URI in HTML),
- :class:`Beside` (text blocks with figures beside them in HTML; one after the other in
  Markdown).

``to_markdown(blocks, root)`` and ``to_html(blocks, title)`` render them. The HTML stands alone:
its CSS inline, every figure embedded, no script, nothing fetched; its tables and figures wrap or
shrink to fit a window of 1280 px.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import re
from pathlib import Path

#: the width of the label column of a run's "label   value" lines (harmony.analysis.report)
FACT_WIDTH = 29


@dataclasses.dataclass
class Heading:
    text: str
    level: int = 2
    anchor: str | None = None


@dataclasses.dataclass
class Para:
    text: str
    kind: str | None = None     # "note": a remark set apart


@dataclasses.dataclass
class Bullets:
    items: list[str]


@dataclasses.dataclass
class Pre:
    text: str


@dataclasses.dataclass
class Facts:
    lines: list[str]


@dataclasses.dataclass
class Cell:
    text: str
    kind: str | None = None     # styled in HTML: answered, undecided, none, cannot, differs, ...
    href: str | None = None     # a link (e.g. "#q-balances")


@dataclasses.dataclass
class Table:
    columns: list[str]
    rows: list[list]            # of Cell or str
    row_kinds: list | None = None   # one kind (or None) per row
    numeric: frozenset = frozenset()  # columns aligned right
    caption: str | None = None


@dataclasses.dataclass
class Figure:
    path: Path
    alt: str = ""


@dataclasses.dataclass
class Beside:
    text: list
    figures: list[Figure]


def cell(value) -> Cell:
    return value if isinstance(value, Cell) else Cell("" if value is None else str(value))


def split_fact(line: str) -> tuple[str, str]:
    """("label", "value") of one aligned line; ("", line) for a line that is not one (an indented
    continuation, or no label column)."""
    if (len(line) > FACT_WIDTH and not line[0].isspace()
            and " " in line[FACT_WIDTH - 1:FACT_WIDTH + 1]):
        return line[:FACT_WIDTH].rstrip(), line[FACT_WIDTH:].strip()
    return "", line.strip()


# -------------------------------------------------------------------------------------- Markdown

def _md_cell(c: Cell) -> str:
    text = c.text.replace("|", "\\|").replace("\n", " ")
    return f"[{text}]({c.href})" if c.href else text


def to_markdown(blocks: list, root: Path | None = None) -> str:
    """The document as Markdown; figures linked relative to ``root`` (the report's directory)."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {x}" for x in b.items] + [""]
        elif isinstance(b, (Pre, Facts)):
            text = b.text if isinstance(b, Pre) else "\n".join(b.lines)
            out += ["```", text.rstrip(), "```", ""]
        elif isinstance(b, Table):
            if b.caption:
                out += [b.caption, ""]
            out.append("| " + " | ".join(b.columns) + " |")
            out.append("|" + "|".join("---:" if c in b.numeric else "---" for c in b.columns) + "|")
            out += ["| " + " | ".join(_md_cell(cell(c)) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Figure):
            rel = (b.path.relative_to(root) if root is not None and b.path.is_relative_to(root)
                   else b.path)
            out += [f"![{b.alt or rel}]({rel})", ""]
        elif isinstance(b, Beside):
            out.append(to_markdown(b.text + b.figures, root).rstrip("\n"))
            out.append("")
        else:
            raise TypeError(f"not a document block: {b!r}")
    return "\n".join(out).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------ HTML

#: the page's look: readable at 1280 px, nothing wider than the window (long words break, wide
#: figures shrink), answers coloured by kind (colour-blind safe, and each kind also says its name)
CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2327;margin:0;
 background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:1em 1.5em 3em;background:#fff;box-sizing:border-box}
h1{font-size:1.55em;margin:.4em 0 .3em}h2{font-size:1.25em;margin:1.6em 0 .4em;
 border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1.05em;margin:1.3em 0 .3em}
p,li{overflow-wrap:anywhere}code{font-size:90%;background:#f1f1f1;padding:0 .2em;border-radius:3px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f4f4f4;padding:.6em .8em;
 font-size:85%;margin:.5em 0}
.note{color:#555;font-size:92%}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:90%;max-width:100%}
caption{text-align:left;color:#555;padding-bottom:.3em;caption-side:top}
th,td{border:1px solid #e0e0e0;padding:.3em .5em;text-align:left;vertical-align:top;
 overflow-wrap:break-word}
th{background:#f0f3f5}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.facts td:first-child{white-space:nowrap;color:#444}
td.answered{background:#e3f2e8}td.undecided{background:#fff1d6}td.varies{background:#e6e3f5}td.none{color:#777;
 background:#f2f2f2}td.cannot{color:#666;background:#ececf6;font-style:italic}
tr.differs td{font-weight:600}tr.differs td:not([class]){background:#fdf0e6}
tr.differs td:first-child{box-shadow:inset 4px 0 #de8f05}
tr.apart td:first-child{box-shadow:inset 4px 0 #b0b0b0}
a{color:#0a5c9e}
.beside{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
.beside>.text{flex:1 1 24em;min-width:0}.beside>.figures{flex:1.4 1 32em;min-width:0}
img{max-width:100%;height:auto;display:block;margin:.5em 0}
"""


def _inline(text: str) -> str:
    """Escaped text with Markdown's `code` and **bold** spans as HTML."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _td(c: Cell, numeric: bool) -> str:
    classes = " ".join(x for x in (c.kind, "num" if numeric else None) if x)
    attr = f' class="{classes}"' if classes else ""
    text = _inline(c.text)
    if c.href:
        text = f'<a href="{html.escape(c.href)}">{text}</a>'
    return f"<td{attr}>{text}</td>"


def _html_block(b) -> str:
    if isinstance(b, Heading):
        anchor = f' id="{html.escape(b.anchor)}"' if b.anchor else ""
        return f"<h{b.level}{anchor}>{_inline(b.text)}</h{b.level}>"
    if isinstance(b, Para):
        return (f'<p class="{b.kind}">{_inline(b.text)}</p>' if b.kind
                else f"<p>{_inline(b.text)}</p>")
    if isinstance(b, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b.items) + "</ul>"
    if isinstance(b, Pre):
        return f"<pre>{html.escape(b.text.rstrip())}</pre>"
    if isinstance(b, Facts):
        rows = []
        for line in b.lines:
            label, value = split_fact(line)
            rows.append(f"<tr><td>{html.escape(label)}</td><td>{html.escape(value)}</td></tr>"
                        if label else f'<tr><td colspan="2">{html.escape(value)}</td></tr>')
        return '<table class="facts">' + "".join(rows) + "</table>"
    if isinstance(b, Table):
        kinds = b.row_kinds or [None] * len(b.rows)
        out = ["<table>"]
        if b.caption:
            out.append(f"<caption>{_inline(b.caption)}</caption>")
        out.append("<thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in b.columns)
                   + "</tr></thead><tbody>")
        for row, kind in zip(b.rows, kinds):
            tr = f'<tr class="{kind}">' if kind else "<tr>"
            out.append(tr + "".join(_td(cell(c), col in b.numeric)
                                    for c, col in zip(row, b.columns)) + "</tr>")
        out.append("</tbody></table>")
        return "".join(out)
    if isinstance(b, Figure):
        data = base64.b64encode(Path(b.path).read_bytes()).decode()
        return (f'<img alt="{html.escape(b.alt or Path(b.path).name)}" '
                f'src="data:image/png;base64,{data}">')
    if isinstance(b, Beside):
        text = "\n".join(_html_block(x) for x in b.text)
        if not b.figures:
            return text
        figs = "\n".join(_html_block(f) for f in b.figures)
        return (f'<div class="beside"><div class="text">{text}</div>'
                f'<div class="figures">{figs}</div></div>')
    raise TypeError(f"not a document block: {b!r}")


def to_html(blocks: list, title: str) -> str:
    """The document as one HTML page that needs nothing else: no network, no script."""
    body = "\n".join(_html_block(b) for b in blocks)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style></head>\n"
            f"<body><main>\n{body}\n</main></body></html>\n")
