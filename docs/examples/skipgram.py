"""Skip-gram with negative sampling trained on embstore tables, beside gensim's Word2Vec
(docs/training.md).  Run: ``python docs/examples/skipgram.py [workdir]``.

The corpus is the Lee background corpus that gensim ships with its test data (about
300 news stories, 19,000 words).  Two tables: the input vectors (initialised uniformly,
as word2vec does) and the output vectors (zeros), both trained with row-wise Adagrad by
``embstore.torch.Embedding``; a batch is 1,024 (center, context) pairs from a window of
5 and 5 negatives each drawn from the unigram distribution to the power 0.75."""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from gensim.models import Word2Vec
from gensim.test.utils import datapath
from gensim.utils import simple_preprocess

import embstore
import embstore.torch as et

DIM, WINDOW, NEG, MIN_COUNT, EPOCHS, BATCH = 50, 5, 5, 5, 10, 1024
PROBES = ["government", "police", "australia", "fire", "palestinian", "president"]


def corpus() -> list[list[str]]:
    with open(datapath("lee_background.cor"), encoding="utf-8") as f:
        return [simple_preprocess(line) for line in f]


def pairs(docs, index, rng) -> np.ndarray:
    """(center, context) id pairs, windows shrunk at random as word2vec does."""
    out = []
    for doc in docs:  # a loop per story (a few hundred)
        ids = np.array([index[w] for w in doc if w in index], np.int64)
        for shift in range(1, WINDOW + 1):  # a loop per distance in the window
            keep = rng.integers(1, WINDOW + 1, size=max(0, ids.size - shift)) >= shift
            a, b = ids[:-shift][keep], ids[shift:][keep]
            out += [np.stack([a, b], 1), np.stack([b, a], 1)]
    return np.concatenate(out)


def train(work: Path, docs) -> tuple[list[str], embstore.Table]:
    counts = Counter(w for d in docs for w in d)
    words = [w for w, c in counts.most_common() if c >= MIN_COUNT]
    index = {w: i for i, w in enumerate(words)}
    freq = np.array([counts[w] for w in words], np.float64) ** 0.75
    noise = torch.from_numpy(freq / freq.sum())
    v = len(words)
    embstore.create(work / "in", shape=(v, DIM), overwrite=True,
                    init={"kind": "uniform", "scale": 0.5 / DIM, "seed": 1}).close()
    embstore.create(work / "out", shape=(v, DIM), overwrite=True).close()
    emb_in = et.Embedding(work / "in", optimizer="rowwise_adagrad", lr=0.05)
    emb_out = et.Embedding(work / "out", optimizer="rowwise_adagrad", lr=0.05)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    for epoch in range(EPOCHS):  # a loop per epoch
        p = torch.from_numpy(rng.permutation(pairs(docs, index, rng)))
        for a in range(0, len(p), BATCH):  # a loop per batch
            center, context = p[a: a + BATCH, 0], p[a: a + BATCH, 1]
            negatives = torch.multinomial(noise, center.numel() * NEG, replacement=True)
            u = emb_in(center)                                              # (B, D)
            out = emb_out(torch.cat([context, negatives]))                  # (B + B*NEG, D)
            pos = (u * out[: center.numel()]).sum(1)
            neg = torch.bmm(out[center.numel():].view(-1, NEG, DIM), u.unsqueeze(2))
            loss = -(torch.nn.functional.logsigmoid(pos).sum()
                     + torch.nn.functional.logsigmoid(-neg).sum()) / center.numel()
            loss.backward()
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}")
    emb_in.close()
    emb_out.close()
    return words, embstore.open(work / "in")


def main() -> None:
    torch.set_num_threads(1)  # the batches' tensors are small: threads only add overhead
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    docs = corpus()
    words, table = train(work, docs)
    ours = embstore.MemoryTable(table.to_numpy(), keys=words)
    layer = embstore.Embedding(ours)
    gensim = Word2Vec(docs, vector_size=DIM, window=WINDOW, negative=NEG, sg=1,
                      min_count=MIN_COUNT, epochs=EPOCHS, seed=1, workers=1)
    shared = []
    for w in PROBES:  # a loop per probe word
        ids, _ = layer.most_similar(w, k=10)
        mine = [words[i] for i in ids]
        theirs = [x for x, _ in gensim.wv.most_similar(w, topn=10)]
        shared.append(len(set(mine) & set(theirs)))
        print(f"{w:>12}  embstore: {', '.join(mine[:6])}")
        print(f"{'':>12}  gensim:   {', '.join(theirs[:6])}   ({shared[-1]}/10 shared)")
    print(f"neighbours shared with gensim: {sum(shared)} of {10 * len(PROBES)}")


if __name__ == "__main__":
    main()
