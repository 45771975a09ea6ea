"""Cross-checks of a reconstruction against the kernel's own view.

Needs: a rebuilt run queue (:func:`harmony.analysis.reconstruct.df_runqueue`) and kernel samples
(``kernel_samples`` of a run: ts, sweep_ns, pid, cpu, state, read from /proc during the run).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def kernel_agreement(runqueue: pd.DataFrame, samples: pd.DataFrame, cpus: list[int],
                     t0: int, t_end: int) -> dict:
    """Compare the rebuilt per-CPU run queues with the kernel's, sweep by sweep.

    A sweep reads /proc/<pid>/stat of every task; the kernel's run queue of CPU i is the number of
    tasks in state R whose task_cpu is i. A sweep agrees when every CPU's count equals the rebuilt
    step function at the sweep's midpoint. Sweeps are not instantaneous, so a migration during a
    sweep can make an honest disagreement; ``sweep_us_median`` says how long they took.

    Returns: sweeps, agreeing, agreement (fraction, None without sweeps), sweep_us_median,
    disagreements (up to 10 examples: t, cpu, kernel, rebuilt).
    """
    from harmony.analysis.reconstruct import runqueue_at

    s = samples[(samples["ts"] >= t0) & (samples["ts"] <= t_end)]
    if s.empty:
        return {"sweeps": 0, "agreeing": 0, "agreement": None, "sweep_us_median": None,
                "disagreements": []}
    running = s[s["state"] == "R"]
    kernel = (running.groupby(["ts", "cpu"]).size().unstack("cpu", fill_value=0)
              .reindex(index=np.unique(s["ts"]), columns=cpus, fill_value=0))
    rebuilt = runqueue_at(runqueue, kernel.index.to_numpy()).reindex(columns=cpus, fill_value=0)
    rebuilt.index = kernel.index
    same = (kernel.to_numpy() == rebuilt.to_numpy())
    agree = same.all(axis=1)
    examples = []
    for ts_i, row in zip(*np.nonzero(~same)):
        if len(examples) >= 10:
            break
        examples.append({"t": (kernel.index[ts_i] - t0) / 1e9, "cpu": cpus[row],
                         "kernel": int(kernel.iat[ts_i, row]), "rebuilt": int(rebuilt.iat[ts_i, row])})
    return {"sweeps": int(len(agree)), "agreeing": int(agree.sum()),
            "agreement": float(agree.mean()),
            "sweep_us_median": float(s.groupby("ts")["sweep_ns"].first().median() / 1e3),
            "disagreements": examples}
