#!/usr/bin/env bash
# Build the container image from deploy/Dockerfile: `scripts/build-image.sh [docker build flags...]`.
#   IMAGE=registry.example/sched scripts/build-image.sh --push     (tags IMAGE:VERSION and IMAGE:dev)
# It needs a Docker engine (or another BuildKit builder behind the docker CLI). Machines of this project's
# kind, CI's included, have only the docker client, so CI lints the Dockerfile and runs its entry point and
# health check commands in a plain virtualenv (tests/deploy/test_image.py) but never builds it.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-sched}
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)

command -v docker >/dev/null 2>&1 || { echo "build-image.sh: no docker CLI on PATH" >&2; exit 2; }
if ! docker info >/dev/null 2>&1; then
  echo "build-image.sh: the docker CLI cannot reach a Docker engine ('docker info' fails); building an image" \
       "needs one (this project's CI machines have only the client)" >&2
  exit 2
fi

docker build -f deploy/Dockerfile \
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "CREATED=$CREATED" \
  -t "$IMAGE:$VERSION" -t "$IMAGE:dev" "$@" .
echo "built $IMAGE:$VERSION ($REVISION)"
