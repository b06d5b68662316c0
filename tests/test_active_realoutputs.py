"""Real tool outputs the first fixtures did not have (tests/fixtures/diag/SOURCES.md, "verifier"
rows), each parsed and judged as the `active` command would, plus the constructed variants that
exercise one documented format detail each."""

from __future__ import annotations

import pytest

from exporter.activecheck import dcgm, nccl
from tests.helpers import FIXTURES

DIAG = FIXTURES / "diag"
GiB = 1 << 30


def text(name: str) -> str:
    return (DIAG / name).read_text()


def expect(value: float | None):
    return lambda nodes: value


def test_dcgm31_real_output_with_leading_text_null_tests_and_gpu_ids_of_both_kinds():
    """NVIDIA/DCGM's own "Deserialize real output" case: a warning line before the JSON, `null`
    entries between tests, PASS in capitals, gpu_ids as "0,...,7" and as integers."""
    findings, version, runtime_error = dcgm.parse(text("dcgm3.1-diag-pass-8gpu-leading-warning-nulls.json"))
    assert (version, runtime_error) == ("3.1.0", "")
    assert {f.gpu for f in findings} == {str(i) for i in range(8)}
    assert len(findings) == 9 * 8 + 8  # nine Deployment tests on every GPU, and software per GPU
    res, _, _, _ = dcgm.judge(text("dcgm3.1-diag-pass-8gpu-leading-warning-nulls.json"), 0)
    assert res == "pass"


def test_dcgm3_skipped_status_is_a_skip_not_dropped():
    """NVVS 3.x writes PASS|FAIL|WARN|SKIPPED (nvvs/include/NvvsCommon.h): a test every GPU
    skipped is a skip, not a document with no result."""
    doc = text("dcgm3.1-diag-pass-8gpu-leading-warning-nulls.json").replace('"PASS"', '"SKIPPED"')
    findings, _, _ = dcgm.parse(doc)
    assert findings and {f.status for f in findings} == {"skip"}


@pytest.mark.parametrize(("name", "size", "busbw", "hosts"), [
    ("nccl-tests-allreduce-a100x8-single-node-10g-mpirun-oci.txt", 10 * GiB, 232.20, 1),
    ("nccl-tests-allreduce-a100x8-2node-10g-mpirun-oci.txt", 10 * GiB, 191.76, 2),  # an mpirun line first
    ("nccl-tests-2.17.6-allreduce-b200-2node-mpirun-dstack.txt", 2 * GiB, 702.91, None),  # no rank lines
    ("nccl-tests-2.18.3-allreduce-gh200x4-2node-srun-nris.txt", 128 << 20, 107.63, 2),  # int8
    ("nccl-tests-allreduce-rtx5090-1gpu-issue287.txt", 128 << 20, 0.0, 1),  # one GPU: busbw 0, %.2f wide
    ("nccl-tests-allreduce-a100x8-no-check-c0-constructed.txt", 10 * GiB, 232.20, 1),  # #wrong N/A
    ("nccl-tests-allreduce-a100x8-benign-warn-constructed.txt", 10 * GiB, 232.20, 1),
])
def test_nccl_real_runs_pass_at_their_largest_size(name, size, busbw, hosts):
    seen: list[int | None] = []
    r = nccl.judge(text(name), 0, size, lambda n: seen.append(n) or None, 0.9)
    assert r.result == "pass", r.reason
    assert r.measurements["bus_bandwidth_bytes_per_second"] == pytest.approx(busbw * 1e9)
    assert seen == [hosts]


def test_nccl_real_runs_under_the_expected_value_are_a_bandwidth_failure():
    """191.8 GB/s on 2 x A100 against 400 expected: bandwidth, degraded (never a wrong-value
    failure)."""
    out = text("nccl-tests-allreduce-a100x8-2node-10g-mpirun-oci.txt")
    r = nccl.judge(out, 0, 10 * GiB, expect(400.0), 0.9)
    assert r.result == "fail" and [f.test for f in r.findings] == [nccl.BANDWIDTH]


@pytest.mark.parametrize("name", ["nccl-tests-allreduce-rtx5090x2-nccl-failure-issue287.txt",
                                  "nccl-tests-allreduce-rtx5090x2-debug-info-warn-issue287.txt"])
def test_nccl_real_failed_collective_is_a_collective_failure(name):
    """NVIDIA/nccl-tests#287: the table header, then `Test NCCL failure ... 'unhandled cuda
    error'` (with NCCL_DEBUG=INFO, NCCL WARN lines, some benign, interleaved)."""
    r = nccl.judge(text(name), 3, 128 << 20, expect(10.0), 0.9)
    assert r.result == "fail" and [f.test for f in r.findings] == [nccl.COLLECTIVE]
    assert "unhandled cuda error" in r.reason


