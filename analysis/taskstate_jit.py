"""Compiled per-task state machine (numba): :func:`taskstate.task_records` in two passes.

The numpy version in :mod:`taskstate` evaluates the state machine with forward fills over whole
arrays (~25 passes and as many temporaries of the trace's length); here one pass over the events
emits the records and one pass per task walks them, with the same rules (documented in
:mod:`taskstate`). When it runs rather than the numpy version is :mod:`harmony.core.jit`'s choice;
the tests run both and compare them.
"""

from __future__ import annotations

import numpy as np

from harmony.core.kernels import inline, kernel

# record codes, as in taskstate (RECORDS)
WAKEUP, WAKEUP_NEW, SWITCH_IN, SWITCH_OUT_RUNNABLE, SWITCH_OUT_SLEEP, MIGRATE, EXIT = range(7)
SWITCH = 100                         # event kind of a sched_switch (gives up to two records)
# anomaly codes, as in taskstate (ANOMALIES)
(_SWITCH_IN_NOT_RUNNABLE, _SWITCH_IN_WRONG_CPU, _SWITCH_IN_WHILE_RUNNING, _SWITCH_OUT_NOT_RUNNING,
 _WAKEUP_WRONG_CPU, _WAKEUP_NEW_RUNNABLE, _MIGRATE_WRONG_CPU, _MIGRATE_WHILE_RUNNING,
 _RUNNABLE_AFTER_EXIT) = range(1, 10)


@kernel
def _task(table, v):
    """Dense task index of pid ``v`` (-1: not an experiment task); table[v + 1], clipped."""
    i = np.int64(v) + 1
    if i < 0:
        i = 0
    elif i >= table.shape[0]:
        i = table.shape[0] - 1
    return table[i]


@kernel
def emit(codes, lut, pid, prev_pid, table, rows, task, rec):
    """Records of the experiment tasks in seq order (seq = 2 * row, + 1 for a switch-in), written
    to rows/task/rec (room: two a switch, one an event of another kind read, as
    taskstate._records_room counts; no bounds are checked); returns how many.

    Event e's kind is lut[codes[e]] (codes[e] < 0: none): SWITCH, a record code (wakeup,
    wakeup_new, migrate, exit) or -1. The rec of a switch-out is SWITCH_OUT_RUNNABLE here; the
    caller's prev_state decides between runnable and sleep.
    """
    k = 0
    # the three ways to emit a record are written out: a shared helper, even inlined, made this
    # loop 6x slower (9 -> 55 ms per 2.5 M events)
    for e in range(codes.shape[0]):
        c = codes[e]
        if c < 0:
            continue
        kd = lut[c]
        if kd < 0:
            continue
        if kd == SWITCH:
            t = _task(table, prev_pid[e])
            if t >= 0:
                rows[k] = e
                task[k] = t
                rec[k] = SWITCH_OUT_RUNNABLE
                k += 1
            t = _task(table, pid[e])
            if t >= 0:
                rows[k] = e
                task[k] = t
                rec[k] = SWITCH_IN
                k += 1
        else:
            t = _task(table, pid[e])
            if t >= 0:
                rows[k] = e
                task[k] = t
                rec[k] = kd
                k += 1
    return k


@kernel
def by_task(task, n_tasks, order, ends, where):
    """A stable counting sort: order = the records ordered by task (each task's in their given
    order), ends[t] = where task t's records end in it, where[k] = where record k went (the
    inverse of order: the sorted rows in the records' given order)."""
    for t in range(n_tasks):
        ends[t] = 0
    for k in range(task.shape[0]):
        ends[task[k]] += 1
    at = np.empty(n_tasks, np.int64)
    total = 0
    for t in range(n_tasks):
        at[t] = total
        total += ends[t]
        ends[t] = total
    for k in range(task.shape[0]):
        t = task[k]
        order[at[t]] = k
        where[k] = at[t]
        at[t] += 1


