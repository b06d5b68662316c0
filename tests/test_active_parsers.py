"""The active checks' pure parsers on every fixture in tests/fixtures/diag (real outputs, and a
few constructed per the documented format: SOURCES.md says which)."""

import json

import pytest

from exporter.activecheck import dcgm, efa, nccl
from exporter.activecheck.expected import GiB, family, figure
from tests.helpers import FIXTURES

DIAG = FIXTURES / "diag"


def text(name: str) -> str:
    return (DIAG / name).read_text()


# --- DCGM --------------------------------------------------------------------------------------

def test_dcgm3_pass_is_a_pass_of_nine_deployment_tests_naming_no_gpu():
    res, reason, findings, _ = dcgm.judge(text("dcgm3-diag-r1-pass.json"), 0)
    assert res == "pass"
    assert len(findings) == 9 and {f.category for f in findings} == {"Deployment"}
    assert {f.gpu for f in findings} == {""}  # 3.x results without gpu_ids: the node's


def test_dcgm3_fail_and_warn_fail_on_persistence_and_keep_the_warning():
    res, reason, findings, _ = dcgm.judge(text("dcgm3-diag-r1-fail-warn.json"), dcgm.EXIT_TEST_FAILED)
    assert res == "fail" and "Persistence Mode" in reason
    by = {f.test: f.status for f in findings}
    assert by["Persistence Mode"] == "fail" and by["Environment Variables"] == "warn"
    assert by["Blacklist"] == "pass"


