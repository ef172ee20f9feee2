"""Weights gathered onto huge pages: the same values, one buffer, aligned, advised where the OS takes the advice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from specviz.kernels import pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 255, (3000, 700), dtype=torch.uint8, generator=g), torch.randn(5, 7, generator=g),
            torch.randn(1_000_001, generator=g).to(torch.bfloat16)]


def test_the_copies_hold_the_same_values_one_after_another_in_one_buffer_from_a_huge_page():
    tensors = _tensors()
    copies = pages.gathered(tensors)
    assert all(torch.equal(c, t) and c.dtype == t.dtype and c.shape == t.shape for c, t in zip(copies, tensors))
    assert len({c.untyped_storage().data_ptr() for c in copies}) == 1
    used = sum(-(-t.numel() * t.element_size() // pages.ALIGN) * pages.ALIGN for t in tensors)
    assert copies[0].untyped_storage().nbytes() == used  # what memory accounts count: the bytes used
    assert copies[0].data_ptr() % pages.HUGE == 0 and all(c.data_ptr() % pages.ALIGN == 0 for c in copies)
    assert copies[1].data_ptr() >= copies[0].data_ptr() + copies[0].numel()  # none overlaps the one before
    assert copies[2].data_ptr() >= copies[1].data_ptr() + 4 * copies[1].numel()
    copies[0][0, 0] ^= 1
    assert not torch.equal(copies[0], tensors[0])  # control: a copy, not the original


def test_a_second_gathering_copies_nothing_and_strided_tensors_are_copied_contiguous():
    copies = pages.gathered(_tensors())
    again = pages.gathered(copies)
    assert all(a is c for a, c in zip(again, copies))
    moved = pages.gathered(copies[:2])  # control: a part of the buffer is gathered afresh (the rest would be dead)
    assert moved[0].untyped_storage().data_ptr() != copies[0].untyped_storage().data_ptr()
    strided = torch.arange(12.0).reshape(3, 4).T
    copy = pages.gathered([strided])[0]
    assert copy.is_contiguous() and torch.equal(copy, strided)


def test_the_buffer_outlives_all_but_its_last_copy():
    last = pages.gathered(_tensors())[2]
    torch.randn(10_000_000)  # other allocations meanwhile
    assert torch.equal(last, _tensors()[2])


def test_where_no_buffer_can_be_mapped_the_tensors_stay(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(pages.mmap, "mmap", refuse)
    tensors = _tensors()
    assert all(c is t for c, t in zip(pages.gathered(tensors), tensors))


def _mapping(address: int) -> str:
    """This process's /proc/self/smaps entry for the mapping holding `address`."""
    for entry in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        start, end = (int(a, 16) for a in entry.split()[0].split("-"))
        if start <= address < end:
            return entry
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not THP.exists() or "[madvise]" not in THP.read_text(),
                    reason="transparent huge pages here are not given on advice")
def test_the_buffer_is_advised_huge_pages():
    copy = pages.gathered([torch.zeros(8 << 20, dtype=torch.uint8)])[0]
    assert re.search(r"THPeligible:\s+1", _mapping(copy.data_ptr()))
    other = torch.zeros(8 << 20, dtype=torch.uint8)  # control: torch's own allocation, not advised
    assert re.search(r"THPeligible:\s+0", _mapping(other.data_ptr()))