@kernel
def arrange(order, rows, task, rec_in, pidset, seq, pid, rec, k_lo, k_hi):
    """The records' seq, pid and rec columns in (task, seq) order, for k in [k_lo, k_hi): output
    row k is record order[k] of :func:`emit`'s rows/task/rec_in (a switch-out's rec still
    SWITCH_OUT_RUNNABLE: :func:`walk` decides)."""
    for k in range(k_lo, k_hi):
        r = order[k]
        rc = rec_in[r]
        seq[k] = 2 * np.int64(rows[r]) + (1 if rc == SWITCH_IN else 0)
        pid[k] = pidset[task[r]]
        rec[k] = rc


@inline
def _gather_group(seq, rec, ev_cpu, ev_orig, ev_target, ev_prev_state, cpu, orig, dest, first,
                  g0, g1):
    """The first pass over one task's records [g0, g1): their columns from the events, each
    switch-out's runnable or sleep, and first[k] = "a runnable switch-out after the task's exit
    that no switch-in of it follows: its last" (until the second pass); (the first record that
    sets runnable, the first that sets running; -1: none)."""
    f_runnable = -1
    f_running = -1
    exit_pending = False
    for k in range(g0, g1):
        e = seq[k] >> 1
        rc = rec[k]
        cpu[k] = ev_cpu[e]
        orig[k] = -1
        dest[k] = -1
        dead = False
        if rc == SWITCH_OUT_RUNNABLE:
            if ev_prev_state[e] != 0:
                rc = SWITCH_OUT_SLEEP
                exit_pending = False    # dead (or asleep): what follows is not this exit's
            else:
                dead = exit_pending     # preempted as it exits, unless no switch-in follows
        elif rc == EXIT:
            exit_pending = True
        elif rc == MIGRATE:
            orig[k] = ev_orig[e]
            dest[k] = ev_target[e]
        elif rc == WAKEUP or rc == WAKEUP_NEW:
            dest[k] = ev_target[e]
            if rc == WAKEUP_NEW:
                exit_pending = False    # a new task of this pid
        rec[k] = rc
        # runnable set by: wakeup, wakeup_new, switch-in, runnable switch-out (1), sleep or
        # dead switch-out (0); running set by: switch-in (1), switch-outs, wakeup_new, migrate (0)
        sets_runnable = rc == WAKEUP or rc == WAKEUP_NEW or rc == SWITCH_IN or \
            rc == SWITCH_OUT_RUNNABLE or rc == SWITCH_OUT_SLEEP
        sets_running = rc != WAKEUP and rc != EXIT
        if f_runnable < 0 and sets_runnable:
            f_runnable = k
        if f_running < 0 and sets_running:
            f_running = k
        first[k] = dead   # first pass: holds "dead switch-out" until the second pass
    # a runnable switch-out after the exit is the last (the dead task's, as a kernel that
    # reports no dead state writes it) only where no switch-in of the task follows before a
    # new task of its pid (wakeup_new); else it was preempted while it exited
    switched_in_later = False
    for k in range(g1 - 1, g0 - 1, -1):
        rc = rec[k]
        if first[k] and switched_in_later:
            first[k] = False
        if rc == SWITCH_IN:
            switched_in_later = True
        elif rc == WAKEUP_NEW:
            switched_in_later = False
    return f_runnable, f_running


@inline
def _state_before(rec, cpu, orig, g0, f_runnable, f_running):
    """(runnable, running, CPU) inferred before a task's first record g0 (see taskstate's
    module doc) from the first records that set them."""
    r0 = rec[g0]
    is_sw0 = r0 == SWITCH_IN or r0 == SWITCH_OUT_RUNNABLE or r0 == SWITCH_OUT_SLEEP
    runnable = False
    if f_runnable >= 0:
        rf = rec[f_runnable]
        runnable = rf == SWITCH_IN or rf == SWITCH_OUT_RUNNABLE or rf == SWITCH_OUT_SLEEP
    running = False
    if f_running >= 0:
        rf = rec[f_running]
        running = rf == SWITCH_OUT_RUNNABLE or rf == SWITCH_OUT_SLEEP
    running = running and runnable
    if is_sw0 or r0 == EXIT:
        where = np.int64(cpu[g0])
    elif r0 == MIGRATE:
        where = np.int64(orig[g0])
    else:
        where = np.int64(-1)
    return runnable, running, where


