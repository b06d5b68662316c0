"""`gpu-health-exporter ack --gpu N [--xid X]`: record that an operator reset or repaired a GPU.

The acknowledgement is stored in the state file (with the GPU's XID counts at that moment as its
baseline); the daemon picks it up on its next scrape. XIDs counted up to now stop driving that
GPU's verdict (all of them, or only XID X); the counters themselves never go down. NVML state
(row remap pending/failure, recovery action, lost) is not acknowledged: it clears when the GPU's
state does.
"""

from __future__ import annotations

import argparse
import sys
import time

from exporter.collector import Context
from exporter.xid.catalog import CATALOG, valid_xid
from exporter.xid.parser import pci_key, pci_label
from exporter.xid.service import one_shot
from exporter.xid.store import Ack, split_key

HELP = "acknowledge a GPU's XIDs after a reset or repair (clears its sticky verdict; counters stay)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", required=True, metavar="N",
                   help="GPU index (as NVML numbers them) or PCI address (for a GPU NVML no longer lists).")
    p.add_argument("--xid", type=int, metavar="X", help="Acknowledge only this XID (default: all).")
    p.add_argument("--force", action="store_true",
                   help="Record the ack for a PCI address this node shows no GPU at (NVML does not list "
                        "it, and neither the kernel log nor the state file names one there).")


def run(args: argparse.Namespace, ctx: Context) -> int:
    svc = one_shot(ctx)  # the backlog too: the baseline includes XIDs the daemon has not written yet
    target = args.gpu.strip()
    pci = index = None
    uuid = ""
    if ":" in target:
        pci = pci_key(target)
    elif target.isdigit():
        index = int(target)
        s = svc.session()
        dev = next((d for d in s.devices if d.index == index), None) if s is not None else None
        if dev is not None:
            pci, uuid = pci_key(dev.pci_bus_id), dev.uuid
        else:
            pci = svc.gpu_at_index(index)
    if pci is None:
        print(f"gpu-health-exporter ack: no GPU {target!r} (give an index NVML lists or a PCI address)",
              file=sys.stderr)
        return 2
    counts = svc.snapshot().counts.get(pci)
    if not (svc.is_listed(pci) or counts is not None or args.force):
        # a typo'd address would otherwise silence nothing and say it did
        print(f"gpu-health-exporter ack: this node has no GPU at {pci_label(pci)}: NVML does not list it "
              "and neither the kernel log nor the state file names it; check the address, or give "
              "--force to record the ack anyway", file=sys.stderr)
        return 2
    if args.xid is not None:
        counted = {split_key(k)[0] for k in counts or {}}
        if not valid_xid(args.xid) or (args.xid not in CATALOG and args.xid not in counted):
            print(f"gpu-health-exporter ack: XID {args.xid} is not in the XID catalog (docs/xid.md) nor "
                  f"counted on GPU {target}; nothing to acknowledge", file=sys.stderr)
            return 2
    ident = svc.identity(pci)
    if ident is not None:
        index = ident.index if index is None else index
        uuid = uuid or ident.uuid
    baseline = {k: n for k, n in (counts or {}).items() if args.xid is None or split_key(k)[0] == args.xid}
    problem = svc.write_ack(Ack(pci, index, uuid, args.xid, time.time(), baseline, mono=time.monotonic()))
    if problem:
        path = svc.snapshot().state.path if svc.state.disabled else svc.acks_file.path
        print(f"gpu-health-exporter ack: cannot write the state file {path}: {problem}", file=sys.stderr)
        return 2
    what = f"XID {args.xid}" if args.xid is not None else "all XIDs"
    listed = ", ".join(f"{k} x{n}" for k, n in sorted(baseline.items())) or "none counted yet"
    print(f"acknowledged {what} on GPU {index if index is not None else '-'} ({pci_label(pci)}): {listed}")
    return 0
