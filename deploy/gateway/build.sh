#!/usr/bin/env bash
# Build the gateway image, tagged by a hash of what goes into it (`make gateway-image`):
#   execgate-gateway:<sha12 of Dockerfile, pyproject.toml, gateway/, backends/, policies/,
#                     deploy/execgate.toml, and the base image's id>
# An unchanged tree is never rebuilt. Prints the tag on its last line.
#
#   BASE_IMAGE=python:3.11-slim deploy/gateway/build.sh   # where a registry is reachable
#   deploy/gateway/build.sh                               # default: the local sandbox image
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
BASE_IMAGE=${BASE_IMAGE:-$("$PYTHON" -c 'from backends.docker.image import default_image; print(default_image())')}
# The embedded policy engine compiles policies/ with OPA: the image carries the binary.
OPA_BIN=$("$PYTHON" -c 'from gateway.policy.compiler import find_opa_binary; print(find_opa_binary())') \
  || { echo "no OPA binary to put in the image: run 'make opa'" >&2; exit 1; }
docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 \
  || { echo "base image $BASE_IMAGE missing: run 'make images' (or set BASE_IMAGE)" >&2; exit 1; }

TAG=execgate-gateway:$("$PYTHON" - "$BASE_IMAGE" "$OPA_BIN" <<'PY'
import hashlib, subprocess, sys
from pathlib import Path
h = hashlib.sha256()
h.update(Path(sys.argv[2]).read_bytes())
h.update(subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", sys.argv[1]],
                        check=True, capture_output=True).stdout)
roots = ["deploy/gateway/Dockerfile", "pyproject.toml", "deploy/execgate.toml",
         "gateway", "backends", "policies"]
for root in roots:
    p = Path(root)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*")
             if f.is_file() and "__pycache__" not in f.parts)
    for f in files:
        h.update(str(f).encode() + b"\0" + f.read_bytes())
print(h.hexdigest()[:12])
PY
)
if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"
  exit 0
fi

CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
# Wheels of execgate and every dependency (pip's cache makes a rebuild cheap), plus pip.
# From a copy of the sources: a build/ left in the tree could carry stale modules.
mkdir -p "$CTX/src"
tar -c --exclude=__pycache__ pyproject.toml gateway backends | tar -x -C "$CTX/src"
"$PYTHON" -m pip wheel --quiet --wheel-dir "$CTX/wheels" "$CTX/src" pip >&2
# The base's Python may need more (e.g. async-timeout below 3.11.3): ask it, offline,
# what is missing, and fetch that on the host, until it resolves.
for _ in 1 2 3 4 5; do
  missing=$(docker run --rm --network=none --user 0 -v "$CTX/wheels:/w:ro" "$BASE_IMAGE" sh -c \
    'python3 $(ls /w/pip-*.whl)/pip install --dry-run --quiet --no-index --find-links /w \
       --target /tmp/t execgate 2>&1' | sed -n 's/.*No matching distribution found for \([^ ]*\).*/\1/p' || true)
  [ -z "$missing" ] && break
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$CTX/wheels" "$missing" >&2
done
cp -r policies "$CTX/policies"
mkdir -p "$CTX/debs"
if command -v apt-get >/dev/null; then
  # Run as root, apt's sandbox user cannot write into a private temp dir.
  (cd "$CTX/debs" && apt-get download -qq libatomic1 2>/dev/null) \
    || echo "apt-get download libatomic1 failed: the build will try the base's apt" >&2
fi
cp deploy/execgate.toml "$CTX/execgate.toml"
cp "$OPA_BIN" "$CTX/opa"
docker build --quiet --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$TAG" \
  -f deploy/gateway/Dockerfile "$CTX" >&2
echo "$TAG"
