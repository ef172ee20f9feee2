"""Weights a kernel streams, copied into one buffer on transparent huge pages where the operating system gives them.

A CPU's hardware prefetchers stop at each 4 KB page, and every page a stream enters costs a walk of the page
tables (two levels of them in a virtual machine). On a 2-core Xeon 6/207 (KVM) two threads read 1 GB at 25.3 GB/s
on 4 KB pages and 32.9 GB/s on 2 MB pages with the hardware's prefetchers alone; the draft's 4-bit x 8-bit
products read 22-26 GB/s from 4 KB pages against 24-28 on 2 MB pages, asking 4 KB ahead; and the target's bf16
products (`streamed`, widened, 2 KB ahead) took 91.4 / 103.8 / 118.0 ms at 1 / 5 / 9 rows on 4 KB pages against
87.5 / 96.7 / 105.8 on 2 MB pages: the verify's few rows gain most. Linux gives huge pages to
an anonymous private mapping advised `MADV_HUGEPAGE` (transparent huge pages "madvise" or "always"); elsewhere, or
when it declines, the buffer is the same memory on small pages: the same bits, read the usual way.
"""

from __future__ import annotations

import mmap

import torch

HUGE = 2 << 20  # a transparent huge page on x86-64
ALIGN = 64  # each tensor starts on a cache line


def gathered(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of `tensors` (CPU, any strides), one after another in one buffer whose start is on a huge
    page, advised to be backed by huge pages. Each copy keeps the buffer alive; the buffer is freed with the last of
    them. `tensors` themselves where they already lie so (a second call copies nothing) or where no such buffer can be
    mapped."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // ALIGN) * ALIGN
    if not total or already(tensors, offsets, total):
        return list(tensors)
    try:
        region = mmap.mmap(-1, total + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):  # no mapping to be had (a limit on this process's memory): they stay where they are
        return list(tensors)
    start = -torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr() % HUGE
    # the bytes used and no more (a storage's size is what memory accounts count); it holds `region` while it lives
    flat = torch.frombuffer(region, dtype=torch.uint8, offset=start, count=total)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # (Linux) before any page is touched: the faults then take huge pages
        region.madvise(mmap.MADV_HUGEPAGE)
    copies = []
    for t, offset, size in zip(tensors, offsets, sizes):
        part = flat[offset:offset + size].view(t.dtype).view(t.shape)
        part.copy_(t)
        copies.append(part)
    return copies


def already(tensors: list[torch.Tensor], offsets: list[int], total: int) -> bool:
    """Whether `tensors` are contiguous and lie at `offsets` in one storage of `total` bytes starting on a huge page:
    what `gathered` would make of them."""
    storage = tensors[0].untyped_storage()
    base = storage.data_ptr()
    return (base % HUGE == 0 and storage.nbytes() == total
            and all(t.is_contiguous() and t.untyped_storage().data_ptr() == base and t.data_ptr() - base == offset
                    for t, offset in zip(tensors, offsets)))
