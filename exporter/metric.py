"""The exporter's metric data types: a family (`Metric`) and its samples (`Sample`), and the
Go spelling of a sample value.

They stand in for prometheus_client's types of the same names, with the fields the collectors
and the renderer use: importing prometheus_client loads its HTTP servers, ssl, wsgiref and
urllib.request (~11 MiB RSS), and the exporter serves and renders metrics itself.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Sample(NamedTuple):
    name: str  # a counter's samples end in _total, its family's name does not
    labels: dict[str, str]
    value: float


class Metric:
    """One metric family: HELP, TYPE (gauge or counter), optional UNIT, and its samples."""

    __slots__ = ("name", "documentation", "type", "unit", "samples")

    def __init__(self, name: str, documentation: str, type: str, unit: str = "") -> None:
        self.name = name
        self.documentation = documentation
        self.type = type
        self.unit = unit
        self.samples: list[Sample] = []

    def __repr__(self) -> str:
        return f"Metric({self.name!r}, {self.type!r}, {len(self.samples)} samples)"


def go_float(v: float) -> str:
    """A value as Prometheus' Go code writes it: +Inf, -Inf, NaN, and exponent notation from
    1e+07 up (Python's repr switches at 1e16); otherwise Python's repr. prometheus_client's
    floatToGoString, whose output the tests compare with."""
    d = float(v)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s
