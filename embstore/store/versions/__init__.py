"""Versions of every table (docs/FORMAT.md): the commit protocol (:mod:`.commit`: one
journal rename is the commit point, and each commit makes a version), snapshots of hard
links (:mod:`.snapshot`), rows written since the last compaction (:mod:`.delta`,
:mod:`.keydelta`), which versions are kept (:mod:`.retain`), and what a table handle does
with them (:mod:`.handle`).  Nothing is imported here."""
