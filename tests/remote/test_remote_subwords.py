"""A fastText table on S3 keeps its n-grams: unknown words get the same vectors as locally."""

from __future__ import annotations

import numpy as np
from test_fasttext_bin import WORDS, ref_vector, write_model

import embstore


def test_remote_fasttext_table_composes_unknown_words(s3, tmp_path):
    rng = np.random.default_rng(3)
    vocab = rng.standard_normal((len(WORDS), 6)).astype(np.float32)
    ngrams = rng.standard_normal((97, 6)).astype(np.float32)
    write_model(tmp_path / "m.bin", WORDS, vocab, ngrams, minn=2, maxn=5)
    local = tmp_path / "t.emb"
    embstore.import_file(tmp_path / "m.bin", local, format="fasttext-bin")
    url = f"s3://{s3.bucket}/ft.emb"
    unknown = ["thee", "königsberger", "naive", "o"]
    want = np.stack([ref_vector(u, None, ngrams, 2, 5) for u in unknown])
    with embstore.open(local) as t:
        embstore.save(url, t).close()
        here = t.lookup_keys(unknown + WORDS[:2], oov="subword")
    with embstore.open(url) as r:
        assert r.subwords is not None and r.subwords.bucket == 97
        got = r.lookup_keys(unknown + WORDS[:2], oov="subword")
        np.testing.assert_array_equal(got, here)
        np.testing.assert_allclose(got[:4], want, atol=1e-6)
        ids, _ = embstore.Embedding(r, oov="subword").most_similar("thee", k=3)
        assert ids.shape == (3,)
    assert embstore.verify(url).ok
