"""GPU and interconnect presets: memory, peak compute, and alpha-beta links.

The numbers live in ``data/hardware.toml`` (shipped in the wheel as
``parmem/data/hardware.toml``); each entry cites its datasheet there and in
:attr:`Hardware.source`.

Conventions:

* bandwidth is bytes/s **per direction** (NVIDIA quotes NVLink and PCIe as the
  bidirectional total: A100 NVLink3 "600 GB/s" is 300e9 B/s each way);
* latency is the alpha of the alpha-beta (Hockney) model, in seconds; it is a
  modelling assumption, stated as such in the YAML;
* memory is what ``nvidia-smi`` reports as total (MiB, converted to bytes), not
  the marketing "80 GB";
* memory bandwidth is the HBM peak of the datasheet's "GPU Memory Bandwidth" row, in bytes/s
  (H100 SXM "3.35TB/s" is 3.35e12 B/s).

Example:
    >>> from parmem.hardware import hardware_preset
    >>> hw = hardware_preset("h100-sxm")
    >>> hw.memory_bytes // 2**20
    81559
    >>> hw.intra_node.bandwidth
    450000000000.0
    >>> hw.memory_bandwidth
    3350000000000.0
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from parmem._check import integer, number
from parmem._data import load_toml

__all__ = [
    "Link",
    "Hardware",
    "hardware_preset",
    "hardware_presets",
    "link_preset",
    "link_presets",
    "usable_bytes",
    "device_memory_bytes",
]

_FILE = "hardware.toml"


#: the most memory a GPU may have, in bytes (1 PiB)
MAX_MEMORY_BYTES = 2**50


def _is_number(x: Any) -> bool:
    """A finite real number (not a bool, not NaN or infinity)."""
    try:
        x = number("x", x)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Link:
    """One interconnect, in the alpha-beta model: time(n bytes) = latency + n / bandwidth.

    Attributes:
        name: preset name, e.g. ``"nvlink4"``.
        bandwidth: bytes/s per direction (beta = 1 / bandwidth), > 0.
        latency: seconds per message (alpha), >= 0.
        description: free text.
        source: where the bandwidth comes from.
    """

    name: str
    bandwidth: float
    latency: float
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not _is_number(self.bandwidth) or self.bandwidth <= 0:
            raise ValueError(
                f"Link {self.name!r}: bandwidth={self.bandwidth!r} must be a number > 0"
            )
        if not _is_number(self.latency) or self.latency < 0:
            raise ValueError(f"Link {self.name!r}: latency={self.latency!r} must be a number >= 0")

    def transfer_time(self, nbytes: int, messages: int = 1) -> float:
        """Alpha-beta time of ``messages`` sequential messages carrying ``nbytes`` in total.

        Source: Hockney (1994), "The communication challenge for MPP", the alpha-beta
        model used by Thakur, Rabenseifner & Gropp (2005) §2.
        """
        size = number("nbytes", nbytes, 0)
        messages = integer("messages", messages, 0)
        return messages * self.latency + size / self.bandwidth


@dataclass(frozen=True)
class Hardware:
    """One GPU model and the links around it.

    Attributes:
        name: preset name, e.g. ``"a100-80gb"``.
        memory_bytes: total device memory as ``nvidia-smi`` reports it, in bytes.
        peak_flops_bf16: dense BF16 Tensor Core peak, FLOP/s (no 2:4 sparsity).
        intra_node: GPU-to-GPU link inside a node (NVLink).
        inter_node: per-GPU network link between nodes (InfiniBand).
        pcie: host link.
        description: product name.
        source: datasheet citation.
        memory_bandwidth: HBM bandwidth, bytes/s (the datasheet's "GPU Memory Bandwidth";
            keyword-only; 0, the default, means unknown: memory sizing needs none, and the
            serving roofline refuses such a GPU by name).
        generation: the GPU architecture, ``"ampere"`` (A100) or ``"hopper"`` (H100, H200), from
            ``data/hardware.toml`` (keyword-only; ``""``: not stated). The planner's time model
            reads it for the fraction of the peak the kernels sustain
            (:attr:`parmem.planner.Assumptions.mfu_hopper_scale`).
    """

    name: str
    memory_bytes: int
    peak_flops_bf16: float
    intra_node: Link
    inter_node: Link
    pcie: Link
    description: str = ""
    source: str = ""
    memory_bandwidth: float = dataclass_field(default=0.0, kw_only=True)
    generation: str = dataclass_field(default="", kw_only=True)

    def __post_init__(self) -> None:
        if (
            not isinstance(self.memory_bytes, int)
            or isinstance(self.memory_bytes, bool)
            or not 0 < self.memory_bytes <= MAX_MEMORY_BYTES
        ):
            raise ValueError(
                f"Hardware {self.name!r}: memory_bytes={self.memory_bytes!r:.40} must be an int > 0 "
                f"and <= {MAX_MEMORY_BYTES} (1 PiB)"
            )
        if not _is_number(self.peak_flops_bf16) or self.peak_flops_bf16 <= 0:
            raise ValueError(
                f"Hardware {self.name!r}: peak_flops_bf16={self.peak_flops_bf16!r} must be > 0"
            )
        for field in ("intra_node", "inter_node", "pcie"):
            if not isinstance(getattr(self, field), Link):
                raise ValueError(f"Hardware {self.name!r}: {field} must be a Link")
        if not _is_number(self.memory_bandwidth) or self.memory_bandwidth < 0:
            raise ValueError(
                f"Hardware {self.name!r}: memory_bandwidth={self.memory_bandwidth!r:.40} must be a "
                "number >= 0 (HBM bytes/s; 0: unknown)"
            )

    @property
    def memory_gib(self) -> float:
        """Memory in GiB (2**30 bytes), for display."""
        return self.memory_bytes / 2**30


def _table(section: str) -> dict[str, dict[str, Any]]:
    data = load_toml(_FILE)
    if not isinstance(data, dict) or not isinstance(data.get(section), dict):
        raise ValueError(f"{_FILE}: top-level key {section!r} must be a mapping")
    return data[section]


def _number(entry: dict[str, Any], key: str, where: str) -> float:
    if key not in entry:
        raise ValueError(f"{_FILE}: {where} lacks field {key!r}")
    value = entry[key]
    if not _is_number(value):
        raise ValueError(
            f"{_FILE}: {where}.{key}={value!r} must be a number "
            "(write floats as 300.0e+9: PyYAML reads 300e9 as a string)"
        )
    return value


def link_presets() -> list[str]:
    """Names of the link presets, sorted."""
    return sorted(_table("links"))


def hardware_presets() -> list[str]:
    """Names of the hardware presets, sorted."""
    return sorted(_table("hardware"))


def link_preset(name: str) -> Link:
    """The :class:`Link` preset ``name`` (e.g. ``"nvlink3"``, ``"ib-ndr"``, ``"pcie5"``).

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    links = _table("links")
    if not isinstance(name, str) or name not in links:
        raise ValueError(f"unknown link {name!r}; known: {', '.join(sorted(links))}")
    entry = links[name]
    return Link(
        name=name,
        bandwidth=_number(entry, "bandwidth", f"links.{name}"),
        latency=_number(entry, "latency", f"links.{name}"),
        description=str(entry.get("description", "")),
        source=str(entry.get("source", "")),
    )


