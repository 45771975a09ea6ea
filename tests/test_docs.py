"""The user documentation (README.md, docs/*.md) stays true to the code: every ``harmony ...``
command it shows parses against the real command line, and every relative link leads to a file
(and heading) that exists.

Commands are taken from the fenced code blocks (every block but Python) and from inline code spans
that start a ``harmony`` command (``sudo``, ``VAR=value`` prefixes and shell pipes allowed). Each
is resolved to its click command and parsed with ``make_context`` (resilient parsing off), never
run: an unknown command, an unknown option, an option missing its value, a value a typed option
refuses or an argument too many fails. Placeholders are fine: an upper-case word (``RUN_DIR``,
``FILE``, ``N``) or ``<...>`` as a value (a typed option's placeholder is given a valid value of
its type), ``[...]`` around optional parts, ``{a,b}`` for a choice, ``...`` for "the rest as
above". Files named are not looked for (a doc names the user's files). Beyond click, the names
click cannot check are checked against the code that owns them: the experiment (``harmony run
EXP``, ``--experiment``), each ``-p KEY=VALUE``'s key against that experiment's parameters, and
``simulate --policy``. A command in a code block must be complete (its required arguments given,
unless it says ``...``); an inline span may name a command without its arguments.

Hermetic: imports the CLI and the experiment declarations, reads Markdown, runs nothing.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: the README's length, a page (the rest lives in docs/)
README_MAX_LINES = 200

PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|<[^>]+>)$")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", "(", ")", ">", ">>", "<", "2>", "2>&1"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)


@dataclasses.dataclass
class Command:
    page: str
    line: int
    text: str
    tokens: list[str]
    complete: bool          # from a code block: required arguments must be given

    def __str__(self):
        return f"{self.page}:{self.line}: {self.text}"


@dataclasses.dataclass
class Markdown:
    """A page split into its fenced code blocks and its prose (fences blanked, lines kept)."""
    blocks: list[tuple[int, str, list[str]]]    # (first line number, info string, lines)
    prose: str

    @classmethod
    def parse(cls, text: str) -> "Markdown":
        blocks, prose, fence, info, start, body = [], [], None, "", 0, []
        for n, line in enumerate(text.split("\n"), 1):
            m = FENCE.match(line)
            if fence is None and m:
                fence, info, start, body = m.group(1), m.group(2).lower(), n + 1, []
                prose.append("")
            elif fence is not None and line.strip().startswith(fence) and \
                    not line.strip().strip(fence[0]):
                blocks.append((start, info, body))
                fence = None
                prose.append("")
            elif fence is not None:
                body.append(line)
                prose.append("")
            else:
                prose.append(line)
        return cls(blocks, "\n".join(prose))


def shell_segments(text: str) -> list[list[str]]:
    """The simple commands of a shell line (split at pipes, ``&&``, ``;``; comments dropped)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments, current = [], []
    for token in lexer:
        if token in SHELL_OPERATORS or set(token) <= set("|&;()<>"):
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    return [s for s in segments if s]


def harmony_argv(segment: list[str]) -> list[str] | None:
    """The arguments after ``harmony`` if this simple command runs it (behind ``sudo`` or
    ``VAR=value`` assignments), else None."""
    i = 0
    while i < len(segment) and (segment[i] == "sudo" or re.match(r"^[A-Za-z_]\w*=", segment[i])):
        i += 1
    if i < len(segment) and segment[i] == "harmony":
        return segment[i + 1:]
    return None


def commands_in(page: Path, text: str | None = None) -> list[Command]:
    text = page.read_text() if text is None else text
    name = page_id(page) if page.is_absolute() else str(page)
    md = Markdown.parse(text)
    found = []
    for start, info, lines in md.blocks:
        if info in ("python", "py", "pycon"):
            continue
        logical, first = "", None
        for n, line in enumerate(lines, start):
            first = n if not logical else first
            if line.rstrip().endswith("\\"):
                logical += line.rstrip()[:-1] + " "
                continue
            logical += line
            found += _commands(name, first, logical, complete=True)
            logical = ""
    for m in INLINE_CODE.finditer(md.prose):
        span = " ".join(m.group(2).split())
        if re.search(r"(^|[|&;]\s*|sudo\s+)harmony\s", span + " "):
            line = md.prose.count("\n", 0, m.start()) + 1
            found += _commands(name, line, span, complete=False)
    return found


