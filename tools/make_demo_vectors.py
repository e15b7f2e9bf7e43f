"""Train the small real word-vector table that ``embstore demo`` imports.

Trains gensim's word2vec (CBOW, 32 dims, 5 epochs, fixed seed, one worker so
the result is reproducible) on the Lee background corpus that gensim ships in
its test data (314 news articles), keeps words seen at least 3 times, and
writes them in word2vec text format, as gensim writes it, to
``embstore/data/lee_word2vec.txt``.

    pip install gensim && python tools/make_demo_vectors.py
"""

from __future__ import annotations

import pathlib

from gensim.models import Word2Vec
from gensim.test.utils import datapath
from gensim.utils import simple_preprocess

OUT = pathlib.Path(__file__).resolve().parents[1] / "embstore" / "data" / "lee_word2vec.txt"


def main() -> None:
    with open(datapath("lee_background.cor"), encoding="utf-8") as f:
        sentences = [simple_preprocess(line) for line in f]
    model = Word2Vec(sentences, vector_size=32, window=5, min_count=3, epochs=20, seed=7,
                     workers=1)
    model.wv.save_word2vec_format(str(OUT), binary=False)
    print(f"wrote {OUT}: {len(model.wv)} words x {model.wv.vector_size} dims")


if __name__ == "__main__":
    main()
