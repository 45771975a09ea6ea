"""Parse tracefs ``format`` files (events/<system>/<event>/format, header_page, header_event).

Nothing here hard-codes a field offset: every consumer asks the parsed format where a field lives,
because kernels differ (``char comm[16]`` vs ``__data_loc char[] comm``, ``long`` vs ``int``
prev_state, 4- vs 8-byte ``local_t`` commit words ...).

Parsing functions raise :class:`FormatError` (a ``ValueError``); the ``load_*`` helpers, which know
the file they read, turn it into :class:`~harmony.probes.base.TraceCorrupt` naming that file.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import operator
import re
from pathlib import Path

from harmony.core.errors import FormatError  # noqa: F401  (raised here)
from harmony.probes.base import TraceCorrupt

# Sizes of the C scalar types that appear as array elements in event formats.
_ELEM_SIZES = {
    "char": 1, "signed char": 1, "unsigned char": 1, "bool": 1, "u8": 1, "s8": 1, "__u8": 1,
    "short": 2, "unsigned short": 2, "u16": 2, "s16": 2, "__u16": 2,
    "int": 4, "unsigned int": 4, "unsigned": 4, "u32": 4, "s32": 4, "__u32": 4, "pid_t": 4,
    "long long": 8, "unsigned long long": 8, "u64": 8, "s64": 8, "__u64": 8,
}

_FIELD_RE = re.compile(
    r"^\s*field:\s*(?P<decl>[^;]*?)\s*;\s*offset:\s*(?P<offset>\d+)\s*;\s*size:\s*(?P<size>\d+)\s*;"
    r"(?:\s*signed:\s*(?P<signed>\d+)\s*;)?")


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of an event record, as the kernel's format file describes it.

    ``offset``/``size`` are in bytes from the start of the event data (the ``common_type`` field).
    ``is_array``: declared with ``[]``/``[N]``; ``array_len``: N for fixed arrays, None for ``[]``
    (a flexible array running to the end of the record, e.g. ftrace print ``buf``).
    ``data_loc``: ``__data_loc``: the record holds a u32, low 16 bits = offset of the payload from
    the start of the record, high 16 bits = its length. ``rel_loc``: ``__rel_loc``: same, but the
    offset counts from the end of this u32 field.
    """

    name: str
    type: str
    offset: int
    size: int
    signed: bool
    is_array: bool = False
    array_len: int | None = None
    data_loc: bool = False
    rel_loc: bool = False

    @property
    def elem_size(self) -> int:
        if self.data_loc or self.rel_loc:
            return _ELEM_SIZES.get(self.type, 1)
        if self.is_array:
            if self.array_len:
                return max(1, self.size // self.array_len)
            return _ELEM_SIZES.get(self.type, 1)
        return self.size

    @property
    def is_string(self) -> bool:
        """A char array or a dynamic char string."""
        return self.type in ("char", "unsigned char", "signed char") and (
            self.is_array or self.data_loc or self.rel_loc)


@dataclasses.dataclass
class EventFormat:
    """A parsed ``events/<system>/<event>/format`` file."""

    system: str
    name: str
    id: int
    fields: dict[str, Field]          # common_* fields first, in file order
    print_fmt: str = ""
    text: str = ""                    # the verbatim file (the trace.dat writer stores it)

    @property
    def full_name(self) -> str:
        return f"{self.system}:{self.name}"

    def field(self, name: str) -> Field | None:
        return self.fields.get(name)

    def first_field(self, *names: str) -> Field | None:
        for n in names:
            f = self.fields.get(n)
            if f is not None:
                return f
        return None


@dataclasses.dataclass(frozen=True)
class HeaderPage:
    """Layout of a ring-buffer page header (from events/header_page)."""

    timestamp_offset: int = 0
    timestamp_size: int = 8
    commit_offset: int = 8
    commit_size: int = 8               # sizeof(local_t) == sizeof(long) of the kernel
    data_offset: int = 16
    data_size: int = 4080              # page_size - data_offset for the default sub-buffer


@dataclasses.dataclass(frozen=True)
class HeaderEvent:
    """Ring-buffer event header encoding (from events/header_event)."""

    type_len_bits: int = 5
    time_delta_bits: int = 27
    padding: int = 29
    time_extend: int = 30
    time_stamp: int = 31
    data_max_type_len: int = 28


#: the largest field offset, size or array length a format may give: a record lies within one
#: ring-buffer page (sub-buffer), and trace.dat pages are at most 16 MiB (tracedat_read)
MAX_FIELD_BYTES = 1 << 24


def _bounded(digits: str, what: str, base: int = 10) -> int:
    """The number ``digits`` spell, or FormatError if it exceeds MAX_FIELD_BYTES (checked on the
    text first: Python refuses to convert over 4300 digits)."""
    value = int(digits, base) if len(digits.lstrip("0")) <= 8 else MAX_FIELD_BYTES + 1
    if value > MAX_FIELD_BYTES:
        raise FormatError(f"field {what} {digits[:20]}{'...' if len(digits) > 20 else ''} is "
                          f"larger than a ring-buffer page can be")
    return value


def _parse_decl(decl: str) -> tuple[str, str, bool, int | None, bool, bool]:
    """Split a C declaration 'unsigned char buf[16]' ->
    (type, name, is_array, len, data_loc, rel_loc)."""
    decl = " ".join(decl.split())
    data_loc = rel_loc = False
    if decl.startswith("__data_loc "):
        data_loc = True
        decl = decl[len("__data_loc "):]
    elif decl.startswith("__rel_loc "):
        rel_loc = True
        decl = decl[len("__rel_loc "):]
    is_array = False
    array_len: int | None = None
    m = re.match(r"^(?P<type>.*?)\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                 r"\s*\[(?P<len>[^\]]*)\]\s*$", decl)
    if m and not (data_loc or rel_loc):
        is_array = True
        typ, name, ln = m.group("type"), m.group("name"), m.group("len").strip()
        if re.fullmatch(r"0[xX][0-9a-fA-F]+", ln):
            array_len = _bounded(ln[2:], f"array length of {name}", base=16)
        elif re.fullmatch(r"\d+", ln):                   # decimal, leading zeros too ("08")
            array_len = _bounded(ln, f"array length of {name}")
        else:
            array_len = None
        if ln and array_len is None:
            array_len = -1            # a macro name: resolved from size later
    else:
        # '__data_loc char[] comm' keeps the brackets on the type
        m2 = re.match(r"^(?P<type>.*?)\s*(?:\[[^\]]*\])?"
                      r"\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*$", decl)
        if not m2:
            raise FormatError(f"cannot parse field declaration {decl!r}")
        typ, name = m2.group("type"), m2.group("name")
        if data_loc or rel_loc:
            is_array = True
    typ = typ.replace("[]", "").strip()
    return typ, name, is_array, array_len, data_loc, rel_loc


@functools.lru_cache(maxsize=4096)
def parse_field_line(line: str) -> Field | None:
    """Parse one ``field:...`` line, or return None if the line is not a field line. Cached (a
    Field is immutable): every capture's formats repeat the same lines, and parsing them was most
    of a small trace's decoding overhead (~3 ms a capture)."""
    m = _FIELD_RE.match(line)
    if not m:
        return None
    typ, name, is_array, array_len, data_loc, rel_loc = _parse_decl(m.group("decl"))
    offset, size = _bounded(m.group("offset"), "offset"), _bounded(m.group("size"), "size")
    signed_s = m.group("signed")
    if signed_s is None:
        signed = not typ.startswith("unsigned") and typ not in ("u8", "u16", "u32", "u64", "bool")
    else:
        signed = signed_s != "0"
    if array_len == -1:
        es = _ELEM_SIZES.get(typ, 1)
        array_len = size // es if size else None
    return Field(name=name, type=typ, offset=offset, size=size, signed=signed, is_array=is_array,
                 array_len=array_len, data_loc=data_loc, rel_loc=rel_loc)


#: the sizes the common fields every record starts with may have: the event type id is looked up in
#: a table of 2^(8 * size) entries (the kernel's is an unsigned short), the pid is read
#: as an integer
_COMMON_SIZES = {"common_type": (1, 2), "common_pid": (1, 2, 4, 8)}


def parse_format(text: str, system: str = "") -> EventFormat:
    """Parse the text of an event ``format`` file."""
    name = None
    ev_id = None
    fields: dict[str, Field] = {}
    print_fmt = ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("name:"):
            name = s[5:].strip()
        elif s.startswith("ID:"):
            try:
                ev_id = int(s[3:].strip())
            except ValueError:
                raise FormatError(f"bad ID line {s!r}") from None
        elif s.startswith("field:"):
            f = parse_field_line(s)
            if f is None:
                raise FormatError(f"cannot parse field line {s!r}")
            fields[f.name] = f
        elif s.startswith("print fmt:"):
            print_fmt = s[len("print fmt:"):].strip()
    if name is None or ev_id is None:
        raise FormatError("format lacks a name: or ID: line")
    if "common_type" not in fields:
        raise FormatError(f"format of {name} lacks the common_type field")
    for common, sizes in _COMMON_SIZES.items():
        f = fields.get(common)
        if f is not None and (f.size not in sizes or f.is_array):
            raise FormatError(f"format of {name}: {common} of {f.size} bytes"
                              + (" (an array)" if f.is_array else ""))
    return EventFormat(system=system, name=name, id=ev_id, fields=fields, print_fmt=print_fmt,
                       text=text)


def parse_header_page(text: str) -> HeaderPage:
    """Parse events/header_page: where the page timestamp, commit word and data start."""
    fields = {}
    for line in text.splitlines():
        f = parse_field_line(line)
        if f is not None:
            fields[f.name] = f
    try:
        ts, commit, data = fields["timestamp"], fields["commit"], fields["data"]
    except KeyError as e:
        raise FormatError(f"header_page lacks the {e.args[0]} field") from None
    if ts.size != 8 or commit.size not in (4, 8):
        raise FormatError(f"header_page has unsupported sizes (timestamp {ts.size}, "
                          f"commit {commit.size})")
    return HeaderPage(timestamp_offset=ts.offset, timestamp_size=ts.size,
                      commit_offset=commit.offset, commit_size=commit.size,
                      data_offset=data.offset, data_size=data.size)


def check_page_layout(hp: HeaderPage, page_size: int) -> None:
    """FormatError unless pages of ``page_size`` bytes can have the header ``hp`` describes: the
    time stamp and commit word before the data, the data 4-byte aligned and starting inside the
    page."""
    if (page_size <= 0 or page_size % 8 or hp.data_offset % 4 or hp.data_offset >= page_size
            or hp.timestamp_offset + hp.timestamp_size > hp.data_offset
            or hp.commit_offset + hp.commit_size > hp.data_offset):
        raise FormatError(f"unsupported page layout (page size {page_size}, time stamp at "
                          f"{hp.timestamp_offset}, commit at {hp.commit_offset}, data at "
                          f"{hp.data_offset})")


def parse_header_event(text: str) -> HeaderEvent:
    """Parse events/header_event (the compressed event header description)."""
    vals = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\w+)\s*:\s*(\d+)\s*bits", line)
        if m:
            vals[m.group(1)] = int(m.group(2))
            continue
        m = re.match(r"^\s*(\w[\w ]*?)\s*:\s*type\s*==\s*(\d+)", line)
        if m:
            vals[m.group(1).strip()] = int(m.group(2))
            continue
        m = re.match(r"^\s*data max type_len\s*==\s*(\d+)", line)
        if m:
            vals["data_max"] = int(m.group(1))
    if "type_len" not in vals or "time_delta" not in vals:
        raise FormatError("header_event lacks the type_len/time_delta description")
    h = HeaderEvent(type_len_bits=vals["type_len"], time_delta_bits=vals["time_delta"],
                    padding=vals.get("padding", 29), time_extend=vals.get("time_extend", 30),
                    time_stamp=vals.get("time_stamp", 31),
                    data_max_type_len=vals.get("data_max", 28))
    if (h.type_len_bits, h.time_delta_bits) != (5, 27):
        raise FormatError(f"unsupported event header ({h.type_len_bits}/{h.time_delta_bits} bits)")
    return h