def test_nccl_no_check_run_is_not_judged_for_wrong_values():
    rep = nccl.parse(text("nccl-tests-allreduce-a100x8-no-check-c0-constructed.txt"))
    assert [r.wrong for r in rep.rows] == [None] and rep.out_of_bounds is None


def test_dcgm4_failure_on_a_cpu_entity_is_the_nodes_not_dropped():
    """DCGM 4.x results carry entity_group (GPU, CPU...): level 3 runs cpu_eud on Grace nodes. A
    CPU entity's failure names no GPU; it is the node's, never lost (lost, the run reads pass)."""
    import json

    doc = json.loads(text("dcgm4-diag-r3-pass-h100x8-assembled.json"))
    cat = doc["DCGM Diagnostic"]["test_categories"][0]
    cat["tests"].append({"name": "cpu_eud", "results": [
        {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Fail",
         "warnings": [{"warning": "example CPU EUD failure", "error_id": 100, "error_category": 1,
                       "error_severity": 4}]}]})  # no test_summary: the result alone says it
    res, reason, findings, _ = dcgm.judge(json.dumps(doc), 226)
    assert res == "fail", reason
    assert [(f.gpu, f.test) for f in findings if f.status == "fail"] == [("", "cpu_eud")]


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", "0: ", "[default0]:", "[rank0]:", "gpu-1-1: "])
def test_nccl_a_size_that_fills_its_column_is_read_after_any_launcher_prefix(prefix):
    """nccl-tests prints size as %12li: 128 GiB has 12 digits and no leading space, so OpenMPI's
    and torchrun's prefixes end right against it."""
    row = ("137438953472   34359738368     float     sum      -1   560000  245.43  429.50      0"
           "   560000  245.43  429.50      0")
    rep = nccl.parse(prefix + row + "\n")
    assert [(r.size, r.busbw) for r in rep.rows] == [(128 * GiB, 429.50)]


@pytest.mark.parametrize(("name", "devices"), [
    ("fi_info-efa-hpc6a-1dev-rdm-dgrm.txt", {"rdmap0s31"}),
    ("fi_info-efa-rdm-1dev-aws-guide.txt", {"rdmap0s6"}),
])
def test_fi_info_real_listings_count_devices_once(name, devices):
    from exporter.activecheck import efa

    assert efa.devices(text(name)) == devices


def test_dcgm_a_json_fragment_on_stderr_before_the_document_is_skipped():
    """stdout and stderr are read together: a structured log line with its own braces ahead of
    the document must not be taken for it."""
    out = 'warning: {"module": "nvvs", "msg": "retrying"}\n' + text("dcgm4-diag-r1-fail-config-gb10.json")
    res, reason, found, version = dcgm.judge(out, 226)
    assert res == "fail", reason
    assert version == "4.2.3" and ("0", "software") in {(f.gpu, f.test) for f in found if f.status == "fail"}


@pytest.mark.parametrize("bad", ["nan", "inf", "-nan"])
def test_nccl_a_non_finite_busbw_is_never_a_pass(bad):
    row = (f" 17179869184    4294967296     float     sum      -1    70654  243.16  {bad}      0"
           f"    70609  243.31  {bad}      0")
    r = nccl.judge(row + "\n", 0, 16 * GiB, expect(400.0), 0.9)
    assert r.result != "pass", r.reason


def test_nccl_rank_lines_without_group_of_older_builds_count_nodes():
    out = ("#   Rank  0 Pid  41003 on    node-a device  0 [0x1a] Tesla V100-SXM2-32GB\n"
           "#   Rank  1 Pid  52011 on    node-b device  0 [0x1a] Tesla V100-SXM2-32GB\n")
    assert nccl.parse(out).hosts == {"node-a", "node-b"}


def test_nccl_invalid_usage_is_a_configuration_error_not_a_node_fault():
    """ncclInvalidUsage: the caller's setup (CSCS's docs: NCCL_NET names a plugin that is not
    found). Every node would fail alike: `error`, never a degraded verdict fleet-wide."""
    out = ("nid006352:34157:34217 [1] net.cc:626 NCCL WARN Error: network AWS Libfabric not found.\n"
           "nid006352: Test NCCL failure common.cu:958 "
           "'invalid usage (run with NCCL_DEBUG=WARN for details)\n")
    r = nccl.judge(out, 3, 16 * GiB, expect(400.0), 0.9)
    assert r.result == "error" and not r.findings, r.reason
    assert "invalid usage" in r.reason
