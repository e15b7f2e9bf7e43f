"""What :func:`~embstore.store.verify.verify` does that depends on where a table lives, one
class a medium, chosen by the type of its place (:func:`checks_for`): how the table is
opened as a reader opens it, the local folder the checks of whole files run on, whether the
norms can be recomputed from the rows, and the versions of the medium (a local table's
older snapshots, object storage's manifests and compacted bases).  The checks themselves
(every layout's loops, the key index, the norms, the approximate index) are written once,
in :mod:`.` and :mod:`.tree`, over the place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import CorruptStoreError, FormatError, LockTimeoutError, NotATableError
from ..meta import read_table_meta, unsafe_files
from ..objects.check import check_versions
from ..place.base import Place
from ..place.local import LocalDir
from ..place.objects import ObjectStore
from ..remote.open import read_remote_meta
from ..remote.verify import downloaded
from ..versions.commit import settle
from ..versions.snapshot import differs, list_versions, snapshot_root
from .report import VerifyReport

__all__ = ["checks_for", "LocalChecks", "ObjectChecks"]

#: verify_table(checks, root, attrs, meta, report): every check of one table (its newest
#: version, or an older one) over the checks of its medium
VerifyTable = Callable[["LocalChecks", Path, dict, dict, VerifyReport], None]


class LocalChecks:
    """A table in a local folder: read in place; its older versions are snapshot
    directories, each verified as a table where it holds files of its own."""

    #: the norms are recomputed from the rows (read locally) and compared
    recomputes_norms = True
    #: an array in no layout of embstore's is read through zarr-python (not refused)
    refuses_foreign_layouts = False

    def __init__(self, place: LocalDir):
        self.place = place

    def open_table(self, report: VerifyReport) -> tuple[dict, dict] | None:
        """The table's attributes and the metadata of ``vectors``, as a reader opens them
        (a committed write finished first); None, with the problem reported, if they
        cannot be read safely."""
        root = self.place.root
        unsafe = unsafe_files(root) if root.is_dir() else []
        for file, message in unsafe:  # reading on would block on a FIFO or read another table
            report.add(file, None, message)
        if unsafe:
            return None
        try:
            if root.is_dir():
                settle(root)  # as a reader opening it: a committed write is finished first
            return read_table_meta(root)
        except NotATableError:
            raise  # nothing to verify: not damage
        except (FormatError, CorruptStoreError, LockTimeoutError) as exc:
            report.add(str(root), None, str(exc))
            return None

    @contextmanager
    def tree(self, report: VerifyReport) -> Iterator[Path]:
        """The folder the checks of whole files run on: the table's own."""
        yield self.place.root

    def older_versions(self, root: Path, report: VerifyReport,
                       verify_table: VerifyTable) -> None:
        """Every retained version but the newest whose files are not all the newest's (the
        same inode, or the same bytes): verified as a table of its own (a snapshot
        directory is one), so a damaged file only an older version holds is found too."""
        versions = list_versions(root)
        if len(versions) < 2:
            return
        newest_snap = snapshot_root(root, versions[-1])
        for v in versions[:-1]:  # a loop per older version
            try:
                snap = snapshot_root(root, v)
                if not differs(snap, newest_snap):
                    continue
                attrs, meta = read_table_meta(snap)
            except (FormatError, CorruptStoreError, OSError) as exc:
                report.add(str(root), None, f"version {v}: {exc}")
                continue
            sub = VerifyReport(str(snap))
            verify_table(LocalChecks(LocalDir(snap)), snap, attrs, meta, sub)
            for d in sub.damaged:  # (its manifest, deltas and pins: checked by the caller)
                report.add(d.file, d.chunk, f"version {v}: {d.message}")
            if sub.unchecked or (attrs.get("format") == 2 and sub.unchecked_arrays):
                report.add(str(snap), None, f"version {v}: {sub.unchecked} chunks of vectors "
                           f"and arrays {sub.unchecked_arrays} without checksums in a "
                           "format-2 table (their checksum arrays are damaged or missing)")

    def manifests(self, report: VerifyReport, verify_url: Callable[[str], VerifyReport]
                  ) -> None:
        """(A local table's manifests are checked with its folder: :func:`.tree._check_versions`.)"""


class ObjectChecks:
    """A table on object storage: its objects but the row arrays downloaded for the checks
    of whole files, the row arrays read by ranges; every retained version's manifest and
    deltas checked, and each compacted base verified as a table (docs/FORMAT.md §11a)."""

    recomputes_norms = False  # (the rows are not downloaded: the one-pass check's findings)
    refuses_foreign_layouts = True  # (zarr-python would read it through a local copy only)

    def __init__(self, place: ObjectStore):
        self.place = place

    def open_table(self, report: VerifyReport) -> tuple[dict, dict] | None:
        try:
            attrs, meta, _ = read_remote_meta(self.place.client)
            return attrs, meta
        except (FormatError, CorruptStoreError) as exc:
            report.add(self.place.url, None, str(exc))
            return None

    @contextmanager
    def tree(self, report: VerifyReport) -> Iterator[Path]:
        """A local folder of the table's objects, its row arrays left out."""
        if self.place.get("zarr.json") is None:  # (a GET: a HEAD cannot tell a missing bucket)
            raise NotATableError("not an embstore table: the group's zarr.json is missing",
                                 path=self.place.url)
        with downloaded(self.place, report) as root:
            yield root

    def older_versions(self, root: Path, report: VerifyReport,
                       verify_table: VerifyTable) -> None:
        """(Object storage's versions are its manifests: :meth:`manifests`.)"""

    def manifests(self, report: VerifyReport, verify_url: Callable[[str], VerifyReport]
                  ) -> None:
        """Every retained version's manifest and deltas, and the compacted bases they read,
        each verified as a table of its own (``verify_url(url)``: the whole check again)."""
        versions, bases = check_versions(self.place.client, report.add)
        report.arrays += [f"manifest {n}" for n in versions]  # (and their deltas)
        for prefix in sorted(bases):  # a loop per compacted base: a table of its own
            sub = verify_url(f"{self.place.url}/{prefix}")
            report.damaged += sub.damaged
            report.shards, report.chunks = report.shards + sub.shards, report.chunks + sub.chunks
            report.unchecked += sub.unchecked
            report.ok = report.ok and sub.ok


Checks = LocalChecks | ObjectChecks

#: the checks of each medium, by the type of its place (a new medium: one class, one entry)
_MEDIA: dict[type, type] = {LocalDir: LocalChecks, ObjectStore: ObjectChecks}


def checks_for(place: Place) -> Checks:
    """The checks of the medium ``place`` is on."""
    return _MEDIA[type(place)](place)
