#!/usr/bin/env python3
"""Writes the generated parts of mdrelay/_native.pyi, each between its markers, from the Rust
definitions the extension is built from, so that nothing written by hand can drift from them:

- `Subscriber.__new__`'s keywords, from the client library's `Settings` struct
  (client/src/settings.rs), the one definition of every receive setting: the extension reads its
  keyword arguments into that struct, so the stub lists its fields, with their Python types and
  docs;
- the record classes (the stream's events, `UnknownMessage`, `Book`) and the `StreamEvent`
  union, from their definitions in src/messages.rs (`py_record!`, `stream_events!`), the
  extension's classes themselves;
- the message classes, from the model's table (`for_each_message_type!` in iex/src/message.rs)
  and the Python side of it in src/messages.rs (`for_each_python_class!`, which names a class
  for each `Message` variant, and `python_field!`, which gives each field its presentation):
  the same macros the extension's classes are generated from.

`--check` changes nothing and fails when the stub is not what they give (CI runs it).
"""

import re
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = HERE.parent / "client" / "src" / "settings.rs"
MODEL = HERE.parent / "iex" / "src" / "message.rs"
MESSAGES = HERE / "src" / "messages.rs"
STUB = HERE / "mdrelay" / "_native.pyi"

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

# Each presentation of a model field (the types of `messages::field`) as Python reads it.
PRESENTATIONS = {
    "Timestamp": "int",
    "Integer": "int",
    "Price": "int",
    "Code": "str",
    "Flag": "bool",
    "Ticker": "str",
    "Text": "str",
    "SideName": "str",
}

# The class of any message type the model does not know, hand-written beside the generated ones.
UNKNOWN_MESSAGE = "UnknownMessage"


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
                out.append((match[1], match[2], " ".join(filter(None, doc))))
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


def settings_keywords() -> str:
    return "".join(keyword(*f) for f in fields(SETTINGS.read_text()))


def macro_body(source: str, name: str, path: Path) -> str:
    """The text of `macro_rules! name`, up to its closing brace (the first at the start of a line)."""
    start = source.find(f"macro_rules! {name} {{")
    if start < 0:
        sys.exit(f"generate_stub.py: {path} has no macro_rules! {name}")
    end = source.find("\n}\n", start)
    return source[start:end]


def model_table() -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """Each `Message` variant of the model's table: the fields its type byte decides, and the
    other fields with their model types, in the layout's order (of a variant's two entries, the
    first: the sides of a price level have the same fields)."""
    body = macro_body(MODEL.read_text(), "for_each_message_type", MODEL)
    entry = re.compile(r"(\w+)\s+\"\w+\"\s*=\s*\w+\s*=>\s*(\w+)\(\w+\s*\{([^{}]*)\}\s*\{([^{}]*)\}\s*\)", re.S)
    variants: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    for match in entry.finditer(body):
        fixed = [item.partition(":")[0].strip() for item in match[3].split(",") if item.strip()]
        layout = []
        for item in match[4].split(","):
            if item.strip():
                name, _, rust = item.partition(":")
                layout.append((name.strip(), " ".join(rust.split())))
        variants.setdefault(match[2], (fixed, layout))
    if not variants:
        sys.exit(f"generate_stub.py: no entries read from for_each_message_type! in {MODEL}")
    return variants


def python_classes(source: str) -> list[tuple[str, str, list[str]]]:
    """(variant, class name, doc lines) of each entry of `for_each_python_class!`."""
    body = macro_body(source, "for_each_python_class", MESSAGES)
    out = []
    doc: list[str] = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("///"):
            doc.append(line[3:].strip())
        elif match := re.fullmatch(r"(\w+) => (\w+), table \w+ \{[^}]*\},", line):
            out.append((match[1], match[2], doc))
            doc = []
    if not out:
        sys.exit(f"generate_stub.py: no entries read from for_each_python_class! in {MESSAGES}")
    return out


