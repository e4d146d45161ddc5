#!/usr/bin/env bash
# One command that prepares a fresh Debian 12 machine of this project's kind:
#   - a virtualenv in .venv with the package (editable) and its dev tools,
#   - etcd 3.5.x server + etcdctl under .cache/etcd (no change to the system's apt state),
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

# --- etcd 3.5.x --------------------------------------------------------------
# Debian 12 ships only etcd 3.4; trixie's 3.5.x debs run on bookworm (glibc >= 2.34). We download them
# with a private apt configuration and unpack with dpkg -x, so the system's apt state is untouched.
ETCD_DIR=$ROOT/.cache/etcd
if ! "$ETCD_DIR/root/usr/bin/etcd" --version >/dev/null 2>&1; then
  log "fetching etcd 3.5 from Debian trixie into $ETCD_DIR"
  A=$ETCD_DIR/apt
  rm -rf "$A" "$ETCD_DIR/root"
  mkdir -p "$A/lists/partial" "$A/archives/partial" "$ETCD_DIR/root"
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" >"$A/sources.list"
  O=(-o "Dir::Etc::sourcelist=$A/sources.list" -o Dir::Etc::sourceparts=/nonexistent
     -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
  apt-get "${O[@]}" -qq update
  (cd "$A" && apt-get "${O[@]}" -qq download etcd-server etcd-client 2>&1 | grep -v unsandboxed || true)
  for d in "$A"/etcd-*.deb; do dpkg -x "$d" "$ETCD_DIR/root"; done
  rm -rf "$A"
fi
# Not `| head -1`: head exits after one line and, under pipefail, etcd's SIGPIPE (exit 141) fails setup.
ETCD_VERSION=$("$ETCD_DIR/root/usr/bin/etcd" --version)
echo "${ETCD_VERSION%%$'\n'*}"

# --- Python --------------------------------------------------------------------
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PY --version)"
  rm -rf .venv
  "$PY" -m venv .venv
fi
# etcd binaries next to the venv's tools so `schedctl`, tests and operators find them on PATH.
for b in etcd etcdctl etcdutl; do ln -sf "$ETCD_DIR/root/usr/bin/$b" ".venv/bin/$b"; done
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
log "done: activate with 'source .venv/bin/activate' (schedctl, etcd, etcdctl are on its PATH)"
