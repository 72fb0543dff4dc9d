#!/usr/bin/env python3
"""Run mq-bridge (PyPI mq-bridge-basic 1.2) as a store-and-forward engine for drill.

mq-bridge is a library with Python bindings and no command-line program, so this script is the
engine's process: it loads the two routes of mq-bridge.yaml.tmpl (HTTP ingest -> dir_spool,
dir_spool -> MQTT) and runs them until SIGTERM/SIGINT.

    python3 mq_bridge_forwarder.py --ingest 127.0.0.1:PORT --mqtt HOST:PORT --topic TOPIC \
        --data-dir DIR [--api 127.0.0.1:PORT]
    python3 mq_bridge_forwarder.py --config RENDERED.yaml [--data-dir DIR] [--api 127.0.0.1:PORT]

The first form renders mq-bridge.yaml.tmpl (beside this script, or --template FILE) with the
addresses; the second runs a file drill already rendered from that template.

Ingest: POST /ingest, body = NDJSON (any bytes, really). The whole body becomes one message
and one spool chunk; "202 Accepted" (body "Message processed") is sent after the chunk is
fsynced and renamed into place. Readiness: this script prints "mq-bridge forwarder ready" once
both routes are started (the HTTP port is listening before that line).

--api adds GET /health (200 "ok") and GET /stats on a separate port. They are this script's,
not mq-bridge's (mq-bridge has neither): /stats reads the spool directory and answers
{"waiting": <NDJSON lines in unsent chunks>, "waiting_chunks": <unsent chunks>, "failed": 0}.
mq-bridge keeps no failed count: with no DLQ configured a chunk the broker refuses is retried.

Environment: MQ_BRIDGE_LOG / RUST_LOG override the log level (default info); logs go to stderr.
"""

import argparse
import http.server
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="an already rendered mq-bridge YAML file with routes ingest and forward")
    p.add_argument("--template", default=str(HERE / "mq-bridge.yaml.tmpl"))
    p.add_argument("--ingest", help="HTTP listen address, 127.0.0.1:PORT")
    p.add_argument("--mqtt", help="destination broker, HOST:PORT")
    p.add_argument("--topic", help="destination topic")
    p.add_argument("--data-dir", help="durable directory (the spool is DATA_DIR/spool)")
    p.add_argument("--api", help="optional 127.0.0.1:PORT for GET /health and GET /stats")
    p.add_argument("--log-level", default="info")
    a = p.parse_args()
    if a.config is None and not all([a.ingest, a.mqtt, a.topic, a.data_dir]):
        p.error("give --config FILE, or all of --ingest --mqtt --topic --data-dir")
    return a


def render(template: str, values: dict) -> str:
    """drill's placeholder language: {name} -> value, {{ and }} -> literal braces; a name not
    in values (say {work_dir} in a comment) is left as written, as drill's own render does."""
    out, i = [], 0
    while i < len(template):
        c = template[i]
        if c in "{}" and template[i + 1:i + 2] == c:
            out.append(c)
            i += 2
        elif c == "{":
            end = template.index("}", i)
            name = template[i + 1:end]
            out.append(values.get(name, "{" + name + "}"))
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def spool_dir(config_text: str, data_dir):
    if data_dir:
        return Path(data_dir) / "spool"
    for line in config_text.splitlines():  # the first dir_spool path in the file
        s = line.strip()
        if s.startswith("path:") and "spool" in s:
            return Path(s.split(":", 1)[1].strip().strip('"'))
    return None


def serve_api(addr: str, spool):
    host, port = addr.rsplit(":", 1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, code, body, ctype):
            data = body.encode()
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.answer(200, "ok\n", "text/plain")
            elif self.path == "/stats":
                chunks = lines = 0
                try:
                    for f in os.scandir(spool):
                        if f.name.endswith(".bin") and f.is_file():
                            chunks += 1
                            try:
                                with open(f.path, "rb") as fh:
                                    data = fh.read()
                            except FileNotFoundError:  # delivered meanwhile
                                chunks -= 1
                                continue
                            lines += sum(1 for l in data.split(b"\n") if l.strip())
                except FileNotFoundError:
                    pass
                self.answer(200, json.dumps({"waiting": lines, "waiting_chunks": chunks, "failed": 0}) + "\n",
                            "application/json")
            else:
                self.answer(404, "not found\n", "text/plain")

    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    a = parse_args()
    logging.basicConfig(level=getattr(logging, a.log_level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("mq_bridge_forwarder")
    try:
        import mq_bridge
        from mq_bridge import Route
    except ImportError:
        sys.exit(f"mq_bridge_forwarder: {sys.executable} cannot import mq_bridge; "
                 "pip install mq-bridge-basic==1.2.0 into this interpreter")
    mq_bridge.init_logging(a.log_level)

    if a.config:
        text = Path(a.config).read_text()
    else:
        if a.data_dir:
            Path(a.data_dir).mkdir(parents=True, exist_ok=True)
        text = render(Path(a.template).read_text(), {
            "ingest": a.ingest, "link.mqtt": a.mqtt, "topic": a.topic, "data_dir": a.data_dir,
        })
    spool = spool_dir(text, a.data_dir)

    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("signal %s: stopping the routes", signum)
        mq_bridge.request_shutdown()
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    # Ingest first: it must take records even while the destination is unreachable.
    ingest = Route.from_str(text, "ingest")
    ingest.start()
    if a.api:
        serve_api(a.api, spool)
    # Route.start() does not return until the route has connected (up to startup_timeout_ms),
    # and a thread blocked inside it keeps Python's signal handlers from running: start the
    # forward route on its own thread so that SIGTERM still works during an outage.
    forward = Route.from_str(text, "forward")
    routes = [ingest]
    failed = []

    def watch(name, route):
        # join() returns when the route has ended: by our stop(), or by itself (a fatal error).
        route.join()
        if not stop.is_set():
            log.error("route %s ended by itself: exiting", name)
            failed.append(name)
            stop.set()

    def start_forward():
        try:
            forward.start()
        except Exception as e:
            log.error("the forward route did not start: %s", e)
            failed.append("forward")
            stop.set()
            return
        routes.append(forward)
        log.info("forward route started (connected to the destination)")
        watch("forward", forward)

    threading.Thread(target=watch, args=("ingest", ingest), daemon=True).start()
    threading.Thread(target=start_forward, daemon=True).start()
    log.info("mq-bridge forwarder ready (mq-bridge %s, spool %s)", mq_bridge.__version__, spool)
    print("mq-bridge forwarder ready", file=sys.stderr, flush=True)

    while not stop.wait(0.5):
        pass
    for r in routes:
        try:
            r.stop()
            r.join()
        except Exception as e:  # a route that already ended
            log.warning("stopping a route: %s", e)
    log.info("stopped")
    sys.stderr.flush()
    os._exit(1 if failed else 0)  # do not wait for a forward route still blocked in start()


if __name__ == "__main__":
    main()
