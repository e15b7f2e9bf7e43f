"""Batch lookups over Parquet columns (ids, keys, lists of them) against NumPy lookups."""

from __future__ import annotations

import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import embstore  # noqa: E402
from embstore.errors import MissingDependencyError  # noqa: E402
from embstore.batch import parquet as bparquet  # noqa: E402

V, D = 60, 5
KEYS = [f"w{i}" for i in range(V)]


@pytest.fixture(scope="module")
def weights():
    return np.random.default_rng(3).standard_normal((V, D)).astype(np.float32)


@pytest.fixture(params=["memory", "zarr"])
def table(request, weights, tmp_path):
    if request.param == "memory":
        yield embstore.MemoryTable(weights.copy(), keys=KEYS)
        return
    t = embstore.save(tmp_path / "t", weights, keys=KEYS, chunk_rows=4, shard_rows=16)
    yield t
    t.close()


def _write(tmp_path, columns, row_group_size=3):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def _vectors(path, name="vector"):
    return pq.read_table(path).column(name).to_pylist()


def _rows(weights, ids):
    return [None if i is None else weights[i].tolist() for i in ids]


@pytest.mark.parametrize("batch_rows", [None, 2], ids=["auto", "2-rows"])
def test_id_column(table, weights, tmp_path, batch_rows):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, 10).tolist()
    ids[4] = None
    src = _write(tmp_path, {"id": pa.array(ids, pa.int32()), "doc": [f"d{i}" for i in range(10)],
                            "other": list(range(10))})
    out = tmp_path / "out.parquet"
    res = embstore.lookup_file(table, src, out, column="id", keep=["doc"], batch_rows=batch_rows)
    assert res["rows"] == 10 and res["batches"] == (1 if batch_rows is None else 5)
    got = pq.read_table(out)
    assert got.column_names == ["vector", "doc"]
    assert got.schema.field("vector").type == pa.list_(pa.float32(), D)
    assert got.column("doc").to_pylist() == [f"d{i}" for i in range(10)]
    assert _vectors(out) == _rows(weights, ids)
    assert pq.ParquetFile(out).metadata.num_row_groups == res["batches"]


def test_list_of_ids_column(table, weights, tmp_path):
    lists = [[1, 2, 3], [], None, [59], [0, None, 7], [4] * 9]
    src = _write(tmp_path, {"ids": lists}, row_group_size=2)
    out = tmp_path / "out.parquet"
    res = embstore.lookup_file(table, src, out, column="ids", batch_rows=4)
    assert res["rows"] == 6 and res["batches"] == 2  # 4 + 2 rows, across row groups
    assert pq.read_table(out).schema.field("vector").type == pa.list_(pa.list_(pa.float32(), D))
    assert _vectors(out) == [None if x is None else _rows(weights, x) for x in lists]


@pytest.mark.parametrize("listed", [False, True], ids=["scalar", "lists"])
def test_key_columns_and_oov(table, weights, tmp_path, listed):
    keys = ["w3", "nope", None, "w59"]
    col = [[k] for k in keys] if listed else keys
    src = _write(tmp_path, {"k": col})
    out = tmp_path / "out.parquet"
    where = "row 1, position 0" if listed else "row 1"
    with pytest.raises(embstore.KeyNotFoundError, match=f"in.parquet, {where}: key 'nope' is "
                       "not in the table"):
        embstore.lookup_file(table, src, out, column="k")
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if "partial" in p]
    zero = np.zeros(D, np.float32).tolist()
    want = [weights[3].tolist(), zero, None, weights[59].tolist()]
    embstore.lookup_file(table, src, out, column="k", oov="zero")
    got = _vectors(out)
    assert got == ([[w] for w in want] if listed else want)
    embstore.lookup_file(table, src, out, column="k", oov="unk", unk_id=7, overwrite=True)
    want[1] = weights[7].tolist()
    got = _vectors(out)
    assert got == ([[w] for w in want] if listed else want)