# --- sched_switch prev_state "preempted" flag --------------------------------------------------

#: TASK_REPORT_MAX since Linux 4.14: the bit __trace_sched_switch_state() sets for a preempted task.
DEFAULT_PREEMPT_FLAG = 0x100

#: the longest constant expression evaluated: the preempt mask is ~120 characters; longer input
#: (a corrupt file) is refused before it is parsed, so that nothing here runs long or deep
MAX_EXPR_CHARS = 256

_BINARY = {ast.BitOr: operator.or_, ast.BitAnd: operator.and_, ast.BitXor: operator.xor,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Add: operator.add,
           ast.Sub: operator.sub, ast.Mult: operator.mul}
_UNARY = {ast.Invert: operator.invert, ast.USub: operator.neg, ast.UAdd: operator.pos}
_U64 = (1 << 64) - 1


def eval_c_int_expr(expr: str) -> int:
    """Evaluate a constant C integer expression (literals, | & ^ << >> + - * ~, parentheses) as
    the kernel's 64-bit unsigned arithmetic does: each result is taken modulo 2^64 and a shift
    counts 0..63. The expression is parsed, never executed."""
    if len(expr) > MAX_EXPR_CHARS:
        raise FormatError(f"not a constant expression: {len(expr)} characters")
    e = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU]?)\b", r"\1", expr)
    e = re.sub(r"\(\s*(?:unsigned\s+)?(?:long\s+long|long|int)\s*\)", "", e)   # (long) casts
    try:
        tree = ast.parse(e.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise FormatError(f"not a constant expression: {expr!r}") from None
    return _eval_node(tree.body, expr)


def _eval_node(node: ast.AST, expr: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value & _U64
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand, expr)) & _U64
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _eval_node(node.left, expr), _eval_node(node.right, expr)
        if isinstance(node.op, (ast.LShift, ast.RShift)) and b > 63:
            raise FormatError(f"shift by {b} in {expr!r}")
        return _BINARY[type(node.op)](a, b) & _U64
    raise FormatError(f"not a constant expression: {expr!r}")


