"""Offline batch lookup jobs: ids (or keys) in, vectors out, locally or on Dask.

``job`` plans and runs a job (:func:`lookup_file`), ``io`` reads inputs and
writes outputs block by block, ``dask`` runs blocks as tasks on a cluster.
"""

from __future__ import annotations

from .io import open_table, output_kind
from .job import lookup_file

__all__ = ["lookup_file", "open_table", "output_kind"]