def test_dcgm3_with_the_text_dcgmi_prints_first_and_gpu_ids_strings():
    doc = json.loads(text("dcgm3-diag-r1-pass.json"))
    first_test = doc["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]
    first_test["results"] = [{"gpu_ids": "0,1", "status": "PASS"}]
    out = "Successfully ran diagnostic for group.\n" + json.dumps(doc)
    findings, _, _ = dcgm.parse(out)
    assert [(f.gpu, f.status) for f in findings[:2]] == [("0", "pass"), ("1", "pass")]


def test_dcgm4_real_gb10_document_fails_software_on_a_config_error_naming_gpu_0():
    res, reason, findings, version = dcgm.judge(text("dcgm4-diag-r1-fail-config-gb10.json"), 226)
    assert (res, version) == ("fail", "4.2.3")
    [f] = findings
    assert (f.gpu, f.test, f.category, f.status, f.error_ids) == ("0", "software", "Deployment", "fail", [29])
    assert not f.isolate  # severity 5 is CONFIG, not ISOLATE (2)
    assert "Persistence mode" in f.message


def test_dcgm4_real_diagnostic_test_object_in_a_full_document_passes_on_8_gpus():
    res, _, findings, version = dcgm.judge(text("dcgm4-diag-r3-pass-h100x8-assembled.json"), 0)
    assert (res, version) == ("pass", "4.1.1")
    diag = [f for f in findings if f.test == "diagnostic"]
    assert sorted(f.gpu for f in diag) == [str(i) for i in range(8)]  # info cut after GPU 2 (DCGM#215)


def test_dcgm4_isolate_failure_names_the_gpu_and_its_error():
    out = text("dcgm4-diag-r2-fail-isolate-constructed.json")
    res, reason, findings, _ = dcgm.judge(out, dcgm.EXIT_ISOLATE)
    assert res == "fail" and "GPU 3 Hardware/memory (error 11)" in reason
    [f] = [f for f in findings if f.status == "fail"]
    assert (f.gpu, f.category, f.isolate) == ("3", "Hardware", True)


def test_dcgm4_warn_is_warn_not_fail():
    res, _, findings, _ = dcgm.judge(text("dcgm4-diag-r1-warn-constructed.json"), 0)
    assert res == "warn" and {f.status for f in findings} == {"warn"} and len(findings) == 8


def test_dcgm4_runtime_error_is_a_tool_error():
    res, reason, _, _ = dcgm.judge(text("dcgm4-diag-runtime-error-constructed.json"), 226)
    assert res == "error" and "GPUs are in use" in reason


@pytest.mark.parametrize(("exit_code", "want"), [(0, "pass"), (205, "pass"), (226, "warn"), (1, "error")])
def test_dcgm_exit_code_beside_an_all_pass_json(exit_code, want):
    assert dcgm.judge(text("dcgm4-diag-r3-pass-h100x8-assembled.json"), exit_code)[0] == want


@pytest.mark.parametrize(("output", "exit_code", "want"), [
    ("Error: unable to establish a connection to the specified host: localhost\n", 235, "skip"),
    (text("dcgm4-diag-r3-pass-h100x8-assembled.json"), 235, "skip"),  # no host engine: never judged
    ("", 203, "error"),
    ("\x00\x01 garbage {not json", 0, "error"),
    ('{"something": "else"}', 0, "error"),
    ('{"DCGM Diagnostic": {"test_categories": []}}', 0, "error"),
])
def test_dcgm_no_host_engine_is_skip_and_garbage_is_error_never_fail(output, exit_code, want):
    assert dcgm.judge(output, exit_code)[0] == want


def test_dcgm_iterations_document_and_not_run():
    one = json.loads(text("dcgm4-diag-r3-pass-h100x8-assembled.json"))
    two = json.loads(text("dcgm4-diag-r2-fail-pcie-constructed.json"))
    two["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["status"] = "Not Run"
    res, _, findings, _ = dcgm.judge(json.dumps({"iterations": [one, two], "Overall Result": "Fail"}), 226)
    assert res == "fail"
    assert [(f.gpu, f.category) for f in findings if f.status == "fail"] == [("5", "Integration")]
    assert any(f.status == "skip" for f in findings)


def test_dcgm_levels():
    assert [dcgm.level(x) for x in (1, "2", "long", "XLONG", "quick")] == [1, 2, 3, 4, 1]
    with pytest.raises(ValueError, match="expected 1 to 4"):
        dcgm.level(5)


# --- nccl-tests --------------------------------------------------------------------------------

def expect(gbps):
    return lambda nodes: gbps


@pytest.mark.parametrize(("name", "size", "busbw", "nodes"), [
    ("nccl-tests-allreduce-a100x8-single-node.txt", GiB, 231.72, 1),
    ("nccl-tests-allreduce-a100x8-2node.txt", GiB, 182.80, 2),
    ("nccl-tests-allreduce-p5-2node-aws.txt", 16 * GiB, 487.26, None),  # srun `0: `, no rank lines
    ("nccl-tests-allreduce-p4de-2node-aws.txt", 2 * GiB, 78.33, None),
    ("nccl-tests-allreduce-p5-awsbatch-aws.txt", 16 * GiB, 483.35, None),  # OpenMPI [1,0]<stdout>:
    ("nccl-tests-allreduce-p5-2node-eks-excerpt-aws.txt", 2 * GiB, 437.89, None),  # a `...` elision line
    ("hyperpod-deep-health-check-nccl-log-aws-doc.txt", 2 * GiB, 1.19, None),  # blank, timestamp lines; %.0f
])
def test_nccl_busbw_at_the_judged_size_under_every_launcher_prefix(name, size, busbw, nodes):
    r = nccl.judge(text(name), 0, size, expect(None), 0.9)
    assert r.result == "pass"
    assert r.measurements["bus_bandwidth_bytes_per_second"] == pytest.approx(busbw * 1e9)
    assert r.measurements.get("nodes") == nodes


def test_nccl_avg_bus_bandwidth_is_not_what_is_judged():
    # the AWS Batch run's footer says 156.742 (the mean over 8 B..16 GiB): a gate on it would fail a
    # healthy p5 against 460; busbw at 16 GiB (483) passes
    out = text("nccl-tests-allreduce-p5-awsbatch-aws.txt")
    assert "Avg bus bandwidth    : 156.742" in out
    assert nccl.judge(out, 0, 16 * GiB, expect(460.0), 0.9).result == "pass"


def test_nccl_under_the_expected_value_fails_on_bandwidth():
    r = nccl.judge(text("nccl-tests-allreduce-p4de-2node-aws.txt"), 0, 2 * GiB, expect(100.0), 0.9)
    assert r.result == "fail" and "under 90.0" in r.reason
    assert [f.test for f in r.findings] == [nccl.BANDWIDTH]
    assert r.measurements["expected_bus_bandwidth_bytes_per_second"] == 100e9


def test_nccl_two_node_run_is_judged_by_the_multi_node_figure():
    seen = []
    nccl.judge(text("nccl-tests-allreduce-a100x8-2node.txt"), 0, GiB, lambda n: seen.append(n) or 150.0, 0.9)
    assert seen == [2]


def test_nccl_failed_launch_is_an_error_not_a_node_fault():
    r = nccl.judge(text("nccl-tests-mpirun-failure-not-enough-slots.txt"), 1, 16 * GiB, expect(460.0), 0.9)
    assert r.result == "error" and not r.findings


def test_nccl_failure_lines_fail_the_collective():
    r = nccl.judge(text("nccl-tests-nccl-failure-constructed.txt"), 3, 16 * GiB, expect(460.0), 0.9)
    assert r.result == "fail" and "Test NCCL failure" in r.reason
    assert [f.test for f in r.findings] == [nccl.COLLECTIVE]


def test_nccl_rows_with_wrong_values_na_and_exponent_numbers():
    row = "  17179869184  4294967296  float  sum  -1  1.2e+07  1.43  2.50  N/A  1.2e+07  1.43  2.50  N/A"
    rep = nccl.parse(f"0: {row}\n")
    assert rep.rows == [nccl.Row(17179869184, 2.5, 2.5, None)]
    wrong = row.replace("N/A", "3", 1)
    assert nccl.judge(wrong, 7, 17179869184, expect(1.0), 0.9).result == "fail"
    r = nccl.judge("[0] " + row + "\n", 0, 17179869184, expect(1.0), 0.9)  # Intel MPI's prefix
    assert r.result == "pass"


def test_nccl_missing_size_or_garbage_is_an_error():
    single = text("nccl-tests-allreduce-a100x8-single-node.txt")  # its largest size is 1 GiB
    assert nccl.judge(single, 0, 16 * GiB, expect(1.0), 0.9).result == "error"
    assert nccl.judge("\x00garbage\n" * 5, 0, 16 * GiB, expect(1.0), 0.9).result == "error"


# --- EFA -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "want"), [
    ("fi_info-efa-p4d-4dev.txt", {"rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"}),
    ("fi_info-efa-direct-1dev.txt", {"rdmap47s0"}),
    ("fi_info-efa-mpirun-prefix-1dev.txt", {"rdmap197s0"}),
    ("fi_info-no-efa.txt", set()),
])
def test_fi_info_devices(name, want):
    assert efa.devices(text(name)) == want


def test_fi_info_garbage_is_not_zero_devices():
    assert efa.devices("segfault\n") is None
    assert efa.devices("provider: tcp\n    domain: eth0\n") is None


# --- expected figures ----------------------------------------------------------------------------

def test_expected_figures_per_family_and_overrides():
    assert [family(t) for t in ("p5.48xlarge", "ml.p5en.48xlarge", "p6-b200.48xlarge", None)] == \
        ["p5", "p5en", "p6-b200", ""]
    for t in ("p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"):
        assert figure(t, "multi_node", {}) is not None, t
    assert figure("p5.48xlarge", "multi_node", {}).busbw_gbps == 487.09
    assert figure("g6.12xlarge", "single_node", {}) is None
    o = figure("ml.p5.48xlarge", "single_node", {"p5": {"single_node": 400, "single_node_size_bytes": GiB}})
    assert (o.busbw_gbps, o.size_bytes, o.source) == (400.0, GiB, "configured")