def _term_before(s: str, end: int) -> str:
    """The comma-separated argument of a print fmt that ends at index ``end`` (exclusive)."""
    depth = 0
    i = end - 1
    in_str = False
    while i >= 0:
        c = s[i]
        if c == '"' and (i == 0 or s[i - 1] != "\\"):
            in_str = not in_str
        elif not in_str:
            if c == ")":
                depth += 1
            elif c == "(":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
        i -= 1
    return s[i + 1:end].strip()


def preempt_flag_from_print_fmt(print_fmt: str) -> int | None:
    """The prev_state bit sched_switch prints as "+", from its print fmt; None if not derivable.

    Looks for the ``<expr> ? "+" : ""`` term and evaluates the mask in ``REC->prev_state & <mask>``.
    """
    m = re.search(r'\?\s*"\+"\s*:\s*""', print_fmt)
    if not m:
        return None
    term = _term_before(print_fmt, m.start())
    m2 = re.match(r"^\(*\s*REC->prev_state\s*&\s*(?P<mask>.+)$", term, re.S)
    if not m2:
        return None
    mask = m2.group("mask").strip()
    if len(mask) > MAX_EXPR_CHARS:
        return None
    # drop parentheses opened before REC->prev_state and left unbalanced at the end
    while mask.count(")") > mask.count("(") and mask.endswith(")"):
        mask = mask[:-1].rstrip()
    try:
        value = eval_c_int_expr(mask)
    except FormatError:
        return None
    if value <= 0 or value & (value - 1):
        return None                    # not a single bit: do not trust it
    return value


