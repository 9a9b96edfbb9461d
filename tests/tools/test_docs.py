"""The documentation cannot drift from the code: the CLI reference lists every flag `--help` shows."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
OPTION_LINE = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)", re.M)  # "  --flag X, -f X   help": the invocation part


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _help(module: str, argv: list[str]) -> str:
    """What `python -m MODULE ARGV --help` prints, from the entry point itself."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        _hooks().entry_point(module)([*argv, "--help"])
    return out.getvalue()


def _flags(help_text: str) -> set[str]:
    """The long flags `--help` lists as options (not those its prose mentions)."""
    return {f for line in OPTION_LINE.findall(help_text) for f in FLAG.findall(line)} - {"--help"}


def _cli_page() -> str:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    return _hooks().on_page_markdown(page, page=None, config=None, files=None)


def _section(page: str, heading: str) -> str:
    """The part of the rendered page under `heading` (up to the next heading of that level or higher)."""
    level = heading.split(" ")[0]
    start = page.index(f"{heading}\n")
    nxt = re.search(rf"^#{{1,{len(level)}}} ", page[start + len(heading) + 1:], re.M)
    return page[start:start + len(heading) + 1 + nxt.start()] if nxt else page[start:]


def test_every_command_marker_is_rendered():
    page = _cli_page()
    assert "<!-- cli:" not in page
    assert set(_hooks().COMMANDS) <= set(re.findall(r"<!-- cli: ([\w.]+) -->",
                                                    (ROOT / "docs" / "reference" / "cli.md").read_text()))


def test_shardify_reference_lists_every_flag_of_every_subcommand():
    page = _cli_page()
    subs = re.findall(r"\{([a-z,]+)\}", _help("sharding.cli", []))[0].split(",")
    assert {"write", "append", "inspect", "index", "gc", "verify"} <= set(subs)
    for sub in subs:
        nested = _hooks().subcommands(_hooks().subcommands(_hooks().parser_of("shardify"))[sub])
        commands = [[sub, n] for n in nested] if nested else [[sub]]  # shardify tokenizer train
        for argv in commands:
            section = _section(page, f"{'#' * (2 + len(argv))} `shardify {' '.join(argv)}`")
            flags = _flags(_help("sharding.cli", argv))
            missing = sorted(f for f in flags if f"`{f}" not in section)
            assert flags and not missing, f"shardify {' '.join(argv)}: {missing} in --help but not in the reference"


@pytest.mark.parametrize("module,heading", [("trainer.__main__", "## `python -m trainer`"),
                                            ("trainer.scaling", "## `python -m trainer.scaling`"),
                                            ("trainer.which", "## `python -m trainer.which`")])
def test_trainer_reference_lists_every_flag(module, heading):
    section = _section(_cli_page(), heading)
    flags = _flags(_help(module, []))
    missing = sorted(f for f in flags if f"`{f}" not in section)
    assert len(flags) >= 3 and not missing, f"{module}: {missing} in --help but not in docs/reference/cli.md"


def test_usage_continuation_lines_line_up_under_the_program_name():
    """argparse indents a wrapped usage under "usage: PROG "; the page drops "usage: ", so the
    continuation lines move left by as much and line up under the arguments after PROG."""
    parser = argparse.ArgumentParser(prog="tool sub")
    for i in range(12):
        parser.add_argument(f"--option-number-{i}", metavar="VALUE")
    block = _hooks()._usage(parser).splitlines()  # noqa: SLF001 - the one renderer of usage blocks
    first, rest = block[1], block[2:-1]
    assert first.startswith("tool sub [-h]") and rest, block
    indent = " " * len("tool sub ")
    assert all(line.startswith(indent) and line[len(indent)] != " " for line in rest), block


def stale_verdicts(text: str, current: str) -> list[str]:
    """The `verdict: ...` lines of a page that are not what the trainer prints today."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("verdict: ")
            and line.strip() != current]


def test_the_pages_show_the_verdict_the_trainer_prints_today():
    """README.md (no hook renders it) quotes the example run's verdict as today's trainer.report.verdict
    words it; the training guide's marker is rendered from the same function and run."""
    hooks, example = _hooks(), "examples/digits-run.json"
    current = hooks.verdict_line(example)
    readme = (ROOT / "README.md").read_text()
    assert current in readme and stale_verdicts(readme, current) == []
    guide = (ROOT / "docs" / "guides" / "training.md").read_text()
    assert f"<!-- verdict: {example} -->" in guide and stale_verdicts(guide, current) == []
    rendered = hooks.on_page_markdown(guide, page=None, config=None, files=None)
    assert current in rendered and "<!-- verdict:" not in rendered


def test_an_old_verdict_text_is_caught():
    current = _hooks().verdict_line("examples/digits-run.json")
    old = ("verdict: INPUT-BOUND: 16% of step time waits for data, 29% of loading work hidden; decode dominates "
           "loading: try --decode dali, or more --num-workers (now 1)")
    assert stale_verdicts(f"text\n{old}\n", current) == [old]
    assert stale_verdicts(f"text\n{current}\n", current) == []
