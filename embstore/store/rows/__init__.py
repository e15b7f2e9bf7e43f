"""Format-2 row arrays (docs/FORMAT.md §3a): rows at a fixed stride in plain
Zarr chunks of about 64 MiB (``layout``), a crc32c per 4 KiB page in a side array
(``pages``), written front to back (``stream``) and read by arithmetic from chunk files
mapped side by side (``source``)."""
