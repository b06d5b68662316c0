"""The EC2 instance type from the DMI product name, read without any network call.

On EC2 (Nitro) instances the firmware's product name is the instance type:
/sys/devices/virtual/dmi/id/product_name reads `p5.48xlarge`. Elsewhere it names the machine
(`PowerEdge R750xa`, `Standard PC (Q35 + ICH9, 2009)`, Xen's `HVM domU`), which is not an
instance type and is ignored, as is a missing or unreadable file (containers without /sys,
non-x86 boards).
"""

from __future__ import annotations

import os
import re

PRODUCT_NAME = "devices/virtual/dmi/id/product_name"  # under the sysfs root

# family[generation][options].size, as EC2 names types: p5.48xlarge, p5en.48xlarge,
# p6-b200.48xlarge, u-6tb1.metal, g6e.xlarge, trn2.48xlarge
_INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+")


def product_name_path(sysfs: str) -> str:
    return os.path.join(sysfs, PRODUCT_NAME)


def instance_type(sysfs: str) -> str | None:
    """The instance type the DMI product name under `sysfs` gives, or None."""
    try:
        with open(product_name_path(sysfs), "rb") as f:
            raw = f.read(256)
    except OSError:
        return None
    name = raw.decode("ascii", "replace").strip()
    return name if _INSTANCE_TYPE.fullmatch(name) else None
