#!/bin/bash
# Slurm Prolog: the opt-in active checks before a job lands on the node (`gpu-health-exporter
# active`; docs/active-checks.md), with a cached pass. HealthCheckProgram stays the passive
# gpu-health-check.sh: it runs every few minutes on busy nodes, where a stress test would hurt jobs.
#
#   slurm.conf:  Prolog=/opt/gpu-health-exporter/slurm/active-check-prolog.sh   (or call it from yours)
#                PrologFlags=Alloc          (it runs at allocation, on every node of the job)
#                PrologEpilogTimeout=600    (above GPU_HEALTH_ACTIVE_BUDGET + 30; Slurm's default is none)
#   Meant for whole-node (exclusive) jobs: a DCGM diagnostic or an all-reduce on GPUs another job
#   holds would disturb that job and fail. On shared nodes set GPU_HEALTH_ACTIVE_CHECKS=nvml.
#
# Cached pass: when every selected check passed (or was skipped: tool missing) within
# GPU_HEALTH_ACTIVE_REUSE seconds it runs nothing and exits 0 at once, so back-to-back jobs pay
# for the checks once an hour, not each time.
# `active`'s exit status -> the prolog's:
#   0 pass                       0
#   2 action required            1: Slurm drains the node ("Prolog error") and requeues the job;
#     (DCGM hardware/integration)   the details go to syslog (tag gpu-health-active)
#   1 degraded (bandwidth under expected, a setting off)
#                                0, logged; 1 (drain) when GPU_HEALTH_ACTIVE_DRAIN_ON=degraded
#   3 could not check, a timeout or any other status
#                                0, logged: a tool problem is not a node fault
# The prolog never calls scontrol (Slurm advises against it in a prolog); on HyperPod an operator
# hands a drained node to auto-resume with `scontrol update ... State=FAIL Reason=Action:Replace`.
# Settings (all optional) in /etc/default/gpu-health-check or the file GPU_HEALTH_CHECK_CONFIG names:
#   GPU_HEALTH_EXPORTER          the exporter (/opt/gpu-health-exporter/bin/gpu-health-exporter)
#   GPU_HEALTH_ACTIVE_ARGS       extra arguments (e.g. "--config /etc/gpu-health-exporter/config.yaml")
#   GPU_HEALTH_ACTIVE_CHECKS     checks to run (default: nvml,efa,dcgm; nccl-tests is opt-in here)
#   GPU_HEALTH_ACTIVE_DCGM_LEVEL dcgmi diag level (1: ~30 s; default: active.dcgm_level, 2)
#   GPU_HEALTH_ACTIVE_BUDGET     seconds for all checks (300)
#   GPU_HEALTH_ACTIVE_REUSE      seconds a pass is reused for (3600)
#   GPU_HEALTH_ACTIVE_DRAIN_ON   action (default) or degraded
set -u
PATH=/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin:${PATH:-}

config=${GPU_HEALTH_CHECK_CONFIG:-/etc/default/gpu-health-check}
# shellcheck source=/dev/null
[ -r "$config" ] && . "$config"
exporter=${GPU_HEALTH_EXPORTER:-/opt/gpu-health-exporter/bin/gpu-health-exporter}
checks=${GPU_HEALTH_ACTIVE_CHECKS:-nvml,efa,dcgm}
budget=${GPU_HEALTH_ACTIVE_BUDGET:-300}
reuse=${GPU_HEALTH_ACTIVE_REUSE:-3600}
drain_on=${GPU_HEALTH_ACTIVE_DRAIN_ON:-action}
node=${SLURMD_NODENAME:-$(hostname -s)}

log() { logger -t gpu-health-active -- "$node: $*" 2>/dev/null; echo "gpu-health-active: $node: $*" >&2; }

level=()
[ -n "${GPU_HEALTH_ACTIVE_DCGM_LEVEL:-}" ] && level=(--dcgm-level "$GPU_HEALTH_ACTIVE_DCGM_LEVEL")
# The command keeps its own budget; `timeout` only bounds a command that could not start its clock.
# shellcheck disable=SC2086  # GPU_HEALTH_ACTIVE_ARGS is a list of arguments
out=$(timeout "$((${budget%.*} + 30))" "$exporter" active --checks "$checks" --budget "$budget" \
      --reuse-pass "$reuse" ${level[@]+"${level[@]}"} ${GPU_HEALTH_ACTIVE_ARGS:-} 2>&1)
status=$?
summary=$(printf '%s' "$out" | tr '\n' ' ' | tr -cd '[:print:]' | head -c 400)
case $status in
  0) exit 0 ;;
  2) log "active checks: action required, failing the prolog (Slurm drains the node, requeues job ${SLURM_JOB_ID:-?}): $summary"
     exit 1 ;;
  1) if [ "$drain_on" = degraded ]; then
       log "active checks: degraded, failing the prolog (GPU_HEALTH_ACTIVE_DRAIN_ON=degraded): $summary"
       exit 1
     fi
     log "active checks: degraded (not draining): $summary" ;;
  124) log "active checks: timed out after $((${budget%.*} + 30))s (not draining)" ;;
  *) log "active checks: could not check, exit status $status (not draining): $summary" ;;
esac
exit 0
