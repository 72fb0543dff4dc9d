#!/usr/bin/env python3
"""Renders the scenario file's JSON Schema (`drill schema`, generated from the types the parser
reads) as the book's reference chapter, so the reference cannot drift from the parser.

    drill schema | python3 ci/book_reference.py > docs/src/reference.md
"""

import json
import re
import sys


def ref_name(node):
    return node["$ref"].rsplit("/", 1)[-1]


def type_of(node, defs):
    """A short type: `Duration`, `integer`, `list of RawFault`, `refuse | reset | …`."""
    if "const" in node:
        return f"`{node['const']}`"
    if "$ref" in node:
        name = ref_name(node)
        target = defs.get(name, {})
        values = enum_values(target)
        if values and len(values) <= 8:
            return " \\| ".join(f"`{v}`" for v in values)
        return f"[{name}](#{name.lower()})"
    if "anyOf" in node:
        parts = [type_of(n, defs) for n in node["anyOf"] if n.get("type") != "null"]
        return " or ".join(parts)
    if "oneOf" in node:
        values = enum_values(node)
        if values:
            return " \\| ".join(f"`{v}`" for v in values)
        return " or ".join(type_of(n, defs) for n in node["oneOf"])
    t = node.get("type")
    if isinstance(t, list):
        t = [x for x in t if x != "null"]
        t = t[0] if len(t) == 1 else " or ".join(t)
    if t == "array":
        return f"list of {type_of(node.get('items', {}), defs)}"
    if t == "object" and "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
        return f"map of {type_of(node['additionalProperties'], defs)}"
    return t or "any"


def enum_values(node):
    if "enum" in node:
        return node["enum"]
    if "oneOf" in node and all("const" in n or "enum" in n for n in node["oneOf"]):
        return [v for n in node["oneOf"] for v in ([n["const"]] if "const" in n else n["enum"])]
    return None


def enum_rows(node):
    """(value, meaning) for each value of an enum-like node."""
    if "enum" in node:
        return [(v, "") for v in node["enum"]]
    rows = []
    for n in node.get("oneOf", []):
        for v in [n["const"]] if "const" in n else n.get("enum", []):
            rows.append((v, n.get("description", "")))
    return rows


def book_link(m):
    """A citation of a book page in a doc comment (the path under docs/src/, as the code writes
    it) as a link from this chapter: `[design §1.7](design.md#rule-1-7)`."""
    page, anchor = m.group(1), m.group(2) or ""
    label = page[: -len(".md")]
    rule = re.fullmatch(r"#rule-(\d+)-(\d+)", anchor)
    section = re.fullmatch(r"#(\d+)-[\w-]+", anchor)
    if page == "design.md" and rule:
        label = f"design §{rule.group(1)}.{rule.group(2)}"
    elif page == "design.md" and section:
        label = f"design §{section.group(1)}"
    return f"[{label}]({page}{anchor})"


def one_line(text):
    text = " ".join((text or "").split()).replace("|", "\\|")
    return re.sub(r"docs/src/([\w-]+\.md)(#[\w-]+)?", book_link, text)


def table(node, defs, out):
    props = node.get("properties", {})
    required = set(node.get("required", []))
    out.append("| field | type | required | what it is |")
    out.append("|---|---|---|---|")
    for name, p in props.items():
        desc = one_line(p.get("description", ""))
        req = "yes" if name in required else ""
        out.append(f"| `{name}` | {type_of(p, defs)} | {req} | {desc} |")
    out.append("")


def main():
    schema = json.load(sys.stdin)
    defs = schema.get("$defs", {})
    out = [
        "# Scenario reference",
        "",
        "Generated from `drill schema` (the JSON Schema of the types the scenario parser reads) by",
        "`ci/book_reference.py` at each book build: it cannot drift from the parser. `drill check`",
        "validates a file against the same rules, and more (a fault's target must exist, a promise",
        "must be one the destination can keep); errors name the file, line, column and field.",
        "",
        "## The scenario file",
        "",
    ]
    table(schema, defs, out)
    for name in sorted(defs):
        node = defs[name]
        out.append(f"## {name}")
        out.append("")
        if node.get("description"):
            out.append(one_line(node["description"]))
            out.append("")
        values = enum_values(node)
        if values:
            out.append("| value | meaning |")
            out.append("|---|---|")
            for value, meaning in enum_rows(node):
                out.append(f"| `{value}` | {one_line(meaning)} |")
            out.append("")
        elif "properties" in node:
            table(node, defs, out)
        else:
            if "pattern" in node:
                out.append(f"A string matching `{node['pattern']}`.")
                out.append("")
            elif "anyOf" in node or "oneOf" in node:
                forms = []
                for n in node.get("anyOf", node.get("oneOf", [])):
                    if "pattern" in n:
                        forms.append(f"a string matching `{n['pattern']}`")
                    else:
                        forms.append(type_of(n, defs))
                out.append("One of: " + "; ".join(forms) + ".")
                out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
