"""Compiled (numba) passes of :func:`harmony.analysis.plots.step_envelopes`: every CPU's run
queue binned for its figure in one pass over the run-queue table.

The numpy version takes each CPU's steps out of the table (a mask and two copies a CPU) and bins
them with float temporaries as long as the steps. Here one pass counts each CPU's steps and finds
its first, and another writes each binned CPU's least and greatest length a bin, with the same
arithmetic: the same arrays, the same PNG byte for byte. The run-queue figure of a 10 M-event
import (5.4 M steps, read back from its file) took 0.17-0.18 s instead of 0.28-0.42; the whole
import 0.985x the time (5 interleaved pairs, 2026-12-06). When it runs rather than the numpy
version is :mod:`harmony.core.jit`'s choice; the tests run both and compare them.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import kernel


@kernel
def _slot(table, cpu):
    """The position of CPU ``cpu`` by ``table`` (a key table, clipped at both ends; -1: none)."""
    i = cpu + 1
    if i < 0:
        i = 0
    elif i >= table.shape[0]:
        i = table.shape[0] - 1
    return table[i]


@kernel
def steps_per_cpu(cpu, table, counts, first):
    """For each CPU j of ``table`` (a key table of the CPUs drawn): its steps in the run-queue
    table's ``cpu`` column, added to ``counts[j]``, and its first row, ``first[j]`` (left as it
    is, -1, where it has none)."""
    for i in range(cpu.shape[0]):
        j = _slot(table, cpu[i])
        if j >= 0:
            if counts[j] == 0:
                first[j] = i
            counts[j] += 1


@kernel
def envelopes(cpu, t, nr, table, binned, t0, span, edges, low, high):
    """The run queue of each binned CPU as :func:`harmony.analysis.plots.step_envelope` bins it:
    row k of ``low`` / ``high`` (``binned[j]`` = k for CPU j of ``table``, -1: not binned) gets
    the least / greatest length the step function (``t``, ``nr`` of its rows, in time order)
    takes in each of its bins, whose starts are ``edges[k]``: the length in force at a bin's
    start (the last step at or before it, else the first step), and every step in the bin, a
    step's bin being ``min(int((t - t0[k]) / span[k] * bins), bins - 1)`` (0 where ``span[k]``
    is not positive)."""
    n_binned, bins = low.shape
    now = np.zeros(n_binned, np.float64)           # the length in force after the last step
    started = np.zeros(n_binned, np.bool_)
    filled = np.zeros(n_binned, np.int64)          # bins whose start has its length
    least = np.full((n_binned, bins), np.inf)
    most = np.full((n_binned, bins), -np.inf)
    for i in range(t.shape[0]):
        j = _slot(table, cpu[i])
        if j < 0:
            continue
        k = binned[j]
        if k < 0:
            continue
        ti = t[i]
        v = np.float64(nr[i])
        if not started[k]:
            now[k] = v
            started[k] = True
        b = filled[k]
        while b < bins and edges[k, b] < ti:      # starts before this step: the length before
            low[k, b] = now[k]
            high[k, b] = now[k]
            b += 1
        filled[k] = b
        now[k] = v
        s = 0
        if span[k] > 0:
            s = min(int((ti - t0[k]) / span[k] * bins), bins - 1)
        if v < least[k, s]:
            least[k, s] = v
        if v > most[k, s]:
            most[k, s] = v
    for k in range(n_binned):
        for b in range(filled[k], bins):           # starts at or after the last step
            low[k, b] = now[k]
            high[k, b] = now[k]
        for b in range(bins):
            if least[k, b] < low[k, b]:
                low[k, b] = least[k, b]
            if most[k, b] > high[k, b]:
                high[k, b] = most[k, b]
