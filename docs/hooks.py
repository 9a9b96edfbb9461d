"""MkDocs hooks: the CLI reference is rendered from the argparse parsers at build time, a run's
verdict from the trainer's own verdict function, and the benchmark pages are taken from
benchmarks/ as they are.

docs/reference/cli.md holds a marker per command (`<!-- cli: shardify -->`); each is replaced by
that command's flags, defaults and help, read from the very parser that `--help` prints, so the
page cannot drift from the code. The parser is caught as the entry point starts to parse
(`main(["--help"])` never gets to print): no entry point needs to expose its parser for this.
tests/tools/test_docs.py checks the rendered page against every `--help`.

A `<!-- verdict: examples/RUN.json -->` marker (inside a run's console output) becomes the line
`verdict: ...` that today's `trainer.report.verdict` gives for the report stored in that file, so
a page never shows a verdict the code no longer prints; README.md, which no hook renders, is
checked against the same function by tests/tools/test_docs.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# marker name -> (module, function called with ["--help"]); the parser it builds is documented.
COMMANDS = {
    "shardify": ("sharding.cli", "main"),
    "trainer": ("trainer.__main__", "main"),
    "trainer.scaling": ("trainer.scaling", "main"),
    "trainer.which": ("trainer.which", "main"),
    "tools.s3_server": ("tools.s3_server", "main"),
    "tools.cloud_servers": ("tools.cloud_servers", "main"),
}
MARKER = re.compile(r"<!-- cli: ([\w.]+) -->")
VERDICT = re.compile(r"<!-- verdict: ([\w./-]+\.json) -->")


class _Caught(BaseException):  # not Exception: an entry point may catch those to report them
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def entry_point(module: str, func: str = "main"):
    """`module.func`, or `module.__main__.func` where the module is a package run with -m."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    found = importlib.import_module(module)
    if not hasattr(found, func) and hasattr(found, "__path__"):
        found = importlib.import_module(f"{module}.__main__")
    return getattr(found, func)


def parser_of(name: str) -> argparse.ArgumentParser:
    """The parser the entry point `name` (a COMMANDS key) builds, caught before it parses anything."""
    module, func = COMMANDS[name]
    entry = entry_point(module, func)
    original = argparse.ArgumentParser.parse_known_args

    def catch(self, *args, **kwargs):  # the first parse is the entry point's own parser
        raise _Caught(self)

    argparse.ArgumentParser.parse_known_args = catch
    try:
        entry(["--help"])
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise RuntimeError(f"{module}.{func}(['--help']) returned without parsing its arguments")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """{name: parser} of the parser's subcommands ({} when it has none)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def render(name: str) -> str:
    """Markdown for one command: its usage and flags, then each subcommand's."""
    parser = parser_of(name)
    subs = subcommands(parser)
    if not subs:
        return _render_parser(parser, level=3)
    return _render_subcommands(parser, subs, level=3)


def _render_subcommands(parser: argparse.ArgumentParser, subs: dict[str, argparse.ArgumentParser],
                        level: int) -> str:
    """Each subcommand under a heading of `level`, its own subcommands (`shardify tokenizer train`) nested."""
    parts = [_usage(parser)]
    helps = {a.dest: a.help for a in _sub_actions(parser)}
    for sub_name, sub in subs.items():
        nested = subcommands(sub)
        body = (_render_subcommands(sub, nested, level + 1) if nested
                else _render_parser(sub, level=level + 1))
        parts.append(f"{'#' * level} `{sub.prog}`\n\n{helps.get(sub_name) or ''}\n\n{body}")
    return "\n\n".join(parts)


def _sub_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return list(action._choices_actions)  # noqa: SLF001
    return []


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage block without argparse's "usage: " prefix, its continuation lines moved left as far
    (argparse indents them to line up under the prefix)."""
    prefix = "usage: "
    first, *rest = parser.format_usage().strip().removeprefix(prefix).split("\n")
    rest = [line.removeprefix(" " * len(prefix)) for line in rest]
    return "```text\n" + "\n".join([first, *rest]) + "\n```"


def _render_parser(parser: argparse.ArgumentParser, level: int) -> str:
    formatter = parser._get_formatter()  # noqa: SLF001 - expands %(default)s as --help does
    positional = [a for a in parser._actions if not a.option_strings]  # noqa: SLF001
    optional = [a for a in parser._actions  # noqa: SLF001
                if a.option_strings and not isinstance(a, argparse._HelpAction)]  # noqa: SLF001
    lines = [_usage(parser), ""]
    if positional:
        lines += [f"{'#' * level} Arguments", ""] + [_item(a, formatter) for a in positional] + [""]
    if optional:
        lines += [f"{'#' * level} Options", ""] + [_item(a, formatter) for a in optional]
    return "\n".join(lines).rstrip() + "\n"


def _item(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if action.option_strings:
        meta = "" if action.nargs == 0 else " " + formatter._format_args(  # noqa: SLF001
            action, formatter._get_default_metavar_for_optional(action))  # noqa: SLF001
        name = ", ".join(f"`{opt}{meta}`" for opt in action.option_strings)
    else:
        name = f"`{action.metavar or action.dest}`"
    text = formatter._expand_help(action) if action.help else ""  # noqa: SLF001
    text = _escape(" ".join(text.split()))
    extra = []
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
        extra.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if _shows_default(action) and "default" not in text:
        extra.append(f"default: `{action.default}`")
    text = " ".join([text] + ([f"({'; '.join(extra)})"] if extra else [])).strip()
    return f"- {name}: {text}" if text else f"- {name}"


def _shows_default(action: argparse.Action) -> bool:
    if action.default in (None, argparse.SUPPRESS, False, [], (), "") or action.nargs == 0:
        return False
    return bool(action.option_strings)


def _escape(text: str) -> str:
    """Help text as literal markdown: no accidental emphasis, links or tags."""
    return re.sub(r"([*_<>\[\]])", r"\\\1", text)


def on_files(files, config):
    """The benchmark pages live beside the benchmarks (benchmarks/*.md); the site shows them under
    benchmarks/, so their own links between each other work as they do on GitHub."""
    from mkdocs.structure.files import File

    for path in sorted((ROOT / "benchmarks").glob("*.md")):
        if path.name != "README.intro.md":  # the page's hand-written opening, already inside README.md
            files.append(File.generated(config, f"benchmarks/{path.name}", abs_src_path=str(path)))
    return files


def verdict_line(example: str) -> str:
    """`verdict: ...` as the trainer prints it today for the run stored in docs/`example` (its report
    fields, num_workers, decode and whether it had a GPU)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from trainer.report import verdict

    run = json.loads((ROOT / "docs" / example).read_text())
    return "verdict: " + verdict(run["report"], num_workers=run["num_workers"], decode=run["decode"],
                                 has_gpu=run["has_gpu"])


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' signature
    """Replace each `<!-- cli: NAME -->` marker with NAME's rendered reference, and each
    `<!-- verdict: FILE -->` with the verdict today's code gives for that run."""
    markdown = VERDICT.sub(lambda m: verdict_line(m.group(1)), markdown)
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
