"""MkDocs hook: the reference pages that cannot drift from the code, generated at build time.

* ``<!-- attent:config-reference -->`` on a page becomes the configuration reference: every
  section of an experiment, sweep, benchmark and theory-lab YAML, read from the pydantic models
  (and the theory lab's dataclasses) themselves: each field's key, type, constraints, default
  and description. The description is the field's ``Field(description=...)``, else the comment
  the code gives it (on its line, or the comment lines right above it).
* ``<!-- attent:cli-reference -->`` becomes the command-line reference: ``attent --help`` and
  each command's help, from the CLI's own argparse parser.

The package is imported from ``platform/`` of this checkout; nothing here imports torch, Ray or
MLflow (the configs validate without them, as ``attent validate`` does).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import html
import importlib
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

CONFIG_MARKER = "<!-- attent:config-reference -->"
CLI_MARKER = "<!-- attent:cli-reference -->"


def on_config(config, **kwargs):
    root = Path(config.config_file_path).resolve().parent
    for path in (str(root), str(root / "platform")):  # platform first: the package `attent`
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    return config


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


# ---------------------------------------------------------------------------------------------
# descriptions from the source: Field(description=...), else the field's comments


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in ``cls``'s own body: the comment on the field's line(s), and
    the block of comment lines right above it. A block between two fields belongs to the one
    below, unless both have comments on their own lines: then it continues the one above."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    comment_only = {n for n, line in enumerate(lines, 1) if line.strip().startswith("#")}
    body = ast.parse(source).body[0].body
    fields = [
        (node.target.id, node.lineno, node.end_lineno)
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]
    found: dict[str, list[str]] = {}
    previous: tuple[str, int, bool] | None = None  # the field above: name, end line, own comment
    for name, start, end in fields:
        block: list[str] = []
        n = start - 1
        while n in comment_only:
            block.insert(0, comments[n])
            n -= 1
        own = [comments[k] for k in range(start, end + 1) if k in comments and k not in comment_only]
        continues = previous is not None and n == previous[1] and previous[2] and own
        if block and continues:
            found[previous[0]].extend(block)
            block = []
        found[name] = block + own
        previous = (name, end, bool(own))
    return {name: " ".join(text) for name, text in found.items() if text}


def own_field_owner(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO whose own body declares ``name``."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass
    return cls


# ---------------------------------------------------------------------------------------------
# types, defaults, constraints


def is_section(tp) -> bool:
    return isinstance(tp, type) and (issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp))


def type_name(tp, sections: dict[type, str]) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_name(args[0], sections)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`" if not isinstance(a, str) else f'`"{a}"`' for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        text = " \\| ".join(type_name(a, sections) for a in rest)
        return f"{text} \\| `null`" if len(rest) < len(args) else text
    if origin in (list, tuple, set, dict):
        inner = ", ".join("…" if a is Ellipsis else type_name(a, sections) for a in args)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if tp is typing.Any:
        return "any"
    if is_section(tp):
        anchor = sections.get(tp)
        return f"[{tp.__name__}](#{anchor})" if anchor else tp.__name__
    return f"`{getattr(tp, '__name__', str(tp))}`"


def constraint_text(metadata) -> str:
    symbols = {
        "gt": ">",
        "ge": "≥",
        "lt": "<",
        "le": "≤",
        "min_length": "length ≥",
        "max_length": "length ≤",
        "pattern": "matches",
    }
    parts = []
    for item in metadata:
        for attr, symbol in symbols.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{symbol} `{value}`")
    return ", ".join(parts)


def default_text(value) -> str:
    if value is PydanticUndefined or value is dataclasses.MISSING:
        return "**required**"
    if is_section(type(value)):
        return "see its section"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`".replace("|", "\\|")


def rows_of(cls: type) -> list[tuple[str, object, str, object]]:
    """(name, type, constraints, default) of each field a YAML section takes."""
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        return [
            (
                f.name,
                hints[f.name],
                "",
                f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
            )
            for f in dataclasses.fields(cls)
        ]
    rows = []
    for name, info in cls.model_fields.items():
        default = info.default_factory() if info.default_factory is not None else info.default
        rows.append((name, info.annotation, constraint_text(info.metadata), default))
    return rows


def description(cls: type, name: str) -> str:
    info = getattr(cls, "model_fields", {}).get(name)
    if info is not None and info.description:
        return info.description
    return field_comments(own_field_owner(cls, name)).get(name, "")


def nested_sections(tp) -> list[type]:
    if is_section(tp):
        return [tp]
    return [s for a in typing.get_args(tp) for s in nested_sections(a)]


def md_text(text: str) -> str:
    """A comment as table-cell Markdown: outside code spans, ``<``, ``>``, ``*`` and ``|`` are
    literal characters, not HTML or emphasis or a cell border."""
    pieces = re.split(r"(`[^`]*`)", text)
    return "".join(
        piece.replace("|", "\\|")
        if piece.startswith("`")
        else html.escape(piece, quote=False).replace("*", "\\*").replace("|", "\\|")
        for piece in pieces
    )


def section_table(cls: type, key: str, sections: dict[type, str]) -> str:
    lines = [f"### `{key}` {{#{sections[cls]}}}", ""]
    doc = inspect.getdoc(cls) if cls.__doc__ and cls.__doc__ != BaseModel.__doc__ else ""
    if doc and not doc.startswith(cls.__name__ + "("):  # a dataclass's generated signature
        lines += [doc, ""]
    lines += [
        f"Model: `{cls.__module__}.{cls.__qualname__}`",
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, tp, constraints, default in rows_of(cls):
        kind = type_name(tp, sections) + (f" ({constraints})" if constraints else "")
        text = md_text(description(cls, name))
        lines.append(f"| `{name}` | {kind} | {default_text(default)} | {text} |")
    return "\n".join(lines) + "\n"


def walk(root: type, key: str, order: list[tuple[type, str]], seen: set[type]) -> None:
    """``root`` and, depth first, every section nested in it, each class once in the whole page
    (a class used in several places is described where it first appears, and linked to)."""
    if root in seen:
        return
    seen.add(root)
    order.append((root, key))
    for name, tp, _, _ in rows_of(root):
        for nested in nested_sections(tp):
            walk(nested, f"{key}.{name}" if key else name, order, seen)


def config_reference() -> str:
    config = importlib.import_module("attent.experiment.schema")
    registry = importlib.import_module("attent.tasks.registry")
    sweep = importlib.import_module("attent.sweep.spec")
    benchmark = importlib.import_module("attent.benchmark")
    theory = importlib.import_module("attent.theory.config")

    tasks = list(zip(registry.TASKS, registry.config_classes()))
    seen: set[type] = {cls for _, cls in tasks}  # the `task:` union: described one by one below
    groups: list[tuple[str, str, str, type]] = [  # title, introduction, anchor prefix, root
        (
            "Experiment file",
            "`attent train FILE`, `attent validate FILE`: the top level and its sections. "
            "`task:` is one of the task sections further down, chosen by its `name`.",
            "exp",
            config.ExperimentConfig,
        )
    ]
    groups += [
        (f"`task:` with `name: {name}`", f"The `task:` section of a `{name}` experiment.", f"task-{name}", cls)
        for name, cls in tasks
    ]
    groups += [
        ("Sweep file", "`attent sweep FILE`: one top-level key, `sweep:`.", "sweep", sweep.SweepSpec),
        ("Benchmark file", "`attent bench FILE`: one top-level key, `benchmark:`.", "bench", benchmark.BenchmarkSpec),
        ("Theory-lab file", "`attent theory FILE`: the teaching experiment's settings.", "theory", theory.TheoryConfig),
    ]
    bases = {"exp": "", "sweep": "sweep", "bench": "benchmark", "theory": ""}
    plans, sections = [], {}
    for title, intro, prefix, root in groups:
        base = bases.get(prefix, "task")
        order: list[tuple[type, str]] = []
        walk(root, base, order, seen)
        if prefix == "exp":
            seen -= {cls for _, cls in tasks}
        for cls, key in order:
            parts = [part for part in key.split(".") if part][1 if base else 0 :]
            sections[cls] = "cfg-" + "-".join([prefix, *parts]).replace("_", "-")
        plans.append((title, intro, order))
    out = []
    for title, intro, order in plans:
        out += [f"## {title}", "", intro, ""]
        out += [section_table(cls, key or "(top level)", sections) for cls, key in order]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# the command line


class _Built(Exception):
    """Carries the parser ``attent.cli.main.main`` built, out of main, before it parses anything."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__("parser built")
        self.parser = parser


