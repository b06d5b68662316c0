"""The EC2 instance type from the DMI product name, and whether the host is an EC2 instance at all,
read without any network call.

On EC2 (Nitro) instances the firmware's product name is the instance type:
/sys/devices/virtual/dmi/id/product_name reads `p5.48xlarge`. Elsewhere it names the machine
(`PowerEdge R750xa`, `Standard PC (Q35 + ICH9, 2009)`, Xen's `HVM domU`), which is not an
instance type and is ignored, as is a missing or unreadable file (containers without /sys,
non-x86 boards).

Whether the host is on EC2 (`on_ec2`): Nitro instances (every GPU type) have the system vendor
`Amazon EC2`; Xen-based ones a BIOS vendor `Amazon` (newer) or a product UUID beginning `ec2`. A
host whose DMI says none of that is not on EC2, and its IMDS lookup is skipped (exporter/imds.py):
asking 169.254.169.254 there only times out. No DMI to read (a container without /sys, a board
without DMI): not known, IMDS is asked.
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


EC2_VENDOR_FILES = ("sys_vendor", "bios_vendor", "product_uuid", "board_asset_tag", "product_name")


def on_ec2(sysfs: str) -> bool | None:
    """True when the DMI identity under `sysfs` is an EC2 instance's, False when it is readable and
    is not, None when none of its files can be read."""
    base = os.path.dirname(product_name_path(sysfs))
    seen = {}
    for name in EC2_VENDOR_FILES:
        try:
            with open(os.path.join(base, name), "rb") as f:
                seen[name] = f.read(256).decode("ascii", "replace").strip()
        except OSError:
            continue
    if not seen:
        return None
    if seen.get("sys_vendor") == "Amazon EC2" or seen.get("bios_vendor", "").startswith("Amazon"):
        return True
    uuid, tag = seen.get("product_uuid", ""), seen.get("board_asset_tag", "")
    if uuid.lower().startswith("ec2") or tag.startswith("i-"):
        return True
    return bool(_INSTANCE_TYPE.fullmatch(seen.get("product_name", "")))