def hardware_preset(name: str) -> Hardware:
    """The :class:`Hardware` preset ``name`` (one of :func:`hardware_presets`).

    ``memory_bytes`` is ``memory_mib * 2**20`` from the YAML; ``memory_bandwidth`` is read as
    bytes/s. Sources are in
    ``data/hardware.toml`` and in the returned ``source`` field.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    table = _table("hardware")
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(sorted(table))}")
    entry = table[name]
    where = f"hardware.{name}"
    mib = _number(entry, "memory_mib", where)
    if not isinstance(mib, int):
        raise ValueError(f"{_FILE}: {where}.memory_mib={mib!r} must be an integer")
    links = {}
    for field in ("intra_node", "inter_node", "pcie"):
        if field not in entry:
            raise ValueError(f"{_FILE}: {where} lacks field {field!r}")
        links[field] = link_preset(entry[field])
    return Hardware(
        name=name,
        memory_bytes=mib * 2**20,
        peak_flops_bf16=_number(entry, "peak_flops_bf16", where),
        memory_bandwidth=_number(entry, "memory_bandwidth", where),
        generation=str(entry.get("generation", "")),
        description=str(entry.get("description", "")),
        source=" ".join(str(entry.get("source", "")).split()),
        **links,
    )


def usable_bytes(hardware: Hardware, margin: float) -> int:
    """The memory a layout may use on ``hardware``: ``(1 − margin)`` of ``memory_bytes`` (the
    book's rule keeps ``margin``, 10 % by default, free for what an estimate leaves out; Chapter
    10, :data:`parmem.fit.MARGIN`)."""
    m = number("margin", margin, 0.0, 1.0, hi_open=True)
    return int(hardware.memory_bytes * (1 - m))


def device_memory_bytes(gpu: object) -> int:
    """The device memory of ``gpu``: bytes (an int), a :class:`Hardware` or a preset name; a
    ValueError names ``gpu`` otherwise."""
    if isinstance(gpu, str):
        try:
            return hardware_preset(gpu).memory_bytes
        except ValueError as e:
            raise ValueError(f"gpu={gpu!r:.60}: {e}") from None
    if hasattr(gpu, "memory_bytes"):
        return int(gpu.memory_bytes)
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 < gpu <= MAX_MEMORY_BYTES:
        raise ValueError(
            f"gpu={gpu!r:.40} must be bytes (an integer in 1..{MAX_MEMORY_BYTES}), a Hardware "
            "or a preset name"
        )
    return gpu
