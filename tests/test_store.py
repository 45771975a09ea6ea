"""The run directory's table files: what store.write_table writes is what pandas would."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harmony import store


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(n)
    df = pd.DataFrame({
        "ts": np.arange(n, dtype=np.int64) * 1000,
        "cpu": rng.integers(0, 64, n).astype(np.int16),
        "pid": rng.integers(1, 1 << 22, n).astype(np.int32),
        "event": pd.Categorical(rng.choice(["sched_switch", "sched_wakeup"], n)),
        "comm": rng.choice(["a", "bb", "hmy-w0"], n).astype(object),
        "share": rng.random(n),
        "truncated": rng.random(n) < 0.5,
    })
    df.loc[::7, "share"] = np.nan
    df.attrs = {"anomalies": 3, "anomaly_kinds": {"switch_out_not_running": 2}, "ratio": 0.5,
                "note": "x", "flags": [1, 2], "dropped": np.arange(3)}  # not JSON: not kept
    return df


@pytest.mark.parametrize("rows", [0, 5, 3000])
@pytest.mark.parametrize("threaded", [False, True])
def test_write_table_reads_back_as_pandas_own_writer(tmp_path, monkeypatch, rows, threaded):
    if threaded:  # the many-rows path, whose threads pyarrow starts itself
        monkeypatch.setattr(store, "THREADED_CONVERSION_ROWS", 0)
    df = _frame(rows)
    store.write_table(tmp_path, "mine", df)
    theirs = df.copy(deep=False)
    theirs.attrs = {k: v for k, v in df.attrs.items() if k != "dropped"}
    theirs.to_parquet(tmp_path / "theirs.parquet", index=False)
    got = store.read_table(tmp_path / "mine.parquet")
    want = pd.read_parquet(tmp_path / "theirs.parquet")
    pd.testing.assert_frame_equal(got, want)
    assert got.attrs == want.attrs == theirs.attrs
    # the same metadata keys too (pandas' own PANDAS_ATTRS beside pyarrow's copy of the attrs)
    meta = [pq.read_schema(tmp_path / f"{w}.parquet").metadata for w in ("mine", "theirs")]
    assert meta[0].keys() == meta[1].keys()
    assert meta[0].get(b"PANDAS_ATTRS") == meta[1].get(b"PANDAS_ATTRS")
    assert "dropped" in df.attrs  # the caller's frame is left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.parquet", "theirs.parquet"]


@pytest.mark.parametrize("chunk", [1 << 20, 1000])
def test_write_table_encodes_int64_by_delta_narrow_ints_and_floats_split_the_rest_by_dictionary(
        tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(store, "WRITE_CHUNK_ROWS", chunk)   # 1000: row group by row group
    df = _frame(3000)
    df["end"] = pd.array(np.where(np.arange(3000) % 5, df["ts"] + 7, 0), dtype="Int64")
    df.loc[::5, "end"] = pd.NA                              # a nullable int64 column too
    store.write_table(tmp_path, "mine", df)
    pd.testing.assert_frame_equal(store.read_table(tmp_path / "mine.parquet"), df)
    meta = pq.ParquetFile(tmp_path / "mine.parquet").metadata
    assert meta.num_row_groups == (3 if chunk == 1000 else 1)
    for g in range(meta.num_row_groups):
        enc = {meta.row_group(g).column(i).path_in_schema: meta.row_group(g).column(i).encodings
               for i in range(meta.num_columns)}
        stats = {meta.row_group(g).column(i).path_in_schema:
                 meta.row_group(g).column(i).is_stats_set for i in range(meta.num_columns)}
        assert [c for c, has in stats.items() if has] == ["ts", "end"]
        codec = {meta.row_group(g).column(i).path_in_schema:
                 meta.row_group(g).column(i).compression for i in range(meta.num_columns)}
        for name in ("ts", "end"):              # delta-packed: not compressed
            assert "DELTA_BINARY_PACKED" in enc[name] and "RLE_DICTIONARY" not in enc[name]
            assert codec[name] == "UNCOMPRESSED"
        for name in ("cpu", "pid", "share"):    # narrow integers, floats: split, no dictionary
            assert "BYTE_STREAM_SPLIT" in enc[name] and "RLE_DICTIONARY" not in enc[name]
            assert codec[name] == "SNAPPY"
        for name in ("event", "comm"):
            assert "RLE_DICTIONARY" in enc[name], (name, enc[name])
            assert codec[name] == "SNAPPY"


@pytest.mark.parametrize("chunk", [1 << 20, 1000])
def test_write_table_makes_a_column_required_where_nothing_is_missing(tmp_path, monkeypatch,
                                                                       chunk):
    """Parquet's optional columns store a definition level a value: a column with no missing
    value is written required, one with any optional, whichever row group holds it (here only
    the last of three, written row group by row group), and both read back as they were."""
    monkeypatch.setattr(store, "WRITE_CHUNK_ROWS", chunk)
    df = _frame(3000)
    df["share"] = df["share"].fillna(0.5)        # no NaN left
    df["late"] = np.where(np.arange(3000) < 2990, 1.0, np.nan)          # NaN in the last rows
    df["late_cat"] = pd.Categorical(np.where(np.arange(3000) < 2990, "a", None))
    df["late_obj"] = np.where(np.arange(3000) < 2990, "x", None).astype(object)
    df["late_na"] = pd.array(np.where(np.arange(3000) < 2990, 1, 0), dtype="Int64")
    df.loc[2999, "late_na"] = pd.NA
    store.write_table(tmp_path, "mine", df)
    pd.testing.assert_frame_equal(store.read_table(tmp_path / "mine.parquet"), df)
    schema = pq.ParquetFile(tmp_path / "mine.parquet").schema
    optional = {schema.column(i).name for i in range(len(schema))
                if schema.column(i).max_definition_level > 0}
    assert optional == {"late", "late_cat", "late_obj", "late_na"}
    # an empty frame's columns of no type stay optional (Parquet has no required null column)
    store.write_table(tmp_path, "empty", df.iloc[:0].assign(comm=pd.Series([], dtype=object)))
    assert len(store.read_table(tmp_path / "empty.parquet")) == 0


def test_write_table_leaves_no_partial_file(tmp_path):
    class Unstorable:
        pass

    bad = pd.DataFrame({"x": [Unstorable()]})
    with pytest.raises(pa.ArrowInvalid, match="Conversion failed for column x with type object"):
        store.write_table(tmp_path, "bad", bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("n", [0, 1, 50])
def test_rows_frame_is_the_frame_astype_would_give(n):
    dtypes = {"ts": "int64", "cpu": "int16", "pid": np.int32, "share": np.float64, "comm": str}
    rows = [(1000 * i, i % 4, 100 + i, i / 7, f"hmy-w{i}") for i in range(n)]
    got = store.rows_frame(rows, dtypes)
    assert list(got.columns) == list(dtypes)
    assert [str(t) for t in got.dtypes] == ["int64", "int16", "int32", "float64", "str"]
    if n:
        want = pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)
        pd.testing.assert_frame_equal(got, want)
