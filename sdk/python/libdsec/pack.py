"""The result of pack_diff."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping

from . import _wire

__all__ = ["Pack"]


@dataclasses.dataclass
class Pack:
    """The environment :meth:`Sandbox.pack_diff` registered.

    Attributes:
        image: the new environment, NAME:TAG.
        layer_digest, layer_size: the new layer.
        layers: every layer of image, lowest first (the new one last).
        files: names in the new layer.
        frozen: seconds the sandbox was frozen; duration: of the whole call.
    """

    image: str
    layer_digest: str = ""
    layer_size: int = 0
    layers: List[str] = dataclasses.field(default_factory=list)
    files: int = 0
    frozen: float = 0.0
    duration: float = 0.0

    @classmethod
    def _from_json(cls, m: Mapping[str, Any]) -> "Pack":
        return cls(image=m.get("image", ""), layer_digest=m.get("layerDigest", ""),
                   layer_size=_wire.to_int(m.get("layerSize")), layers=list(m.get("layers") or []),
                   files=_wire.to_int(m.get("files")), frozen=_wire.parse_duration(m.get("frozen")),
                   duration=_wire.parse_duration(m.get("duration")))
