#!/bin/bash
# Slurm health check around `gpu-health-exporter check` (docs/deploy.md, "Slurm and HyperPod Slurm").
#
#   slurm.conf:  HealthCheckProgram=/opt/gpu-health-exporter/slurm/gpu-health-check.sh
#                HealthCheckInterval=300
#                HealthCheckNodeState=ANY,CYCLE
#   or a prolog: Prolog=/opt/gpu-health-exporter/slurm/gpu-health-check.sh --prolog   (absolute path)
#
# Verdict (check's exit status) -> action:
#   0 healthy, 1 degraded      nothing (degraded is an alert, not a drain)
#   2 action required          drain the node with a reason naming the GPUs and the cause:
#                                "gpu-health: GPU 1 replace (xid_replace: XID 94)"
#                              and the Slurm jobs or pods the faults behind that reason hit (the
#                              XIDs of the verdict's tiers, or the SXids of a node reason), as
#                              `check` recorded them (kept after the job died of it):
#                              "... XID 94; job 4242)"; never the workloads of another XID (an
#                              application's XID 13) when the verdict's reason is something else.
#                              The reason is printable single-line text (no control characters,
#                              no U+2028 line separators), at most 200 characters
#                              on HyperPod Slurm instead state FAIL with the reason its auto-resume acts
#                              on, "Action:Replace" or "Action:Reboot" (a GPU reset is done by a reboot
#                              there); the details go to syslog (tag gpu-health-check)
#   3 could not check, or the check failed or timed out: never drains (logged, with check's
#                              problems); but a GPU that does not answer NVML (reason
#                              gpu_not_answering: a fault of the node, not of the tool) fails a
#                              prolog (exit 1: Slurm drains the node and requeues the job), so no job
#                              starts on it; as a health check it is logged (the daemon pages if it lasts)
# A node already drained, failed or down is left as it is (its reason is not overwritten).
# As a prolog (--prolog) it exits 1 after draining, so Slurm requeues the job; otherwise 0.
# Settings (all optional) in /etc/default/gpu-health-check or the file GPU_HEALTH_CHECK_CONFIG names:
#   GPU_HEALTH_EXPORTER  the exporter        (/opt/gpu-health-exporter/bin/gpu-health-exporter)
#   GPU_HEALTH_CHECK_ARGS extra check args   (e.g. "--config /etc/gpu-health-exporter/config.yaml")
#   GPU_HEALTH_HYPERPOD  auto|yes|no         (auto: yes where /opt/ml/config/resource_config.json exists)
#   GPU_HEALTH_TIMEOUT   seconds for check   (45: Slurm kills a health check after 60 s)
#   SCONTROL             scontrol to use     (found on PATH, /opt/slurm/bin, /usr/bin)
set -u
PATH=/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin:${PATH:-}

config=${GPU_HEALTH_CHECK_CONFIG:-/etc/default/gpu-health-check}
# shellcheck source=/dev/null
[ -r "$config" ] && . "$config"
exporter=${GPU_HEALTH_EXPORTER:-/opt/gpu-health-exporter/bin/gpu-health-exporter}
python=${GPU_HEALTH_PYTHON:-$(dirname "$exporter")/python3}
hyperpod=${GPU_HEALTH_HYPERPOD:-auto}
timeout_s=${GPU_HEALTH_TIMEOUT:-45}
scontrol=${SCONTROL:-scontrol}
node=${SLURMD_NODENAME:-$(hostname -s)}
prolog=no
[ "${1:-}" = "--prolog" ] && prolog=yes

log() { logger -t gpu-health-check -- "$node: $*" 2>/dev/null; echo "gpu-health-check: $node: $*" >&2; }
done_ok() { exit 0; }

# Exit 3: log check's problems (not the JSON's first bytes, which are only the node header); a prolog
# fails when a GPU does not answer NVML.
unknown() {
  local why hung
  why=$(printf '%s' "$report" | "$python" -c '
import json, sys
d = json.load(sys.stdin)
hung = [str(g["gpu"]) for g in d.get("gpus", []) if "gpu_not_answering" in g.get("reasons", [])]
print(",".join(hung) or "-", "; ".join(d.get("problems", [])) or "no reason given")
' 2>/dev/null) || why="- $(printf '%s' "$report" | tr -d '\n' | head -c 300)"
  hung=${why%% *}
  why=${why#* }
  if [ "$hung" != - ] && [ "$prolog" = yes ]; then
    log "GPU(s) $hung do not answer NVML: failing the prolog (Slurm drains the node and requeues the job): $(printf '%s' "$why" | head -c 400)"
    exit 1
  fi
  log "could not check (not draining): $(printf '%s' "$why" | head -c 400)"
  done_ok
}

if [ "$hyperpod" = auto ]; then
  if [ -e /opt/ml/config/resource_config.json ]; then hyperpod=yes; else hyperpod=no; fi
fi

# shellcheck disable=SC2086  # GPU_HEALTH_CHECK_ARGS is a list of arguments
report=$(timeout "$timeout_s" "$exporter" check --json ${GPU_HEALTH_CHECK_ARGS:-} 2>/dev/null)
status=$?
case $status in
  0) done_ok ;;
  1) log "degraded (not draining): $(printf '%s' "$report" | head -c 300 | tr '\n' ' ')"; done_ok ;;
  2) ;;
  3) unknown ;;
  124) log "check timed out after ${timeout_s}s (not draining)"; done_ok ;;
  *) log "check failed with exit status $status (not draining)"; done_ok ;;
