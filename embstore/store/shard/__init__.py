"""The local shard files of a table: the shard index and its chunks (``file``), mapped
gathers (``read``), compressed chunks decoded (``codec``), shard streaming and rewrites
(``write``), all shards side by side in one address range (``arena``)."""
