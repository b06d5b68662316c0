#!/usr/bin/env bash
# Builds kube-apiserver once per machine from Debian's own `kubernetes` source package (Kubernetes
# 1.20.2 with vendor/; Debian ships only kubectl from it) and caches the binary OUTSIDE the clone, so
# tests/test_kubernetes.py starts it rather than builds it. About 5 minutes on 2 idle cores.
# Prints the path of the cached binary (docs/deploy.md, "The GpuHealthy node condition", says what
# the tests do with it).
#   KUBE_APISERVER_CACHE  cache directory (default /var/cache/gpu-health-exporter)
set -euo pipefail
cache="${KUBE_APISERVER_CACHE:-/var/cache/gpu-health-exporter}"
bin="$cache/kube-apiserver-1.20.2"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
# deb-src from Debian's own archive only (beside the machine's debian.sources)
if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    | $SUDO tee /etc/apt/sources.list.d/debian-src.sources >/dev/null
  $SUDO apt-get update -qq
fi
need=()
for pkg in golang-go rsync jq etcd-server golang-github-modern-go-reflect2-dev dpkg-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
$SUDO mkdir -p "$cache"
work="$(mktemp -d "${TMPDIR:-/tmp}/kube-apiserver-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get source --download-only kubernetes >/dev/null 2>&1 || apt-get source --download-only kubernetes
tar -xzf kubernetes_*.orig.tar.gz
cd kubernetes-1.20.2
# The vendored reflect2 1.0.1 crashes on Go >= 1.18 ("fatal error: fault" in mapiternext):
# Debian's 1.0.2 replaces it.
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod
sed -i 's#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v1.0.2#' go.mod vendor/modules.txt
make WHAT=cmd/kube-apiserver >&2
$SUDO install -m 0755 _output/bin/kube-apiserver "$bin.tmp"
$SUDO mv "$bin.tmp" "$bin"
echo "$bin"
