"""The ``synthetic`` probe: replays a simulated recording so it is analysed like a real one.

``harmony simulate`` (:mod:`harmony.analysis.refpolicy`) writes, under ``raw/synthetic/``:
events.parquet (canonical events, :mod:`harmony.probes.schema`), markers.parquet and meta.json
(the :class:`~harmony.probes.base.Capture` meta keys). This probe only decodes those files; it
cannot record, so ``available()`` says so and ``harmony run --probe synthetic`` refuses to start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harmony.probes.base import Capture, Probe, ProbeError, TraceCorrupt
from harmony.probes.schema import check_events


class SyntheticProbe(Probe):
    name = "synthetic"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return False, "the synthetic probe only replays simulated runs (see `harmony simulate`)"

    def start(self) -> None:
        raise ProbeError(self.available()[1])

    def mark(self, text: str) -> int:
        raise ProbeError(self.available()[1])

    def stop(self) -> None:
        return None

    @classmethod
    def decode_dir(cls, out_dir: Path) -> Capture:
        out_dir = Path(out_dir)
        tables = {}
        for name in ("events", "markers"):
            path = out_dir / f"{name}.parquet"
            try:
                tables[name] = pd.read_parquet(path)
            except FileNotFoundError:
                raise TraceCorrupt(f"{path}: not found") from None
            except Exception as exc:
                raise TraceCorrupt(f"{path}: unreadable Parquet ({type(exc).__name__})") from None
        try:
            check_events(tables["events"])
        except ValueError as exc:
            raise TraceCorrupt(f"{out_dir / 'events.parquet'}: {exc}") from None
        meta_path = out_dir / "meta.json"
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise TraceCorrupt(f"{meta_path}: not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceCorrupt(f"{meta_path}: corrupt JSON ({exc})") from None
        return Capture(tables["events"], tables["markers"], meta)