def _commands(page: str, line: int, text: str, complete: bool) -> list[Command]:
    if "harmony" not in text:
        return []
    try:
        segments = shell_segments(text)
    except ValueError as exc:      # unbalanced quotes: only a problem if harmony is run there
        if re.match(r"\s*(sudo\s+)?harmony\s", text):
            return [Command(page, line, text, ["<unparseable: %s>" % exc], complete)]
        return []
    return [Command(page, line, text, argv, complete) for argv in map(harmony_argv, segments)
            if argv is not None]


def normalise(tokens: list[str]) -> tuple[list[str], bool]:
    """The arguments with the docs' meta-syntax taken out; and whether ``...`` elided some."""
    out, elided = [], False
    for token in tokens:
        if token in ("...", "…"):
            elided = True
            continue
        token = token.strip("[]") if token.startswith("[") or token.endswith("]") else token
        if token.endswith("..."):
            token, elided = token[:-3], True
        m = re.fullmatch(r"\{([^{},]+),[^{}]*\}", token)
        if m:
            token = m.group(1)
        if token:
            out.append(token)
    return out, elided


def placeholder_value(param: click.Parameter) -> str | None:
    """A valid value for a typed option given a placeholder, or None to keep the placeholder."""
    kind = param.type
    if isinstance(kind, click.Choice):
        return str(kind.choices[0])
    if isinstance(kind, (click.IntRange, click.FloatRange)):
        low = kind.min if kind.min is not None else (kind.max if kind.max is not None else 1)
        return str(low)
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        return "1"
    return None


def fill_placeholders(command: click.Command, args: list[str], mention: bool) -> list[str]:
    """``args`` with each typed option's placeholder value made a valid one; ``mention``: prose
    naming an option last (`harmony suite --kernel`) gives it a placeholder value."""
    options = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in param.opts + param.secondary_opts:
                options[opt] = param
    out = list(args)
    last = options.get(out[-1]) if out else None
    if mention and last is not None and not (last.is_flag or last.count):
        out.append("VALUE")
    for i, token in enumerate(out):
        name, eq, value = token.partition("=")
        param = options.get(name if eq else token)
        if param is None or param.is_flag or param.count:
            continue
        if eq and PLACEHOLDER.match(value):
            fill = placeholder_value(param)
            out[i] = f"{name}={fill}" if fill is not None else token
        elif not eq and i + 1 < len(out) and PLACEHOLDER.match(out[i + 1]):
            fill = placeholder_value(param)
            out[i + 1] = fill if fill is not None else out[i + 1]
    return out


def resolve(args: list[str]) -> tuple[click.Command, list[str], click.Context, str]:
    """The click command ``harmony ARGS`` names, the arguments left for it, its parent context."""
    from harmony.cli import main

    # the group's context settings (its -h) as `harmony` has them: click caches a command's help
    # option the first time it is asked for, so a context without them would leak into others
    command, name = main, "harmony"
    ctx = click.Context(main, info_name="harmony", **main.context_settings)
    while isinstance(command, click.Group):
        if not args:
            raise click.UsageError(f"`harmony {name}` needs a command", ctx=ctx)
        name, sub, args = command.resolve_command(ctx, args)
        if sub is None:
            raise click.UsageError(f"no such command {name!r}", ctx=ctx)
        command, ctx = sub, click.Context(sub, info_name=name, parent=ctx)
    return command, args, ctx.parent, name


def experiment_params(name: str) -> set[str]:
    from harmony.experiments import get_experiment

    return {p.name for p in get_experiment(name).all_params()}


