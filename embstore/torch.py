"""PyTorch modules over embstore tables (``pip install embstore[torch]``).

:class:`Embedding` and :class:`EmbeddingBag` are frozen ``torch.nn.Module``s that read
rows from any :class:`embstore.Table`: a :class:`~embstore.MemoryTable`, or an on-disk
table that stays on disk (out of core: each forward reads only the rows it needs).
``forward`` takes integer id tensors and returns tensors with the semantics of
``torch.nn.Embedding`` / ``torch.nn.EmbeddingBag`` (``padding_idx``, ``max_norm``,
per-sample weights, the three bag modes); the math is :class:`embstore.Embedding`'s,
and the looked-up rows become the result without a copy (``torch.from_numpy``).

The modules hold no parameters (nothing to train, nothing in ``state_dict``).  They are
safe in ``DataLoader`` workers: pickled (``spawn``) a module over an on-disk table
carries its path and options, never rows, and the worker opens the table again; after a
``fork`` the first forward in the child opens its own handle.  A module over a
:class:`~embstore.MemoryTable` pickles the array (it is in memory anyway).

:func:`to_nn_embedding` hands an ordinary, trainable-if-you-like ``torch.nn.Embedding``
the whole table.

Given ``optimizer=`` (``"sgd"``, ``"rowwise_adagrad"``) and ``lr=``, a module over a table
opened ``"r+"`` (or a path, or a MemoryTable) trains its rows: the backward updates the
batch's rows in a write-back row cache of ``row_cache_bytes``, ``checkpoint()`` commits
rows and optimizer state as a version, ``prefetch(ids)`` reads ahead, and a new module
resumes from the newest checkpoint (``resume=N``: from rows version N).  See
docs/training.md and :mod:`embstore.train`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

import contextlib
from collections.abc import Iterator

from .errors import (EmbstoreError, InvalidIdError, InvalidOptionError, InvalidTypeError,
                     ShapeMismatchError)
from .ids import as_ids
from .layer import Embedding as _Layer
from .memory import MemoryTable
from .optional import require
from .store.table import ZarrTable
from .store.table import open as open_table
from .table import Table
from .train.engine import Trainer
from .train.modules import Trainable, bag_forward, embedding_forward, prefetching

__all__ = ["Embedding", "EmbeddingBag", "to_nn_embedding", "TorchIdError", "TorchShapeError",
           "TorchNotImplementedError", "TorchPaddingIdxError", "prefetching"]

if TYPE_CHECKING:
    import torch
else:
    torch = require("torch", extra="torch", feature="embstore.torch")  # PyTorch, not this module

_BAG_MODES = ("sum", "mean", "max")


# -- errors: the class torch raises, and embstore's (issue 32) -------------------------------
class TorchIdError(InvalidIdError, RuntimeError):
    """An id ``torch.nn.EmbeddingBag`` refuses with ``RuntimeError`` (out of range, not an
    integer); still an ``IndexError`` (:class:`~embstore.InvalidIdError`), as
    ``torch.nn.Embedding`` raises for out-of-range ids."""


class TorchShapeError(ShapeMismatchError, RuntimeError):
    """Offsets, weights or a weight matrix torch refuses: ``RuntimeError`` (bad offsets, a
    weight that is not 2-D, per-sample weights of another dtype) or ``ValueError`` (shapes;
    :class:`~embstore.ShapeMismatchError` is one)."""


class TorchNotImplementedError(InvalidOptionError, NotImplementedError):
    """``per_sample_weights`` with ``mode='max'`` (torch: ``NotImplementedError``)."""


class TorchPaddingIdxError(InvalidIdError, AssertionError):
    """A module's ``padding_idx`` out of range (torch: ``AssertionError``)."""


_AS_TORCH: dict[type[EmbstoreError], type[EmbstoreError]] = {
    InvalidIdError: TorchIdError, ShapeMismatchError: TorchShapeError,
    InvalidOptionError: TorchNotImplementedError}


@contextlib.contextmanager
def _torch_errors(table: dict[type[EmbstoreError], type[EmbstoreError]] | None = None
                  ) -> Iterator[None]:
    """Re-raise embstore's errors of a forward as the classes that also derive from the
    builtin torch raises there (message and attributes kept)."""
    try:
        yield
    except EmbstoreError as exc:
        for base, cls in (table or _AS_TORCH).items():
            if type(exc) is base:
                new = cls.__new__(cls)
                new.__dict__.update(exc.__dict__)
                new.args = exc.args
                raise new.with_traceback(exc.__traceback__) from None
        raise


