#!/usr/bin/env python3
"""Checks the book and the README: every relative link points at a file that exists (and at
a heading that exists, for `file.md#anchor`), and every YAML code block that is a whole
scenario (top-level `name:`, `destination:` and `workload:`) passes `drill check`.

    python3 ci/book_check.py DRILL_BINARY README.md docs/src
Exit 1 with one line per broken link or invalid scenario.
"""

import os
import re
import subprocess
import sys
import tempfile

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\s*$")


def slug(heading):
    """mdBook's and GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_and_blocks(path):
    """The lines outside code fences, and the fenced blocks as (language, first line, text)."""
    prose, blocks, block, lang, start = [], [], None, "", 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m and block is None:
                block, lang, start = [], m.group(1), n
            elif line.startswith("```") and block is not None:
                blocks.append((lang, start, "".join(block)))
                block = None
            elif block is not None:
                block.append(line)
            else:
                prose.append((n, line))
    return prose, blocks


def anchors(path):
    prose, _ = prose_and_blocks(path)
    return {slug(l.lstrip("#")) for _, l in prose if l.startswith("#")}


def is_scenario(text):
    top = {l.split(":", 1)[0] for l in text.splitlines() if re.match(r"^[a-z_]+:", l)}
    return {"name", "destination", "workload"} <= top


def main():
    drill, *roots = sys.argv[1:]
    files = []
    for root in roots:
        if os.path.isdir(root):
            for dirpath, _, names in os.walk(root):
                files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".md")]
        else:
            files.append(root)
    broken, scenarios = [], []
    for path in files:
        prose, blocks = prose_and_blocks(path)
        for n, line in prose:
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = m.group(1) or m.group(2)
                if re.match(r"^[a-z]+:", target) or target.startswith("mailto:"):
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(dest):
                    broken.append(f"{path}:{n}: link to {target}: no such file {dest}")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    broken.append(f"{path}:{n}: link to {target}: no heading #{anchor} in {dest}")
        for lang, start, text in blocks:
            if lang in ("yaml", "yml") and is_scenario(text):
                scenarios.append((path, start, text))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (path, start, text) in enumerate(scenarios):
            f = os.path.join(tmp, f"block-{i}.yaml")
            with open(f, "w", encoding="utf-8") as out:
                out.write(text)
            r = subprocess.run([drill, "check", f], capture_output=True, text=True)
            if r.returncode != 0:
                said = (r.stdout + r.stderr).strip().replace(f, "the block")
                broken.append(f"{path}:{start}: a scenario block that fails drill check: {said}")
    for b in broken:
        print(b)
    print(f"book check: {len(files)} files, {len(scenarios)} scenario blocks checked, {len(broken)} problems")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
