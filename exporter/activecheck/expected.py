"""Expected all_reduce bus bandwidth per instance family, from published figures (none was
measured by this project: no GPU node was available). Each figure is busbw in GB/s at the size
it was published for; the check runs all_reduce_perf at that size and judges busbw there
against `active.nccl_min_fraction` x the figure. `active.nccl_expected` overrides any entry.

Sources (tests/fixtures/diag/SOURCES.md; docs/active-checks.md):
- p5 multi-node: AWS awsome-distributed-ai micro-benchmarks/nccl-tests README (16da837), 2 x
  p5.48xlarge over EFA: 487.09 GB/s at 16 GiB (the AWS Batch run: 483.05).
- p5 single node: no AWS figure. Azure's ND H100 v5 health check gates 8 x H100 SXM at 460 GB/s
  at 16 GiB (azurehpc-health-checks conf/nd96isr_h100_v5.conf).
- p4d multi-node: the same AWS README, 2 x p4de.24xlarge: 78.33 GB/s at 2 GiB (its largest size).
- p4d single node: 8 x A100-SXM4 (facebookresearch/gcm's sample): 231.7 GB/s at 1 GiB.
- p6 (p6-b200) multi-node: AWS PCS compute-test.md, 4 x p6-b200: 377 GB/s at 16 GiB.
- p5e and p5en (8 x H200, the same NVLink 4 and 3,200 Gbps EFA as p5): no published figure;
  p5's are used, an inference. Azure's ND H200 v5 conf says 431 single node (its README 480).
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class Figure:
    busbw_gbps: float
    size_bytes: int
    source: str


# family -> {"single_node" | "multi_node": Figure}
PUBLISHED: dict[str, dict[str, Figure]] = {
    "p4d": {"single_node": Figure(231.7, GiB, "gcm sample, 8 x A100-SXM4, 1 GiB"),
            "multi_node": Figure(78.33, 2 * GiB, "AWS awsome README, 2 x p4de, 2 GiB")},
    "p5": {"single_node": Figure(460.0, 16 * GiB, "Azure ND H100 v5 threshold, 16 GiB"),
           "multi_node": Figure(487.09, 16 * GiB, "AWS awsome README, 2 x p5, 16 GiB")},
    "p6": {"multi_node": Figure(377.0, 16 * GiB, "AWS PCS compute-test, 4 x p6-b200, 16 GiB")},
}
PUBLISHED["p4de"] = PUBLISHED["p4d"]
PUBLISHED["p5e"] = PUBLISHED["p5en"] = PUBLISHED["p5"]  # inferred: same NVLink and EFA bandwidth
PUBLISHED["p6-b200"] = PUBLISHED["p6"]
DEFAULT_SIZE = 16 * GiB


def family(instance_type: str | None) -> str:
    """p5.48xlarge -> p5; ml.p5en.48xlarge (HyperPod) -> p5en; p6-b200.48xlarge -> p6-b200."""
    t = (instance_type or "").strip().lower()
    t = t.removeprefix("ml.")
    return t.split(".", 1)[0]


def figure(instance_type: str | None, scope: str, overrides: dict[str, dict[str, float]]) -> Figure | None:
    """The expected busbw for `scope` (single_node, multi_node) of the instance type: the
    override (`active.nccl_expected: {p5: {single_node: 450}}`, at DEFAULT_SIZE unless it gives
    `<scope>_size_bytes`), else the published figure; None when there is neither."""
    fam = family(instance_type)
    o = overrides.get(fam) or overrides.get(instance_type or "") or {}
    if scope in o:
        return Figure(float(o[scope]), int(o.get(f"{scope}_size_bytes", DEFAULT_SIZE)), "configured")
    return PUBLISHED.get(fam, {}).get(scope)