def test_out_of_range_ids(table, weights, tmp_path):
    src = _write(tmp_path, {"ids": [[1], [2, V]], "id": [0, -1]})
    out = tmp_path / "out.parquet"
    with pytest.raises(embstore.InvalidIdError,
                       match=rf"row 1, position 1: id {V} is out of range for a table of {V}"):
        embstore.lookup_file(table, src, out, column="ids")
    with pytest.raises(embstore.InvalidIdError, match="row 1: id -1 is out of range"):
        embstore.lookup_file(table, src, out, column="id")
    embstore.lookup_file(table, src, out, column="ids", oov="zero")
    assert _vectors(out)[1] == [weights[2].tolist(), [0.0] * D]


def test_refusals(table, tmp_path):
    src = _write(tmp_path, {"id": [1, 2], "x": [0.5, 1.5]})
    out = tmp_path / "out.parquet"
    with pytest.raises(embstore.FormatError, match="a Parquet input needs a Parquet output"):
        embstore.lookup_file(table, src, tmp_path / "out.npy", column="id")
    with pytest.raises(embstore.FormatError, match=r"no column 'nope' \(columns: id, x\)"):
        embstore.lookup_file(table, src, out, column="nope")
    with pytest.raises(embstore.FormatError, match="column 'x' must hold integer ids or string"):
        embstore.lookup_file(table, src, out, column="x")
    two = tmp_path / "two.parquet"  # without column=: input_ids, or the only id column
    pq.write_table(pa.table({"a": [1], "b": [2]}), two)
    with pytest.raises(embstore.FormatError, match=r"expected column= naming the column of ids "
                                                   r"or keys: 2 columns of integer ids among"):
        embstore.lookup_file(table, two, out)
    with pytest.raises(ValueError, match="resume= is not supported for Parquet"):
        embstore.lookup_file(table, src, out, column="id", resume=True)
    embstore.lookup_file(table, src, out, column="id")
    with pytest.raises(embstore.DestinationExistsError):
        embstore.lookup_file(table, src, out, column="id")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(embstore.FormatError, match="not a readable Parquet file"):
        embstore.lookup_file(table, tmp_path / "bad.parquet", tmp_path / "o2.parquet",
                             column="id")


def test_the_looked_up_column_can_be_kept(table, weights, tmp_path):
    src = _write(tmp_path, {"id": [4, 5]})
    out = tmp_path / "out.parquet"
    embstore.lookup_file(table, src, out, column="id", keep=["id", "id"])
    got = pq.read_table(out)
    assert got.column_names == ["vector", "id"] and got.column("id").to_pylist() == [4, 5]
    assert _vectors(out) == _rows(weights, [4, 5])


def test_empty_input_gives_an_empty_output_with_the_schema(table, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"ids": pa.array([], pa.list_(pa.int64())), "doc": pa.array(
        [], pa.string())}), src)
    out = tmp_path / "out.parquet"
    res = embstore.lookup_file(table, src, out, column="ids", keep="doc")
    got = pq.read_table(out)
    assert res["rows"] == 0 and got.num_rows == 0
    assert got.schema.field("vector").type == pa.list_(pa.list_(pa.float32(), D))
    assert got.column_names == ["vector", "doc"]


def test_batches_follow_the_output_budget(table, tmp_path, monkeypatch):
    src = _write(tmp_path, {"ids": [[1, 2, 3, 4]] * 20}, row_group_size=20)
    monkeypatch.setattr(bparquet, "DEFAULT_BLOCK_BYTES", 4 * D * 4 * 5)  # 5 rows of 4 ids
    res = embstore.lookup_file(table, src, tmp_path / "out.parquet", column="ids")
    assert res["batches"] == 4 and res["ids"] == 80


def test_cli_lookup_parquet(weights, tmp_path):
    from click.testing import CliRunner

    from embstore.cli import cli

    embstore.save(tmp_path / "t", weights, keys=KEYS).close()
    src = _write(tmp_path, {"toks": [["w1", "w2"], ["zz"]], "doc": ["a", "b"]})
    out = tmp_path / "out.parquet"
    run = CliRunner().invoke
    res = run(cli, ["lookup", str(tmp_path / "t"), str(src), str(out), "--column", "toks",
                    "--keep", "doc", "--oov", "zero", "--quiet"])
    assert res.exit_code == 0, res.output
    got = pq.read_table(out)
    assert got.column("doc").to_pylist() == ["a", "b"]
    assert got.column("vector").to_pylist() == [_rows(weights, [1, 2]), [[0.0] * D]]
    res = run(cli, ["lookup", str(tmp_path / "t"), str(src), str(out), "--column", "toks",
                    "--overwrite"])
    assert res.exit_code == 1 and "Error: " in res.output and "row 1, position 0: key 'zz'" \
        in res.output
    res = run(cli, ["lookup", str(tmp_path / "t"), str(src), str(tmp_path / "o.parquet")])
    assert res.exit_code == 1 and "expected --column naming the column of ids" in res.output


