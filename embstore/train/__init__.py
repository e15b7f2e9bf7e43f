"""Training embstore tables (issue 40; docs/training.md): the write-back row cache
(:mod:`.cache`), the sparse optimizers (:mod:`.rules`), reading ahead (:mod:`.prefetch`),
optimizer state and checkpoints on disk (:mod:`.persist`), the trainer (:mod:`.engine`)
and the forwards of the trainable ``embstore.torch`` modules (:mod:`.modules`).

The cache, the persistence and the rules import torch only where they need it; the
modules are reached through :mod:`embstore.torch`."""

from .persist import TrainerBusyError, read_checkpoints

__all__ = ["TrainerBusyError", "read_checkpoints"]
