"""Versions and commits of tables on object storage (docs/FORMAT.md §11a).

:mod:`.manifest` names the commit area's objects and reads and checks manifests and deltas;
:mod:`.source` reads one version's rows (the base table and its deltas); :mod:`.commit` makes
a version by a conditional PUT and rebases a commit that lost a race; :mod:`.version` opens a
version for a handle and runs its writes, compaction, log and vacuum.
"""
