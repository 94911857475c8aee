"""Hardware presets against their datasheets."""

from __future__ import annotations

import dataclasses

import pytest

from parmem.hardware import (
    Hardware,
    Link,
    hardware_preset,
    hardware_presets,
    link_preset,
    link_presets,
)

MiB = 2**20


def test_preset_names():
    assert hardware_presets() == ["a100-40gb", "a100-80gb", "h100-sxm", "h200"]
    assert link_presets() == ["ib-hdr", "ib-ndr", "nvlink3", "nvlink4", "pcie4", "pcie5"]


# memory.total as nvidia-smi prints it for each board (MiB):
# A100-SXM4-40GB 40960, A100-SXM4-80GB 81920, H100 80GB HBM3 81559, H200 143771.
@pytest.mark.parametrize(
    ("name", "mib"),
    [("a100-40gb", 40960), ("a100-80gb", 81920), ("h100-sxm", 81559), ("h200", 143771)],
)
def test_memory_matches_nvidia_smi(name, mib):
    hw = hardware_preset(name)
    assert hw.memory_bytes == mib * MiB
    assert isinstance(hw.memory_bytes, int)
    assert hw.memory_gib == pytest.approx(mib / 1024)


# Dense BF16 Tensor Core peaks: A100 datasheet "BF16 312 TFLOPS" (624 with sparsity);
# H100 SXM and H200 datasheets "BF16 1,979 TFLOPS" are with 2:4 sparsity, so 989 dense.
@pytest.mark.parametrize(
    ("name", "flops"),
    [("a100-40gb", 312e12), ("a100-80gb", 312e12), ("h100-sxm", 989e12), ("h200", 989e12)],
)
def test_peak_bf16(name, flops):
    assert hardware_preset(name).peak_flops_bf16 == flops


# Per-direction bandwidth = datasheet bidirectional figure / 2 for NVLink and PCIe;
# InfiniBand line rate in bits / 8.
@pytest.mark.parametrize(
    ("name", "per_direction"),
    [
        ("nvlink3", 600e9 / 2),  # A100: "NVLink 600GB/s"
        ("nvlink4", 900e9 / 2),  # H100/H200 SXM: "NVLink 900GB/s"
        ("pcie4", 64e9 / 2),  # A100: "PCIe Gen4 64GB/s"
        ("pcie5", 128e9 / 2),  # H100: "PCIe Gen5 128GB/s"
        ("ib-hdr", 200e9 / 8),  # HDR 200 Gb/s
        ("ib-ndr", 400e9 / 8),  # NDR 400 Gb/s
    ],
)
def test_link_bandwidth(name, per_direction):
    link = link_preset(name)
    assert link.name == name
    assert link.bandwidth == pytest.approx(per_direction, rel=1e-12)
    # latency is a stated modelling assumption: a few microseconds
    assert 1e-6 <= link.latency <= 2e-5
    assert link.source


@pytest.mark.parametrize(
    ("name", "intra", "inter", "pcie"),
    [
        ("a100-40gb", "nvlink3", "ib-hdr", "pcie4"),
        ("a100-80gb", "nvlink3", "ib-hdr", "pcie4"),
        ("h100-sxm", "nvlink4", "ib-ndr", "pcie5"),
        ("h200", "nvlink4", "ib-ndr", "pcie5"),
    ],
)
def test_hardware_links_and_source(name, intra, inter, pcie):
    hw = hardware_preset(name)
    assert hw.name == name
    assert (hw.intra_node, hw.inter_node, hw.pcie) == tuple(
        link_preset(n) for n in (intra, inter, pcie)
    )
    assert "Datasheet" in hw.source
    # NVLink is faster than the per-GPU network, which is no faster than PCIe
    assert hw.intra_node.bandwidth > hw.pcie.bandwidth >= hw.inter_node.bandwidth


def test_unknown_names_list_known():
    with pytest.raises(ValueError, match=r"unknown hardware 'x'; known: a100-40gb, a100-80gb"):
        hardware_preset("x")
    with pytest.raises(ValueError, match=r"unknown link 'nvlink9'; known: ib-hdr"):
        link_preset("nvlink9")


def test_frozen():
    hw = hardware_preset("a100-80gb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.memory_bytes = 1  # type: ignore[misc]


def test_link_validation_and_transfer_time():
    with pytest.raises(ValueError, match="bandwidth=0 must be a number > 0"):
        Link("x", 0, 1e-6)
    with pytest.raises(ValueError, match="latency=-1 must be a number >= 0"):
        Link("x", 1e9, -1)
    link = Link("x", 1e9, 2e-6)
    # alpha-beta by hand: 3 messages * 2 us + 5e8 B / 1e9 B/s = 6e-6 + 0.5 s
    assert link.transfer_time(500_000_000, messages=3) == pytest.approx(0.500006)
    with pytest.raises(ValueError, match="nbytes=-1"):
        link.transfer_time(-1)


def test_hardware_validation():
    nv = link_preset("nvlink4")
    with pytest.raises(ValueError, match=r"memory_bytes=80\.0 must be an int > 0"):
        Hardware("x", 80.0, 1e15, nv, nv, nv)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peak_flops_bf16=0 must be > 0"):
        Hardware("x", 80, 0, nv, nv, nv)
    with pytest.raises(ValueError, match="intra_node must be a Link"):
        Hardware("x", 80, 1e15, "nvlink4", nv, nv)  # type: ignore[arg-type]


def test_usable_bytes_keeps_the_margin_free():
    """One home for the memory a layout may use: the planner's Assumptions, parmem.fit and the
    analyses all ask parmem.hardware.usable_bytes (81,559 MiB as nvidia-smi reports an H100)."""
    from parmem.hardware import usable_bytes
    from parmem.planner import Assumptions

    h100 = hardware_preset("h100-sxm")
    assert usable_bytes(h100, 0.1) == int(81559 * 2**20 * 0.9)
    assert Assumptions().usable_bytes(h100) == usable_bytes(h100, 0.1)
    with pytest.raises(ValueError, match="margin="):
        usable_bytes(h100, 1.0)
