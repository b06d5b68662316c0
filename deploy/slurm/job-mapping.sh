#!/bin/bash
# gpu-health-exporter: keep the Slurm job mapping directory (dcgm-exporter's format, the one AWS's
# HyperPod lifecycle scripts write) that the exporter reads with workload.slurm_job_mapping_dir:
# one file per GPU, /run/slurm/dcgm_job_mapping/<index>, holding the ids of the jobs on that GPU,
# one a line. docs/deploy.md, "Workloads", says how to install it.
#
# GPU_HEALTH_JOB_MAPPING_NAMES picks the file names:
#   index (default)  the NVML indexes of SLURM_JOB_GPUS: <dir>/2 (what dcgm-exporter reads)
#   uuid             the GPU and MIG UUIDs of CUDA_VISIBLE_DEVICES, as Slurm 25.11 sets it:
#                    <dir>/GPU-<uuid>, <dir>/MIG-<uuid> (the exporter reads both forms)
#   both             each of the two
#
#   job-mapping.sh add      from the Prolog (prolog.sh):  SLURM_JOB_ID's line into each of SLURM_JOB_GPUS
#   job-mapping.sh remove   from the Epilog (epilog.sh):  that line out of every GPU's file (whatever
#                           SLURM_JOB_GPUS says, so a Slurm that does not give it to the Epilog
#                           leaves no ended job behind); a file left empty goes
#
# Each change is made under one lock (flock on <dir>/.lock) and lands whole: the new content is
# written to a temporary file in the directory and renamed over the old one, so a reader sees the
# old or the new file, never a half-written one. Only this job's line is added or removed, so jobs
# sharing a GPU keep theirs; running it twice changes nothing the second time.
#
# It never fails the job: a Prolog or Epilog that exits non-zero drains the node, which a lost
# bookkeeping line does not deserve. Problems go to stderr and syslog (tag gpu-health-exporter).
# GPU_HEALTH_JOB_MAPPING_DIR overrides the directory.
#
# Bash 4.2 (Amazon Linux 2) and later: an empty array is never expanded as "${a[@]}" under set -u
# (before 4.4 that is an unbound-variable error, which would fail the Epilog and drain the node) but
# as ${a[@]+"${a[@]}"}; tests/test_shell_scripts.py rejects the construct in every script.
set -uo pipefail

action=${1:-}
dir=${GPU_HEALTH_JOB_MAPPING_DIR:-/run/slurm/dcgm_job_mapping}
job=${SLURM_JOB_ID:-}
gpus=${SLURM_JOB_GPUS:-}
visible=${CUDA_VISIBLE_DEVICES:-}
names=${GPU_HEALTH_JOB_MAPPING_NAMES:-index}

say() {
  echo "gpu-health-exporter job-mapping: $*" >&2
  logger -t gpu-health-exporter -- "job-mapping: $*" 2>/dev/null || true
}

# 0,2-4,7 -> 0 2 3 4 7 (Slurm lists indexes with commas; ranges are accepted too)
indexes() {
  local part lo hi i
  local IFS=,
  for part in $1; do
    if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
      lo=$((10#${BASH_REMATCH[1]})) hi=$((10#${BASH_REMATCH[2]}))
      for ((i = lo; i <= hi && i < 4096; i++)); do echo "$i"; done
    elif [[ $part =~ ^[0-9]+$ ]]; then
      echo "$((10#$part))"
    else
      say "job $job: SLURM_JOB_GPUS part '$part' is not a GPU index; skipped"
    fi
  done
}

# GPU-<uuid>,MIG-<uuid> -> one a line (entries of CUDA_VISIBLE_DEVICES that are not UUIDs are skipped)
uuids() {
  local part
  local IFS=,
  for part in $1; do
    if [[ $part =~ ^(GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{6,62}[0-9A-Fa-f]$ ]]; then
      echo "$part"
    elif [[ -n $part ]]; then
      say "job $job: CUDA_VISIBLE_DEVICES entry '$part' is not a GPU or MIG UUID; skipped"
    fi
  done
}

# Rewrite <dir>/<gpu> with this job's line added or removed (called under the lock).
update() {
  local gpu=$1 file="$dir/$1" tmp line found=0
  local -a keep=()
  if [[ -e $file ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
      line=${line//[[:space:]]/}
      [[ -z $line ]] && continue
      if [[ $line == "$job" ]]; then found=1; [[ $action == add ]] && keep+=("$line"); continue; fi
      keep+=("$line")
    done <"$file"
  fi
  if [[ $action == add ]]; then
    ((found)) && return 0
    keep+=("$job")
  else
    ((found)) || return 0
    if ((${#keep[@]} == 0)); then
      rm -f -- "$file"
      return
    fi
  fi
  tmp=$(mktemp "$dir/.$gpu.XXXXXX") || return 1
  # keep is never empty here, and expanded the guarded way anyway (tests/test_shell_scripts.py)
  if ! { printf '%s\n' ${keep[@]+"${keep[@]}"} >"$tmp" && chmod 0644 "$tmp" && mv -f -- "$tmp" "$file"; }; then
    rm -f -- "$tmp"
    return 1
  fi
}

main() {
  case $action in add | remove) ;; *) say "usage: job-mapping.sh add|remove (got '$action')"; return 0 ;; esac
  case $names in index | uuid | both) ;; *) say "GPU_HEALTH_JOB_MAPPING_NAMES '$names' is not index, uuid or both; index used"; names=index ;; esac
  [[ $job =~ ^[0-9]+$ ]] || { say "SLURM_JOB_ID '$job' is not a job id; nothing done"; return 0; }
  local -a targets=()
  local f
  if [[ $action == add ]]; then
    [[ -n $gpus || ( $names != index && -n $visible ) ]] || return 0 # a job without GPUs
    # shellcheck disable=SC2174  # the mode is the mapping directory's; its parents are Slurm's
    mkdir -p -m 0755 -- "$dir" || { say "cannot create $dir"; return 0; }
  else
    [[ -d $dir ]] || return 0
  fi
  exec 9>>"$dir/.lock" || { say "cannot open $dir/.lock"; return 0; }
  flock -w 30 9 || { say "job $job: $dir/.lock still held after 30 s; mapping not updated"; return 0; }
  if [[ $action == add ]]; then
    [[ $names == uuid ]] || while IFS= read -r f; do targets+=("$f"); done < <(indexes "$gpus")
    [[ $names == index ]] || while IFS= read -r f; do targets+=("$f"); done < <(uuids "$visible")
  else
    for f in "$dir"/*; do
      f=${f##*/}
      [[ $f =~ ^[0-9]+(\.[0-9]+)?$ || $f =~ ^(GPU|MIG)-[0-9A-Fa-f-]+$ ]] && targets+=("$f")
    done
  fi
  # "${targets[@]}" of an empty array is an unbound variable to bash 4.2 under set -u (RHEL 7's bash)
  ((${#targets[@]})) || return 0
  for f in ${targets[@]+"${targets[@]}"}; do
    update "$f" || say "job $job: could not $action its line in $dir/$f"
  done
  return 0
}

main
exit 0
