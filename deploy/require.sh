#!/usr/bin/env bash
# Check a make target's prerequisites before its recipe runs, and name what to install.
# Usage: deploy/require.sh TARGET NEED...
#   (NEED: python venv go certs libs runtimes ip nsjail-build)
# Every missing one is listed (package names for Debian 12 and Ubuntu 24.04), then it
# exits 1, so a fresh machine stops here rather than with `command not found` mid-recipe.
set -uo pipefail

target="$1"
shift
PYTHON="${PYTHON:-python3}"
missing=()

need() { missing+=("$1"); }
have() { command -v "$1" >/dev/null 2>&1; }
# A shared library the wheels link against (libatomic: rego-cpp; libstdc++: both).
have_lib() { compgen -G "/usr/lib/*/$1" >/dev/null || compgen -G "/lib/*/$1" >/dev/null; }

for want in "$@"; do
  case "$want" in
    python)
      if ! have "$PYTHON"; then
        need "$PYTHON (Python 3.11 or later): apt-get install python3 (Debian 12: 3.11, Ubuntu 24.04: 3.12)"
      elif ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        need "Python 3.11 or later ($PYTHON is $("$PYTHON" -V 2>&1)): apt-get install python3 (Debian 12: 3.11, Ubuntu 24.04: 3.12)"
      fi
      ;;
    venv)
      # Debian and Ubuntu ship venv's ensurepip separately: without it `python3 -m venv` fails.
      if have "$PYTHON" && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
        need "Python's venv module with ensurepip: apt-get install python3-venv"
      fi
      ;;
    go)
      if ! have go; then
        need "go (any Go 1.17 or later; the Go OPA needs is fetched by the build): apt-get install golang-go (Debian 12: Go 1.19, Ubuntu 24.04: Go 1.22)"
      elif ! go env GOVERSION >/dev/null 2>&1; then
        need "Go 1.17 or later ($(go version 2>&1)): apt-get install golang-go (Debian 12: Go 1.19, Ubuntu 24.04: Go 1.22)"
      fi
      ;;
    certs)
      # Go reads the system's CA bundle to reach the module proxy (pip brings its own).
      [ -s /etc/ssl/certs/ca-certificates.crt ] \
        || need "the system CA certificates (for the Go module proxy): apt-get install ca-certificates"
      ;;
    libs)
      have_lib libatomic.so.1 || need "libatomic.so.1 (rego-cpp, the embedded policy engine): apt-get install libatomic1"
      have_lib libstdc++.so.6 || need "libstdc++.so.6 (nsjail, rego-cpp): apt-get install libstdc++6"
      ;;
    runtimes)
      # Sandboxes execute the host's own read-only runtimes.
      [ -x /usr/bin/python3 ] || need "/usr/bin/python3 (the sandboxes' Python): apt-get install python3"
      [ -x /bin/bash ] || [ -x /usr/bin/bash ] || need "bash (the sandboxes' shell): apt-get install bash"
      [ -x /usr/bin/node ] || need "/usr/bin/node (the sandboxes' JavaScript, Node 18 or later): apt-get install nodejs"
      ;;
    ip)
      PATH="$PATH:/usr/sbin:/sbin" have ip \
        || need "ip (the tests inspect sandboxes' network namespaces with it): apt-get install iproute2"
      ;;
    nsjail-build)
      # deploy/nsjail/build.sh: nsjail from source, linked statically (the -dev packages
      # carry the static libraries it links).
      have python3 || need "python3 (fetches nsjail's source): apt-get install python3"
      have g++ && have gcc || need "a C and C++ compiler (nsjail): apt-get install g++"
      have make || need "make: apt-get install make"
      have patch || need "patch (deploy/nsjail/compiled_policy.patch): apt-get install patch"
      have pkg-config || need "pkg-config (nsjail's Makefile): apt-get install pkg-config"
      have bison && have flex || need "bison and flex (kafel, nsjail's seccomp compiler): apt-get install bison flex"
      have protoc || need "protoc (nsjail's config): apt-get install protobuf-compiler"
      have_lib libprotobuf.a || need "libprotobuf.a (nsjail, linked statically): apt-get install libprotobuf-dev"
      have_lib libnl-route-3.a || need "libnl-route-3.a (nsjail, linked statically): apt-get install libnl-route-3-dev"
      { have readelf && have strip && have nm; } || need "binutils (readelf, nm, strip): apt-get install binutils"
      ;;
    *)
      echo "deploy/require.sh: unknown prerequisite '$want'" >&2
      exit 2
      ;;
  esac
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "make $target: missing prerequisites (see README.md, Requirements):" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi
