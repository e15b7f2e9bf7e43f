"""Training embstore tables (issue 40): trainable embstore.torch modules against PyTorch and
a NumPy reference of row-wise Adagrad, the write-back cache, checkpoints and resuming,
prefetching."""

from __future__ import annotations

import os
import shutil
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import embstore  # noqa: E402
import embstore.torch as et  # noqa: E402
import trainchild  # noqa: E402
from embstore.train.persist import TrainerBusyError, read_checkpoints  # noqa: E402

V, D = 60, 8
LR = 0.05


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """torch's tiny sparse ops are 10x slower with threads on this shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def weights():
    return np.random.default_rng(7).standard_normal((V, D)).astype(np.float32)


@pytest.fixture(params=["memory", "zarr"])
def table(request, weights, tmp_path):
    if request.param == "memory":
        yield embstore.MemoryTable(weights.copy())
        return
    t = embstore.save(tmp_path / "t", weights)
    t.close()
    t = embstore.open(tmp_path / "t", mode="r+")
    yield t
    t.close()


def _batches(n, shape=(6, 5), seed=3):
    """Ids with many repeats, and the coefficients of a linear + quadratic loss."""
    rng = np.random.default_rng(seed)
    for _ in range(n):  # a loop per step
        ids = torch.from_numpy(rng.integers(0, V // 2, size=shape))
        c = torch.from_numpy(rng.standard_normal(tuple(shape) + (D,)).astype(np.float32))
        yield ids, c


def _loss(x, c):
    return (x * c).sum() + 0.1 * (x * x).sum()


def _rel(a, b):
    return float(np.abs(a - b).max() / max(1e-30, np.abs(b).max()))


def _rowwise_adagrad_reference(w, steps, lr, eps=1e-8):
    """FBGEMM's rule in NumPy: per step g = the row's gradient summed over its
    occurrences; state += mean(g^2); row -= lr * g / (sqrt(state) + eps)."""
    w = w.astype(np.float64).copy()
    state = np.zeros(w.shape[0])
    for ids, c in steps:  # a loop per step
        ids, c = ids.numpy().reshape(-1), c.numpy().reshape(-1, D).astype(np.float64)
        g_rows = c + 0.2 * w[ids]
        g = np.zeros_like(w)
        np.add.at(g, ids, g_rows)
        u = np.unique(ids)
        state[u] += (g[u] ** 2).mean(axis=1)
        w[u] -= lr * g[u] / (np.sqrt(state[u])[:, None] + eps)
    return w.astype(np.float32), state.astype(np.float32)


def test_sgd_equals_torch_sparse_sgd(table, weights):
    emb = et.Embedding(table, optimizer="sgd", lr=LR)
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()), freeze=False,
                                             sparse=True)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for ids, c in _batches(200):
        out = emb(ids)
        assert out.requires_grad and out.shape == ids.shape + (D,)
        _loss(out, c).backward()
        opt.zero_grad()
        _loss(ref(ids), c).backward()
        opt.step()
    got = emb(torch.arange(V)).detach().numpy()
    assert _rel(got, ref.weight.detach().numpy()) < 1e-6
    assert emb.step == 200
    emb.checkpoint()
    assert _rel(table.to_numpy(), ref.weight.detach().numpy()) < 1e-6  # written back
    np.testing.assert_array_equal(table[V // 2:], weights[V // 2:])  # untouched rows
    emb.close()


def test_rowwise_adagrad_equals_numpy_reference(table, weights):
    steps = list(_batches(200, seed=5))
    emb = et.Embedding(table, optimizer="rowwise_adagrad", lr=LR)
    for ids, c in steps:
        _loss(emb(ids), c).backward()
    want_w, want_s = _rowwise_adagrad_reference(weights, steps, LR)
    with torch.no_grad():
        got = emb(torch.arange(V)).numpy()
    assert _rel(got, want_w) < 1e-4
    assert _rel(emb.optimizer_state(np.arange(V))[:, 0], want_s) < 1e-4
    emb.close()


def test_a_module_used_twice_in_a_step_equals_torch(table, weights):
    """Two lookups of one module in a loss (a skip-gram's contexts and negatives): two
    backward passes, each applied; SGD equals torch's one step with the summed gradient."""
    emb = et.Embedding(table, optimizer="sgd", lr=LR)
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()), freeze=False,
                                             sparse=True)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for (ids, c), (ids2, c2) in zip(_batches(50), _batches(50, seed=8)):
        (_loss(emb(ids), c) + _loss(emb(ids2), c2)).backward()
        opt.zero_grad()
        (_loss(ref(ids), c) + _loss(ref(ids2), c2)).backward()
        opt.step()
    assert _rel(emb(torch.arange(V)).detach().numpy(), ref.weight.detach().numpy()) < 1e-6
    emb.close()


