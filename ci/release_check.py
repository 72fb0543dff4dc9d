#!/usr/bin/env python3
"""Checks that `cargo binstall` would find drill in the archives ci/package.sh packs.

Reads [package.metadata.binstall] from Cargo.toml, fills its templates the way cargo-binstall
does for one target, packs the given binary with ci/package.sh, and checks: the archive's name
is the pkg-url's last part, the bin-dir path is inside it and runs (`--version`), and the
.sha256 matches. Also checks that the release workflow uploads what the templates name.
    ci/release_check.py <binary>
"""
import hashlib, os, re, subprocess, sys, tarfile, tempfile, tomllib

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cargo = tomllib.load(open(os.path.join(root, "Cargo.toml"), "rb"))
meta = cargo["package"]["metadata"]["binstall"]
version = cargo["package"]["version"]
target = "x86_64-unknown-linux-gnu"
vals = {"name": "drill", "version": version, "target": target, "bin": "drill",
        "binary-ext": "", "archive-suffix": ".tar.gz", "repo": cargo["package"]["repository"]}
fill = lambda t: re.sub(r"\{\s*([\w-]+)\s*\}", lambda m: vals[m.group(1)], t)
problems = []
assert meta.get("pkg-fmt") == "tgz", "pkg-fmt must be tgz: ci/package.sh packs .tar.gz"
url, bin_dir = fill(meta["pkg-url"]), fill(meta["bin-dir"])
with tempfile.TemporaryDirectory() as out:
    archive = subprocess.check_output(
        ["bash", os.path.join(root, "ci/package.sh"), sys.argv[1], target, out], text=True
    ).strip()
    if os.path.basename(archive) != url.rsplit("/", 1)[1]:
        problems.append(f"archive {os.path.basename(archive)} is not pkg-url's {url}")
    digest, fname = open(archive + ".sha256").read().split()
    if hashlib.sha256(open(archive, "rb").read()).hexdigest() != digest:
        problems.append(f"{fname}: checksum does not match")
    with tarfile.open(archive) as tar:
        if bin_dir not in tar.getnames():
            problems.append(f"bin-dir {bin_dir} is not in {fname}: {tar.getnames()}")
        else:
            tar.extractall(out, filter="data")
            v = subprocess.run([os.path.join(out, bin_dir), "--version"], capture_output=True, text=True)
            if v.returncode != 0 or not v.stdout.startswith(f"drill {version}"):
                problems.append(f"{bin_dir} --version: {v.returncode} {v.stdout!r}")
release = open(os.path.join(root, "ci/github/release.yml")).read()
for needed in ["ci/package.sh", "v*", ".sha256", "maturin"]:
    if needed not in release:
        problems.append(f"ci/github/release.yml does not mention {needed}")
for p in problems:
    print("ci/release_check.py:", p, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"ci/release_check.py: binstall finds {bin_dir} in {url.rsplit('/', 1)[1]}; checksum and --version ok")
