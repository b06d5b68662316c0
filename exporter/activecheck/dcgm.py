"""`dcgmi diag -r LEVEL -j`: its JSON (DCGM 3.x and 4.x) and exit status to a CheckResult.

DCGM 4.x: {"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
[{"entity_group", "entity_id", "status", "warnings": [{"error_id", "error_severity", ...}]}],
"test_summary"}]}], "runtime_error"?}, "entity_groups", "metadata": {"version"}}.
DCGM 3.x: top key "DCGM GPU Diagnostic", display names ("Persistence Mode"), results carrying
`gpu_id`/`gpu_ids` or none, no test_summary. `--iterations N` wraps documents in
{"iterations": [...]}. Text may precede the JSON, so the first `{` starts it. (Sources:
NVIDIA/DCGM dcgmi/Diag.cpp at 72fa3fe; facebookresearch/gcm#38; tests/fixtures/diag/SOURCES.md.)

Status strings are Pass, Fail, Warn, Skip, Not Run (any case; 3.x also SKIPPED). Exit codes: 0 OK, 226 a test
failed, 205 an error of ISOLATE priority, 203 NVVS killed, 235 no host engine. The JSON is
trusted over the exit code (205 comes with all-Pass JSON in gcm's fixtures): 235 is `skip` (no
host engine: never a failure), output that is not a diagnostic is `error` (a tool problem,
never a node fault) unless dcgmi exited 226 or 205: then it is a failure naming no GPU
(degraded: no category says more).
"""

from __future__ import annotations

import json
from typing import Any

from exporter.activecheck.result import CheckResult, Finding

EXIT_OK, EXIT_ISOLATE, EXIT_NVVS_KILLED, EXIT_TEST_FAILED, EXIT_NO_HOST_ENGINE = 0, 205, 203, 226, 235
# dcgmErrorSeverity_t (dcgmlib/dcgm_errors.h): 0 NONE, 1 MONITOR, 2 ISOLATE, 3 UNKNOWN, 4 TRIAGE,
# 5 CONFIG, 6 RESET. (awsome's parse-dcgm-results.py reads 3 as ISOLATE: that is its own scale.)
SEVERITY_ISOLATE = 2
TOP_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
# NVVS 3.x's JSON comment (nvvs/include/NvvsCommon.h) lists PASS|FAIL|WARN|SKIPPED
STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip", "skipped": "skip",
          "not run": "skip"}
LEVELS = {"quick": 1, "short": 1, "medium": 2, "long": 3, "xlong": 4}


class NotDiagnostic(ValueError):
    """The output holds no diagnostic document."""


def first_json(text: str) -> Any:
    """The first diagnostic JSON object in `text` (leading text such as "Successfully ran
    diagnostic for group.", or a log line on stderr with braces of its own, is skipped; what
    follows the object is ignored)."""
    dec = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        try:
            doc, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(doc, dict) and (any(k in doc for k in TOP_KEYS) or "iterations" in doc):
            return doc
        i = text.find("{", end)
    raise NotDiagnostic("no JSON object in dcgmi's output")


def _list(v: Any) -> list[Any]:
    """v when it is a list, else none (garbage of the right shape above it)."""
    return v if isinstance(v, list) else []


def _status(v: Any) -> str:
    return STATUS.get(str(v or "").strip().lower(), "")


def _gpus(r: dict[str, Any]) -> list[str]:
    """The GPU(s) a result is about: entity_id of a GPU entity (4.x), gpu_id or gpu_ids (3.x);
    "" (the node) for another entity or none."""
    if "entity_id" in r:
        if str(r.get("entity_group", "GPU")).upper() != "GPU":
            return [""]  # a CPU (cpu_eud), a switch...: the node's
        return [str(r["entity_id"])]
    if "gpu_id" in r:
        return [str(r["gpu_id"])]
    ids = r.get("gpu_ids")
    if isinstance(ids, list):
        return [str(i) for i in ids]
    if isinstance(ids, (str, int)) and str(ids).strip():
        return [s.strip() for s in str(ids).split(",") if s.strip()]
    return [""]


def _warnings(r: dict[str, Any]) -> tuple[list[int], bool, str]:
    ids, isolate, msgs = [], False, []
    warnings = r.get("warnings")
    if isinstance(warnings, dict):
        warnings = [warnings]
    for w in warnings if isinstance(warnings, list) else []:
        if not isinstance(w, dict):
            continue
        if isinstance(w.get("error_id"), int):
            ids.append(w["error_id"])
        if w.get("error_severity") == SEVERITY_ISOLATE:
            isolate = True
        if w.get("warning"):
            msgs.append(str(w["warning"]))
    return ids, isolate, "; ".join(msgs)


def _documents(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, dict) and isinstance(doc.get("iterations"), list):
        return [d for d in doc["iterations"] if isinstance(d, dict)]
    return [doc] if isinstance(doc, dict) else []


