"""Wake-ups derived from sched_waking against the recorded sched_wakeup (``analysis/waking.py``).

A trace from ``perf sched record`` has sched_waking and no sched_wakeup; ``harmony import`` then
derives each wake-up from its sched_waking. This measures how right that is on recordings that
have both: every tracefs recording (``raw/tracefs``, or a directory holding ``meta.json`` and
``cpuN.raw``) under the given run or suite directories is decoded, its sched_wakeup dropped, the
wake-ups derived, and each matched to its task's first recorded one at or after it
(:func:`harmony.analysis.waking.df_wakeup_check`).

Per recording: wake-ups recorded and derived; matched (a recorded one found: none where the probe
was blind); of those, onto the recorded CPU; placed (onto a placement migration's CPU) and pulls
(migrations taken as idle pulls); every task's migrations, and how many have the same kind
(wake-up placement or balance: ``df_migrations``) from the derived wake-ups as from the recorded
ones; how early a derived wake-up is (median, 99th percentile, us).
Needs no root: record a suite first (``harmony suite --quick --out DIR``).

example: python bench/waking.py runs/suite-1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import numpy as np  # noqa: E402


def recordings(dirs: list[Path]) -> list[Path]:
    """Every tracefs recording directory under ``dirs`` (sorted)."""
    found = set()
    for d in dirs:
        for meta in [d / "meta.json", *d.rglob("meta.json")]:
            if meta.is_file() and (meta.parent / "formats").is_dir():
                found.add(meta.parent)
    return sorted(found)


def check(raw: Path) -> dict:
    from harmony.analysis.waking import derived_again, df_migration_kind_check, df_wakeup_check
    from harmony.analysis.arrays import event_mask
    from harmony.probes.ringbuf import decode_dir

    events = decode_dir(raw).events
    recorded = int(event_mask(events, "sched_wakeup").sum())
    derived = derived_again(events)         # once, for both checks
    kinds = df_migration_kind_check(events, derived)
    migrations, same_kind = len(kinds), int((kinds["kind"] == kinds["derived_kind"]).sum())
    df = df_wakeup_check(events, derived)
    info = df.attrs["derived"]
    found = df.dropna(subset=["rec_ts"])
    early = found["early_ns"].to_numpy() / 1e3
    return {"recording": str(raw), "recorded": recorded, "derived": len(df),
            "matched": len(found),
            "same_cpu": int((found["target_cpu"] == found["rec_target_cpu"]).sum()),
            "placed": info.get("placed", 0), "pulls": info.get("pulls", 0),
            "after_switch_out": info.get("after_switch_out", 0),
            "migrations": migrations, "same_kind": same_kind,
            "early_us_median": float(np.median(early)) if len(early) else None,
            "early_us_p99": float(np.percentile(early, 99)) if len(early) else None,
            "early_us_all": early.tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("dirs", nargs="+", type=Path, help="run or suite directories")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON (- = stdout)")
    args = ap.parse_args()
    raws = recordings(args.dirs)
    if not raws:
        ap.error("no tracefs recording (meta.json, formats/) under "
                 + " ".join(map(str, args.dirs)))
    rows = []
    for k, raw in enumerate(raws, 1):
        print(f"[{k}/{len(raws)}] {raw}", file=sys.stderr)
        rows.append(check(raw))
    common.table(["recording", "recorded", "derived", "matched", "same CPU", "placed", "pulls",
                  "migrations", "same kind", "early us (median)", "early us (p99)"],
                 [[r["recording"], r["recorded"], r["derived"], r["matched"], r["same_cpu"],
                   r["placed"], r["pulls"], r["migrations"], r["same_kind"], r["early_us_median"],
                   r["early_us_p99"]] for r in rows])
    matched = sum(r["matched"] for r in rows)
    same = sum(r["same_cpu"] for r in rows)
    early = np.concatenate([np.asarray(r.pop("early_us_all")) for r in rows])
    total = {"recordings": len(rows), "recorded": sum(r["recorded"] for r in rows),
             "derived": sum(r["derived"] for r in rows), "matched": matched, "same_cpu": same,
             "placed": sum(r["placed"] for r in rows), "pulls": sum(r["pulls"] for r in rows),
             "after_switch_out": sum(r["after_switch_out"] for r in rows),
             "migrations": sum(r["migrations"] for r in rows),
             "same_kind": sum(r["same_kind"] for r in rows),
             "early_us_median": float(np.median(early)) if len(early) else None,
             "early_us_p99": float(np.percentile(early, 99)) if len(early) else None}
    print(f"\n{total['recordings']} recordings: {total['derived']} wake-ups derived, "
          f"{total['recorded']} recorded; {matched} matched, {same} of them onto the recorded "
          f"CPU ({same / matched:.2%}); {total['placed']} placed by a migration, "
          f"{total['pulls']} migrations taken as pulls, {total['after_switch_out']} after their "
          f"task's switch-out; {total['same_kind']} of "
          f"{total['migrations']} migrations of the same kind (wake-up or balance) as from the "
          "recorded wake-ups; a derived one "
          f"{total['early_us_median']:.1f} us early (median), {total['early_us_p99']:.1f} us "
          "(99th percentile)" if matched else
          "no derived wake-up matched a recorded one")
    common.emit_json(args.json, {"recordings": rows, "total": total})
    return 0


if __name__ == "__main__":
    sys.exit(main())