def test_without_pyarrow_the_error_names_the_extra(table, tmp_path, monkeypatch):
    src = _write(tmp_path, {"id": [1]})
    import sys
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails
    with pytest.raises(MissingDependencyError,
                       match=r"a Parquet batch job needs pyarrow.*pip install 'embstore\[parquet\]'"):
        embstore.lookup_file(table, src, tmp_path / "out.parquet", column="id")


def test_a_damaged_file_is_a_one_line_error(weights, tmp_path):
    from click.testing import CliRunner

    from embstore.cli import cli

    embstore.save(tmp_path / "t", weights).close()
    src = _write(tmp_path, {"id": list(range(40))}, row_group_size=10)
    data = src.read_bytes()
    cases = {"junk.parquet": b"PAR1 this is not parquet PAR1",
             "truncated.parquet": data[: len(data) // 2],
             "garbled.parquet": data[:8] + bytes(200) + data[208:]}  # pages zeroed, footer fine
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        out = tmp_path / f"out-{name}"
        res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(tmp_path / name),
                                       str(out), "--column", "id", "-q"])
        assert res.exit_code == 1, (name, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: {tmp_path / name}: "), lines
        assert ("not a readable Parquet file" in lines[0]
                or "cannot read row groups 0-3" in lines[0]), lines
        assert not out.exists() and not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def _same_table(got, want):
    assert got.column_names == want.column_names and got.schema == want.schema
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0", host="127.0.0.1") as c:
        yield c


@pytest.mark.dask
@pytest.mark.parametrize("kind", ["id-lists", "key-lists", "ids"])
def test_dask_parts_equal_the_local_job(weights, tmp_path, cluster, monkeypatch, kind):
    embstore.save(tmp_path / "t", weights, keys=KEYS, chunk_rows=4, shard_rows=16).close()
    rng = np.random.default_rng(5)
    lists = [rng.integers(0, V, rng.integers(0, 7)).tolist() for _ in range(50)]
    lists[7], lists[20] = None, [3, None, 4]
    col = {"id-lists": lists, "key-lists": [None if x is None else [
        None if i is None else KEYS[i] for i in x] for x in lists],
        "ids": [None if x is None else (x or [0])[0] for x in lists]}[kind]
    src = _write(tmp_path, {"v": col, "doc": [f"d{i}" for i in range(50)]}, row_group_size=6)
    monkeypatch.setattr(bparquet, "PART_BYTES", 3 * 6 * D * 4)  # 3 groups of 6 rows a part
    local, parts = tmp_path / "local.parquet", tmp_path / "dask.parquet"
    embstore.lookup_file(tmp_path / "t", src, local, column="v", keep=["doc"], batch_rows=4)
    res = embstore.lookup_file(tmp_path / "t", src, parts, column="v", keep=["doc"],
                               batch_rows=4, scheduler=cluster.scheduler_address)
    assert res["rows"] == 50 and res["parts"] >= 3 and res["scheduler"].startswith("tcp://")
    names = sorted(os.listdir(parts))
    assert names == [f"part-{i:05d}.parquet" for i in range(res["parts"])]
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    _same_table(pq.read_table(parts), pq.read_table(local))
    want = [None if x is None else _rows(weights, x) for x in lists] if kind != "ids" else \
        _rows(weights, col)
    assert _vectors(parts) == want


@pytest.mark.dask
def test_dask_errors_name_the_row_and_leave_nothing(weights, tmp_path, cluster, monkeypatch):
    embstore.save(tmp_path / "t", weights, keys=KEYS).close()
    toks = [["w1"]] * 30 + [["w2", "zz"]] + [["w3"]] * 9
    src = _write(tmp_path, {"toks": toks}, row_group_size=5)
    monkeypatch.setattr(bparquet, "PART_BYTES", 5 * D * 4)  # a part per row group
    out = tmp_path / "out.parquet"
    with pytest.raises(embstore.KeyNotFoundError, match="in.parquet, row 30, position 1: key "
                       "'zz' is not in the table"):
        embstore.lookup_file(tmp_path / "t", src, out, column="toks",
                             scheduler=cluster.scheduler_address)
    assert sorted(os.listdir(tmp_path)) == ["in.parquet", "t"]
    with pytest.raises(ValueError, match="a Dask job needs a table on disk"):
        embstore.lookup_file(embstore.MemoryTable(weights, keys=KEYS), src, out, column="toks",
                             scheduler=cluster.scheduler_address)


@pytest.mark.dask
@pytest.mark.slow  # starts its own cluster
def test_cli_parquet_on_a_local_cluster(weights, tmp_path):
    from click.testing import CliRunner

    from embstore.cli import cli

    embstore.save(tmp_path / "t", weights, keys=KEYS).close()
    src = _write(tmp_path, {"ids": [[1, 2], [3], []] * 5, "doc": list(range(15))})
    run = CliRunner().invoke
    for name, extra in (("local", []), ("dask", ["--scheduler", "local", "--workers", "1"])):
        res = run(cli, ["lookup", str(tmp_path / "t"), str(src), str(tmp_path / f"{name}.parquet"),
                        "--column", "ids", "--keep", "doc"] + extra)
        assert res.exit_code == 0, res.output
    assert " part file" in res.output
    _same_table(pq.read_table(tmp_path / "dask.parquet"), pq.read_table(tmp_path / "local.parquet"))


def test_cli_oov_unk_needs_unk_id_for_parquet_too(weights, tmp_path):
    from click.testing import CliRunner

    from embstore.cli import cli

    embstore.save(tmp_path / "t", weights).close()
    src = _write(tmp_path, {"id": [1, V]})
    out = tmp_path / "out.parquet"
    res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(src), str(out),
                                   "--column", "id", "--oov", "unk"])
    assert res.exit_code == 2 and "--oov unk needs --unk-id" in res.output
    res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(src), str(out),
                                   "--column", "id", "--oov", "unk", "--unk-id", "3", "-q"])
    assert res.exit_code == 0, res.output
    assert _vectors(out) == _rows(weights, [1, 3])