def check_names(name: str, params: dict) -> list[str]:
    """What click cannot check: experiment names, -p keys, the simulator's policy."""
    from harmony.experiments import CATALOG

    problems, experiments = [], []
    for exp in ([params.get("experiment"), params.get("experiment_option")]
                if name in ("run", "simulate", "import") else []) + \
            list(params.get("experiments") or ()):
        if exp is None or PLACEHOLDER.match(exp):
            continue
        if exp not in CATALOG:
            problems.append(f"unknown experiment {exp!r} (the catalog: {', '.join(CATALOG)})")
        else:
            experiments.append(exp)
    named = (name == "run" or params.get("experiment") or params.get("experiment_option")
             or params.get("experiments"))
    keys = set().union(*map(experiment_params, experiments if named else CATALOG))
    for pair in params.get("params") or ():
        key = pair.partition("=")[0].strip()
        if key and not PLACEHOLDER.match(key) and keys and key not in keys:
            problems.append(f"-p {key}: no such parameter of {', '.join(experiments) or 'any'} "
                            "experiment")
    policy = params.get("policy_name")
    if name == "simulate" and policy and not PLACEHOLDER.match(policy):
        from harmony.analysis.refpolicy import ALL_POLICIES as POLICIES

        if policy not in POLICIES:
            problems.append(f"--policy {policy}: no such reference policy ({', '.join(POLICIES)})")
    return problems


def check(cmd: Command) -> list[str]:
    """Why ``cmd`` would not parse, if it would not (an empty list when it does)."""
    args, elided = normalise(cmd.tokens)
    if args and args[0].startswith("<unparseable"):
        return [args[0]]
    if "--help" in args or "-h" in args:    # help is every command's; the rest must still parse
        args = [a for a in args if a not in ("--help", "-h")]
        elided = True
    try:
        command, rest, parent, name = resolve(args)
    except click.UsageError as exc:
        if not cmd.complete and not args:
            return []
        return [exc.format_message()]
    if isinstance(command, click.Group):
        return []
    rest = fill_placeholders(command, rest, mention=not cmd.complete)
    try:
        ctx = command.make_context(name, rest, parent=parent, resilient_parsing=False)
    except click.MissingParameter as exc:
        return [] if (elided or not cmd.complete) else [exc.format_message()]
    except click.UsageError as exc:
        return [exc.format_message()]
    return check_names(name, ctx.params)


@pytest.fixture
def files_not_looked_for(monkeypatch):
    """A doc names the user's files (RUN_DIR, trace.dat): parse them without looking."""
    monkeypatch.setattr(click.Path, "convert", lambda self, value, param, ctx: value)


