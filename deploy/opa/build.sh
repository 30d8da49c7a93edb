#!/usr/bin/env bash
# Build the pinned OPA server from its Go module with whatever Go the distribution ships
# (`make opa`). Usage: build.sh VERSION OPA_DIR CACHE_DIR
#
# OPA's go.mod names the Go it needs (v1.22.4: go 1.26.0), newer than any distribution's
# (Debian 12: 1.19; Ubuntu 24.04: 1.22, whose packages also pin GOTOOLCHAIN=local). So
# when the Go on PATH is older, the Go that OPA asks for is fetched as the ordinary module
# golang.org/toolchain@v0.0.1-goX.Y.Z.OS-ARCH through the module proxy (any module-aware
# Go can download it) and run from the module cache, after the same first-use fix-up Go
# 1.21+ does when it switches toolchains itself: exec bits, and the `_go.mod` files
# renamed in module zips put back as `go.mod`. Everything Go writes (GOPATH, GOMODCACHE,
# GOCACHE) is under CACHE_DIR/go, outside the tree, so an empty home directory works and
# a later build (or another clone) reuses it. GOMODCACHE / GOPROXY / GOFLAGS from the
# environment are honoured.
set -euo pipefail

version="$1" opa_dir="$2" cache_dir="$3"
go_dir="$cache_dir/go"
export GOPATH="$go_dir/path"
export GOMODCACHE="${GOMODCACHE:-$go_dir/mod}"
export GOCACHE="$go_dir/build"
# A GOROOT left in the environment would point the fetched toolchain at the wrong library.
unset GOROOT

say() { echo "make opa: $*" >&2; }

# Run directly (not from make): the same prerequisite check and message.
bash "$(dirname "$0")/../require.sh" opa go certs || exit 1

# "1.26.0" -> 1260000-ish integer, comparable; "1.26" counts as 1.26.0, "1.21rc2" as 1.21.
go_num() {
  local v="${1#go}" major minor patch
  v="${v%%[!0-9.]*}"
  IFS=. read -r major minor patch <<<"$v"
  echo $((major * 1000000 + ${minor:-0} * 1000 + ${patch:-0}))
}

host_go="$(go env GOVERSION 2>/dev/null || true)"
[ -n "$host_go" ] || { say "'go env GOVERSION' failed: Go 1.17 or later is needed"; exit 1; }

# What OPA's go.mod asks for: its `toolchain` line if any, else its `go` line.
mod_json="$(go mod download -json "github.com/open-policy-agent/opa@$version")"
gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$mod_json")"
[ -f "$gomod" ] || { say "could not download github.com/open-policy-agent/opa@$version:"; echo "$mod_json" >&2; exit 1; }
want="go$(sed -n 's/^go[[:space:]]\{1,\}\([0-9][0-9.]*\).*/\1/p' "$gomod")"
tool_line="$(sed -n 's/^toolchain[[:space:]]\{1,\}\(go[0-9][0-9.]*\).*/\1/p' "$gomod")"
if [ -n "$tool_line" ] && [ "$(go_num "$tool_line")" -gt "$(go_num "$want")" ]; then
  want="$tool_line"
fi
# A `go 1.N` line without a patch level names the toolchain go1.N.0 (Go 1.21 and later).
case "$want" in go1.[0-9][0-9]) want="$want.0" ;; esac

go_bin=go
if [ "$(go_num "$host_go")" -lt "$(go_num "$want")" ]; then
  toolchain="golang.org/toolchain@v0.0.1-$want.$(go env GOOS)-$(go env GOARCH)"
  say "OPA $version needs $want; $host_go is older: fetching $toolchain"
  tc_json="$(go mod download -json "$toolchain")"
  tc_dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$tc_json")"
  [ -d "$tc_dir" ] || { say "could not download $toolchain:"; echo "$tc_json" >&2; exit 1; }
  if [ ! -x "$tc_dir/bin/go" ] || ! cmp -s "$tc_dir/src/_go.mod" "$tc_dir/src/go.mod"; then
    chmod -R u+w "$tc_dir"
    # Tools before bin/go: an executable bin/go is the sign that the fix-up is done.
    find "$tc_dir/pkg/tool" -type f -exec chmod a+x {} +
    find "$tc_dir/lib" -type f -name 'go_?*_?*_exec' -exec chmod a+x {} +
    find "$tc_dir/src" -name _go.mod ! -path "$tc_dir/src/_go.mod" \
      -execdir cp _go.mod go.mod \;
    cp "$tc_dir/src/_go.mod" "$tc_dir/src/go.mod"
    chmod a+x "$tc_dir/bin/gofmt" "$tc_dir/bin/go"
    chmod -R a-w "$tc_dir"
  fi
  go_bin="$tc_dir/bin/go"
fi

mkdir -p "$opa_dir"
say "building OPA $version with $("$go_bin" env GOVERSION) into $opa_dir"
GOTOOLCHAIN=local GOBIN="$opa_dir" GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" \
  "$go_bin" install "github.com/open-policy-agent/opa@$version"
# Not `| head -1`: under pipefail, OPA's SIGPIPE on its second line would fail the build.
built="$("$opa_dir/opa" version)"
say "built: ${built%%$'\n'*}"