def cli_parser() -> argparse.ArgumentParser:
    """The parser of ``attent.cli.main.main`` itself (its global options and every command): main is
    called with its parsing replaced by a function that hands the parser back. A CLI that exposes
    ``build_parser()`` is asked directly."""
    cli = importlib.import_module("attent.cli.main")
    if hasattr(cli, "build_parser"):
        return cli.build_parser()

    def hand_back(self, *args, **kwargs):
        raise _Built(self)

    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = hand_back
    try:
        cli.main(["--help"])
    except _Built as built:
        return built.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise RuntimeError("attent.cli.main.main() parsed no arguments: the command-line reference cannot be generated")


def cli_reference() -> str:
    parser = cli_parser()
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
    out = ["## `attent`", "", "```text", parser.format_help().rstrip(), "```", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, command in sub.choices.items():
        command.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
        out += [
            f"## `attent {name}`",
            "",
            helps.get(name) or "",
            "",
            "```text",
            command.format_help().rstrip(),
            "```",
            "",
        ]
        inner = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        for action in inner:
            for inner_name, inner_command in action.choices.items():
                inner_command.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
                out += [
                    f"### `attent {name} {inner_name}`",
                    "",
                    "```text",
                    inner_command.format_help().rstrip(),
                    "```",
                    "",
                ]
    return "\n".join(out)
