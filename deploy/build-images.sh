#!/usr/bin/env bash
# Builds Switchyard's container image (switchyard:local, or $SWITCHYARD_IMAGE)
# from static binaries compiled on this machine. No registry is needed: the
# image is FROM scratch. Usage: deploy/build-images.sh (from anywhere).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
image="${SWITCHYARD_IMAGE:-switchyard:local}"
version="$(git -C "$repo" describe --tags --always --dirty 2>/dev/null || echo dev)"

mkdir -p "$here/bin/data"
echo "== building static binaries (CGO_ENABLED=0) into deploy/bin"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$here/bin/switchyard" ./cmd/switchyard)
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$here/bin/healthcheck" ./deploy/healthcheck)
cp "$repo/examples/stack.yaml" "$here/bin/stack.yaml"
cp "$repo/examples/engine-endpoints.yaml" "$here/bin/engine-endpoints.yaml"

echo "== building image $image"
docker build --label "org.opencontainers.image.version=$version" -t "$image" -f "$here/Dockerfile" "$here"
docker image ls "$image"
