"""Training embstore tables (issue 40; docs/training.md): the write-back row cache
(:mod:`.cache`), the sparse optimizers (:mod:`.rules`), reading ahead (:mod:`.prefetch`),
optimizer state and checkpoints on disk (:mod:`.persist`), the trainer (:mod:`.engine`)
and the forwards of the trainable ``embstore.torch`` modules (:mod:`.modules`).

Deterministic initial rows for ``embstore.create(..., init=...)`` are the store's
(:mod:`embstore.store.rowinit`).  The package imports nothing itself (the modules are
reached through :mod:`embstore.torch`; checkpoints are listed by
:func:`embstore.train.persist.read_checkpoints`)."""