def sched_switch_preempt_flag(fmt: EventFormat | None) -> tuple[int, str | None]:
    """(flag bit, note or None). Falls back to TASK_REPORT_MAX (0x100) with a note."""
    if fmt is None:
        return DEFAULT_PREEMPT_FLAG, None
    v = preempt_flag_from_print_fmt(fmt.print_fmt)
    if v is not None:
        return v, None
    return DEFAULT_PREEMPT_FLAG, ("could not derive the sched_switch preempt flag from its print "
                                  f"fmt; assumed TASK_REPORT_MAX={DEFAULT_PREEMPT_FLAG:#x}")


# --- loading from a directory ------------------------------------------------------------------

def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError as e:
        raise TraceCorrupt(f"{path}: cannot read ({e.strerror or e})") from None


def load_format(path: Path, system: str | None = None) -> EventFormat:
    """Parse a format file; TraceCorrupt naming the file if it is missing or malformed."""
    path = Path(path)
    text = _read_text(path)
    try:
        return parse_format(text, system=system if system is not None else path.parent.parent.name)
    except FormatError as e:
        raise TraceCorrupt(f"{path}: {e}") from None


def load_header_page(path: Path) -> HeaderPage:
    path = Path(path)
    try:
        return parse_header_page(_read_text(path))
    except FormatError as e:
        raise TraceCorrupt(f"{path}: {e}") from None


def load_header_event(path: Path) -> HeaderEvent:
    path = Path(path)
    try:
        return parse_header_event(_read_text(path))
    except FormatError as e:
        raise TraceCorrupt(f"{path}: {e}") from None


def load_formats_dir(formats_dir: Path) -> dict[int, EventFormat]:
    """All ``<system>/<event>/format`` files under ``formats_dir``, keyed by event ID."""
    formats_dir = Path(formats_dir)
    if not formats_dir.is_dir():
        raise TraceCorrupt(f"{formats_dir}: formats directory is missing")
    out: dict[int, EventFormat] = {}
    for path in sorted(formats_dir.glob("*/*/format")):
        fmt = load_format(path)
        if fmt.id in out and out[fmt.id].full_name != fmt.full_name:
            raise TraceCorrupt(f"{path}: event ID {fmt.id} also used by {out[fmt.id].full_name}")
        out[fmt.id] = fmt
    return out