_MEMORY = """
import sys, pyarrow as pa, embstore
from embstore.batch import parquet as bparquet
bparquet.DEFAULT_BLOCK_BYTES = 1 << 12
embstore.lookup_file(sys.argv[1], sys.argv[2], sys.argv[3], column="k", oov="zero")
print(pa.default_memory_pool().max_memory())
"""


def test_arrow_memory_does_not_grow_with_the_row_groups(weights, tmp_path):
    """pyarrow's default pre-buffering kept every row group read so far (regression)."""
    import subprocess
    import sys

    embstore.save(tmp_path / "t", weights, keys=KEYS).close()
    peaks = []
    for groups in (2, 24):
        # 1 MB a row group, in keys of 496 bytes: a key over 512 bytes is hashed alone in
        # Python (keys/siphash.py), which made 2 KB keys cost 0.45 ms each (5 CPU-s here)
        keys = [f"{i:06d}" + "x" * 490 for i in range(2000 * groups)]
        keys[::7] = [KEYS[i % V] for i in range(len(keys[::7]))]
        src = tmp_path / f"in{groups}.parquet"
        pq.write_table(pa.table({"k": keys}), src, row_group_size=2000, compression="none",
                       use_dictionary=False)
        assert pq.ParquetFile(src).metadata.num_row_groups == groups
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.dirname(os.path.dirname(embstore.__file__))] +
            os.environ.get("PYTHONPATH", "").split(os.pathsep))}
        out = subprocess.run([sys.executable, "-c", _MEMORY, str(tmp_path / "t"), str(src),
                              str(tmp_path / f"out{groups}.parquet")], capture_output=True,
                             text=True, env=env)
        assert out.returncode == 0, out.stderr
        peaks.append(int(out.stdout.split()[-1]))
    assert peaks[1] < 2 * peaks[0], peaks  # 12x the row groups; pre-buffered: about 10x