def page_id(page: Path) -> str:
    """A page's path as the messages name it: from the repository's root where it is inside."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_harmony_command_parses(page, files_not_looked_for):
    commands = commands_in(page)
    wrong = [f"{cmd}\n    -> {why}" for cmd in commands for why in check(cmd)]
    assert not wrong, f"{len(wrong)} command(s) of {page_id(page)} do not parse:\n" + \
        "\n".join(wrong)


def test_the_docs_show_commands():
    """The extraction finds the commands (a change of format must not leave nothing checked)."""
    readme = commands_in(ROOT / "README.md")
    assert any(c.tokens[:2] == ["suite", "--quick"] for c in readme)
    assert any(c.tokens[:1] == ["run"] and c.complete for c in readme)
    assert len([c for page in PAGES for c in commands_in(page)]) > 50


@pytest.mark.parametrize("doc, why", [
    ("```sh\nharmony run single-source --no-such-option 3\n```", "No such option"),
    ("```sh\nharmony frobnicate runs/e1\n```", "No such command"),
    ("```sh\nharmony kernel frobnicate\n```", "No such command"),
    ("```sh\nharmony run single-source --duration\n```", "requires an argument"),
    ("```sh\nharmony run single-source --duration soon\n```", "not a valid float"),
    ("```sh\nharmony run single-source extra-argument\n```", "unexpected extra argument"),
    ("```sh\nharmony report\n```", "Missing argument"),
    ("```sh\nharmony simulate --suite --ncpus 4\n```", "Missing option"),
    ("```sh\nharmony run no-such-experiment\n```", "unknown experiment"),
    ("```sh\nharmony run how-many -p no_such_key=1\n```", "no_such_key: no such parameter"),
    ("```sh\nharmony simulate --policy fair --suite --out DIR\n```", "no such reference policy"),
    ("Run `harmony report --frobnicate RUN_DIR` once.", "No such option"),
    ("As root: `sudo ./install.sh && sudo harmony suite --quikc`.", "No such option"),
    ("```sh\nssh host perf record -o - | harmony import - --pidd 3\n```", "No such option"),
])
def test_a_wrong_command_fails(doc, why, files_not_looked_for):
    commands = commands_in(Path("doc.md"), doc)
    assert len(commands) == 1, commands
    problems = check(commands[0])
    assert problems and why in problems[0], problems


@pytest.mark.parametrize("doc", [
    "```sh\nharmony import FILE --comm 'myapp*' [--pid PID] [--t0-marker TEXT]\n```",
    "```sh\nharmony simulate --policy {global-queue,poly-balance} --ncpus P --suite --out DIR\n```",
    "```sh\nharmony compare SOURCE SOURCE... [--all-metrics] [--json] [--out DIR]\n```",
    "```sh\nHARMONY_JIT=0 harmony run ...\n```",
    "Mentioned by name: `harmony report`, `harmony kernel build`.",
    "```sh\nharmony run EXP --help\n```",
])
def test_placeholders_parse(doc, files_not_looked_for):
    commands = commands_in(Path("doc.md"), doc)
    assert commands
    assert [check(c) for c in commands] == [[]] * len(commands)


# --- links ----------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower case, punctuation dropped, spaces ->
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in Markdown.parse(page.read_text()).prose.split("\n"):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    prose = Markdown.parse(page.read_text()).prose
    prose = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose)
    wrong = []
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):      # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        line = prose.count("\n", 0, m.start()) + 1
        if not dest.exists():
            wrong.append(f"{page_id(page)}:{line}: {target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            wrong.append(f"{page_id(page)}:{line}: {target}: no such heading in "
                         f"{page_id(dest)}")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page):
    wrong = broken_links(page)
    assert not wrong, "\n".join(wrong)


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with `code`\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-heading-with-code) [gone](missing.md) "
                    "[no anchor](other.md#not-a-heading) ![img](x.png)\n")
    wrong = broken_links(page)
    assert [w.split(": ", 1)[1] for w in wrong] == [
        "missing.md: no such file", "other.md#not-a-heading: no such heading in other.md",
        "x.png: no such file"]


#: the repository's top folders: a path in a code span that starts with one names a file of it
REPO_DIRS = ("harmony", "analysis", "probes", "experiments", "tests", "bench", "fuzz", "docs",
             ".ci")
REPO_PATH = re.compile(r"^(?:\.\./)*((?:%s)/[\w./-]*\w)/?$" % "|".join(map(re.escape, REPO_DIRS)))
PYTHON_M = re.compile(r"python3?\s+-m\s+(harmony(?:\.\w+)*)")


def named_files(page: Path) -> list[tuple[int, str]]:
    """The repository paths (``harmony/vm/scx.py``, ``bench/``) and ``python -m harmony.X``
    modules the page names in its code, with their line numbers."""
    text = page.read_text()
    md = Markdown.parse(text)
    found = []
    for m in INLINE_CODE.finditer(md.prose):
        span = " ".join(m.group(2).split())
        line = md.prose.count("\n", 0, m.start()) + 1
        path = REPO_PATH.match(span)
        if path:
            found.append((line, path.group(1)))
        found += [(line, f"-m {mod}") for mod in PYTHON_M.findall(span)]
    for start, _, lines in md.blocks:
        for n, line in enumerate(lines, start):
            found += [(n, f"-m {mod}") for mod in PYTHON_M.findall(line)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_file_and_module_named_exists(page):
    """Files move (the rooms); a page naming one must follow."""
    import importlib.util

    wrong = []
    for line, name in named_files(page):
        if name.startswith("-m "):
            try:
                found = importlib.util.find_spec(name[3:]) is not None
            except ImportError:
                found = False
            if not found:
                wrong.append(f"{page_id(page)}:{line}: python {name}: no such module")
        elif not (ROOT / name).exists():
            wrong.append(f"{page_id(page)}:{line}: {name}: no such file in the repository")
    assert not wrong, "\n".join(wrong)


def test_every_docs_page_and_figure_is_reachable():
    """Each docs page is linked from the README's map, each figure in docs/ shown by a page."""
    readme = (ROOT / "README.md").read_text()
    shown = "\n".join(p.read_text() for p in PAGES)
    pages = [p.name for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in readme]
    figures = [p.name for p in (ROOT / "docs").glob("*.png") if p.name not in shown]
    assert not pages, f"docs pages the README does not link: {pages}"
    assert not figures, f"figures in docs/ no page shows: {figures}"


def test_the_readme_is_a_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): put the rest in a docs/ page "
        "of its topic and link it from the README's map")