def presentation_rules(source: str) -> list[tuple[re.Pattern[str], str]]:
    """The arms of `python_field!`, in order: a pattern of `name: type` and the presentation."""
    body = macro_body(source, "python_field", MESSAGES)
    arm = re.compile(r"\(\$what:ident (\$\w+:ident|\w+): (.+?)\) => \{ \$crate::messages::presentation!\(\$what (\w+)")
    rules = []
    for name, rust, presentation in arm.findall(body):
        # A metavariable (`$name:ident`, `$len:tt`) matches any one name or token.
        pattern = re.sub(r"\\\$\w+:\w+", r"\\S+?", re.escape(f"{name}: {rust}"))
        rules.append((re.compile(pattern), presentation))
    if not rules:
        sys.exit(f"generate_stub.py: no arms read from python_field! in {MESSAGES}")
    return rules


def python_type(rules: list[tuple[re.Pattern[str], str]], name: str, rust: str) -> str:
    """The Python type of a model field, as `python_field!` presents it."""
    for pattern, presentation in rules:
        if pattern.fullmatch(f"{name}: {rust}"):
            if presentation not in PRESENTATIONS:
                sys.exit(f"generate_stub.py: no Python type for the presentation {presentation}; add it to PRESENTATIONS")
            return PRESENTATIONS[presentation]
    sys.exit(f"generate_stub.py: python_field! presents no field {name}: {rust}; add an arm to it")


