#!/usr/bin/env bash
# Installs what building and testing redis-rl needs, when it is missing:
#   - redis-server (Debian's package; also brings redis-cli and redis-benchmark)
#   - libclang for the redis-module crate's bindgen step
#     (libclang1-14 + libclang-common-14-dev: the smallest set that works on Debian 12)
# Uses apt-get as root, or through sudo. Prints what to install by hand otherwise.
# Arguments name more Debian packages whose command of the same name is needed (e.g.
# `install-deps.sh stress` for make test-loaded). The argument `staticcheck` (make lint) is
# installed with `go install` from the Go module proxy instead, at a pinned version, into
# `go env GOBIN` (else `$(go env GOPATH)/bin`), where make lint runs it.
set -euo pipefail

STATICCHECK_VERSION=v0.8.2
missing=()
for tool in "$@"; do
    case "$tool" in
    staticcheck)
        gobin=$(go env GOBIN)
        [ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
        if [ ! -x "$gobin/staticcheck" ]; then
            echo "install-deps: go install honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" >&2
            (cd / && go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION")
        fi
        ;;
    *) command -v "$tool" >/dev/null 2>&1 || missing+=("$tool") ;;
    esac
done
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    missing+=(redis-server)
fi
have_libclang() {
    [ -n "${LIBCLANG_PATH:-}" ] && return 0
    compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || compgen -G "/usr/lib/x86_64-linux-gnu/libclang*.so*" >/dev/null || compgen -G "/usr/lib/aarch64-linux-gnu/libclang*.so*" >/dev/null
}
have_clang_headers() {
    compgen -G "/usr/lib/llvm-*/lib/clang/*/include/stddef.h" >/dev/null || compgen -G "/usr/lib/clang/*/include/stddef.h" >/dev/null
}
if ! have_libclang || ! have_clang_headers; then
    missing+=(libclang1-14 libclang-common-14-dev)
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: no apt-get here; install by hand: redis-server (7.0 or newer) and libclang" >&2
    exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "install-deps: not root and no sudo; run as root: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
