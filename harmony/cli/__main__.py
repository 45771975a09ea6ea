"""``python -m harmony.cli``: the ``harmony`` command."""

from harmony.cli import entry

entry()
