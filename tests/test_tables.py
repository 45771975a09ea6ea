"""Every declared table (harmony.core.columns.Table) is built with exactly its declared columns, in
order, and dtypes: in memory, as its producer returns it, and in the Parquet file a run stores it
in.

Hermetic: the runs are simulated (harmony.simulate), the event streams made up
(harmony.analysis.event_streams), the kernel samplers fed a made-up sched debug file and counters.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest
from conftest import IMPLEMENTATIONS, use_implementation

from harmony import store
from harmony.analysis import counters, event_streams, foreign, reconstruct, tables
from harmony.core.columns import STR_DTYPE, Table
from harmony.probes import proc_sched, proc_stat, sched_debug
from harmony.simulate import simulate_run
from harmony.workload.tasks import TASKS, TaskSpec, tasks_frame

#: every declared table of a run but the events and markers (harmony.probes.schema)
DECLARED = tables.ALL + (TASKS, proc_stat.KERNEL_SAMPLES, proc_sched.KERNEL_COUNTERS,
                         sched_debug.KERNEL_NR_RUNNING)
#: the tables a run stores as <name>.parquet
STORED = tables.STORED + (TASKS, proc_stat.KERNEL_SAMPLES, proc_sched.KERNEL_COUNTERS,
                          sched_debug.KERNEL_NR_RUNNING)
DTYPES = {"int16", "int32", "int64", "float64", "bool", "category", "str", "object"}


def check(table: Table, df, tmp_path, stored: bool = True) -> None:
    """``df`` is a ``table``, and so is what storing it in a run directory and reading it back
    gives."""
    table.check(df)
    if stored:
        store.write_table(tmp_path, table.name, df)
        table.check(store.read_table(tmp_path / f"{table.name}.parquet"))


@pytest.fixture
def runs(tmp_path, no_figures):
    """Simulated runs, analysed by the pipeline: one whose tasks never stop and one where a task
    stops (its tasks table's stop_after_s is then float, not None)."""
    return [simulate_run("pairwise-random", "single-source", 4, tmp_path / "single",
                         {"duration": "1", "layout": "6,0,1,1"}),
            simulate_run("pairwise-random", "work-conservation", 4, tmp_path / "idle",
                         {"duration": "1", "idle_from_s": "0.3", "idle_to_s": "0.6"})]


def test_declarations():
    """Each column has a known dtype and a meaning; table names are unique; the tasks table is
    pid, TaskSpec's fields, comm; the stored tables are the run's."""
    for table in DECLARED:
        for c in table.columns:
            assert set(c.dtypes) <= DTYPES and c.meaning, (table.name, c)
    assert len({t.name for t in DECLARED}) == len(DECLARED)
    assert TASKS.names == ("pid", *(f.name for f in dataclasses.fields(TaskSpec)), "comm")
    assert {t.name for t in tables.STORED} | {"tasks", "kernel_samples", "kernel_counters"} \
        <= set(store.TABLES)
    assert "nr_running" in str(sched_debug.KERNEL_NR_RUNNING)


def test_frame_refuses_a_wrong_column():
    with pytest.raises(ValueError, match=r"runqueue lacks \['nr'\] and has undeclared \['n'\]"):
        tables.RUNQUEUE.frame({"ts": [], "t": [], "cpu": [], "n": []})
    df = tables.RUNQUEUE.frame({"ts": [1], "t": [0.0], "cpu": [0], "nr": [1]})
    with pytest.raises(ValueError, match="runqueue: cpu is int64, not int32"):
        tables.RUNQUEUE.check(df)
    with pytest.raises(ValueError, match="order"):
        tables.RUNQUEUE.check(df[["t", "ts", "cpu", "nr"]])


def test_a_run_stores_its_declared_tables(runs):
    """The pipeline's Parquet files, as a loaded run reads them."""
    for run in runs:
        for table in tables.STORED + (TASKS,):
            table.check(run.table(table.name))
    assert runs[0].tasks["stop_after_s"].dtype == object          # all None
    assert runs[1].tasks["stop_after_s"].dtype == np.float64      # one task stops


def test_tables_of_a_run(runs, tmp_path):
    """Every analysis table rebuilt from a simulated run's events, in memory and stored."""
    for k, run in enumerate(runs):
        m, events, tasks = run.manifest, run.events, run.tasks
        t0, t_end, cpus = m["t0_ns"], m["end_ns"], m["cpus"]
        d = tmp_path / str(k)
        d.mkdir()
        core = reconstruct.df_core(events, tasks, cpus, t0, t_end)
        for table in (tables.MIGRATIONS, tables.RUNS, tables.RUNQUEUE):
            check(table, core[table.name], d)
        check(tables.ALLOCATION, reconstruct.df_allocation(core["runs"], tasks, t0, t_end,
                                                           int(m["params"]["window_s"] * 1e9)), d)
        check(tables.SHARES, reconstruct.df_task_share(core["runs"], tasks, cpus, t0, t_end), d)
        check(tables.ANOMALIES, reconstruct.df_anomalies(events, tasks, t0), d, stored=False)
        load = foreign.df_foreign_load(events, tasks, [*cpus, max(cpus) + 1], t0, t_end)
        assert np.isnan(load["foreign_s"].iloc[-1])         # a CPU without switches is there too
        check(tables.FOREIGN_LOAD, load, d, stored=False)
        check(TASKS, tasks_frame([TaskSpec("a", cut_duty_at_s=0.5), TaskSpec("b")], [1, 2]), d)
        reads = [(label, int(p), t0 + i, t0 + i + 10, 2, 50 + i, 10**6)
                 for i, label in ((0, "start"), (1, "end")) for p in tasks["pid"]]
        kernel = proc_sched.KERNEL_COUNTERS.from_rows(reads)
        agreement = counters.df_counter_agreement(events, core["runs"], kernel)
        assert len(agreement) == len(tasks)
        check(tables.COUNTER_AGREEMENT, agreement, d, stored=False)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reconstruction_tables(implementation, monkeypatch, tmp_path):
    """The reconstruction's tables from an event stream with lost events (anomalies, runs of
    unseen start), by each implementation."""
    use_implementation(implementation, monkeypatch)
    sim = event_streams.simulate(ncpus=4, ntasks=12, n_events=20_000, seed=5, p_exit=0.01)
    events = sim.events.drop(index=sim.events.index[100::97]).reset_index(drop=True)
    cpus = range(4)
    core = reconstruct.df_core(events, sim.tasks, cpus, sim.t0, sim.t_end)
    assert core["runs"]["unseen_start"].any() and core["runqueue"].attrs["anomalies"] > 0
    for table in (tables.MIGRATIONS, tables.RUNS, tables.RUNQUEUE):
        check(table, core[table.name], tmp_path)
    check(tables.ALLOCATION, reconstruct.df_allocation(core["runs"], sim.tasks, sim.t0, sim.t_end,
                                                       10**6), tmp_path)
    check(tables.SHARES, reconstruct.df_task_share(core["runs"], sim.tasks, cpus, sim.t0,
                                                   sim.t_end), tmp_path)
    anomalies = reconstruct.df_anomalies(events, sim.tasks, sim.t0)
    assert len(anomalies)
    check(tables.ANOMALIES, anomalies, tmp_path, stored=False)
    check(tables.FOREIGN_LOAD, foreign.df_foreign_load(events, sim.tasks, cpus, sim.t0,
                                                       sim.t_end), tmp_path, stored=False)


def _sched_debug_text(ktime_ns: int) -> str:
    def task(current, state, comm, pid):
        return f"{'>' if current else ' '}{state} {comm:>15} {pid:5d}   1.0   E   2.0"

    return "\n".join([
        f"ktime                                   : {ktime_ns // 10**6}.{ktime_ns % 10**6:06d}",
        "", "cpu#0, 2600.000 MHz", "  .nr_running                    : 2", "",
        "runnable tasks:", " S            task   PID   vruntime  eligible  deadline", "-" * 60,
        task(True, "R", "hmy-w00", 1001), task(False, "R", "kworker/0:1", 77),
        task(False, "S", "hmy-w01", 1002),
        "", "cpu#1, 2600.000 MHz", "  .nr_running                    : 0", "",
        "runnable tasks:", " S            task   PID   vruntime  eligible  deadline", "-" * 60,
        task(False, "S", "hmy-w02", 1003), ""])


def test_kernel_sampler_tables(monkeypatch, tmp_path):
    """The kernel samplers' tables: each sampler's frame, with samples and without any."""
    # /proc/<pid>/stat of this process, swept by the sampler's own thread
    sampler = proc_stat.KernelSampler([os.getpid()], hz=200.0)
    check(proc_stat.KERNEL_SAMPLES, sampler.frame(), tmp_path)
    sampler.start()
    sampler.begin.set()
    deadline = time.monotonic() + 10
    while not sampler.rows and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stopping.set()
    sampler.join()
    assert sampler.rows
    check(proc_stat.KERNEL_SAMPLES, sampler.frame(), tmp_path)

    # the sched debug file, made up
    path = tmp_path / "sched_debug"
    path.write_text(_sched_debug_text(time.clock_gettime_ns(time.CLOCK_MONOTONIC)))
    nr = sched_debug.NrRunningSampler([1001, 1002, 1003], [0, 1], hz=10.0, path=path)
    check(sched_debug.KERNEL_NR_RUNNING, nr.frame(), tmp_path)
    nr.sample(reader_tid=4242)
    nr.close()
    assert not nr.errors and list(nr.frame()["other_comms"]) == ["kworker/0:1", ""]
    check(sched_debug.KERNEL_NR_RUNNING, nr.frame(), tmp_path)

    # /proc/<pid>/sched, made up: the counters as the kernel prints them
    text = (b"\nse.nr_migrations                             :                    3\n"
            b"nr_switches                                  :                   40\n"
            b"se.sum_exec_runtime                          :             1.475086\n")
    monkeypatch.setattr(proc_sched, "read", lambda pid: (10, 20, *proc_sched.parse(text)))
    reads = proc_sched.CounterReads([7, 8])
    check(proc_sched.KERNEL_COUNTERS, reads.frame(), tmp_path)
    reads.take("start")
    reads.take("end")
    assert list(reads.frame()["sum_exec_ns"]) == [1475086] * 4
    check(proc_sched.KERNEL_COUNTERS, reads.frame(), tmp_path)


def test_str_dtype_is_pandas_default():
    """A "str" column is what pandas makes of Python strings (object before pandas 3)."""
    assert tasks_frame([TaskSpec("a")])["name"].dtype == STR_DTYPE


def test_every_derived_tables_cpus_are_int32():
    """A CPU is int32 in every table the analysis derives, whatever it costs a large one (the
    run queue's): a user joins them on their CPUs, and pandas' merge_asof refuses keys of two
    integer types (docs/api.md joins the migrations with the run queue so)."""
    declared = [t for t in vars(tables).values() if isinstance(t, Table)]
    cpus = {(t.name, c.name): c.dtype for t in declared for c in t.columns
            if c.name == "cpu" or c.name.endswith("_cpu")}
    assert {"runqueue", "migrations", "runs"} <= {t for t, _ in cpus}
    assert set(cpus.values()) == {"int32"}, cpus
