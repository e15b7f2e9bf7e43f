"""The device's own limit for a cold batch, beside the ``ooc`` scenario's methods.

The pages a batch's rows lie on (in the ``.npy`` of the same rows) are read with
``O_DIRECT`` (past the page cache: nothing to evict, nothing read ahead) by 64 threads of a
small C program, timed inside it (process start excluded): no reader built on the page
cache can fetch the same pages faster, so ``embstore / limit`` says how far a cold batch is
from the hardware, and ``memmap / limit`` how large a speed-up over ``np.memmap`` the device
allows at all.  Measured here (virtio disk, 2026-12-01): 16,384 random 4 KiB pages take
166-178 ms at 64 threads, the same at 128 or 256 (the device's ~98,000 reads a second),
215 ms at 16 threads; Python threads calling ``os.preadv`` reach 233 ms at best.
Skipped without a C compiler (``cc``) or without ``O_DIRECT``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..common import Skip

THREADS = 64
PAGE = 4096

_SRC = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static int fd; static int64_t *offs; static long n; static long next_i = 0;
static void *work(void *arg) {
    void *buf;
    (void)arg;
    if (posix_memalign(&buf, 4096, 4096)) exit(3);
    for (;;) {
        long i = __sync_fetch_and_add(&next_i, 1);
        if (i >= n) break;
        if (pread(fd, buf, 4096, offs[i]) < 0) { perror("pread"); exit(4); }
    }
    free(buf);
    return 0;
}
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    fd = open(argv[1], O_RDONLY | O_DIRECT);
    if (fd < 0) { perror("open O_DIRECT"); return 5; }
    int threads = atoi(argv[2]);
    long cap = 1 << 16; offs = malloc(cap * 8); n = 0;
    for (;;) {
        if (n == cap) { cap *= 2; offs = realloc(offs, cap * 8); }
        size_t got = fread(offs + n, 8, cap - n, stdin);
        if (!got) break;
        n += (long)got;
    }
    pthread_t *t = malloc(sizeof(pthread_t) * threads);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, work, 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    return 0;
}
"""


class DeviceReader:
    """``ms(npy, ids)``: the time 64 ``O_DIRECT`` threads take to read the pages rows ``ids``
    of the ``.npy`` lie on."""

    def __init__(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None or not hasattr(os, "O_DIRECT"):
            raise Skip("no C compiler (cc) or no O_DIRECT here")
        self._dir = tempfile.mkdtemp(prefix="embstore-devlimit-")
        src, self.exe = Path(self._dir) / "devread.c", Path(self._dir) / "devread"
        src.write_text(_SRC)
        built = subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(self.exe)],
                               check=False, capture_output=True, text=True)
        if built.returncode:
            raise Skip(f"could not build the O_DIRECT reader: {built.stderr[-300:]}")

    @staticmethod
    def pages(npy: Path, ids: np.ndarray) -> np.ndarray:
        """Byte offsets of the distinct pages rows ``ids`` of ``npy`` lie on (sorted)."""
        m = np.load(npy, mmap_mode="r")
        rb = m.shape[1] * m.dtype.itemsize
        start = m.offset + ids.reshape(-1).astype(np.int64) * rb
        first, last = start // PAGE, (start + rb - 1) // PAGE
        span = last - first + 1
        step = np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
        return np.unique(np.repeat(first, span) + step) * PAGE

    def ms(self, npy: Path, ids: np.ndarray) -> float:
        offs = self.pages(npy, ids).astype("<i8")
        rng = np.random.default_rng(0)
        rng.shuffle(offs)  # (as the ids come: no help from sorted order)
        out = subprocess.run([str(self.exe), str(npy), str(THREADS)], input=offs.tobytes(),
                             check=False, capture_output=True)
        if out.returncode:
            raise Skip(f"O_DIRECT reads failed: {out.stderr.decode(errors='replace')[-300:]}")
        return float(out.stdout.decode().strip())

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
