#!/usr/bin/env bash
# Builds local container images of the brokers from binaries on this machine, for machines with
# a Docker engine but no image registry (drill's tests run the container runtime with them):
#   drill-local/mosquitto   mosquitto and its shared libraries
#   drill-local/nats        nats-server (a static binary)
#   drill-local/kafka       tansu (the Kafka-protocol broker) and its shared libraries
#   drill-local/rsyslog     rsyslogd, its modules (imrelp among them) and their libraries
#   drill-local/postgres    Debian's PostgreSQL server, initdb, their modules and data files
# Each is a minimal root filesystem imported with `docker import`. Users' machines pull the
# official images instead (eclipse-mosquitto, nats, apache/kafka, rsyslog/rsyslog, postgres).
# Idempotent: an image that exists is kept (pass --force to rebuild). Needs ci/setup.sh first.
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"
if command -v python3 >/dev/null 2>&1; then
  PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
fi
force=0
[ "${1:-}" = "--force" ] && force=1

if ! docker info >/dev/null 2>&1; then
  echo "ci/images.sh: no Docker engine answers; nothing to build"
  exit 0
fi

# Copies a binary and every shared library it loads into a root filesystem.
add_binary() {
  local root=$1 bin=$2 dest=$3
  mkdir -p "$root$(dirname "$dest")"
  cp -L "$bin" "$root$dest"
  { ldd "$bin" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

# The real executable (not a pyenv shim or other wrapper script).
real_binary() {
  local name=$1 candidate
  for candidate in \
    "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)/$name" \
    "$HOME/.cargo/bin/$name" "/usr/sbin/$name" "/usr/local/bin/$name" "$(command -v "$name" || true)"; do
    if [ -x "$candidate" ] && head -c 4 "$candidate" | grep -q 'ELF'; then
      echo "$candidate"
      return
    fi
  done
  echo "ci/images.sh: no $name binary found (run ci/setup.sh first)" >&2
  exit 1
}

# build TAG ENTRYPOINT [SOURCE DEST]...: each SOURCE (a binary or a module) with its shared
# libraries, at DEST. With EXTRA_DIRS (folders copied as they are, at the same path) and
# EXTRA_USER (NAME:UID, a user and group of that id) set for the call.
build() {
  local tag=$1 entry=$2
  shift 2
  if [ $force -eq 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "ci/images.sh: $tag exists"
    return
  fi
  local root
  root=$(mktemp -d)
  mkdir -p "$root/tmp" "$root/data" "$root/etc"
  chmod 1777 "$root/tmp"
  echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
  echo "root:x:0:" > "$root/etc/group"
  while [ $# -gt 0 ]; do
    add_binary "$root" "$1" "$2"
    shift 2
  done
  local dir
  for dir in ${EXTRA_DIRS:-}; do
    mkdir -p "$root$(dirname "$dir")"
    cp -a "$dir" "$root$dir"
  done
  if [ -n "${EXTRA_USER:-}" ]; then
    local name=${EXTRA_USER%%:*} id=${EXTRA_USER##*:}
    echo "$name:x:$id:$id::/tmp:/bin/sh" >> "$root/etc/passwd"
    echo "$name:x:$id:" >> "$root/etc/group"
  fi
  tar -C "$root" -c . | docker import --change "ENTRYPOINT $entry" - "$tag" >/dev/null
  rm -rf "$root"
  echo "ci/images.sh: built $tag"
}

build drill-local/mosquitto '["/usr/sbin/mosquitto"]' "$(real_binary mosquitto)" /usr/sbin/mosquitto
build drill-local/nats '["/nats-server"]' "$(real_binary nats-server)" /nats-server
build drill-local/kafka '["/usr/local/bin/tansu"]' "$(real_binary tansu)" /usr/local/bin/tansu

# rsyslog: Debian's, as ci/setup.sh unpacked it (or the machine's own). Its modules go where
# Debian's build looks for them (/usr/lib/<triplet>/rsyslog), each with its libraries.
rsyslogd=""
for candidate in /usr/sbin/rsyslogd "$HOME/.cache/drill/rsyslog/usr/sbin/rsyslogd"; do
  if [ -x "$candidate" ]; then rsyslogd=$candidate; break; fi
done
if [ -z "$rsyslogd" ]; then
  echo "ci/images.sh: no rsyslogd found (run ci/setup.sh first)" >&2
  exit 1
fi
rsyslog_modules=()
for module in "$(dirname "$(dirname "$rsyslogd")")"/lib/*/rsyslog/*.so; do
  [ -f "$module" ] || continue
  triplet=$(basename "$(dirname "$(dirname "$module")")")
  rsyslog_modules+=("$module" "/usr/lib/$triplet/rsyslog/$(basename "$module")")
done
if [ ${#rsyslog_modules[@]} -eq 0 ]; then
  echo "ci/images.sh: no rsyslog modules next to $rsyslogd" >&2
  exit 1
fi
build drill-local/rsyslog '["/usr/sbin/rsyslogd"]' "$rsyslogd" /usr/sbin/rsyslogd "${rsyslog_modules[@]}"

# PostgreSQL: Debian's server and initdb, the modules initdb loads (plpgsql, the snowball
# dictionaries; not the LLVM JIT), its share/ folder and the time zones, /bin/sh for drill's
# start line, and a postgres user with the official image's uid (999).
pg_bin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/postgres" ]; then
  echo "ci/images.sh: no PostgreSQL in /usr/lib/postgresql (run ci/setup.sh first)" >&2
  exit 1
fi
pg_version=$(basename "$(dirname "$pg_bin")")
pg_files=("$pg_bin/postgres" "$pg_bin/postgres" "$pg_bin/initdb" "$pg_bin/initdb" /bin/sh /bin/sh)
for module in "/usr/lib/postgresql/$pg_version/lib"/*.so; do
  case "$(basename "$module")" in llvmjit*) continue ;; esac
  pg_files+=("$module" "$module")
done
EXTRA_DIRS="/usr/share/postgresql/$pg_version /usr/share/zoneinfo" EXTRA_USER=postgres:999 \
  build drill-local/postgres '["/bin/sh"]' "${pg_files[@]}"
