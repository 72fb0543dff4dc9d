#!/bin/sh
# Starts rsyslogd in the foreground as a user's store-and-forward engine, with the config drill
# rendered into the work folder: rsyslogd.sh CONFIG PIDFILE. Finds rsyslogd as drill does:
# DRILL_RSYSLOGD, on PATH, in /usr/sbin, or where ci/setup.sh unpacks Debian's rsyslog and
# rsyslog-relp (~/.cache/drill/rsyslog, no daemon installed); an unpacked one is given its module
# folder (-M). exec: drill's SIGKILL hits rsyslogd itself.
set -eu
conf=$1
pidfile=$2
unpacked="${HOME:-/root}/.cache/drill/rsyslog"
bin=""
for candidate in "${DRILL_RSYSLOGD:-}" "$(command -v rsyslogd 2>/dev/null || true)" \
  /usr/sbin/rsyslogd "$unpacked/usr/sbin/rsyslogd"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then bin=$candidate; break; fi
done
if [ -z "$bin" ]; then
  echo "rsyslogd.sh: rsyslogd is not installed; run ci/setup.sh (or apt-get install rsyslog rsyslog-relp)" >&2
  exit 127
fi
case "$bin" in
  "$unpacked"/*)
    for modules in "$unpacked"/usr/lib/*/rsyslog; do
      exec "$bin" -n -f "$conf" -i "$pidfile" -M "$modules"
    done ;;
esac
exec "$bin" -n -f "$conf" -i "$pidfile"