def _as_table(path_or_table, cache_bytes) -> tuple[Table, bool]:
    """``(table, opened_here)``: a :class:`Table` as given, the on-disk table at a path,
    or a 2-D array or tensor (a :class:`MemoryTable` over it, as ``from_pretrained``)."""
    if isinstance(path_or_table, Table):
        return path_or_table, False
    if isinstance(path_or_table, (str, os.PathLike)):
        return open_table(path_or_table, mode="r", cache_bytes=cache_bytes), True
    if isinstance(path_or_table, (torch.Tensor, np.ndarray)):
        w = path_or_table
        if w.ndim != 2:
            raise TorchShapeError(f"'weight' must be 2-D (num_embeddings, embedding_dim), got "
                                  f"shape {tuple(w.shape)}")
        if isinstance(w, torch.Tensor):
            w = w.detach().cpu()
            w = (w.float() if w.dtype == torch.bfloat16 else w).numpy()
        return MemoryTable(np.ascontiguousarray(w)), False
    raise InvalidTypeError(f"expected an embstore Table, the path of a table or a 2-D weight, "
                           f"got {type(path_or_table).__name__}")


_TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
                 "bfloat16": torch.bfloat16}


def _rows_dtype(table: Table, given) -> torch.dtype:
    """The torch dtype of the rows a module returns: the table's storage dtype when torch
    has it (a bfloat16 table, or weight, gives bfloat16 as torch does), else its dtype."""
    if isinstance(given, torch.Tensor) and given.dtype == torch.bfloat16:
        return torch.bfloat16
    return _TORCH_DTYPES.get(table.storage_dtype, _TORCH_DTYPES[table.dtype.name])


def _numpy(value, what: str) -> np.ndarray:
    """A tensor (or array-like) as a NumPy array, without a copy for CPU tensors
    (bfloat16, which NumPy lacks, widened to float32: exact)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    if value is None:
        raise InvalidTypeError(f"{what} must be a tensor, got None")
    return np.asarray(value)


def _tensor(rows: np.ndarray, like, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rows as a tensor sharing their memory (``dtype``: cast when it is another, bfloat16),
    on the device of ``like`` (a tensor or None)."""
    if not rows.flags.writeable or not rows.flags.c_contiguous:  # from_numpy wants owned rows
        rows = np.array(rows, order="C")
    out = torch.from_numpy(rows)
    if dtype is not None and out.dtype != dtype:
        out = out.to(dtype)
    if isinstance(like, torch.Tensor) and like.device.type != "cpu":
        out = out.to(like.device)
    return out


def _training(optimizer, lr, eps, row_cache_bytes, resume) -> dict | None:
    """The trainer's options (None: a frozen module)."""
    if optimizer is None:
        return None
    return {"optimizer": optimizer, "lr": lr, "eps": eps, "row_cache_bytes": row_cache_bytes,
            "resume": resume}


def _on_device(out: torch.Tensor, like) -> torch.Tensor:
    """A trained module's rows on the device of its ids (the copy is in the graph)."""
    if isinstance(like, torch.Tensor) and like.device.type != "cpu":
        return out.to(like.device)
    return out


