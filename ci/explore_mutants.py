#!/usr/bin/env python3
"""The per-mutant evidence of `drill explore` (issue: explore finds and shrinks each mutant).

    python3 ci/explore_mutants.py [--drill target/release/drill] [--mutant NAME ...]
        [--budget 10m] [--shrink-budget 10m] [--jobs 2] [--seed 1] [--cap 15]
        [--out reports/explore/mutants] [--table]

For each built-in engine mutant, the base scenario is the catalogue drill the selftest tries
first for it (`Mutant::tried_first` in src/engine/mutant.rs, copied below) with its `faults:`
removed (which keeps its TLS link, poison records or HTTP endpoint) and its workload cut to
--cap seconds (explore plays every run in full). `drill explore BASE --first` then runs with
DRILL_MUTANT set: generated timelines until the first failure, which it shrinks and replays
(`--reproduce 3`: "reproduces k/3", each a `drill run` of minimal-1.yaml). The table, one row
per mutant, goes to OUT/README.md, the bases and every explore folder beside it.

A manual run (about 10 to 20 minutes per mutant on 2 cores): never part of CI.
"""

import argparse, json, os, subprocess, sys, time

import yaml

# Mutant -> the drill the selftest tries first (src/engine/mutant.rs, Mutant::tried_first).
TRIED_FIRST = {
    "ack-before-write": "engine-crash",
    "memory-only": "engine-crash",
    "forget-delivery-marks": "engine-crash",
    "ack-before-fdatasync": "mqtt-power-cut",
    "resend-on-timer": "mqtt-slow",
    "second-attempt-while-open": "mqtt-slow",
    "outage-spends-attempts": "mqtt-refused",
    "expire-by-age": "mqtt-refused",
    "probe-with-oldest-record": "mqtt-refused",
    "resend-out-of-order": "mqtt-refused",
    "stop-after-outage": "mqtt-refused",
    "local-connected-flag": "mqtt-hang",
    "drop-refused-silently": "poison-record",
    "evict-oldest-when-full": "mqtt-disk-full",
    "no-keepalive": "mqtt-strand",
    "trust-torn-tail": "power-cut-torn",
    "outage-status-spends-attempts": "http-503",
    "handshake-failure-is-refusal": "mqtt-tls-bad-certificate",
    "sent-without-writing": "syslog-udp-loss",
}


def seconds(text):
    """`30s`, `2m`, `1m30s`, `500ms` -> seconds."""
    total, num, i = 0.0, "", 0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    while i < len(text):
        c = text[i]
        if c.isdigit() or c == ".":
            num += c
            i += 1
            continue
        unit = "ms" if text[i:i + 2] == "ms" else c
        total += float(num) * units[unit]
        num, i = "", i + len(unit)
    return total


