#!/usr/bin/env python3
"""Checks the book and the README: every relative link points at a file that exists (and at
a heading that exists, for `file.md#anchor`), and every YAML code block that is a whole
scenario (top-level `name:`, `destination:` and `workload:`) passes `drill check`. Also checks
the book's pages cited from code, tests and CI scripts (src/, tests/, ci/ of the repository
this script is in): a citation such as docs/src/design.md#rule-1-5 must name a page of the book
and, after `#`, one of that page's anchors (a heading's, or an explicit `<a id="...">` or
`{#id}`).

    python3 ci/book_check.py DRILL_BINARY README.md docs/src
Exit 1 with one line per broken link, broken citation or invalid scenario.
"""

import functools
import os
import re
import subprocess
import sys
import tempfile

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\s*$")
# An explicit anchor: `<a id="rule-1-5"></a>` anywhere in prose, `{#id}` at a heading's end.
HTML_ANCHOR = re.compile(r"""<a\s[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""")
HEADING_ID = re.compile(r"\{#([\w-]+)[^}]*\}\s*$")
# A page of the book cited from code: its path under docs/src/, optionally with #anchor.
CODE_REF = re.compile(r"docs/src/([\w-]+\.md)(#[\w-]+)?")
CODE_DIRS = ("src", "tests", "ci")
CODE_EXTS = (".rs", ".py", ".sh", ".toml", ".yml", ".yaml")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@functools.lru_cache(maxsize=None)
def anchors(path):
    """Every anchor a page has: each heading's (its `{#id}` if it gives one, else its slug) and
    each explicit `<a id="...">` outside code blocks."""
    prose, _ = prose_and_blocks(path)
    found = set()
    for _, line in prose:
        if line.startswith("#"):
            explicit = HEADING_ID.search(line)
            found.add(explicit.group(1) if explicit else slug(line.lstrip("#")))
        found.update(HTML_ANCHOR.findall(line))
    return found


def code_refs(root=ROOT):
    """Citations of the book in the code, tests and CI scripts under `root` that do not
    resolve, each as `file:line: CITATION: no such file` (or `no such heading`)."""
    broken, checked = [], 0
    for top in CODE_DIRS:
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(names):
                if not name.endswith(CODE_EXTS):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        lines = f.read().splitlines()
                except (UnicodeDecodeError, OSError):
                    continue
                for n, line in enumerate(lines, 1):
                    for m in CODE_REF.finditer(line):
                        checked += 1
                        page = os.path.join(root, "docs", "src", m.group(1))
                        where = f"{os.path.relpath(path, root)}:{n}: {m.group(0)}"
                        if not os.path.isfile(page):
                            broken.append(f"{where}: no such file")
                        elif m.group(2) and m.group(2)[1:] not in anchors(page):
                            broken.append(f"{where}: no such heading")
    return broken, checked


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
    cited, refs = code_refs()
    broken += cited
    for b in broken:
        print(b)
    print(
        f"book check: {len(files)} files, {len(scenarios)} scenario blocks, "
        f"{refs} citations of the book in {', '.join(CODE_DIRS)} checked, {len(broken)} problems"
    )
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