def test_padding_idx_row_is_not_trained(table, weights):
    emb = et.Embedding(table, optimizer="sgd", lr=LR, padding_idx=2)
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()), freeze=False,
                                             sparse=True, padding_idx=2)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for ids, c in _batches(20):
        ids[0] = 2
        _loss(emb(ids), c).backward()
        opt.zero_grad()
        _loss(ref(ids), c).backward()
        opt.step()
    got = emb(torch.arange(V)).detach().numpy()
    np.testing.assert_array_equal(got[2], weights[2])
    assert _rel(got, ref.weight.detach().numpy()) < 1e-6
    emb.close()


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("sum", True), ("mean", False)])
@pytest.mark.parametrize("kind", ["fixed", "offsets"])
def test_bag_equals_torch_sparse_sgd(table, weights, mode, weighted, kind):
    emb = et.EmbeddingBag(table, mode=mode, optimizer="sgd", lr=LR)
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights.copy()), mode=mode,
                                                freeze=False, sparse=True)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    rng = np.random.default_rng(11)
    for _ in range(200):
        if kind == "fixed":
            ids, offsets = torch.from_numpy(rng.integers(0, V // 2, size=(5, 4))), None
            nb = 5
        else:
            ids = torch.from_numpy(rng.integers(0, V // 2, size=13))
            offsets, nb = torch.tensor([0, 3, 3, 9]), 4  # an empty bag
        w = torch.from_numpy(rng.random(tuple(ids.shape)).astype(np.float32)) \
            if weighted else None
        c = torch.from_numpy(rng.standard_normal((nb, D)).astype(np.float32))
        _loss(emb(ids, offsets, per_sample_weights=w), c).backward()
        opt.zero_grad()
        _loss(ref(ids, offsets, per_sample_weights=w), c).backward()
        opt.step()
    got = emb(torch.arange(V).view(V, 1)).detach().numpy()
    assert _rel(got, ref.weight.detach().numpy()) < 1e-6
    emb.close()


def test_bag_per_sample_weights_get_their_gradient(weights):
    emb = et.EmbeddingBag(embstore.MemoryTable(weights.copy()), mode="sum", optimizer="sgd",
                          lr=0.0)
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights.copy()), mode="sum")
    ids = torch.tensor([[1, 2, 3], [4, 4, 5]])
    w1 = torch.rand(2, 3, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_(True)
    emb(ids, per_sample_weights=w1).pow(2).sum().backward()
    ref(ids, per_sample_weights=w2).pow(2).sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad)


def test_rest_of_the_model_trains_with_a_torch_optimizer(table):
    emb = et.Embedding(table, optimizer="rowwise_adagrad", lr=0.1)
    head = torch.nn.Linear(D, 1)
    opt = torch.optim.Adam(head.parameters(), lr=0.01)
    before = head.weight.detach().clone()
    assert list(emb.parameters()) == []
    for ids, c in _batches(5):
        opt.zero_grad()
        head(emb(ids)).pow(2).mean().backward()
        opt.step()
    assert not torch.equal(before, head.weight)
    emb.close()


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_small_cache_evicts_and_equals_a_large_one(tmp_path, weights):
    out = {}
    for name, cache in [("big", "auto"), ("small", 20 * (4 * (D + 1) + 17))]:
        t = embstore.save(tmp_path / name, weights)
        t.close()
        emb = et.Embedding(tmp_path / name, optimizer="rowwise_adagrad", lr=LR,
                           row_cache_bytes=cache)
        for ids, c in _batches(30, shape=(3, 4)):
            _loss(emb(ids), c).backward()
        v = emb.checkpoint()
        out[name] = (emb.trainer.cache.stats["evictions"], v,
                     emb.optimizer_state(np.arange(V)))
        emb.close()
        assert embstore.verify(tmp_path / name).ok
    assert out["big"][0] == 0 and out["small"][0] > 0
    with embstore.open(tmp_path / "big", version=out["big"][1]) as a, \
            embstore.open(tmp_path / "small", version=out["small"][1]) as b:
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    np.testing.assert_array_equal(out["big"][2], out["small"][2])


def test_a_batch_larger_than_the_cache_is_refused(weights):
    emb = et.Embedding(embstore.MemoryTable(weights.copy()), optimizer="sgd",
                       row_cache_bytes=4 * (4 * D + 17))
    from embstore.train.cache import CacheTooSmallError
    with pytest.raises(CacheTooSmallError, match="row_cache_bytes"):
        emb(torch.arange(10))


def _train(path, steps, *, resume=None, cache="auto", ckpt_every=None):
    emb = et.Embedding(path, optimizer="rowwise_adagrad", lr=LR, row_cache_bytes=cache,
                       resume=resume)
    batches = list(_batches(steps, seed=9))
    for i in range(emb.step, steps):  # a loop per step
        ids, c = batches[i]
        _loss(emb(ids), c).backward()
        if ckpt_every and emb.step % ckpt_every == 0:
            emb.checkpoint()
    return emb


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path, weights):
    cache = 24 * (4 * (D + 1) + 17)  # evictions between checkpoints
    for name in ("a", "b"):
        embstore.save(tmp_path / name, weights).close()
    whole = _train(tmp_path / "a", 40, cache=cache)
    va = whole.checkpoint()
    whole.close()
    first = _train(tmp_path / "b", 20, cache=cache)
    v20 = first.checkpoint()
    assert [r["rows"] for r in read_checkpoints(tmp_path / "b")][-1] == v20
    ids, c = next(_batches(1, seed=99))  # trained past the checkpoint, then dropped
    _loss(first(ids), c).backward()
    first.flush()
    first.trainer.close(checkpoint=False)  # as a crash would leave it
    first.close()
    again = _train(tmp_path / "b", 40, cache=cache)  # resumes at step 20
    vb = again.checkpoint()
    again.close()
    with embstore.open(tmp_path / "a", version=va) as a, \
            embstore.open(tmp_path / "b", version=vb) as b:
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    states = []
    for name in ("a", "b"):
        emb = et.Embedding(tmp_path / name, optimizer="rowwise_adagrad")
        assert emb.step == 40
        states.append(emb.optimizer_state(np.arange(V)))
        emb.trainer.close(checkpoint=False)
    np.testing.assert_array_equal(states[0], states[1])
    assert embstore.verify(tmp_path / "b").ok


def test_resume_from_an_older_checkpoint(tmp_path, weights):
    embstore.save(tmp_path / "t", weights).close()
    emb = _train(tmp_path / "t", 10)
    v10 = emb.checkpoint()
    with embstore.open(tmp_path / "t", version=v10) as t:
        at10 = t.to_numpy()
    for ids, c in _batches(5, seed=1):
        _loss(emb(ids), c).backward()
    emb.close()
    again = et.Embedding(tmp_path / "t", optimizer="rowwise_adagrad", lr=LR, resume=v10)
    assert again.step == 10
    with torch.no_grad():
        np.testing.assert_array_equal(again(torch.arange(V)).numpy(), at10)
    again.close()


def test_one_trainer_per_table(tmp_path, weights):
    embstore.save(tmp_path / "t", weights).close()
    emb = et.Embedding(tmp_path / "t", optimizer="sgd")
    with pytest.raises(TrainerBusyError):
        et.Embedding(tmp_path / "t", optimizer="sgd")
    emb.close()
    et.Embedding(tmp_path / "t", optimizer="sgd").close()


def test_prefetch_never_serves_an_older_row(weights):
    t = embstore.MemoryTable(weights.copy())
    emb = et.Embedding(t, optimizer="sgd", lr=1.0, row_cache_bytes=6 * (4 * D + 17))
    ref = weights.copy()
    for step in range(30):  # evictions between a prefetch and its use
        ids = torch.tensor([(step * 3 + k) % 10 for k in range(3)])
        nxt = torch.tensor([((step + 1) * 3 + k) % 10 for k in range(3)])
        out = emb(ids)
        emb.prefetch(nxt)
        np.testing.assert_array_equal(out.detach().numpy(), ref[ids.numpy()])
        out.sum().backward()
        ref[ids.numpy()] -= 1.0
    assert emb.trainer.cache.stats["evictions"] > 0


def test_prefetched_rows_are_used(tmp_path, weights):
    embstore.save(tmp_path / "t", weights).close()
    emb = et.Embedding(tmp_path / "t", optimizer="sgd", lr=LR)
    assert emb.prefetch(torch.tensor([1, 2, 3])) == 3
    pf = emb.trainer.prefetcher
    out = emb(torch.tensor([3, 1]))
    assert pf._staged is not None and out.shape == (2, D)
    np.testing.assert_array_equal(out.detach().numpy(), weights[[3, 1]])
    assert emb.prefetch(torch.tensor([1, 2])) == 1  # 1 is cached now: only 2 read
    emb.close()


def test_output_buffers_are_reused(weights):
    emb = et.Embedding(embstore.MemoryTable(weights.copy()), optimizer="sgd")
    for ids, c in _batches(50):
        _loss(emb(ids), c).backward()
    assert len(emb.trainer._outs._bufs) <= 3


def test_frozen_module_has_no_training(weights):
    emb = et.Embedding(embstore.MemoryTable(weights))
    assert emb.trainer is None and not emb(torch.tensor([1])).requires_grad
    with pytest.raises(embstore.EmbstoreError, match="no optimizer"):
        emb.checkpoint()


def test_training_options_are_checked(tmp_path, weights):
    embstore.save(tmp_path / "t", weights).close()
    with pytest.raises(embstore.EmbstoreError, match="optimizer must be"):
        et.Embedding(embstore.MemoryTable(weights.copy()), optimizer="adam")
    with embstore.open(tmp_path / "t") as ro, pytest.raises(embstore.EmbstoreError,
                                                           match="r\\+"):
        et.Embedding(ro, optimizer="sgd")
    with pytest.raises(embstore.EmbstoreError, match="max"):
        et.EmbeddingBag(embstore.MemoryTable(weights.copy()), mode="max", optimizer="sgd")


def _final(path):
    """Rows and optimizer state of the newest checkpoint of the table at ``path``."""
    rec = read_checkpoints(path)[-1]
    with embstore.open(path, version=rec["rows"]) as t:
        rows = t.to_numpy()
    state_path = path / "vectors" / ".embstore" / "train" / "state-rowwise_adagrad"
    with embstore.open(state_path, version=rec["state"]["rowwise_adagrad"]) as s:
        return rec["step"], rows, s.to_numpy()


def _forked(fn) -> int:
    """Run ``fn()`` (returning an int) in a forked child (torch already imported: no start
    up); returns its result, or -9 if it was SIGKILLed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            os.write(w, str(fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return -9
    assert os.WEXITSTATUS(status) == 0, "the training child failed"
    return int(out)


_CRASH_REFS: dict = {}


@pytest.fixture(scope="session")
def crash_ref(tmp_path_factory):
    """``ref(total, every)``: the folder holding the untouched table, the uninterrupted
    run's final step, rows and optimizer state, and how many durable calls a whole run
    makes; made once per test process for each (total, every), shared by the pieces."""
    def ref(total: int, every: int):
        if (total, every) not in _CRASH_REFS:
            d = tmp_path_factory.mktemp(f"crash-ref-{total}-{every}")
            w = np.random.default_rng(5).standard_normal((trainchild.V, trainchild.D)) \
                .astype(np.float32)
            for name in ("ref", "count", "base"):
                embstore.save(d / name, w).close()
            trainchild.train(d / "ref", total, every)
            n_calls = _forked(lambda: trainchild.run(d / "count", total, every, 0))
            _CRASH_REFS[total, every] = (d / "base", _final(d / "ref"), n_calls)
        return _CRASH_REFS[total, every]
    return ref


def _crash_trials(tmp_path, ref, trials: int, seed: int, total: int = 40, every: int = 5,
                  piece: slice = slice(None)) -> None:
    """``trials`` times (or the ``piece`` of them): a training run of a fresh copy of the
    table SIGKILLed at a random moment (a random one of the calls that make a change
    durable or visible), the table opened and verified, the run resumed from its last
    checkpoint to the end: rows and optimizer state equal an uninterrupted run's."""
    base, (step_a, rows_a, state_a), n_calls = ref(total, every)
    kills = 0
    points = np.random.default_rng(seed).integers(1, n_calls, size=trials)[piece]
    for kill_at in points:  # a loop per trial
        crash = tmp_path / "crash"
        shutil.rmtree(crash, ignore_errors=True)
        shutil.copytree(base, crash, symlinks=True)
        kills += _forked(lambda: trainchild.run(crash, total, every, int(kill_at))) == -9
        with embstore.open(crash):
            pass
        assert embstore.verify(crash).ok
        assert _forked(lambda: trainchild.run(crash, total, every, 0)) > 0
        step_b, rows_b, state_b = _final(crash)
        assert step_a == step_b == total
        np.testing.assert_array_equal(rows_a, rows_b, err_msg=f"killed at call {kill_at}")
        np.testing.assert_array_equal(state_a, state_b, err_msg=f"killed at call {kill_at}")
        assert embstore.verify(crash).ok
        assert embstore.verify(crash / "vectors" / ".embstore" / "train" /
                               "state-rowwise_adagrad").ok
    assert kills >= len(points) * 0.9


def test_sigkill_a_few_times_then_resume_equals_an_uninterrupted_run(tmp_path, crash_ref):
    _crash_trials(tmp_path, crash_ref, 2, seed=0, total=10, every=5)


#: the 50 random moments in 5 pieces of 10 (the same 50 kill points as one test had: a test
#: of ~90 CPU-s was the suite's longest tail on 2 workers; pieces balance across them)
_PIECES = 5


@pytest.mark.slow
@pytest.mark.parametrize("piece", range(_PIECES), ids=lambda k: f"trials-{10 * k}-{10 * k + 9}")
def test_sigkill_at_50_random_moments_then_resume_equals_an_uninterrupted_run(
        tmp_path, crash_ref, piece):
    _crash_trials(tmp_path, crash_ref, 50, seed=1, piece=slice(10 * piece, 10 * piece + 10))


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
@pytest.mark.parametrize("where", ["memory", "disk"])
def test_steady_state_allocates_nothing_of_the_batch_size(tmp_path, where):
    """tracemalloc over 100 steps (NumPy's buffers are traced): no growth, and no
    allocation near the size of the batch's rows (the output, the gradient sums, the rows a
    batch misses and those read ahead live in reused buffers).  ``disk``: an on-disk table
    with the next batch prefetched, its rows missed by the row cache all along (uniform ids
    over 8x the rows a step touches); its pages checked beforehand (the store checks each
    page's crc32c the first time a process reads it, with arrays of the pages' size)."""
    import gc
    import tracemalloc
    rows, dim = (5000, 128) if where == "memory" else (40_000, 128)
    w = np.random.default_rng(1).standard_normal((rows, dim)).astype(np.float32)
    table = embstore.MemoryTable(w) if where == "memory" else embstore.save(
        tmp_path / "t", w)
    if where == "disk":
        table.close()
        table = embstore.open(tmp_path / "t", mode="r+")
        table.lookup(np.arange(rows))  # (each page checked once a process: done first)
    emb = et.Embedding(table, optimizer="rowwise_adagrad", lr=0.01)
    rng = np.random.default_rng(2)
    batches = [torch.from_numpy(rng.integers(0, rows, size=(64, 32))) for _ in range(111)]
    batch_bytes = 64 * 32 * dim * 4

    def step(i):
        out = emb(batches[i])
        if where == "disk":
            emb.prefetch(batches[i + 1])
        out.pow(2).sum().backward()
    for i in range(10):
        step(i)
    misses = emb.trainer.cache.stats["misses"]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(10, 110):
            step(i)
        gc.collect()  # (autograd leaves a few small reference cycles a step)
        cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if where == "disk":  # (rows were read from the table in the steps measured)
        assert emb.trainer.cache.stats["misses"] - misses > 20 * 64 * 32 // 8
    emb.close()
    assert cur - base < 64 << 10
    # the peak: O(batch) ids (8 bytes each), never the rows (512 bytes each)
    assert peak - base < batch_bytes // 4, (peak - base, batch_bytes)


@pytest.mark.parametrize("init", ["uniform", {"kind": "normal", "std": 0.01, "seed": 4}])
def test_create_with_init_is_deterministic_per_row(tmp_path, init):
    from embstore.store.rowinit import check_init, init_rows
    a = embstore.create(tmp_path / "a", shape=(3000, 16), init=init)
    b = embstore.create(tmp_path / "b", shape=(3000, 16), init=init)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    spec = check_init(init, 16)
    np.testing.assert_array_equal(init_rows(spec, 1234, 1240, 16), a[1234:1240])  # any block
    rows = a.to_numpy()
    if spec["kind"] == "uniform":
        assert rows.min() >= -0.25 and rows.max() < 0.25 and abs(rows.mean()) < 0.01
    else:
        assert abs(rows.std() - 0.01) < 5e-4 and abs(rows.mean()) < 5e-4
    other = embstore.create(tmp_path / "c", shape=(3000, 16), init={**spec, "seed": 99})
    assert not np.array_equal(other[0:10], a[0:10])
    emb = et.Embedding(a, optimizer="sgd", lr=0.1)  # trains from there
    _loss(emb(torch.tensor([1, 2])), torch.ones(2, 16)).backward()
    emb.close()
    assert not np.array_equal(a[1:3], b[1:3]) and np.array_equal(a[3:], b[3:])


def test_create_init_is_checked(tmp_path):
    with pytest.raises(embstore.EmbstoreError, match="init must be"):
        embstore.create(tmp_path / "a", shape=(10, 4), init="glorot")
    with pytest.raises(embstore.EmbstoreError, match="takes"):
        embstore.create(tmp_path / "a", shape=(10, 4), init={"kind": "uniform", "std": 1})
    z = embstore.create(tmp_path / "z", shape=(10, 4), init="zeros")
    assert not z.to_numpy().any()


def test_lookup_fills_a_torch_tensor(table, weights):
    out = torch.empty((2, 3, D))
    got = table.lookup(np.array([[1, 2, 3], [4, 5, 1]]), out=out)
    assert got is out
    np.testing.assert_array_equal(out.numpy(), weights[[[1, 2, 3], [4, 5, 1]]])
    with pytest.raises(embstore.EmbstoreError, match="contiguous"):
        table.lookup([1, 2], out=torch.empty((D, 2)).t())
    with pytest.raises(embstore.EmbstoreError, match="shape"):
        table.lookup([1, 2], out=torch.empty((3, D)))


def test_prefetching_iterates_every_batch_and_trains_the_same(weights):
    batches = list(_batches(20))
    got = []
    for wrap in (lambda b, m: b, None):
        emb = et.Embedding(embstore.MemoryTable(weights.copy()), optimizer="rowwise_adagrad",
                           lr=LR, row_cache_bytes=24 * (4 * (D + 1) + 17))  # (evicting)
        it = batches if wrap else et.prefetching(batches, emb, ids=lambda b: b[0])
        seen = 0
        for ids, c in it:
            assert ids is batches[seen][0]
            _loss(emb(ids), c).backward()
            seen += 1
        assert seen == len(batches)
        with torch.no_grad():
            got.append(emb(torch.arange(V)).numpy())
        emb.close()
    np.testing.assert_array_equal(got[0], got[1])
    assert list(et.prefetching([], emb)) == []


def test_a_failure_between_the_state_and_the_rows_commits_is_rolled_back(tmp_path, weights):
    from embstore.train.persist import TrainStore
    embstore.save(tmp_path / "t", weights).close()
    emb = _train(tmp_path / "t", 5)
    v5 = emb.checkpoint()
    state5 = emb.optimizer_state(np.arange(V))
    store = emb.trainer.store
    real = store.table.write, store.table.write_blocks

    def fail(ids, rows):  # the state is committed, the rows are not
        raise OSError("disk full")
    store.table.write = store.table.write_blocks = fail  # (a flush: write_blocks)
    for ids, c in _batches(3, seed=4):
        _loss(emb(ids), c).backward()
    with pytest.raises(OSError):
        emb.flush()
    store.table.write, store.table.write_blocks = real
    emb.trainer.close(checkpoint=False)
    assert isinstance(store, TrainStore)
    again = et.Embedding(tmp_path / "t", optimizer="rowwise_adagrad", lr=LR)
    assert again.step == 5
    np.testing.assert_array_equal(again.optimizer_state(np.arange(V)), state5)
    with embstore.open(tmp_path / "t", version=v5) as t, torch.no_grad():
        np.testing.assert_array_equal(again(torch.arange(V)).numpy(), t.to_numpy())
    again.close()


def test_empty_and_scalar_batches(weights):
    emb = et.Embedding(embstore.MemoryTable(weights.copy()), optimizer="sgd", lr=1.0)
    out = emb(torch.tensor(3))
    assert out.shape == (D,)
    out.sum().backward()
    np.testing.assert_allclose(emb.trainer.cache.peek(np.array([3]))[0], weights[3] - 1.0)
    empty = emb(torch.zeros((0, 4), dtype=torch.int64))
    assert empty.shape == (0, 4, D)
    empty.sum().backward()
    with pytest.raises(IndexError):
        emb(torch.tensor([V]))
    bag = et.EmbeddingBag(embstore.MemoryTable(weights.copy()), mode="sum", optimizer="sgd")
    assert bag(torch.zeros((0, 3), dtype=torch.int64)).shape == (0, D)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_padding_idx_equals_torch(weights, mode):
    emb = et.EmbeddingBag(embstore.MemoryTable(weights.copy()), mode=mode, padding_idx=3,
                          optimizer="sgd", lr=LR)
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights.copy()), mode=mode,
                                                freeze=False, sparse=True, padding_idx=3)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    rng = np.random.default_rng(4)
    for _ in range(50):
        ids = torch.from_numpy(rng.integers(0, 8, size=(6, 4)))
        ids[0] = 3  # a bag of padding only
        c = torch.from_numpy(rng.standard_normal((6, D)).astype(np.float32))
        _loss(emb(ids), c).backward()
        opt.zero_grad()
        _loss(ref(ids), c).backward()
        opt.step()
    got = emb(torch.arange(V).view(V, 1)).detach().numpy()
    got[3] = emb.trainer.cache.peek(np.array([3]))[0]  # (a bag of the padding id is zero)
    np.testing.assert_array_equal(got[3], weights[3])
    assert _rel(got, ref.weight.detach().numpy()) < 1e-6


@pytest.mark.slow
def test_the_checkpoint_outlives_vacuum_while_training_goes_on(tmp_path, weights):
    embstore.save(tmp_path / "t", weights).close()
    emb = _train(tmp_path / "t", 3, cache=32 * (4 * (D + 1) + 17))
    v = emb.checkpoint()
    with embstore.open(tmp_path / "t", version=v) as t:
        at_v = t.to_numpy()
    rng = np.random.default_rng(2)
    for _ in range(40):  # write-backs: more versions than retained (8)
        ids = torch.from_numpy(rng.integers(0, V, size=(6, 5)))
        _loss(emb(ids), torch.ones(6, 5, D)).backward()
    table = emb.trainer.table
    assert table.version > v + 8
    emb.trainer.close(checkpoint=False)  # as a crash leaves it
    again = et.Embedding(tmp_path / "t", optimizer="rowwise_adagrad", lr=LR)
    assert again.step == 3
    with torch.no_grad():
        np.testing.assert_array_equal(again(torch.arange(V)).numpy(), at_v)
    again.close()