class _TableModule(Trainable, torch.nn.Module):
    """What both modules share: the table, its options, pickling by path, fork safety."""

    def __init__(self, table, *, padding_idx: int | None = None, max_norm: float | None = None,
                 norm_type: float = 2.0, cache_bytes="auto", training: dict | None = None):
        super().__init__()
        if training is not None and isinstance(table, (str, os.PathLike)):
            table = open_table(table, mode="r+", cache_bytes=0)  # (the trainer caches rows)
            self._table, self._owns_table = table, True
        else:
            self._table, self._owns_table = _as_table(table, cache_bytes)
        self._dtype = _rows_dtype(self._table, table)
        self._options: dict[str, Any] = {"padding_idx": padding_idx, "max_norm": max_norm,
                         "norm_type": norm_type}
        self._trainer: Trainer | None = None
        try:
            self._build()
            if training is not None:
                if max_norm is not None:
                    raise InvalidOptionError("max_norm with an optimizer: not supported (a "
                                             "trained table is not renormalised)")
                self._trainer = Trainer(self._table, padding_idx=self.padding_idx,
                                        **training)
        except BaseException:
            if self._owns_table:
                self._table.close()
            raise

    def _build(self) -> None:
        with _torch_errors({InvalidIdError: TorchPaddingIdxError}):  # checks the options
            self._layer = _Layer(self._table, **self._options)
        self._pid = os.getpid()

    # -- what torch.nn.Embedding calls its attributes ------------------------------------
    @property
    def table(self) -> Table:
        return self._table

    @property
    def num_embeddings(self) -> int:
        return self._table.vocab_size

    @property
    def embedding_dim(self) -> int:
        return self._table.dim

    @property
    def padding_idx(self) -> int | None:
        return self._layer.padding_idx  # normalised: a negative index counts from the end

    @property
    def max_norm(self) -> float | None:
        return self._layer.max_norm

    @property
    def norm_type(self) -> float:
        return self._layer.norm_type

    @property
    def weight(self) -> torch.Tensor:
        """The rows as a CPU tensor: a copy read as ``table[:]`` (refused as it is past the
        memory the system gives), not a ``Parameter``: a trained module learns in the table."""
        with _torch_errors():
            return _tensor(np.asarray(self._table[:]), None, self._dtype)

    def to(self, *args, **kwargs):
        """No parameters to move: rows come out on the device of the ids.  A device that this
        torch build or machine lacks raises torch's own error (never a silent no-op)."""
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None and device.type != "cpu":
            torch.empty(0, device=device)  # "Torch not compiled with CUDA enabled", ...
        return super().to(*args, **kwargs)

    def cuda(self, device=None):
        """As :meth:`to` with a CUDA device."""
        return self.to(device if isinstance(device, torch.device) else torch.device(
            "cuda", device) if device is not None else torch.device("cuda"))

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        for name in ("padding_idx", "max_norm"):
            if getattr(self, name) is not None:
                s += f", {name}={getattr(self, name)}"
        if self.max_norm is not None and self.norm_type != 2.0:
            s += f", norm_type={self.norm_type}"
        path = self._table.path
        return s + (f", path={str(path)!r}" if path is not None else "")

    # -- the layer, reopened in a forked child ---------------------------------------------
    def _live(self) -> _Layer:
        if self._pid != os.getpid() and isinstance(self._table, ZarrTable):
            # a forked child: the parent's handle (locks, pools, cache) is not ours to use
            self._table = open_table(self._table.path, mode="r",
                                     cache_bytes=self._table.cache_info().capacity_bytes)
            self._owns_table = True
            self._build()
        return self._layer

    # -- pickling: the path and the options, never rows read from a store ----------------
    def __getstate__(self) -> dict:
        if self._trainer is not None:
            raise InvalidTypeError("a module that trains its table is not pickled (one "
                                   "trainer per table: checkpoint() and open it again)")
        state = self.__dict__.copy()
        table = state.pop("_table")
        del state["_layer"], state["_pid"]
        if isinstance(table, ZarrTable):
            state["_table_source"] = ("path", str(table.path),
                                      table.cache_info().capacity_bytes)
        else:  # an in-memory table: its array travels with the module
            state["_table_source"] = ("table", table)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        kind, *rest = state.pop("_table_source")
        super().__setstate__(state)
        if kind == "path":
            path, cache_bytes = rest
            self._table = open_table(path, mode="r", cache_bytes=cache_bytes)
            self._owns_table = True
        elif kind == "table" and isinstance(rest[0], Table):
            self._table = rest[0]
        else:
            raise EmbstoreError(f"cannot restore an embstore.torch module from a table "
                                f"source of kind {kind!r}")
        self._trainer = None
        self._build()

    def close(self) -> None:
        """Close the table if this module opened it (from a path, or again in a worker); a
        trained module checkpoints first."""
        try:
            if self._trainer is not None:
                self._trainer.close()
                self._trainer = None
        finally:
            if self._owns_table:
                self._table.close()


class Embedding(_TableModule):
    """A frozen ``torch.nn.Embedding`` whose rows live in an embstore table.

    ``table``: an :class:`embstore.Table` or the path of an on-disk table (opened
    read-only with a row cache of ``cache_bytes``).  ``padding_idx``: as PyTorch, the
    stored row comes back (it only matters for gradients, and there are none here).
    ``max_norm``/``norm_type``: returned rows whose norm exceeds ``max_norm`` are
    renormalised as ``torch.nn.functional.embedding`` does, without changing the table.

    ``forward(input)``: integer ids of any shape -> ``input.shape + (dim,)`` tensor of the
    table's dtype, on ``input``'s device.  Ids out of range raise
    :class:`embstore.InvalidIdError` (an ``IndexError``, as PyTorch raises).
    """

    def __init__(self, table, *, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, cache_bytes="auto",
                 optimizer: str | None = None, lr: float = 0.01, eps: float = 1e-8,
                 row_cache_bytes="auto", resume: int | None = None):
        super().__init__(table, padding_idx=padding_idx, max_norm=max_norm,
                         norm_type=norm_type, cache_bytes=cache_bytes,
                         training=_training(optimizer, lr, eps, row_cache_bytes, resume))

    @classmethod
    def from_table(cls, path_or_table, *, padding_idx: int | None = None,
                   max_norm: float | None = None, norm_type: float = 2.0,
                   cache_bytes="auto") -> Embedding:
        """As ``torch.nn.Embedding.from_pretrained`` (always frozen), from a table or path."""
        return cls(path_or_table, padding_idx=padding_idx, max_norm=max_norm,
                   norm_type=norm_type, cache_bytes=cache_bytes)

    def forward(self, input) -> torch.Tensor:  # noqa: A002 (torch's name)
        with _torch_errors():
            if self._trainer is not None:
                ids = as_ids(_numpy(input, "input"), self._table.vocab_size)
                return _on_device(embedding_forward(self._trainer, ids), input)
            return _tensor(self._live()(_numpy(input, "input")), input, self._dtype)