def python_order(fixed: list[str], layout: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A class's attributes in Python's order, as `python_order!` makes it: `timestamp` and
    `symbol` first, then the fields the type byte decides, then the others in the layout's
    order."""
    first = [field for name in ("timestamp", "symbol") for field in layout if field[0] == name]
    rest = [field for field in layout if field[0] not in ("timestamp", "symbol")]
    return first + [(name, "fixed") for name in fixed] + rest


def class_stub(name: str, doc: list[str], attributes: list[tuple[str, str]]) -> str:
    """The stub of a frozen record class: its docstring, its attributes, and a constructor that
    takes each attribute by keyword."""
    docstring = "\n    ".join(doc)
    keywords = ", ".join(f"{field}: {annotation}" for field, annotation in attributes)
    return (
        f"@final\nclass {name}:\n"
        f'    """{docstring}"""\n\n'
        + "".join(f"    {field}: {annotation}\n" for field, annotation in attributes)
        + f"    def __new__(cls, *, {keywords}) -> {name}: ...\n"
        "    def __eq__(self, other: object, /) -> bool: ...\n\n"
    )


def message_classes() -> str:
    source = MESSAGES.read_text()
    model = model_table()
    rules = presentation_rules(source)
    out = []
    names = []
    for variant, class_name, doc in python_classes(source):
        if variant not in model:
            sys.exit(f"generate_stub.py: for_each_python_class! names {variant}, not a variant of the model's table")
        attributes = [(name, python_type(rules, name, rust)) for name, rust in python_order(*model[variant])]
        out.append(class_stub(class_name, doc, attributes))
        names.append(class_name)
    members = textwrap.fill(", ".join(names + [UNKNOWN_MESSAGE]) + ",", 96, initial_indent="    ", subsequent_indent="    ")
    out.append(f'Message = Union[\n{members}\n]\n"""Any IEX message."""\n\n')
    listed = textwrap.fill(", ".join(f'"{name}"' for name in names) + ",", 96, initial_indent="    ", subsequent_indent="    ")
    out.append(f"__all__ += [\n{listed}\n]\n")
    return "".join(out)


# Each Rust type of a record's field (`py_record!` in src/messages.rs) as Python reads it.
RECORD_TYPES = {"u8": "int", "u64": "int", "i64": "int", "String": "str", "bool": "bool"}


def record_type(rust: str) -> str:
    """The Python type of a record's field: `RECORD_TYPES`, through `Option`, `Vec` and tuples."""
    rust = rust.strip()
    if rust in RECORD_TYPES:
        return RECORD_TYPES[rust]
    for wrapper, python in (("Option<", "Optional"), ("Vec<", "List")):
        if rust.startswith(wrapper) and rust.endswith(">"):
            return f"{python}[{record_type(rust[len(wrapper) : -1])}]"
    if rust.startswith("(") and rust.endswith(")"):
        return f"Tuple[{', '.join(record_type(part) for part in rust[1:-1].split(','))}]"
    sys.exit(f"generate_stub.py: no Python type for a record field's {rust}; add it to RECORD_TYPES")


def records(body: str) -> list[tuple[str, list[str], list[tuple[str, str]]]]:
    """(class name, doc lines, fields) of each record written in `body` as `py_record!` and
    `stream_events!` take them: doc comments, `Name {`, then a `name: Type,` line per field."""
    out = []
    doc: list[str] = []
    current: tuple[str, list[str], list[tuple[str, str]]] | None = None
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("///"):
            if current is None:
                doc.append(line[3:].strip())
        elif match := re.fullmatch(r"(\w+) \{", line):
            current = (match[1], doc, [])
            doc = []
        elif current is not None and (match := re.fullmatch(r"(\w+): (.+),", line)):
            current[2].append((match[1], record_type(match[2])))
        elif current is not None and line == "}":
            out.append(current)
            current = None
    return out


def record_classes() -> str:
    """The stub of every record class of src/messages.rs, in its order, and the `StreamEvent`
    union of those `stream_events!` lists."""
    source = MESSAGES.read_text()
    classes = []
    events: list[str] = []
    invocation = re.compile(r"^(py_record!\(|stream_events! \{)\n(.*?)^(\);|\})$", re.S | re.M)
    for match in invocation.finditer(source):
        found = records(match[2])
        classes += found
        if match[1].startswith("stream_events"):
            events += [name for name, _, _ in found]
    if not events:
        sys.exit(f"generate_stub.py: no stream_events! list in {MESSAGES}")
    out = [class_stub(name, doc, attributes) for name, doc, attributes in classes]
    out.append(f'StreamEvent = Union[{", ".join(events)}]\n"""Anything that happened to the stream."""\n\n')
    listed = textwrap.fill(", ".join(f'"{name}"' for name, _, _ in classes) + ",", 96, initial_indent="    ", subsequent_indent="    ")
    out.append(f"__all__ += [\n{listed}\n]\n")
    return "".join(out)


# Each generated part of the stub: its opening and closing markers, and what goes between them.
BLOCKS = [
    (
        "        # Generated from mdrelay_client::Settings by python/generate_stub.py: do not edit.\n",
        "        # End of the generated keywords.\n",
        settings_keywords,
    ),
    (
        "# Generated from the model's table (for_each_message_type! in iex/src/message.rs) and\n"
        "# for_each_python_class! and python_field! in python/src/messages.rs by\n"
        "# python/generate_stub.py: do not edit.\n",
        "# End of the generated message classes.\n",
        message_classes,
    ),
    (
        "# Generated from py_record! and stream_events! in python/src/messages.rs by\n"
        "# python/generate_stub.py: do not edit.\n",
        "# End of the generated record classes.\n",
        record_classes,
    ),
]


def main() -> int:
    stub = STUB.read_text()
    fresh = stub
    for begin, end, generate in BLOCKS:
        if begin not in fresh or end not in fresh:
            sys.exit(f"generate_stub.py: {STUB} lacks a generated block (its markers are missing): {begin.strip()}")
        head, rest = fresh.split(begin, 1)
        _, tail = rest.split(end, 1)
        fresh = head + begin + generate() + end + tail
    if "--check" in sys.argv[1:]:
        if fresh != stub:
            print(
                f"{STUB.relative_to(HERE.parent)} is not what mdrelay_client::Settings and the message model give: "
                "run python/generate_stub.py"
            )
            return 1
        return 0
    STUB.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
