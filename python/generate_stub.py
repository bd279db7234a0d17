#!/usr/bin/env python3
"""Writes `Subscriber.__init__`'s keywords in mdrelay/_native.pyi from the client library's
`Settings` struct (client/src/settings.rs), the one definition of every receive setting: the
extension reads its keyword arguments into that struct, so the stub lists its fields, with their
Python types and docs, and nothing written by hand can drift from it.

`--check` changes nothing and fails when the stub is not what the struct gives (CI runs it).
"""

import re
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = HERE.parent / "client" / "src" / "settings.rs"
STUB = HERE / "mdrelay" / "_native.pyi"
BEGIN = "        # Generated from mdrelay_client::Settings by python/generate_stub.py: do not edit.\n"
END = "        # End of the generated keywords.\n"

PATH = 'Union[str, "PathLike[str]"]'
# Each Rust type a field has, as Python gives it (durations: seconds, or text with units).
TYPES = {
    "String": "str",
    "PathBuf": PATH,
    "Duration": "Union[float, str]",
    "SystemTime": "str",
    "bool": "bool",
    "u32": "int",
    "u64": "int",
    "usize": "int",
    "Vec<String>": "Sequence[str]",
    "Profile": 'Literal["default", "low-latency"]',
    "IdleStrategy": 'Literal["spin", "yield", "backoff", "sleep"]',
}


def fields(source: str) -> list[tuple[str, str, str]]:
    """(name, Rust type, doc) of each field of `pub struct Settings` read from a file
    or keyword arguments (`#[serde(skip)]` fields are neither)."""
    body = source.split("pub struct Settings {", 1)[1].split("\n}\n", 1)[0]
    out = []
    doc: list[str] = []
    skip = False
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("///"):
            doc.append(line[3:].strip())
        elif line.startswith("#[serde(") and re.search(r"\bskip\b(?!_)", line):
            skip = True
        elif match := re.fullmatch(r"pub (\w+): (.+),", line):
            if not skip:
                out.append((match[1], match[2], " ".join(doc)))
            doc, skip = [], False
    return out


def keyword(name: str, rust: str, doc: str) -> str:
    optional = rust.startswith("Option<")
    inner = rust[len("Option<") : -1] if optional else rust
    if inner not in TYPES:
        sys.exit(f"generate_stub.py: no Python type for Settings::{name}'s {rust}; add it to TYPES")
    python = TYPES[inner]
    # Not given is the library's default: False for a flag, None (the default its doc names) else.
    annotation, default = (python, "False") if rust == "bool" else (f"Optional[{python}]", "None")
    # Rust's links and code spans read as plain text in a comment.
    doc = re.sub(r"\[`([^`]+)`\]\([^)]*\)", r"\1", doc).replace("`", "")
    comment = "".join(f"        # {line}\n" for line in textwrap.wrap(doc, 92))
    return f"{comment}        {name}: {annotation} = {default},\n"


def generated() -> str:
    return BEGIN + "".join(keyword(*f) for f in fields(SETTINGS.read_text())) + END


def main() -> int:
    stub = STUB.read_text()
    if BEGIN not in stub or END not in stub:
        sys.exit(f"generate_stub.py: {STUB} has no generated block (its markers are missing)")
    head, rest = stub.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    fresh = head + generated() + tail
    if "--check" in sys.argv[1:]:
        if fresh != stub:
            print(f"{STUB.relative_to(HERE.parent)} is not what mdrelay_client::Settings gives: run python/generate_stub.py")
            return 1
        return 0
    STUB.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
