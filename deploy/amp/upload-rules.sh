#!/bin/bash
# Upload rules/*.yml to Amazon Managed Service for Prometheus, one rule groups namespace per file
# (gpu-health-exporter-<file>), creating it the first time and replacing its content after that.
#   deploy/amp/upload-rules.sh WORKSPACE_ID [REGION]      (REGION defaults to the AWS CLI's)
# Needs the AWS CLI v2 and aps:CreateRuleGroupsNamespace, aps:PutRuleGroupsNamespace,
# aps:DescribeRuleGroupsNamespace. The files are plain Prometheus rule files, what AMP expects
# (`groups:`); check them first with `promtool check rules rules/*.yml`.
set -euo pipefail
ws=${1:?usage: upload-rules.sh WORKSPACE_ID [REGION]}
region=()
[ -n "${2:-}" ] && region=(--region "$2")
rules_dir=${RULES_DIR:-$(cd "$(dirname "$0")/../../rules" && pwd)}
aws=${AWS:-aws}
shopt -s nullglob
files=("$rules_dir"/*.yml)
[ ${#files[@]} -gt 0 ] || { echo "no rule files in $rules_dir" >&2; exit 1; }
for f in ${files[@]+"${files[@]}"}; do
  name="gpu-health-exporter-$(basename "$f" .yml)"
  if "$aws" amp describe-rule-groups-namespace ${region[@]+"${region[@]}"} --workspace-id "$ws" --name "$name" \
       >/dev/null 2>&1; then
    verb=put-rule-groups-namespace
  else
    verb=create-rule-groups-namespace
  fi
  "$aws" amp "$verb" ${region[@]+"${region[@]}"} --workspace-id "$ws" --name "$name" --data "fileb://$f" >/dev/null
  echo "$verb $name <- $f"
done
