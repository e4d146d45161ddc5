#!/usr/bin/env bash
# One command that prepares a fresh Debian 12 machine of this project's kind:
#   - a virtualenv in .venv with the package (editable) and its dev tools,
#   - etcd 3.5.x server + etcdctl under .cache/etcd (no change to the system's apt state),
#   - Debian's prometheus + promtool under .cache/prometheus (deploy checks), kubectl checked (from the image),
#   - iproute2/iptables/libfaketime for the drills (namespaces, cuts, clock skew), curl for their shell jobs.
# Idempotent: re-running only fills in what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '[setup] %s\n' "$*"; }

# --- system packages -------------------------------------------------------
need_apt=()
for pkg in iproute2 iptables faketime curl; do
  # No pipe into `grep -q`: under pipefail its early exit can SIGPIPE the writer and fail the test.
  [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" = "install ok installed" ] || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# --- Debian packages unpacked under .cache (no change to the system's apt state) ---------------------
# fetch_debs DIR SUITE PKG...: download PKG from Debian SUITE with a private apt configuration and unpack
# them with dpkg -x into DIR/root. No maintainer scripts run, so nothing is started or enabled.
fetch_debs() {
  local dir=$1 suite=$2; shift 2
  local A=$dir/apt
  rm -rf "$A" "$dir/root"
  mkdir -p "$A/lists/partial" "$A/archives/partial" "$dir/root"
  local MIRROR
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" >"$A/sources.list"
  local O=(-o "Dir::Etc::sourcelist=$A/sources.list" -o Dir::Etc::sourceparts=/nonexistent
           -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
  apt-get "${O[@]}" -qq update
  (cd "$A" && apt-get "${O[@]}" -qq download "$@" 2>&1 | grep -v unsandboxed || true)
  for d in "$A"/*.deb; do dpkg -x "$d" "$dir/root"; done
  rm -rf "$A"
}

# --- etcd 3.5.x --------------------------------------------------------------
# Debian 12 ships only etcd 3.4; trixie's 3.5.x debs run on bookworm (glibc >= 2.34).
ETCD_DIR=$ROOT/.cache/etcd
if ! "$ETCD_DIR/root/usr/bin/etcd" --version >/dev/null 2>&1; then
  log "fetching etcd 3.5 from Debian trixie into $ETCD_DIR"
  fetch_debs "$ETCD_DIR" trixie etcd-server etcd-client
fi
# Not `| head -1`: head exits after one line and, under pipefail, etcd's SIGPIPE (exit 141) fails setup.
ETCD_VERSION=$("$ETCD_DIR/root/usr/bin/etcd" --version)
echo "${ETCD_VERSION%%$'\n'*}"

# --- Prometheus and promtool (tests/deploy: rule checks and unit tests, the live dashboard test) --------
# Debian's own package of this release, unpacked rather than installed: `apt-get install prometheus` would
# start a server on *:9090 (and pull prometheus-node-exporter, another listener); the tests start their own
# on loopback when they need one.
PROM_DIR=$ROOT/.cache/prometheus
if ! "$PROM_DIR/root/usr/bin/promtool" --version >/dev/null 2>&1; then
  SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  log "fetching prometheus from Debian $SUITE into $PROM_DIR"
  fetch_debs "$PROM_DIR" "$SUITE" prometheus
fi
PROM_VERSION=$("$PROM_DIR/root/usr/bin/promtool" --version 2>&1)
echo "${PROM_VERSION%%$'\n'*}"

# --- kubectl (tests/deploy: `kubectl kustomize` renders every overlay) -----------------------------------
# Machines of this kind come with kubectl (the image's apt package `kubectl`, client 1.32, kustomize v5).
# Debian's own kubernetes-client (1.20) embeds kustomize v2, which cannot render these overlays, and no
# other source is reachable from CI; so check and say what is missing rather than install something else.
if ! kubectl kustomize --help >/dev/null 2>&1; then
  log "WARNING: kubectl with 'kustomize' not found: tests/deploy/test_kubernetes.py will fail until it is on PATH"
fi

# --- Python --------------------------------------------------------------------
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PY --version)"
  rm -rf .venv
  "$PY" -m venv .venv
fi
# etcd binaries next to the venv's tools so `schedctl`, tests and operators find them on PATH.
for b in etcd etcdctl etcdutl; do ln -sf "$ETCD_DIR/root/usr/bin/$b" ".venv/bin/$b"; done
for b in prometheus promtool; do ln -sf "$PROM_DIR/root/usr/bin/$b" ".venv/bin/$b"; done
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
log "done: activate with 'source .venv/bin/activate' (schedctl, etcd, etcdctl, promtool are on its PATH)"
