"""Weights on 2 MiB pages (csrc/huge_pages.h): ``copy_to_huge_pages`` and ``dense_pack`` place their tensors in
chunks that Linux is asked (madvise) to back with transparent huge pages. What the copies hold, where they lie,
and that a chunk is unmapped when its last tensor goes."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from llmp_kernels_cpu_native.library import dense_supported, load

load()
copy_to_huge_pages = torch.ops.llmp_native.copy_to_huge_pages
MiB = 1 << 20


def mapping_of(tensor: torch.Tensor) -> dict[str, str] | None:
    """The /proc/self/smaps entry holding the tensor's first byte: its range ("range") and fields, or None."""
    address = tensor.data_ptr()
    entry: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            if entry is not None:
                return entry
            start, end = (int(bound, 16) for bound in head[0].split("-"))
            entry = {"range": head[0]} if start <= address < end else None
        elif entry is not None and ":" in line:
            key, value = line.split(":", 1)
            entry[key] = value.strip()
    return entry


def thp_mode() -> str:
    """Linux's transparent huge page setting ("always", "madvise" or "never"), "absent" without THP."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return "absent"
    return path.read_text().split("[")[1].split("]")[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8, torch.int64])
@pytest.mark.parametrize("shape", [(3, 5), (1,), (0, 7), (257, 129)])
def test_a_copy_holds_the_values(dtype, shape):
    source = (torch.arange(max(1, torch.Size(shape).numel())) % 251).to(dtype)[: torch.Size(shape).numel()]
    source = source.reshape(shape)
    copy = copy_to_huge_pages(source)
    assert copy.dtype == dtype and copy.shape == source.shape and copy.is_contiguous()
    assert torch.equal(copy, source)
    if source.numel():
        assert copy.data_ptr() != source.data_ptr()


def test_a_copy_of_a_strided_view_is_contiguous():
    source = torch.randn(64, 48).t()[::2]  # transposed and strided
    copy = copy_to_huge_pages(source)
    assert copy.is_contiguous() and torch.equal(copy, source)


def test_pieces_are_aligned_and_placed_one_after_another():
    pieces = [copy_to_huge_pages(torch.ones(n, dtype=torch.uint8)) for n in (1, 100, 4096, 70_000, 3)]
    addresses = [piece.data_ptr() for piece in pieces]
    assert all(address % 64 == 0 for address in addresses)
    # small pieces share a chunk: each starts at the next 64-byte boundary after the one before
    for (before, after), size in zip(zip(addresses, addresses[1:]), (1, 100, 4096, 70_000)):
        assert after == before + (size + 63) // 64 * 64
    assert len({mapping_of(piece)["range"] for piece in pieces}) == 1


def test_chunks_are_advised_for_huge_pages():
    copy = copy_to_huge_pages(torch.ones(8 * MiB, dtype=torch.uint8))
    entry = mapping_of(copy)
    assert entry is not None
    mode = thp_mode()
    if mode in ("always", "madvise"):
        assert "hg" in entry["VmFlags"].split(), entry  # MADV_HUGEPAGE took
        assert entry["THPeligible"] == "1", entry
    else:  # no THP: the same memory on ordinary pages
        assert torch.equal(copy, torch.ones(8 * MiB, dtype=torch.uint8))


def test_a_chunk_goes_with_its_last_tensor():
    big = copy_to_huge_pages(torch.ones(65 * MiB, dtype=torch.uint8))  # larger than a chunk: a chunk of its own
    small = copy_to_huge_pages(torch.ones(10, dtype=torch.uint8))  # the rest of it
    span = mapping_of(big)["range"]
    assert mapping_of(small)["range"] == span
    del big
    gc.collect()
    assert mapping_of(small)["range"] == span  # still held by the small piece
    address = small.data_ptr()
    del small
    gc.collect()
    lines = Path("/proc/self/maps").read_text().splitlines()
    ranges = [tuple(int(b, 16) for b in line.split()[0].split("-")) for line in lines]
    assert not any(start <= address < end and f"{start:x}-{end:x}" == span for start, end in ranges)


@pytest.mark.skipif(not dense_supported(), reason="no AVX-512 BF16: the library has no dense_pack here")
def test_dense_pack_puts_its_panels_there():
    weight = torch.randn(300, 70).bfloat16()
    panels = torch.ops.llmp_native.dense_pack(weight)
    padded = torch.zeros(320, 70, dtype=torch.bfloat16)
    padded[:300] = weight
    assert torch.equal(panels, padded.view(5, 64, 35, 2).permute(0, 2, 1, 3))
    entry = mapping_of(panels)
    assert entry is not None and panels.data_ptr() % 64 == 0
    if thp_mode() in ("always", "madvise"):
        assert entry["THPeligible"] == "1", entry
