#!/bin/bash
# SageMaker HyperPod Slurm lifecycle-script snippet: install gpu-health-exporter on every node and its
# Slurm health check on the compute nodes. Call it from the cluster's on_create.sh (after the base
# config has set up Slurm), with this repository's deploy/ and a wheel of the exporter next to it in the
# lifecycle-script S3 prefix, e.g.:
#   bash ./gpu-health-exporter/hyperpod-lifecycle.sh ./gpu-health-exporter
# What it does (docs/deploy.md, "HyperPod Slurm"):
#   1. a venv at /opt/gpu-health-exporter with the wheel; the runbooks at
#      /usr/share/doc/gpu-health-exporter/runbooks.html; the systemd unit; the config; the job
#      mapping prolog/epilog in /opt/gpu-health-exporter/slurm/ when DIR has them (not wired in), and
#      its directory made at boot (tmpfiles.conf, when DIR has it);
#   2. the health check at /opt/gpu-health-exporter/slurm/gpu-health-check.sh (HyperPod mode is
#      detected from /opt/ml/config/resource_config.json: drains become state FAIL with the reason
#      Action:Replace / Action:Reboot that HyperPod's auto-resume acts on);
#   3. on the controller only: HealthCheckProgram/Interval in slurm.conf unless one is set already,
#      then `scontrol reconfigure`.
set -euo pipefail
src=${1:?usage: hyperpod-lifecycle.sh DIR (holding the wheel, gpu-health-exporter.service, gpu-health-check.sh, config.yaml, and optionally job-mapping.sh, prolog.sh, epilog.sh, tmpfiles.conf)}
prefix=/opt/gpu-health-exporter
slurm_conf=${SLURM_CONF:-/opt/slurm/etc/slurm.conf}

python3 -m venv "$prefix"
"$prefix/bin/pip" install -q "$src"/gpu_health_exporter-*.whl
# the runbooks every alert links to by default (docs/deploy.md, "Runbook links")
"$prefix/bin/python" -m exporter.runbooks --out /usr/share/doc/gpu-health-exporter >/dev/null
install -d -m 0755 /etc/gpu-health-exporter "$prefix/slurm"
[ -e /etc/gpu-health-exporter/config.yaml ] || install -m 0644 "$src/config.yaml" /etc/gpu-health-exporter/
install -m 0755 "$src/gpu-health-check.sh" "$prefix/slurm/gpu-health-check.sh"
# The job mapping directory's prolog and epilog (docs/deploy.md, "Workloads"), for clusters whose own
# prolog does not write /run/slurm/dcgm_job_mapping; wiring them into slurm.conf is left to the admin.
for f in job-mapping.sh prolog.sh epilog.sh; do
  if [ -e "$src/$f" ]; then install -m 0755 "$src/$f" "$prefix/slurm/$f"; fi
done
# The mapping directory from boot, so a node no job has run on yet reads "no job", not "directory
# missing" (workload.slurm_job_mapping_missing_seconds).
if [ -e "$src/tmpfiles.conf" ]; then
  install -m 0644 "$src/tmpfiles.conf" /etc/tmpfiles.d/gpu-health-exporter-job-mapping.conf
  systemd-tmpfiles --create /etc/tmpfiles.d/gpu-health-exporter-job-mapping.conf || true
fi
install -m 0644 "$src/gpu-health-exporter.service" /etc/systemd/system/
systemctl daemon-reload
systemctl enable --now gpu-health-exporter

# The controller owns slurm.conf (shared with the compute nodes); never replace an existing health check.
if systemctl is-active --quiet slurmctld 2>/dev/null && [ -w "$slurm_conf" ]; then
  if grep -qiE '^[[:space:]]*HealthCheckProgram=' "$slurm_conf"; then
    echo "slurm.conf already has a HealthCheckProgram; add $prefix/slurm/gpu-health-check.sh to it by hand" >&2
  else
    cat >>"$slurm_conf" <<EOF
# gpu-health-exporter: drain nodes whose GPUs need a reset, reboot or replacement (docs/deploy.md).
HealthCheckProgram=$prefix/slurm/gpu-health-check.sh
HealthCheckInterval=300
HealthCheckNodeState=ANY,CYCLE
EOF
    scontrol reconfigure
  fi
fi