esac

# Action required: summarise which GPUs and why. Prints "<action> <reason text>", action one of
# replace, reboot, reset.
summary=$(printf '%s' "$report" | "$python" -c '
import json, sys
rank = {"replace_required": 3, "reboot_required": 2, "reset_required": 1}
d = json.load(sys.stdin)
node = d["node"]
def line(text):  # printable single-line text: a reason goes to scontrol, syslog and a log line
    return "".join(c if c.isprintable() else " " for c in str(text))
if node["verdict"] == "unknown":  # nothing was checked (older exporters exited 2 on a bad config)
    print("none", line("; ".join(d.get("problems", [])))[:200])
    sys.exit()
def hit(events):  # the workloads the faults hit, as check recorded them: "job 42", "pod ns/name"
    names = []
    for e in events:
        for w in e["workloads"]:
            n = "job " + w["hpc_job"] if w["kind"] == "slurm" else "pod %s/%s" % (w["namespace"], w["pod"])
            if n not in names:
                names.append(n)
    return ("; " + ",".join(names)) if names else ""
parts, worst = [], rank.get(node["verdict"], 0)
for g in d["gpus"]:
    r = rank.get(g["verdict"], 0)
    if not r:
        continue
    worst = max(worst, r)
    xids = sorted({x["xid"] for x in g["xids"]
                   if x["tier"] in ("replace", "reboot", "reset") and not x["acknowledged"]})
    cause = ",".join(g["reasons"]) + (": XID " + ",".join(map(str, xids)) if xids else "")
    # only the events behind this verdict: its XIDs (none when the reason is not an XID)
    cause += hit([e for e in g.get("workloads_hit", []) if e["event"] == "xid" and e["xid"] in xids])
    parts.append("GPU %s %s (%s)" % (g["gpu"], g["verdict"].replace("_required", ""), cause))
if not parts:  # a node-level cause, e.g. fewer GPUs than the instance type has, an NVSwitch SXid
    sxids = {x["sxid"] for x in d.get("nvswitch_sxids", []) if x["tier"] in ("replace", "reboot")} \
        if any(r.startswith("sxid_") for r in node["reasons"]) else set()
    parts.append("node %s (%s; GPUs %s/%s%s)" % (node["verdict"].replace("_required", ""),
                 ",".join(node["reasons"]), node["gpu_count"], node["expected_gpus"],
                 hit([e for g in d["gpus"] for e in g.get("workloads_hit", [])
                      if e["event"] == "sxid" and e["sxid"] in sxids])))
print({3: "replace", 2: "reboot"}.get(worst, "reset"), line("gpu-health: " + "; ".join(parts))[:200])
' 2>/dev/null)
if [ -z "$summary" ]; then
  log "action required but the report could not be read (not draining)"
  done_ok
fi
action=${summary%% *}
detail=${summary#* }
if [ "$action" = none ]; then
  log "check could not run: $detail (not draining)"
  done_ok
fi

state=$("$scontrol" show node "$node" 2>/dev/null | sed -n 's/^ *State=\([^ ]*\).*/\1/p')
case $state in
  *DRAIN*|*FAIL*|*DOWN*)
    log "$detail (node already $state; left as it is)"
    [ "$prolog" = yes ] && exit 1
    done_ok ;;
esac

if [ "$hyperpod" = yes ]; then
  case $action in replace) reason="Action:Replace" ;; *) reason="Action:Reboot" ;; esac
  new_state=FAIL
else
  reason=$detail
  new_state=DRAIN
fi
if "$scontrol" update NodeName="$node" State="$new_state" Reason="$reason"; then
  log "set $new_state, reason \"$reason\": $detail"
else
  log "could not set $new_state (reason \"$reason\"): $detail"
fi
[ "$prolog" = yes ] && exit 1
exit 0