@inline
def _anomaly(rc, dead, runnable, running, where, on_cpu, to_cpu, from_cpu):
    """The anomaly code of record ``rc`` (0: none) in the state before it (``runnable``,
    ``running``, on CPU ``where``); ``on_cpu``, ``to_cpu``, ``from_cpu``: the record's cpu,
    dest_cpu and orig_cpu; ``dead``: its last switch-out, after its exit. The last rule that
    holds wins."""
    is_out = rc == SWITCH_OUT_RUNNABLE or rc == SWITCH_OUT_SLEEP
    a = 0
    if rc == WAKEUP and runnable and where >= 0 and where != to_cpu:
        a = _WAKEUP_WRONG_CPU
    if rc == WAKEUP_NEW and runnable:
        a = _WAKEUP_NEW_RUNNABLE
    if rc == MIGRATE and where >= 0 and where != from_cpu:
        a = _MIGRATE_WRONG_CPU
    if rc == MIGRATE and running:
        a = _MIGRATE_WHILE_RUNNING
    if is_out and not (running and where == on_cpu):
        a = _SWITCH_OUT_NOT_RUNNING
    if dead and rc == SWITCH_OUT_RUNNABLE:
        a = _RUNNABLE_AFTER_EXIT
    if rc == SWITCH_IN and runnable and where != on_cpu:
        a = _SWITCH_IN_WRONG_CPU
    if rc == SWITCH_IN and running:
        a = _SWITCH_IN_WHILE_RUNNING
    if rc == SWITCH_IN and not runnable:
        a = _SWITCH_IN_NOT_RUNNABLE
    return a


@inline
def _apply(rc, dead, runnable, running, where, on_cpu, to_cpu):
    """(runnable, running, CPU) after record ``rc`` applied to the state before it (arguments as
    :func:`_anomaly`'s)."""
    if rc == WAKEUP:
        runnable = True
    elif rc == WAKEUP_NEW:
        runnable = True
        running = False
    elif rc == SWITCH_IN:
        runnable = True
        running = True
    elif rc == SWITCH_OUT_RUNNABLE:
        runnable = not dead
        running = False
    elif rc == SWITCH_OUT_SLEEP:
        runnable = False
        running = False
    elif rc == MIGRATE:
        running = False
    if rc == SWITCH_IN or rc == SWITCH_OUT_RUNNABLE or rc == SWITCH_OUT_SLEEP:
        where = np.int64(on_cpu)
    elif rc != EXIT and to_cpu >= 0:
        where = np.int64(to_cpu)
    return runnable, running, where


@kernel
def walk(seq, pid, rec, ev_cpu, ev_orig, ev_target, ev_prev_state, cpu, orig, dest,
         runnable_before, runnable_after, running_before, running_after, cpu_before, cpu_after,
         first, anomaly, k_lo, k_hi):
    """Fill the other task_records columns (see taskstate.task_records) of the records arranged
    in (task, seq) order (:func:`arrange`), for k in [k_lo, k_hi), a range of whole tasks
    (threads may walk disjoint ones at once). Each task's records are walked twice: once to find
    what its state before the first record must have been (:func:`_gather_group`,
    :func:`_state_before`), once to apply them (:func:`_anomaly`, :func:`_apply`)."""
    n = k_hi
    g0 = k_lo
    while g0 < n:
        g1 = g0 + 1
        while g1 < n and pid[g1] == pid[g0]:
            g1 += 1
        f_runnable, f_running = _gather_group(
            seq, rec, ev_cpu, ev_orig, ev_target, ev_prev_state, cpu, orig, dest, first, g0, g1)
        runnable, running, where = _state_before(rec, cpu, orig, g0, f_runnable, f_running)
        for k in range(g0, g1):
            rc = rec[k]
            dead = first[k]
            first[k] = k == g0
            runnable_before[k] = runnable
            running_before[k] = running
            cpu_before[k] = where
            anomaly[k] = _anomaly(rc, dead, runnable, running, where, cpu[k], dest[k], orig[k])
            runnable, running, where = _apply(rc, dead, runnable, running, where, cpu[k],
                                              dest[k])
            runnable_after[k] = runnable
            running_after[k] = running
            cpu_after[k] = where
        g0 = g1
