#!/usr/bin/env bash
# Build the container image without Docker Hub: a Debian bookworm base from Debian's packages
# (mmdebstrap), then deploy/Dockerfile on it (buildah bud, chroot isolation, vfs storage), so it
# builds where only the Debian and PyPI registries are reachable (CI, this project's machines).
#   deploy/build-image.sh [TAG]        default TAG: localhost/gpu-health-exporter:ci
# The base tarball is cached under $GHE_IMAGE_CACHE (default ~/.cache/gpu-health-exporter), keyed by
# its suite and package list, and imported into buildah once per key; the Dockerfile build is redone
# each time (it takes the tree as it is). Needs root (buildah's vfs storage), mmdebstrap, buildah.
# A TLS-intercepting proxy's CA (PIP_CERT, as pip is configured here) reaches pip as a build secret.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-localhost/gpu-health-exporter:ci}
suite=bookworm
packages=python3,python3-venv,ca-certificates
export STORAGE_DRIVER=vfs
key=$(printf '%s %s\n' "$suite" "$packages" | sha256sum | cut -c1-12)
base=localhost/gpu-health-exporter-base:$suite-$key
cache=${GHE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-health-exporter}

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  mkdir -p "$cache"
  tarball=$cache/base-$suite-$key.tar
  if [ ! -s "$tarball" ]; then
    # No documentation, manual pages or translations: the exporter never reads them.
    mmdebstrap --quiet --variant=essential --include="$packages" \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      "$suite" "$cache/partial-$$.tar"  # mmdebstrap picks the format by the .tar suffix
    mv "$cache/partial-$$.tar" "$tarball"
  fi
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  ln "$tarball" "$ctx/base.tar" 2>/dev/null || cp "$tarball" "$ctx/base.tar"
  printf 'FROM scratch\nADD base.tar /\nCMD ["/bin/bash"]\n' > "$ctx/Containerfile"
  buildah bud --quiet --isolation chroot -t "$base" -f "$ctx/Containerfile" "$ctx" >/dev/null
fi

secret=()
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
[ -n "$cert" ] && [ -s "$cert" ] && secret=(--secret "id=pip_cert,src=$cert")
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
branch=$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)
buildah bud --quiet --isolation chroot --network host ${secret[@]+"${secret[@]}"} \
  --build-arg PYTHON_IMAGE="$base" --build-arg REVISION="$revision" --build-arg BRANCH="$branch" \
  --build-arg BASE_NAME="debian:$suite (mmdebstrap: $packages)" \
  -t "$tag" -f deploy/Dockerfile . >/dev/null
echo "$tag"
