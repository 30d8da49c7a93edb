#!/usr/bin/env bash
# The sandbox image of the docker and docker-gvisor backends, built here: no image can
# be pulled, so a minimal Debian is bootstrapped into a folder and `docker import`ed.
#
# The image is tagged by a hash of this file (the recipe), `execgate-sandbox:<sha12>`,
# which is also the tag the backends use by default (backends/docker_image.py hashes
# the same bytes): changing this file is what makes a new image, and an image that
# exists is never rebuilt. Caches, keyed by the same hash, under ~/.cache/execgate/images:
#   debootstrap-<suite>-<sha12 of the package list>.tgz  the downloaded .debs
#                            (debootstrap --make-tarball): kept across recipe edits
#   rootfs-<sha12>.tar       the finished root filesystem (what `docker import` takes)
# so a clean clone, or an engine whose images were wiped, needs no download.
#
# Contents: Debian's minbase plus full python3 (ctypes, venv: not python3-minimal),
# bash and nodejs; an unprivileged user `sandbox` (uid/gid 150000, owning nothing on
# the host); no setuid/setgid bits; no apt/dpkg state, docs or caches. The backends
# run it read-only with their own launcher, tmpfs mounts, user and environment.
set -euo pipefail

RECIPE=$(readlink -f "$0")
SHA=$(sha256sum "$RECIPE" | cut -c1-12)
TAG=${EXECGATE_IMAGE_REPO:-execgate-sandbox}:$SHA
CACHE=${EXECGATE_CACHE_DIR:-$HOME/.cache/execgate}/images
SUITE=bookworm
PACKAGES=python3,bash,nodejs
SANDBOX_ID=150000

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG is up to date"
  exit 0
fi

# The Debian mirror this machine's apt uses (only Debian's registry may be reachable).
mirror() {
  if [ -n "${EXECGATE_DEBIAN_MIRROR:-}" ]; then echo "$EXECGATE_DEBIAN_MIRROR"; return; fi
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
      2>/dev/null | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' \
    || true
}

mkdir -p "$CACHE"
ROOTFS_TAR=$CACHE/rootfs-$SHA.tar
if [ ! -s "$ROOTFS_TAR" ]; then
  command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install debootstrap" >&2; exit 1; }
  MIRROR=$(mirror)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  WORK=$(mktemp -d /var/tmp/execgate-image.XXXXXX)
  cleanup() {
    # debootstrap mounts /proc and /sys in the target while it installs.
    { findmnt -rno TARGET | grep "^$WORK/" | sort -r | xargs -r umount -l; } || true
    rm -rf "$WORK"
  }
  trap cleanup EXIT
  DEBS=$CACHE/debootstrap-$SUITE-$(echo "$PACKAGES" | sha256sum | cut -c1-12).tgz
  if [ ! -s "$DEBS" ]; then
    echo "downloading $SUITE packages from $MIRROR"
    debootstrap --variant=minbase --include="$PACKAGES" --make-tarball="$DEBS.part" \
      "$SUITE" "$WORK/download" "$MIRROR" >"$WORK/download.log" 2>&1 \
      || { tail -20 "$WORK/download.log" >&2; exit 1; }
    mv "$DEBS.part" "$DEBS"
  fi
  ROOT=$WORK/root
  echo "bootstrapping $SUITE into $ROOT"
  debootstrap --variant=minbase --include="$PACKAGES" --unpack-tarball="$DEBS" \
    "$SUITE" "$ROOT" "$MIRROR" >"$WORK/bootstrap.log" 2>&1 \
    || { tail -20 "$WORK/bootstrap.log" >&2; exit 1; }
  { findmnt -rno TARGET | grep "^$ROOT/" | sort -r | xargs -r umount -l; } || true

  echo "sandbox:x:$SANDBOX_ID:$SANDBOX_ID:sandbox:/workspace:/usr/sbin/nologin" >>"$ROOT/etc/passwd"
  echo "sandbox:x:$SANDBOX_ID:" >>"$ROOT/etc/group"
  # No way up: not one setuid or setgid program (no-new-privileges is the other lock).
  find "$ROOT" -xdev -type f -perm /6000 -exec chmod ug-s {} +
  # Mount points of the backends' tmpfs mounts; the root filesystem is read-only.
  mkdir -p "$ROOT/workspace" "$ROOT/code"
  chmod 0755 "$ROOT/workspace" "$ROOT/code"
  # Nothing a program could read that it does not need: no password hashes (only root
  # needs them, and nothing here logs in), no package state, docs or caches; /var,
  # /run, /srv and /home empty, no /root.
  rm -rf "$ROOT"/etc/shadow* "$ROOT"/etc/gshadow* "$ROOT"/etc/passwd- "$ROOT"/etc/group- \
    "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
    "$ROOT"/var/* "$ROOT"/run/* "$ROOT"/srv/* "$ROOT"/home/* "$ROOT"/tmp/* \
    "$ROOT"/root
  tar -C "$ROOT" --numeric-owner -cf "$ROOTFS_TAR.part" .
  mv "$ROOTFS_TAR.part" "$ROOTFS_TAR"
  # Root filesystems of older recipes are not needed again.
  find "$CACHE" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$SHA.tar" -delete
fi

echo "importing $TAG"
docker import \
  --change "USER $SANDBOX_ID:$SANDBOX_ID" \
  --change "WORKDIR /workspace" \
  --change "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8" \
  --change 'CMD ["/bin/false"]' \
  --message "execgate sandbox image, recipe $SHA" \
  "$ROOTFS_TAR" "$TAG" >/dev/null
docker image inspect --format '{{.RepoTags}} {{.Size}} bytes' "$TAG"
