"""Declared tables: each column's name, dtype and meaning, written once and read by the producer.

A :class:`Table` declares one kind of frame, for instance :data:`harmony.analysis.tables.RUNS`.
Its producer builds the frame through it (:meth:`Table.frame` from arrays, :meth:`Table.from_rows`
from row tuples), so that a column cannot be forgotten, misspelt or put out of order; the tests
check each produced frame against it (:meth:`Table.check`), which the hot path does not.
``print(table)`` shows the declaration as a readable table.

Dtypes are named as pandas prints them: ``int16``, ``int32``, ``int64``, ``float64``, ``bool``,
``category``, ``object``, and ``str`` for a column of Python strings as pandas makes it by default
(its string dtype from pandas 3 on, ``object`` before). A column whose dtype depends on its values
names each one it can have, joined by ``|``.

Where each table is declared: the tasks table in :mod:`harmony.workload.tasks`; the kernel samplers'
tables beside their samplers (:mod:`harmony.probes.proc_stat`, :mod:`harmony.probes.proc_sched`,
:mod:`harmony.probes.sched_debug`); the tables the analysis derives from the events in
:mod:`harmony.analysis.tables`; the events and markers tables themselves in
:mod:`harmony.probes.schema`.

pandas is imported where a frame is built or checked, not at the top: the guest agent
(:mod:`harmony.vm.guest`) declares and fills tables as plain rows, in a virtual machine where
importing pandas would cost seconds, and the host builds the frames.
"""

from __future__ import annotations

import dataclasses
import functools
import textwrap
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from harmony.store import rows_frame

if TYPE_CHECKING:
    import pandas as pd


@functools.cache
def _str_dtype():
    import pandas as pd  # see the module's docstring

    return pd.Series(["x"]).dtype


def __getattr__(name):
    """``STR_DTYPE``: the dtype pandas gives a column of Python strings (``str`` from pandas 3 on,
    ``object`` before), computed on first use."""
    if name == "STR_DTYPE":
        return _str_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass(frozen=True)
class Column:
    """One declared column: its name, dtype (or dtypes, joined by ``|``) and meaning."""

    name: str
    dtype: str
    meaning: str

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(d.strip() for d in self.dtype.split("|"))

    def matches(self, dtype) -> bool:
        """Whether a column of pandas dtype ``dtype`` has one of the declared dtypes."""
        return any(_is(dtype, d) for d in self.dtypes)


def _is(dtype, declared: str) -> bool:
    import pandas as pd  # see the module's docstring

    if declared == "category":
        return isinstance(dtype, pd.CategoricalDtype)
    if declared == "str":
        return dtype == _str_dtype()
    if isinstance(dtype, (pd.CategoricalDtype, pd.StringDtype)):
        return False
    import numpy as np

    return dtype == np.dtype(declared)


class Table:
    """A declared table: its ``name`` (that of its file, <name>.parquet, where a run stores it), a
    sentence on what its rows are (``about``), and its columns in order, each given as
    ``(name, dtype, meaning)``."""

    def __init__(self, name: str, about: str, columns: Iterable[tuple[str, str, str]]):
        self.name, self.about = name, about
        self.columns = tuple(Column(*c) for c in columns)
        self.names = tuple(c.name for c in self.columns)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"table {name}: a column is declared twice")
        self._name_set = frozenset(self.names)

    def frame(self, columns: Mapping, copy: bool | None = None) -> pd.DataFrame:
        """The table of ``columns`` (name -> array), in the declared order. Raises ValueError if
        a declared column is missing or an undeclared one is given. ``copy`` is passed to
        pd.DataFrame (False: each array becomes its own column, as it is). Dtypes are not
        converted nor checked here (see :meth:`check`)."""
        import pandas as pd  # see the module's docstring

        if columns.keys() != self._name_set:
            self._wrong_names(columns.keys())
        return pd.DataFrame({n: columns[n] for n in self.names}, copy=copy)

    def from_rows(self, rows: list[tuple]) -> pd.DataFrame:
        """The table of ``rows`` (tuples, one value per column in the declared order), each
        column made with its declared dtype at once (:func:`harmony.store.rows_frame`); for
        columns of one dtype other than ``category``."""
        import numpy as np

        return rows_frame(rows, {c.name: (str if c.dtype == "str" else np.dtype(c.dtype))
                                 for c in self.columns})

    def check(self, df: pd.DataFrame) -> None:
        """Raise ValueError unless ``df`` has exactly the declared columns, in order, each of
        its declared dtype. For tests: the producers do not check what they build."""
        if tuple(df.columns) != self.names:
            self._wrong_names(df.columns, order=tuple(df.columns))
        wrong = [f"{c.name} is {df[c.name].dtype}, not {c.dtype}" for c in self.columns
                 if not c.matches(df[c.name].dtype)]
        if wrong:
            raise ValueError(f"table {self.name}: " + "; ".join(wrong))

    def _wrong_names(self, names, order: tuple | None = None):
        names = list(names)
        missing = [n for n in self.names if n not in names]
        extra = [n for n in names if n not in self._name_set]
        what = ([f"lacks {missing}"] if missing else []) + ([f"has undeclared {extra}"]
                                                             if extra else [])
        if not what:
            what = [f"has its columns in the order {list(order or names)}, not {list(self.names)}"]
        raise ValueError(f"table {self.name} " + " and ".join(what))

    def __str__(self) -> str:
        """The declaration as a table of 100 columns: name, dtype, meaning."""
        w = max(len(n) for n in self.names)
        d = max(len(c.dtype) for c in self.columns)
        indent = " " * (w + d + 6)
        return "\n".join(textwrap.wrap(f"{self.name}: {self.about}", 100) + [
            textwrap.fill(c.meaning, 100, initial_indent=f"  {c.name:<{w}}  {c.dtype:<{d}}  ",
                          subsequent_indent=indent) for c in self.columns])

    def __repr__(self) -> str:
        return f"<Table {self.name}: {', '.join(self.names)}>"
