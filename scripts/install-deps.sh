#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of meshnet from Debian
# bookworm packages. Idempotent: packages already present are skipped by apt.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  clang clang-format libclang-rt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libssl-dev openssl libisal-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev
  libhwy-dev libpcre2-dev libicu-dev
  python3-numpy python3-jinja2
  libcpp-httplib-dev curl chromium
  etcd-server etcd-client
)
# meshnet api's client and browser tests need Node + npm. Debian's `npm`
# package conflicts with an npm installed another way, so only ask apt for
# them when they are missing.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

# The pinned npm packages (openai, playwright-core) of tests/api.
npm_ci() {
  local dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/api"
  [[ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ]] && return 0
  if [[ -f "$dir/package-lock.json" ]] && command -v npm >/dev/null 2>&1; then
    (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
    echo "install-deps: npm ci in tests/api"
  fi
}

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PKGS[@]} packages present"
  npm_ci
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
npm_ci
