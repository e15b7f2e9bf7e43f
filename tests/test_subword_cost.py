"""Subword composition costs what its n-grams cost: a long word (a caller's unknown key)
is summed down its rows in gensim's order, in pieces of the row budget, exactly as the
one-addition-after-another reference; a 64 KiB unknown key (the longest a table stores)
composes in well under a second (the old per-position loop took 2.6 s), a longer one is
refused at once."""

from __future__ import annotations

import time

import numpy as np
import pytest

import embstore
from embstore.store.subword.hashing import compose, ngram_buckets


def _reference(ids, counts, rows, base=None):
    """One addition after the other, in float32, then the mean (gensim's get_vector and
    adjust_vectors)."""
    out, at = [], 0
    for i, c in enumerate(counts.tolist()):
        acc = np.zeros(rows.shape[1], np.float32) if base is None else base[i].copy()
        for j in ids[at:at + c].tolist():
            acc += rows[j]
        at += c
        n = c + (base is not None)
        out.append(acc / np.float32(n) if n else acc)
    return np.stack(out)


@pytest.mark.parametrize("dim", [1, 2, 7, 64], ids=lambda d: f"dim{d}")
@pytest.mark.parametrize("budget", [5, 64, 1000, 1 << 16], ids=lambda b: f"budget{b}")
@pytest.mark.parametrize("known", [False, True], ids=["unknown", "known"])
def test_long_and_short_words_compose_exactly_as_one_addition_after_another(budget, known, dim):
    rng = np.random.default_rng(budget)
    rows = (rng.standard_normal((257, dim)) * 10 ** rng.uniform(-3, 3, (257, 1))).astype(np.float32)
    counts = np.array([0, 3, 700, 64, 65, 1, 0, 2000, 12, 130], np.int64)
    ids = rng.integers(0, 257, int(counts.sum()))
    base = rng.standard_normal((counts.size, dim)).astype(np.float32) if known else None
    asked = []

    def take(i):
        asked.append(i.size)
        return rows[i]

    got = compose(ids, counts, take, dim, base=base, budget_rows=budget)
    np.testing.assert_array_equal(got, _reference(ids, counts, rows, base))
    assert max(asked) <= budget and sum(asked) == counts.sum()


def test_a_long_unknown_key_costs_linear_time(tmp_path):
    from test_fasttext_bin import write_model

    rng = np.random.default_rng(1)
    words = ["the", "of", "a"]
    vocab = rng.standard_normal((3, 8)).astype(np.float32)
    ngrams = rng.standard_normal((1000, 8)).astype(np.float32)
    src = tmp_path / "m.bin"
    write_model(src, words, vocab, ngrams, minn=3, maxn=6)
    embstore.import_file(src, tmp_path / "t.emb")
    key = "abcdefghij" * 6553  # 64 KiB (the longest key), an unknown word of 262,116 n-grams
    with embstore.open(tmp_path / "t.emb") as t:
        t0 = time.process_time()
        got = t.lookup_keys([key], oov="subword")
        spent = time.process_time() - t0
    ids = ngram_buckets([key], 3, 6, 1000)[0]  # (equal to fastText's: test_fasttext_bin)
    # one float32 addition after the other (np.cumsum is sequential), then the mean
    want = np.cumsum(ngrams[ids], axis=0, dtype=np.float32)[-1] / np.float32(len(ids))
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_allclose(got[0], ngrams[ids].astype(np.float64).mean(axis=0), atol=1e-2)
    assert spent < 1.0, f"{spent:.2f} CPU s for a 64 KiB key (linear cost expected)"


def test_a_query_key_longer_than_a_stored_key_may_be_is_refused_at_once(tmp_path):
    from test_fasttext_bin import write_model

    from embstore.errors import InvalidOptionError
    from embstore.keys.hashing import MAX_KEY_BYTES

    rng = np.random.default_rng(2)
    write_model(tmp_path / "m.bin", ["the"], rng.standard_normal((1, 300)).astype(np.float32),
                rng.standard_normal((500, 300)).astype(np.float32), minn=3, maxn=6)
    embstore.import_file(tmp_path / "m.bin", tmp_path / "t.emb")
    with embstore.open(tmp_path / "t.emb") as t:
        edge = "é" * (MAX_KEY_BYTES // 2)  # exactly the cap: composed
        np.testing.assert_array_equal(t.lookup_keys([edge], oov="subword"),
                                      t.subwords.vectors([edge]))
        t0 = time.process_time()
        with pytest.raises(InvalidOptionError, match="1,048,576 bytes of UTF-8, more than the "
                                                     "65,536 a key may have"):
            t.lookup_keys(["the", "x" * (1 << 20)], oov="subword")
        assert time.process_time() - t0 < 1.0
        with pytest.raises(InvalidOptionError, match="65,537 bytes"):
            t.lookup_keys(["é" * (MAX_KEY_BYTES // 2) + "x"], oov="subword")