def base(drill_dir, drill, cap, into):
    """The catalogue drill `drill` without faults, its workload cut to `cap` seconds."""
    with open(os.path.join(drill_dir, drill + ".yaml")) as f:
        doc = yaml.safe_load(f)
    doc.pop("faults", None)
    doc["name"] = drill + "-base"
    w = doc["workload"]
    if seconds(str(w["duration"])) > cap:
        w["duration"] = f"{cap}s"
    # A poison record past the shortened workload would never be sent.
    if "poison" in w:
        rate = float(str(w["rate"]).split("/")[0])
        w["poison"] = [p for p in w["poison"] if p < rate * cap] or [int(rate * cap / 2)]
    doc["about"] = f"{drill} with its faults removed, workload at most {cap} s: explore's base"
    path = os.path.join(into, drill + "-base.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def row(mutant, drill, folder, took):
    try:
        with open(os.path.join(folder, "explore.json")) as f:
            x = json.load(f)
    except (OSError, ValueError):
        return [mutant, drill, "no explore.json", "", "", "", "", "", f"{took:.0f}"]
    if not x["findings"]:
        return [mutant, drill, f"not found in {x['runs']} runs", "", "", "", "", "",
                f"{took:.0f}"]
    # The first finding shrunk (flaky ones before it are counted, not shown).
    shrunk = [f for f in x["findings"] if f.get("minimal_size")]
    f = shrunk[0] if shrunk else x["findings"][0]
    flaky = x["findings"].index(f)
    before = f"{f['before_size'][0]} faults, {f['before_size'][1] / 1000:.1f} s"
    after = (f"{f['minimal_size'][0]} faults, {f['minimal_size'][1] / 1000:.1f} s"
             if f.get("minimal_size") else "")
    rep = f"{f['reproduced'][0]}/{f['reproduced'][1]}" if f.get("reproduced") else ""
    first = f"{{{', '.join(f['failed'])}}} after {f['found_after_s']:.0f} s"
    if flaky:
        first += f" ({flaky} flaky before)"
    return [mutant, drill, first,
            before, after, str(f["shrink_runs"]), rep, "; ".join(f.get("minimal") or []),
            f"{took:.0f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drill", default="target/release/drill")
    ap.add_argument("--mutant", action="append", default=[])
    ap.add_argument("--budget", default="10m")
    ap.add_argument("--shrink-budget", default="10m")
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--seed", default="1")
    ap.add_argument("--cap", type=int, default=15)
    ap.add_argument("--out", default="reports/explore/mutants")
    ap.add_argument("--table", action="store_true",
                    help="only write OUT/README.md from the mutant folders already there")
    args = ap.parse_args()
    if args.table:
        table(args)
        return
    unknown = [m for m in args.mutant if m not in TRIED_FIRST]
    if unknown:
        ap.error(f"unknown mutant(s) {unknown}; known: {', '.join(TRIED_FIRST)}")
    chosen = args.mutant or list(TRIED_FIRST)
    os.makedirs(os.path.join(args.out, "bases"), exist_ok=True)
    rows = []
    for mutant in chosen:
        drill = TRIED_FIRST[mutant]
        path = base("scenarios", drill, args.cap, os.path.join(args.out, "bases"))
        folder = os.path.join(args.out, mutant)
        started = time.monotonic()
        cmd = [args.drill, "explore", path, "--first", "--budget", args.budget,
               "--shrink-budget", args.shrink_budget, "--jobs", args.jobs, "--seed", args.seed,
               "--shrink-retries", "1", "--reproduce", "3", "--out", folder]
        print(f"explore_mutants: {mutant} from {drill}: {' '.join(cmd)}", file=sys.stderr)
        subprocess.run(cmd, env={**os.environ, "DRILL_MUTANT": mutant},
                       stdout=subprocess.DEVNULL, check=False)
        took = time.monotonic() - started
        with open(os.path.join(folder, "took_s"), "w") as f:
            f.write(f"{took:.0f}\n")
        rows.append(row(mutant, drill, folder, took))
        write(args, rows)


def table(args):
    """The table again from the mutant folders already under --out (runs split over several
    invocations, each with its own --mutant list, write one table at the end)."""
    rows = []
    for mutant, drill in TRIED_FIRST.items():
        folder = os.path.join(args.out, mutant)
        try:
            with open(os.path.join(folder, "took_s")) as f:
                took = float(f.read())
        except OSError:
            continue
        rows.append(row(mutant, drill, folder, took))
    write(args, rows)


def write(args, rows):
    head = ["mutant", "base (faults removed)", "first failure", "found as", "minimal",
            "shrink runs", "reproduces", "minimal timeline", "took s"]
    lines = [
        "# drill explore against the built-in engine's mutants",
        "",
        f"Written by `python3 ci/explore_mutants.py` (seed {args.seed}, `--jobs {args.jobs}`, "
        f"budget {args.budget}, shrink budget {args.shrink_budget}, workloads cut to "
        f"{args.cap} s). Each base is the catalogue drill the selftest tries first for the "
        "mutant with its faults removed (`bases/`); `reproduces` counts `drill run`s of "
        "`minimal-1.yaml` that failed the same way. Each mutant's folder holds explore.md. "
        "`took s` is wall-clock time for the whole explore, reruns and reproductions included, "
        "as measured (on a shared machine it includes the load of whatever ran beside it).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