def parse(text: str) -> tuple[list[Finding], str, str]:
    """(findings, DCGM version, runtime error) of dcgmi diag -j output; NotDiagnostic when it is
    not one. A test with no per-GPU result gives one finding from its summary, GPU ""."""
    findings: list[Finding] = []
    version, runtime_error = "", ""
    docs = _documents(first_json(text))
    seen = False
    for doc in docs:
        body = next((doc[k] for k in TOP_KEYS if isinstance(doc.get(k), dict)), None)
        if body is None:
            continue
        seen = True
        meta = doc.get("metadata")
        version = str((meta or {}).get("version", "") if isinstance(meta, dict) else "") or \
            str(body.get("version", "")) or version
        if body.get("runtime_error"):
            runtime_error = str(body["runtime_error"])
        for cat in _list(body.get("test_categories")):
            if not isinstance(cat, dict):
                continue
            category = str(cat.get("category", ""))
            for test in _list(cat.get("tests")):
                if isinstance(test, dict):
                    findings += _test_findings(test, category)
    if not seen:
        raise NotDiagnostic("dcgmi's JSON has no \"DCGM Diagnostic\" document")
    return findings, version, runtime_error


def _test_findings(test: dict[str, Any], category: str) -> list[Finding]:
    name = str(test.get("name", ""))
    out = []
    for r in _list(test.get("results")):
        if not isinstance(r, dict):
            continue
        status = _status(r.get("status"))
        if not status:
            continue
        ids, isolate, msg = _warnings(r)
        out += [Finding(g, name, status, category, ids, isolate, msg) for g in _gpus(r)]
    if not out:
        summary = test.get("test_summary")
        status = _status(summary.get("status")) if isinstance(summary, dict) else ""
        if status:
            ids, isolate, msg = _warnings(summary)  # type: ignore[arg-type]
            out.append(Finding("", name, status, category, ids, isolate, msg))
    return out


def judge(output: str, exit_code: int | None) -> tuple[str, str, list[Finding], str]:
    """(result, reason, findings, DCGM version) of a finished dcgmi diag run."""
    if exit_code == EXIT_NO_HOST_ENGINE:
        return "skip", "no DCGM host engine answers (dcgmi exit 235): nothing was tested", [], ""
    try:
        findings, version, runtime_error = parse(output)
    except NotDiagnostic as e:
        if exit_code in (EXIT_TEST_FAILED, EXIT_ISOLATE):
            # dcgmi's status says a test failed, and no JSON says which: a node failure with no
            # category and no GPU, so degraded (never replace on an exit status alone)
            what = "a GPU is to be isolated" if exit_code == EXIT_ISOLATE else "a test failed"
            return ("fail", f"dcgmi exited {exit_code} ({what}) and its output holds no diagnostic to say "
                    "which", [Finding("", "diag", "fail")], "")
        if exit_code == EXIT_NVVS_KILLED:
            return "error", "the diagnostic (NVVS) was killed (dcgmi exit 203)", [], ""
        return "error", f"{e} (exit {exit_code})", [], ""
    if runtime_error:
        return "error", f"DCGM could not run the diagnostic: {runtime_error}", findings, version
    if not findings:
        return "error", f"dcgmi's JSON holds no test result (exit {exit_code})", [], version
    failed = [f for f in findings if f.status == "fail"]
    warned = [f for f in findings if f.status == "warn"]
    if failed:
        if exit_code == EXIT_ISOLATE:  # an error of ISOLATE priority: the failed GPUs are to be isolated
            for f in failed:
                f.isolate = True
        return "fail", "failed: " + describe(failed), findings, version
    if warned:
        return "warn", "warnings: " + describe(warned), findings, version
    if exit_code == EXIT_TEST_FAILED:  # the JSON is trusted, but the disagreement is said
        return "warn", "dcgmi exited 226 (a test failed) but its JSON shows none failed", findings, version
    if exit_code not in (EXIT_OK, EXIT_ISOLATE):  # 205 with all-Pass JSON is OK (gcm's fixtures)
        return "error", f"dcgmi exited {exit_code} with no failed test in its JSON", findings, version
    return "pass", f"{len(findings)} results passed", findings, version


def describe(findings: list[Finding]) -> str:
    parts = []
    for f in findings[:8]:
        where = f"GPU {f.gpu} " if f.gpu else ""
        ids = f" (error {','.join(map(str, f.error_ids))})" if f.error_ids else ""
        parts.append(f"{where}{f.category}/{f.test}{ids}")
    more = f" and {len(findings) - 8} more" if len(findings) > 8 else ""
    return ", ".join(parts) + more


def level(value: str | int) -> int:
    """A diag level from 1-4 or its alias (quick, medium, long, xlong)."""
    if isinstance(value, int) or str(value).isdigit():
        n = int(value)
        if 1 <= n <= 4:
            return n
    elif str(value).lower() in LEVELS:
        return LEVELS[str(value).lower()]
    raise ValueError(f"DCGM diag level {value!r}: expected 1 to 4, or quick, medium, long, xlong")


def result(output: str, exit_code: int | None) -> CheckResult:
    res, reason, findings, version = judge(output, exit_code)
    return CheckResult("dcgm", res, reason, exit_code=exit_code, findings=findings,
                       tool=f"dcgmi {version}".strip())
