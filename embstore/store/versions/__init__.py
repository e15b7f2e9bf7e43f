"""Versions of format-2 tables (docs/FORMAT.md V5-V7): snapshots of hard links
(:mod:`.snapshot`), rows written since the last compaction (:mod:`.delta`), and which
versions are kept (:mod:`.retain`).  Nothing is imported here: the commit protocol
(:mod:`embstore.store.commit`) builds snapshots, and the delta overlay builds on it."""