class EmbeddingBag(_TableModule):
    """A frozen ``torch.nn.EmbeddingBag`` whose rows live in an embstore table.

    ``mode``: ``"sum"``, ``"mean"`` (default) or ``"max"``; ``include_last_offset`` as
    PyTorch.  ``forward(input, offsets=None, per_sample_weights=None)``: 2-D ``input``
    is fixed-length bags, 1-D ``input`` with ``offsets`` variable-length bags; the
    result is ``(bags, dim)``.  ``padding_idx`` entries are left out of their bag (and
    of a mean's count); empty bags give zeros.  ``per_sample_weights`` work with
    ``"sum"`` as in PyTorch, and also with ``"mean"`` (``sum(w*x) / sum(w)``, which
    PyTorch refuses).
    """

    def __init__(self, table, *, mode: str = "mean", include_last_offset: bool = False,
                 padding_idx: int | None = None, max_norm: float | None = None,
                 norm_type: float = 2.0, cache_bytes="auto", optimizer: str | None = None,
                 lr: float = 0.01, eps: float = 1e-8, row_cache_bytes="auto",
                 resume: int | None = None):
        if mode not in _BAG_MODES:
            raise InvalidOptionError(f"mode must be one of {', '.join(map(repr, _BAG_MODES))}, "
                                     f"got {mode!r}")
        if optimizer is not None and mode == "max":
            raise InvalidOptionError("a trained EmbeddingBag pools with 'sum' or 'mean', not "
                                     "'max'")
        super().__init__(table, padding_idx=padding_idx, max_norm=max_norm,
                         norm_type=norm_type, cache_bytes=cache_bytes,
                         training=_training(optimizer, lr, eps, row_cache_bytes, resume))
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    @classmethod
    def from_table(cls, path_or_table, *, mode: str = "mean", include_last_offset: bool = False,
                   padding_idx: int | None = None, max_norm: float | None = None,
                   norm_type: float = 2.0, cache_bytes="auto") -> EmbeddingBag:
        """As ``torch.nn.EmbeddingBag.from_pretrained`` (always frozen), from a table or path."""
        return cls(path_or_table, mode=mode, include_last_offset=include_last_offset,
                   padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                   cache_bytes=cache_bytes)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}" + (
            ", include_last_offset=True" if self.include_last_offset else "")

    def forward(self, input, offsets=None, per_sample_weights=None) -> torch.Tensor:  # noqa: A002
        psw = per_sample_weights
        if isinstance(psw, torch.Tensor) and psw.dtype != self._dtype and self.mode != "max":
            raise TorchShapeError(f"per_sample_weights must have the dtype of the rows "
                                  f"({self._dtype}, as torch requires), got {psw.dtype}")
        with _torch_errors():
            ids = _numpy(input, "input")
            off = None if offsets is None else _numpy(offsets, "offsets")
            if self._trainer is not None:
                return _on_device(bag_forward(
                    self._trainer, as_ids(ids, self._table.vocab_size), off,
                    None if psw is None else torch.as_tensor(psw).cpu(), mode=self.mode,
                    include_last_offset=self.include_last_offset), input)
            w = None if psw is None else _numpy(psw, "per_sample_weights")
            rows = self._live().bag(ids, off, w, mode=self.mode,  # type: ignore[arg-type]
                                    include_last_offset=self.include_last_offset)
            return _tensor(rows, input, self._dtype)


def to_nn_embedding(path_or_table, *, freeze: bool = True, padding_idx: int | None = None,
                    max_norm: float | None = None, norm_type: float = 2.0) -> torch.nn.Embedding:
    """An ordinary ``torch.nn.Embedding`` holding a copy of the whole table (it must fit in
    RAM), via ``from_pretrained``; ``freeze=False`` makes its weights trainable."""
    table, opened = _as_table(path_or_table, 0)
    try:
        weights = torch.from_numpy(table.to_numpy()).to(_rows_dtype(table, path_or_table))
    finally:
        if opened:
            table.close()
    return torch.nn.Embedding.from_pretrained(weights, freeze=freeze, padding_idx=padding_idx,
                                              max_norm=max_norm, norm_type=norm_type)
