"""word2vec binary, read a buffer at a time (formats/word2vec/records.py) and written a block
at a time: the rows, keys and errors are those of the record-by-record rule (the reader's
``_split``, today's behaviour, forced here by turning the search off), the bytes written are
the ones a row-by-row writer makes, and gensim reads both ways what it reads."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

import embstore
from embstore.errors import FormatError
from embstore.formats import get
from embstore.formats.word2vec import binary, records
from embstore.formats.word2vec.ahead import ReadAhead

# vector bytes drawn from these: spaces and newlines everywhere, every float32 finite
# (no byte has the exponent bits of a NaN or infinity)
TRICKY = np.array([0x20, 0x0A, 0x20, 0x41, 0x00, 0x3F, 0x0A, 0x20], np.uint8)


def _vectors(rng, n, dim, tricky):
    vecs = rng.standard_normal((n, dim)).astype("<f4")
    if tricky:  # (the first row plain: it tells the layout, as record by record)
        vecs[1:] = TRICKY[rng.integers(0, len(TRICKY), size=(n - 1, 4 * dim))].view("<f4")
    return vecs


def _keys(rng, n, *, spaces=False):
    words = ["a", "the", "été", "naïve", "日本", "</s>", "x1", "Z"]
    out = []
    for i in range(n):
        parts = [words[j] for j in rng.integers(0, len(words), size=1 + int(rng.integers(0, 3)))]
        out.append((" " if spaces and i % 3 == 0 else "_").join(parts) + str(i))
    return out


def _file(keys, vecs, *, newline, quirks=False):
    """The bytes of a word2vec binary file: the C tool's layout (``newline``) or gensim's;
    ``quirks``: a few keys preceded by extra ``\\n`` (which gensim and we skip)."""
    out = [f"{len(keys)} {vecs.shape[1]}\n".encode()]
    for i, (k, v) in enumerate(zip(keys, vecs)):
        lead = b"\n\n" if quirks and i % 7 == 3 else b""
        out.append(lead + k.encode() + b" " + v.astype("<f4").tobytes() + (b"\n" if newline else b""))
    return b"".join(out)


def _read(path, *, search=True, monkeypatch=None, **kw):
    """Rows and keys of ``path``; ``search=False``: record by record only (today's rule)."""
    if not search:
        monkeypatch.setattr(binary, "find_rows",
                            lambda *a, **k: (np.empty(0, np.int64), b""))
    try:
        with binary.BinaryReader(path, **kw) as r:
            blocks = list(r)
    finally:
        if not search:
            monkeypatch.undo()
    dim = blocks[0][0].shape[1] if blocks else 0
    vecs = np.concatenate([b for b, _ in blocks]) if blocks else np.empty((0, dim), np.float32)
    return vecs, [k for _, ks in blocks for k in ks], [len(b) for b, _ in blocks]


LAYOUTS = [(True, False, False), (False, False, False), (True, True, False),
           (True, False, True), (False, False, True)]


@pytest.mark.parametrize("newline,spaces,quirks", LAYOUTS,
                         ids=["c", "gensim", "c-spaced-keys", "c-quirks", "gensim-quirks"])
@pytest.mark.parametrize("tricky", [True, False], ids=["tricky-bytes", "normal"])
@pytest.mark.parametrize("chunk_bytes,block_rows", [(1, 7), (700, 5), (8 << 20, 65536)],
                         ids=["chunk1", "chunk700", "chunk8M"])
def test_search_reads_what_record_by_record_reads(tmp_path, monkeypatch, newline, spaces,
                                                   quirks, tricky, chunk_bytes, block_rows):
    rng = np.random.default_rng([int(newline), int(spaces), int(quirks), int(tricky)])
    n, dim = 600, 5
    keys, vecs = _keys(rng, n, spaces=spaces), _vectors(rng, n, dim, tricky)
    p = tmp_path / "v.bin"
    p.write_bytes(_file(keys, vecs, newline=newline, quirks=quirks))
    kw = {"chunk_bytes": chunk_bytes, "block_rows": block_rows}
    try:
        ref, ref_keys, _ = _read(p, search=False, monkeypatch=monkeypatch, **kw)
    except FormatError as exc:  # a spaced key misread before tricky bytes: the same error
        assert spaces and tricky
        with pytest.raises(FormatError) as info:
            _read(p, **kw)
        assert str(info.value) == str(exc)
        return
    got, got_keys, sizes = _read(p, **kw)
    assert got_keys == ref_keys
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    assert max(sizes) <= block_rows and sum(sizes) == n
    if not spaces:  # (where a key holds spaces, the rule picks among them: compared above)
        assert got_keys == keys
        np.testing.assert_array_equal(got.view(np.uint32), vecs.view(np.uint32))


@pytest.mark.parametrize("newline", [True, False], ids=["c", "gensim"])
def test_gensim_reads_the_same(tmp_path, newline):
    KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
    rng = np.random.default_rng(3)
    keys, vecs = _keys(rng, 2000), _vectors(rng, 2000, 7, tricky=True)
    p = tmp_path / "v.bin"
    p.write_bytes(_file(keys, vecs, newline=newline))
    kv = KeyedVectors.load_word2vec_format(str(p), binary=True)
    got, got_keys, _ = _read(p, chunk_bytes=4096, block_rows=300)
    assert got_keys == kv.index_to_key == keys
    np.testing.assert_array_equal(got, kv.vectors)


def _walk(succ: np.ndarray) -> list[int]:
    """The chain from 0 through ``succ``, one step at a time (the reference)."""
    walk, j = [], 0
    while j < succ.size:
        walk.append(j)
        j = int(succ[j])
    return walk


def test_reachable_is_the_chain():
    """The candidates reachable from 0, checked against a walk, also on chains built so
    that the rounds give up (a false chain longer than MAX_STEPS: the walk takes over)."""
    rng = np.random.default_rng(0)
    for m in (1, 2, 10, 1000, 20_000):
        succ = np.minimum(np.arange(m) + rng.integers(1, 4, size=m), m)
        np.testing.assert_array_equal(records.reachable(succ), _walk(succ))
    m = 2 * records.MAX_STEPS + 10  # 0 -> m; 1 -> 2 -> ... -> m: all of it false
    succ = np.append(m, np.arange(2, m + 1))
    np.testing.assert_array_equal(records.reachable(succ), [0])
    succ = np.minimum(np.arange(m) + 2, m)  # 0 -> 2 -> 4 ..., and 1 -> 3 -> 5 ... (false,
    # more than MAX_STEPS long: the rounds give up, doubling finds the chain)
    np.testing.assert_array_equal(records.reachable(succ), np.arange(0, m, 2))
    for m in (1, 2, 3, 1000):
        succ = np.minimum(np.arange(m) + rng.integers(1, 5, size=m), m)
        np.testing.assert_array_equal(records._doubling(succ), _walk(succ))


BAD = [
    # name, rows, mutate(file bytes, record size) -> bytes, message
    ("truncated", lambda b, rs: b[:-rs // 2], r"row 300: expected 28 bytes of vector after the "
     r"key, got \d+ \(the file is truncated\)"),
    ("bad utf-8", lambda b, rs: b.replace(b"w0237 ", b"w\xff237 "),
     r"row 238: expected a UTF-8 key, got b'w\\xff237'"),
    ("nan", lambda b, rs: b.replace(b"w0150 " + b"\x00" * 4, b"w0150 " + struct.pack("<f", np.nan)),
     r"row 151, column 1: expected a finite number, got"),
    ("line break in key", lambda b, rs: b.replace(b"w0201 ", b"w0\n01 "),
     r"row 202: expected a (key without line breaks|key, a space, 28 bytes of vector and a "
     r"newline)"),
    ("fewer rows", lambda b, rs: b.replace(b"300 7\n", b"301 7\n", 1),
     r"the header promises 301 rows, the file has 300"),
    ("more rows", lambda b, rs: b.replace(b"300 7\n", b"299 7\n", 1),
     r"the header promises 299 rows, the file has more"),
    ("wrong dim", lambda b, rs: b.replace(b"300 7\n", b"300 8\n", 1),
     r"(row \d+: expected|the header promises 300 rows)"),
]


@pytest.mark.parametrize("newline", [True, False], ids=["c", "gensim"])
@pytest.mark.parametrize("mutate,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_file_names_file_and_row(tmp_path, monkeypatch, newline, mutate, message):
    """Errors deep in a file, found by the search, say what record by record says."""
    vecs = np.ones((300, 7), np.float32)
    vecs[150, 0] = 0.0  # the bytes the "nan" case replaces
    keys = [f"w{i:04d}" for i in range(300)]
    data = _file(keys, vecs, newline=newline)
    p = tmp_path / "bad.bin"
    p.write_bytes(mutate(data, 5 + 1 + 28 + newline))
    said = []
    for search in (True, False):
        with pytest.raises(FormatError, match=f"^{p}: {message}") as info:
            _read(p, search=search, monkeypatch=monkeypatch, chunk_bytes=1000, block_rows=64)
        assert info.value.path == str(p)
        said.append(str(info.value))
    assert said[0] == said[1]


def _row_by_row(keys, vecs) -> bytes:
    """A word2vec binary file the C tool's way, one row at a time (the reference)."""
    head = f"{len(keys)} {vecs.shape[1]}\n".encode()
    return head + b"".join(k.encode() + b" " + v.astype("<f4").tobytes() + b"\n"
                           for k, v in zip(keys, vecs))


@pytest.mark.parametrize("n,dim,block_rows", [(0, 3, 4), (1, 1, 4), (1000, 5, 64), (333, 300, 100)])
def test_export_bytes_are_row_by_row(tmp_path, n, dim, block_rows):
    rng = np.random.default_rng(n)
    keys, vecs = _keys(rng, n), _vectors(rng, n, dim, tricky=bool(n % 2))
    t = embstore.MemoryTable(vecs, keys=keys)
    p = tmp_path / "o.bin"
    assert get("word2vec-binary").write(p, t, block_rows=block_rows) == n
    assert p.read_bytes() == _row_by_row(keys, vecs)
    if n:
        KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
        kv = KeyedVectors.load_word2vec_format(str(p), binary=True)
        assert kv.index_to_key == keys
        np.testing.assert_array_equal(kv.vectors, vecs)


def test_export_of_a_stored_table_and_limit(tmp_path):
    rng = np.random.default_rng(1)
    keys, vecs = _keys(rng, 500), _vectors(rng, 500, 16, tricky=False)
    embstore.save(tmp_path / "t.emb", vecs, keys=keys).close()
    embstore.export_table(tmp_path / "t.emb", tmp_path / "o.bin", format="word2vec-binary",
                          limit=321, block_rows=100)
    assert (tmp_path / "o.bin").read_bytes() == _row_by_row(keys[:321], vecs[:321])


def test_pack_rows_needs_one_key_per_row():
    with pytest.raises(ValueError, match="expected 2 keys, got 3"):
        records.pack_rows(np.frombuffer(b"abc", np.uint8), np.ones(3, np.int64),
                          np.zeros((2, 4), np.uint8))
    with pytest.raises(ValueError, match="keys of 4 bytes in all, got 3 bytes"):
        records.pack_rows(np.frombuffer(b"abc", np.uint8), np.array([1, 3]),
                          np.zeros((2, 4), np.uint8))


@pytest.mark.parametrize("newline", [True, False], ids=["c", "gensim"])
def test_pack_rows_is_row_by_row(newline):
    """Records packed a block at once (keys of any UTF-8 length, rows of any bytes) equal
    the records joined one by one."""
    rng = np.random.default_rng(3)
    keys = _keys(rng, 257)
    data = rng.integers(0, 256, size=(257, 12), dtype=np.uint8)
    enc = [k.encode() for k in keys]
    got = records.pack_rows(np.frombuffer(b"".join(enc), np.uint8),
                            np.array([len(e) for e in enc]), data, newline,
                            buf=np.full(1 << 16, 7, np.uint8))
    want = b"".join(e + b" " + d.tobytes() + (b"\n" if newline else b"")
                    for e, d in zip(enc, data))
    assert got.tobytes() == want


@pytest.mark.parametrize("held", ["str", "stored"])
def test_export_takes_the_stored_key_bytes(tmp_path, monkeypatch, held):
    """A stored table's keys are written from their stored bytes (no ``str`` a key), a
    table holding ``str`` keys encodes them: the same file either way, key deltas of
    appended rows included."""
    from embstore.keys.hashing import decode_keys
    from embstore.formats.word2vec import binary

    rng = np.random.default_rng(4)
    keys, vecs = _keys(rng, 300), _vectors(rng, 300, 6, tricky=True)
    if held == "stored":
        t = embstore.save(tmp_path / "t.emb", vecs[:200], keys=keys[:200])
        t.close()
        t = embstore.open(tmp_path / "t.emb", mode="r+")
        t.append(vecs[200:], keys=keys[200:])  # a key delta: the segmented vocabulary
        made = []
        monkeypatch.setattr(binary, "_check_keys", lambda *a: made.append(a))
        import embstore.keys.index as index
        monkeypatch.setattr(index, "decode_keys", lambda *a: made.append(a) or decode_keys(*a))
    else:
        t = embstore.MemoryTable(vecs, keys=keys)
    assert get("word2vec-binary").write(tmp_path / "o.bin", t, block_rows=64) == 300
    assert (tmp_path / "o.bin").read_bytes() == _row_by_row(keys, vecs)
    if held == "stored":
        assert made == []  # no key decoded to str, none checked one by one
    t.close()


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("embstore-")}


def test_read_ahead_order_errors_and_early_close():
    before = _threads()

    def gen(fail_at=None):
        for i in range(10):
            if i == fail_at:
                raise FormatError("row 7: broken", path="x.bin")
            yield i

    assert list(ReadAhead(gen())) == list(range(10))
    it = ReadAhead(gen(fail_at=7))
    got = []
    with pytest.raises(FormatError, match=r"^x.bin: row 7: broken$"):
        for i in it:
            got.append(i)
    assert got == list(range(7))
    it = ReadAhead(gen())
    assert next(it) == 0
    it.close()  # the thread stops and the source generator is closed
    assert _threads() == before


def test_reader_closed_mid_file_stops_its_thread(tmp_path):
    rng = np.random.default_rng(2)
    p = tmp_path / "v.bin"
    p.write_bytes(_file(_keys(rng, 400), _vectors(rng, 400, 4, False), newline=True))
    before = _threads()
    r = binary.BinaryReader(p, block_rows=10)
    it = iter(r)
    assert len(next(it)[0]) == 10
    r.close()
    assert _threads() == before
    r = binary.BinaryReader(p, block_rows=10)
    iter(r)  # the thread starts parsing at once; closing before a block is taken stops it
    r.close()
    assert _threads() == before


def _fails_cleanly(src, tmp_path, match: str, **kw) -> None:
    """Importing ``src`` into ``tmp_path / "t.emb"`` raises an ``OSError`` matching
    ``match``, ends every thread it started and leaves nothing beside ``src``."""
    before = _threads()
    with pytest.raises(OSError, match=match):
        embstore.import_file(src, tmp_path / "t.emb", **kw)
    assert not (tmp_path / "t.emb").exists()
    assert [x.name for x in tmp_path.iterdir()] == [src.name]
    assert _threads() == before


def test_import_whose_table_cannot_be_set_up_stops_the_parser(tmp_path, monkeypatch):
    import embstore.convert as convert

    def broken(*a, **k):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(convert, "TableWriter", broken)
    p = tmp_path / "v.bin"
    p.write_bytes(_file([f"k{i}" for i in range(3000)], np.ones((3000, 4), np.float32),
                        newline=True))
    _fails_cleanly(p, tmp_path, "Permission denied", block_rows=100)


def test_import_of_a_file_with_an_error_leaves_nothing(tmp_path):
    vecs = np.ones((5000, 3), np.float32)
    vecs[4321, 2] = np.inf
    p = tmp_path / "v.bin"
    p.write_bytes(_file([f"k{i}" for i in range(5000)], vecs, newline=True))
    with pytest.raises(FormatError, match=r"row 4322, column 3: expected a finite number"):
        embstore.import_file(p, tmp_path / "t.emb", block_rows=1000)
    assert not (tmp_path / "t.emb").exists()
    assert [x.name for x in tmp_path.iterdir()] == ["v.bin"]


# -- imports with the parser's thread and the writer's thread -------------------------------
def test_import_keeps_first_duplicates_across_blocks(tmp_path):
    rng = np.random.default_rng(4)
    keys = [f"k{i % 700}" for i in range(1000)]  # rows 700.. repeat earlier keys
    vecs = _vectors(rng, 1000, 6, tricky=False)
    p = tmp_path / "v.bin"
    p.write_bytes(_file(keys, vecs, newline=False))
    res = embstore.import_file(p, tmp_path / "t.emb", block_rows=64)
    assert res.rows == 700 and res.duplicates == 300
    with embstore.open(tmp_path / "t.emb") as t:
        np.testing.assert_array_equal(t.to_numpy(), vecs[:700])
        assert list(t.keys) == keys[:700]


def test_a_failed_row_write_is_raised_and_leaves_nothing(tmp_path, monkeypatch):
    """A write failing in the writer's thread while the parser's thread reads ahead: the
    import raises it, both threads end and nothing is left beside DEST."""
    from embstore.store.rows.stream import PagedStream

    calls = []
    real = PagedStream.add

    def failing(self, rows, *, final=False):
        calls.append(len(rows))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, rows, final=final)

    monkeypatch.setattr(PagedStream, "add", failing)
    p = tmp_path / "v.bin"
    p.write_bytes(_file([f"k{i}" for i in range(40_000)], np.ones((40_000, 64), np.float32),
                        newline=True))
    _fails_cleanly(p, tmp_path, "No space left on device", block_rows=4000)
    assert len(calls) >= 3


@pytest.mark.parametrize("keys, row", [(["a", "b c", "d"], 1), (["a", "", "d"], 1),
                                       ([" a", "b", "d"], 0), (["a", "b", "d\t"], 2),
                                       (["a", "b", ""], 2), (["ä\n", "b", "d"], 0)],
                         ids=["space", "empty", "leading space", "tab", "empty last",
                              "newline"])
def test_keys_checked_on_their_bytes_name_the_row(tmp_path, keys, row):
    """The byte-level check of a block's keys lets no key through that a reader would cut
    or lose, and names the row as the key-by-key check does."""
    from embstore.errors import FormatError
    from embstore.formats.word2vec import binary

    class Held(list):  # keys whose bytes the table holds (as a stored table's)
        def utf8_between(self, start, stop):
            enc = [k.encode() for k in self[start:stop]]
            return np.frombuffer(b"".join(enc), np.uint8), np.array([len(e) for e in enc])

    for source in (keys, Held(keys)):
        pad = type(source)(["p"] * 10 + list(source))
        with pytest.raises(FormatError, match=f"row {row + 10}: key"):
            binary._key_bytes(pad, 10, 13)
        fine = type(source)(["p"] * 10 + ["ä", "b", "ü"])
        utf8, lengths = binary._key_bytes(fine, 10, 13)
        assert utf8.tobytes() == "äbü".encode() and lengths.tolist() == [2, 1, 2]