@pytest.mark.parametrize("itype", ["int8", "uint16", "int64", "uint64"])
@pytest.mark.parametrize("batch_rows", [1, 3], ids=["1-row", "3-rows"])
def test_integer_types_nulls_and_sliced_batches(table, weights, tmp_path, itype, batch_rows):
    """Ids and list offsets are read from the Arrow buffers (sliced batches start at an
    offset into them; null lists and null ids give null vectors)."""
    lists = [[1, 2], None, [], [5, None, 59], [0], None, [7, 7, 7, 3]]
    src = _write(tmp_path, {"ids": pa.array(lists, pa.list_(getattr(pa, itype)())),
                            "doc": list(range(len(lists)))}, row_group_size=4)
    out = tmp_path / "out.parquet"
    res = embstore.lookup_file(table, src, out, column="ids", keep=["doc"],
                               batch_rows=batch_rows)
    assert res["ids"] == 10 and res["rows"] == len(lists)
    assert _vectors(out) == [None if x is None else _rows(weights, x) for x in lists]
    assert pq.read_table(out).column("doc").to_pylist() == list(range(len(lists)))


def test_uint64_ids_past_int64_are_out_of_range(table, tmp_path):
    src = _write(tmp_path, {"id": pa.array([3, 2**63 + 5], pa.uint64())})
    with pytest.raises(embstore.InvalidIdError, match=rf"row 1: id {2**63 + 5} is out of range"):
        embstore.lookup_file(table, src, tmp_path / "out.parquet", column="id")


def test_what_lies_under_a_null_id_is_not_looked_up(table, weights):
    """A null id's slot may hold any value (Arrow leaves it undefined): never an error,
    always a null vector."""
    from embstore.batch import arrowio

    data = np.array([4, 10**9, 7, -3], dtype=np.int64)  # 10**9 and -3 under nulls
    valid = np.packbits(np.array([1, 0, 1, 0], bool), bitorder="little")
    ids = pa.Array.from_buffers(pa.int64(), 4, [pa.py_buffer(valid), pa.py_buffer(data)])
    job = arrowio.PartJob(input="in.parquet", column="id", keep=(), vector_column="vector",
                          oov="error", unk_id=None, batch_rows=4, dim=D, dtype="<f4",
                          is_list=False, keys=False)
    schema = arrowio.output_schema(pa, pa.schema([pa.field("id", pa.int64())]), job)
    buf = np.full(4 * D, np.nan, np.float32)
    for sl in (ids, ids.slice(1, 3)):  # a slice starts its bitmap mid-byte
        vec = arrowio.vectors(pa, table, sl, job, 0, buf, path="in.parquet", schema=schema)
        want = [4, None, 7, None][4 - len(sl):]
        assert vec.to_pylist() == _rows(weights, want)


_NO_PANDAS = """
import sys, embstore
embstore.lookup_file(sys.argv[1], sys.argv[2], sys.argv[3], column="ids", keep=["doc"])
print("pandas" in sys.modules)
"""


@pytest.mark.slow  # over 5 CPU-s (2026-12-02 per-test CPU timings)
def test_an_id_job_does_not_import_pandas(weights, tmp_path):
    """pyarrow's ``to_numpy``/``np.asarray`` import pandas (about a second a process,
    a Dask worker each); ids and offsets are read from the Arrow buffers (regression)."""
    import subprocess
    import sys

    embstore.save(tmp_path / "t", weights, keys=KEYS).close()
    src = _write(tmp_path, {"ids": [[1, None], None, [3, 59]], "doc": [0, 1, 2]})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(embstore.__file__))] +
        os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    out = subprocess.run([sys.executable, "-c", _NO_PANDAS, str(tmp_path / "t"), str(src),
                          str(tmp_path / "out.parquet")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"
    assert _vectors(tmp_path / "out.parquet") == [
        [weights[1].tolist(), None], None, _rows(weights, [3, 59])]
