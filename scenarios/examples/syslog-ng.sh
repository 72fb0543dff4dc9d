#!/bin/sh
# Starts syslog-ng in the foreground as a user's store-and-forward engine, with the config drill
# rendered into the work folder: syslog-ng.sh CONFIG STATE_DIR. Finds syslog-ng on PATH, in
# /usr/sbin, or where ci/setup.sh unpacks Debian's syslog-ng-core (~/.cache/drill/syslog-ng; it
# conflicts with rsyslog as a package, so it is never installed, and no daemon is started). Its
# persist file, pid file and control socket are in STATE_DIR (drill's {data_dir}, kept across a
# restart); exec: drill's SIGKILL hits syslog-ng itself.
set -eu
conf=$1
state=$2
unpacked="${HOME:-/root}/.cache/drill/syslog-ng"
bin=""
for candidate in "$(command -v syslog-ng 2>/dev/null || true)" /usr/sbin/syslog-ng \
  "$unpacked/usr/sbin/syslog-ng"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then bin=$candidate; break; fi
done
if [ -z "$bin" ]; then
  echo "syslog-ng.sh: syslog-ng is not installed; run ci/setup.sh (it unpacks Debian's syslog-ng-core)" >&2
  exit 127
fi
set -- --foreground --no-caps --cfgfile="$conf" --persist-file="$state/syslog-ng.persist" \
  --pidfile="$state/syslog-ng.pid" --control="$state/syslog-ng.ctl"
case "$bin" in
  "$unpacked"/*)
    export LD_LIBRARY_PATH="$unpacked/usr/lib/syslog-ng${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    exec "$bin" "$@" --module-path="$unpacked/usr/lib/syslog-ng/3.38" ;;
esac
exec "$bin" "$@"
