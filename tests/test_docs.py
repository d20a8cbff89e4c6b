"""Docs that cannot lie: every name the README and the user guide give must exist.

Checked in README.md and docs/*.md (not docs/results.md, which ``baa report`` generates, nor
docs/lab/):

* a ``baa`` command, and each ``--option`` given to it, exists in the parser of
  :func:`budgeted_attention.cli.build_parser` (in backticked spans, in fenced code blocks, and
  lone backticked options such as `--retime` against the command the section heading names);
* a ``configs/*.yaml`` path exists;
* a backticked dotted name ``budgeted_attention.x.y`` or ``baa.x`` imports or resolves (and the
  ``budgeted_attention`` imports and ``baa.x`` calls of Python blocks);
* a backticked ``*.py`` path exists (from the repository root, ``src/budgeted_attention/`` or ``tests/``);
* a backticked test name (``test_`` and three words or more) is a test function or module of tests/;
* a ``make TARGET`` is a target of the Makefile;
* a relative Markdown link leads to a file that exists.

And docs/cli.md names every command and every option of the parser, each option in its
command's section, so the reference cannot drift from the code. A failure names the file, the
line and the bad name.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from budgeted_attention.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATED = {DOCS / "results.md"}  # written by `baa report`, never by hand


def doc_files() -> list[Path]:
    docs = [p for p in sorted(DOCS.glob("*.md")) if p not in GENERATED]
    return [ROOT / "README.md", *docs]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --------------------------------------------------------------------------- the parser


def cli_options() -> tuple[set[str], dict[str, set[str]], dict[str, set[str]]]:
    """(root options, command -> every option it accepts, command -> its documented options).

    Documented options leave out ``-h/--help`` and hidden ones (``help=argparse.SUPPRESS``)."""
    parser = build_parser()
    root = {o for action in parser._actions for o in action.option_strings}
    accepted: dict[str, set[str]] = {}
    documented: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                accepted[name] = {o for a in sub._actions for o in a.option_strings}
                documented[name] = {
                    o for a in sub._actions for o in a.option_strings
                    if a.help is not argparse.SUPPRESS and o.startswith("--") and o != "--help"
                }
    return root, accepted, documented


ROOT_OPTIONS, ACCEPTED, DOCUMENTED = cli_options()
ALL_OPTIONS = set().union(*ACCEPTED.values()) | ROOT_OPTIONS


# --------------------------------------------------------------------------- reading Markdown


@dataclass
class Span:
    """A piece of a document: a backticked span, a logical line of a fenced block, or a prose line."""

    path: Path
    line: int
    text: str
    kind: str  # "code" (backticked), "block" (a fenced block's line), "prose"
    language: str = ""
    section: tuple[str, ...] | None = None  # the baa commands the enclosing heading names (None: none)

    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


COMMAND = re.compile(r"(?:^|[\s/`(\[])baa ((?:--)?[a-z][\w-]*)")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
BACKTICKS = re.compile(r"(`+)(.+?)\1")


def heading_commands(title: str) -> tuple[str, ...] | None:
    """The commands a heading names (``## `baa serve RUN_DIR`, `baa export RUN_DIR```); ``()``
    for a heading about another program (``benchmarks/serve_load.py``); None when it names none."""
    commands = tuple(m.group(1) for m in COMMAND.finditer(title) if not m.group(1).startswith("--"))
    if commands:
        return commands
    if re.search(r"\w\.py\b", title):
        return ()
    return None


def spans(path: Path) -> Iterator[Span]:
    """Every backticked span, fenced-block line (continuations joined) and prose line of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    stack: list[tuple[int, tuple[str, ...] | None]] = []  # (heading level, its commands)
    fence: str | None = None
    language = ""
    pending: tuple[int, str] | None = None  # a block line ending in a backslash, waiting for the rest
    for number, line in enumerate(lines, start=1):
        section = next((cmds for _, cmds in reversed(stack) if cmds is not None), None)
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
                continue
            if pending:
                start, text = pending
                text += " " + line.strip()
            else:
                start, text = number, line
            if text.rstrip().endswith("\\"):
                pending = (start, text.rstrip()[:-1])
                continue
            pending = None
            yield Span(path, start, text, "block", language, section)
            continue
        opened = FENCE.match(line)
        if opened:
            fence, language = opened.group(1), opened.group(2).lower()
            continue
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, heading_commands(heading.group(2))))
            section = next((cmds for _, cmds in reversed(stack) if cmds is not None), None)
        prose = BACKTICKS.sub(" ", line)
        yield Span(path, number, prose, "prose", section=section)
        for match in BACKTICKS.finditer(line):
            yield Span(path, number, match.group(2).strip(), "code", section=section)


ALL_SPANS = [span for path in doc_files() for span in spans(path)]


def shell_spans() -> Iterator[Span]:
    """Backticked spans and lines of non-Python fenced blocks (where commands are written)."""
    for span in ALL_SPANS:
        if span.kind == "code" or (span.kind == "block" and span.language not in ("python", "py", "yaml", "yml", "json")):
            yield span


def strip_comment(text: str) -> str:
    return re.split(r"(?:^|\s)#(?:\s|$)", text, maxsplit=1)[0]


# --------------------------------------------------------------------------- (a) commands and options


def command_problems(span: Span) -> list[str]:
    """Unknown commands and options of the ``baa`` invocations written in ``span``."""
    problems = []
    for segment in re.split(r"\s(?:&&|\|\||;|&)\s|\s&$", strip_comment(span.text)):
        calls = list(COMMAND.finditer(segment))
        for i, call in enumerate(calls):
            name = call.group(1)
            end = calls[i + 1].start() if i + 1 < len(calls) else len(segment)
            if name.startswith("--"):
                if name not in ROOT_OPTIONS:
                    problems.append(f"{span.where()}: `baa {name}`: baa has no option {name}")
                continue
            if name not in ACCEPTED:
                problems.append(f"{span.where()}: `baa {name}`: no such command (known: {', '.join(sorted(ACCEPTED))})")
                continue
            for option in OPTION.findall(segment[call.end():end]):
                if option not in ACCEPTED[name]:
                    problems.append(f"{span.where()}: `baa {name}` has no option {option}")
    return problems


def lone_option_problems(span: Span) -> list[str]:
    """A backticked span that starts with an option (`--retime`, `--set KEY=VALUE`): an option of
    the command(s) its section heading names, else of any command."""
    if span.kind != "code" or not span.text.startswith("--") or span.section == ():
        return []
    option = OPTION.match(span.text)
    if option is None:
        return []
    option = option.group(0)
    if span.section:
        if any(option in ACCEPTED.get(cmd, ()) for cmd in span.section):
            return []
        return [f"{span.where()}: {option} is not an option of {' or '.join('baa ' + c for c in span.section)} (this section's command)"]
    if option not in ALL_OPTIONS:
        return [f"{span.where()}: {option} is not an option of any baa command"]
    return []


def test_every_baa_command_and_option_exists():
    problems = [p for span in shell_spans() for p in command_problems(span) + lone_option_problems(span)]
    assert not problems, "docs name baa commands or options the CLI does not have:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- (b) config files


CONFIG = re.compile(r"(?<![\w/.-])configs/[\w./-]+?\.ya?ml\b")


def test_every_config_file_exists():
    problems = [
        f"{span.where()}: {name} does not exist"
        for span in ALL_SPANS for name in CONFIG.findall(span.text) if not (ROOT / name).is_file()
    ]
    assert not problems, "docs name config files that do not exist:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- (c) Python names


DOTTED = re.compile(r"^(budgeted_attention|baa)((?:\.[A-Za-z_]\w*)*)(?=$|[(\[\s:,])")


def resolve(name: str) -> str | None:
    """None when ``name`` (``budgeted_attention.a.b``) imports or resolves; else why not.

    A name whose import needs an optional dependency that is not installed counts as resolved."""
    parts = name.split(".")
    module = None
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("budgeted_attention"):
                return None  # an optional extra (transformers, onnx, fastapi) is missing here
            continue
        break
    if module is None:
        return "no such module"
    target = module
    for attribute in parts[cut:]:
        if not hasattr(target, attribute):
            return f"{'.'.join(parts[:cut])} has no attribute {'.'.join(parts[cut:])!r}"
        target = getattr(target, attribute)
    return None


def python_names() -> Iterator[tuple[Span, str]]:
    """(span, dotted name) for backticked names and the imports and ``baa.x`` of Python blocks."""
    for span in ALL_SPANS:
        if span.kind == "code":
            match = DOTTED.match(span.text)
            if match and match.group(2):
                yield span, "budgeted_attention" + match.group(2)
        elif span.kind == "block" and span.language in ("python", "py"):
            for imported in re.finditer(r"^\s*from\s+(budgeted_attention[\w.]*)\s+import\s+([\w, ()]+)", span.text):
                for name in re.findall(r"\w+", imported.group(2)):
                    yield span, f"{imported.group(1)}.{name}"
            for imported in re.finditer(r"^\s*import\s+(budgeted_attention[\w.]*)", span.text):
                yield span, imported.group(1)
            for used in re.finditer(r"(?<![\w.])baa\.(\w+)", span.text):
                yield span, f"budgeted_attention.{used.group(1)}"


def test_every_python_name_resolves():
    problems = [f"{span.where()}: `{name}`: {why}" for span, name in python_names() if (why := resolve(name))]
    assert not problems, "docs name Python objects that do not exist:\n" + "\n".join(problems)


SOURCE_FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b")


def test_every_source_file_exists():
    problems = []
    for span in ALL_SPANS:
        if span.kind != "code":
            continue
        for name in SOURCE_FILE.findall(span.text):
            if not any((base / name).is_file() for base in (ROOT, ROOT / "src" / "budgeted_attention", ROOT / "tests")):
                problems.append(f"{span.where()}: {name} does not exist (from the root, src/budgeted_attention/ or tests/)")
    assert not problems, "docs name source files that do not exist:\n" + "\n".join(problems)


TEST_NAME = re.compile(r"test_\w+_\w+_\w+")  # test_ and three words or more: data.test_file is a config key


def test_every_test_name_exists():
    """A backticked test name (``test_`` and three words or more, as in the conformance checklists of
    docs/extending.md) is a test function or a test module of tests/."""
    defined = set()
    for module in (ROOT / "tests").rglob("test_*.py"):
        defined.add(module.stem)
        defined.update(re.findall(r"^\s*(?:async )?def (test_\w+)", module.read_text(encoding="utf-8"), flags=re.M))
    problems = [f"{span.where()}: `{name}` is no test function or module of tests/"
                for span in ALL_SPANS if span.kind == "code" and TEST_NAME.fullmatch(name := span.text.strip()) and name not in defined]
    assert not problems, "docs name tests that do not exist:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- (d) make targets


def make_targets() -> tuple[set[str], set[str]]:
    """(targets, pattern-rule prefixes such as ``study-``) of the Makefile."""
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        rule = re.match(r"^([A-Za-z0-9_.%/$()-][A-Za-z0-9_.%/$() -]*?)\s*::?(?!=)", line)
        if rule and not line.startswith("\t"):
            targets |= set(rule.group(1).split())
    patterns = {t.split("%")[0] for t in targets if t.endswith("%")}
    return {t for t in targets if "%" not in t}, patterns


def studies_file_exists() -> bool:
    """A list of studies that a ``study-NAME`` target could come from (before the Makefile has the rule)."""
    candidates = [ROOT / "studies.yaml", ROOT / "configs" / "studies.yaml", ROOT / "studies"]
    candidates += list((ROOT / "src" / "budgeted_attention").rglob("studies*.py"))
    return any(path.exists() for path in candidates)


MAKE = re.compile(r"(?:^|[\s`(])make ([a-z][\w-]*)")


def study_names() -> set[str]:
    """The studies of studies.yaml (``make study-NAME`` runs one)."""
    data = yaml.safe_load((ROOT / "studies.yaml").read_text(encoding="utf-8"))
    return {str(study.get("name")) for study in data.get("studies", [])}


def test_every_make_target_exists():
    targets, patterns = make_targets()
    problems = []
    for span in shell_spans():
        for target in MAKE.findall(strip_comment(span.text)):
            study = target.removeprefix("study-") if target.startswith("study-") else None
            if study is not None and not study.isupper() and (ROOT / "studies.yaml").is_file() and study not in study_names():
                problems.append(f"{span.where()}: `make {target}`: studies.yaml has no study {study!r}")
                continue
            if target in targets or any(target.startswith(p) and len(target) > len(p) for p in patterns):
                continue
            if target.startswith("study-") and studies_file_exists():
                continue
            problems.append(f"{span.where()}: `make {target}`: the Makefile has no target {target!r}")
    assert not problems, "docs name make targets that do not exist:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- (e) links


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_every_relative_link_leads_to_a_file():
    problems = []
    for span in ALL_SPANS:
        if span.kind != "prose":
            continue
        for target in LINK.findall(span.text):
            if re.match(r"^[a-z][a-z+.-]*:", target) or target.startswith("#"):
                continue  # a URL (https:, mailto:) or an anchor of the same page
            file = target.split("#", 1)[0].split("?", 1)[0]
            if not (span.path.parent / file).exists():
                problems.append(f"{span.where()}: link to {target!r}: no such file")
    assert not problems, "docs link to files that do not exist:\n" + "\n".join(problems)


def slugs(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path`` (lower case, punctuation dropped, spaces
    to hyphens; a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fence = not fence
        heading = None if fence else HEADING.match(line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(2).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_every_link_anchor_exists():
    """``page.md#section`` and ``#section`` links name a heading of that page (docs/results.md
    included: its sections are the studies of studies.yaml, so a renamed study breaks the link)."""
    problems = []
    for span in ALL_SPANS:
        if span.kind != "prose":
            continue
        for target in LINK.findall(span.text):
            if re.match(r"^[a-z][a-z+.-]*:", target) or "#" not in target:
                continue
            file, anchor = target.split("#", 1)
            page = (span.path.parent / file) if file else span.path
            if file and not file.endswith(".md"):
                continue  # an anchor into another kind of file
            if not page.is_file():
                continue  # a missing page fails test_every_relative_link_leads_to_a_file
            if anchor not in slugs(page):
                problems.append(f"{span.where()}: link to {target!r}: {rel(page)} has no heading with the anchor #{anchor}")
    assert not problems, "docs link to sections that do not exist:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- the CLI reference


def cli_reference_sections() -> dict[str, list[Span]]:
    """docs/cli.md's spans by the command their section heading names."""
    sections: dict[str, list[Span]] = {}
    for span in spans(DOCS / "cli.md"):
        for command in span.section or ():
            sections.setdefault(command, []).append(span)
    return sections


def test_cli_reference_names_every_command_and_option():
    sections = cli_reference_sections()
    problems = []
    for command in sorted(DOCUMENTED):
        if command not in sections:
            problems.append(f"docs/cli.md: no section whose heading names `baa {command}`")
            continue
        written = {o for span in sections[command] if span.kind in ("code", "block") for o in OPTION.findall(span.text)}
        problems += [f"docs/cli.md: the `baa {command}` section never names {option}" for option in sorted(DOCUMENTED[command] - written)]
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    problems += [f"docs/cli.md: never names `baa {option}`" for option in sorted(ROOT_OPTIONS - {"-h", "--help"}) if option not in text]
    assert not problems, "docs/cli.md has drifted from the parser (budgeted_attention.cli.build_parser):\n" + "\n".join(problems)


# --------------------------------------------------------------------------- the README's own rules


README = ROOT / "README.md"
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline:begin -->", "<!-- headline:end -->"


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200: the details go to docs/)"


def test_readme_headline_is_a_generated_slot():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines.count(HEADLINE_BEGIN) == 1 and lines.count(HEADLINE_END) == 1, (
        f"README.md must hold the lines {HEADLINE_BEGIN} and {HEADLINE_END} once each (baa report writes between them)"
    )
    assert lines.index(HEADLINE_BEGIN) < lines.index(HEADLINE_END), f"README.md: {HEADLINE_END} comes before {HEADLINE_BEGIN}"


# What a measured figure looks like: a mean with its spread (1.2 ± 0.1), a speedup (2x, 1.83x,
# 1.83×), a percentage (97 %, 96.85 %) or a loss with decimals. A tolerance such as "±0.5 points"
# has no number before it; a confidence level ("95% confidence") is a setting.
MEASURED = re.compile(r"\d\s*±\s*\d|\b\d+(?:\.\d+)?[x×](?!\w)|\b\d+(?:\.\d+)? ?%(?! confidence)|\b\d+\.\d+ nats\b")


def test_docs_type_no_results():
    """Measured figures come from runs (README's headline slot, docs/results.md, the generated lab
    pages), never typed into README or the user guide."""
    problems = []
    for path in doc_files():
        generated = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            generated = (generated or line == HEADLINE_BEGIN) and line != HEADLINE_END
            if not generated and MEASURED.search(line):
                problems.append(f"{rel(path)}:{number}: {line.strip()}")
    assert not problems, "docs type result figures outside the generated pages:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", doc_files(), ids=rel)
def test_doc_is_readable(path):
    """Every page is UTF-8 with its fences closed (an unclosed fence would hide the rest from the checks)."""
    fences = [line for line in path.read_text(encoding="utf-8").splitlines() if FENCE.match(line)]
    assert len(fences) % 2 == 0, f"{rel(path)}: a fenced code block is not closed"


# --------------------------------------------------------------------------- experiment configs written in the docs


def yaml_blocks() -> list[tuple[str, str]]:
    """(where, text) of every fenced YAML block of README and the user guide."""
    blocks = []
    for path in doc_files():
        lines, inside, start, body = path.read_text(encoding="utf-8").splitlines(), False, 0, []
        for number, line in enumerate(lines, start=1):
            if not inside and re.match(r"^```ya?ml\s*$", line):
                inside, start, body = True, number, []
            elif inside and line.startswith("```"):
                inside = False
                blocks.append((f"{rel(path)}:{start}", "\n".join(body)))
            elif inside:
                body.append(line)
    return blocks


@pytest.mark.parametrize("where,text", yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_every_experiment_config_in_the_docs_loads(where, text, tmp_path):
    """A config the docs tell users to write is one `baa experiment` accepts: a misspelt or
    removed key fails here, named, as it would for the user."""
    from budgeted_attention.pipeline import load_experiment_config  # noqa: PLC0415

    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{where}: not a YAML mapping"
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_experiment_config(str(path))
    except Exception as exc:  # noqa: BLE001 - the message is the finding
        pytest.fail(f"{where}: {type(exc).__name__}: {exc}")


def test_the_results_page_is_the_studies_in_at_most_ten_tables():
    """docs/results.md (generated) holds one section per study of studies.yaml, in its order, at
    most ten, and a replication section only beside them."""
    headings = re.findall(r"^## (.+)$", (DOCS / "results.md").read_text(encoding="utf-8"), flags=re.M)
    studies = [h for h in headings if h != "Replication"]
    in_order = [str(s.get("name")) for s in yaml.safe_load((ROOT / "studies.yaml").read_text(encoding="utf-8"))["studies"]]
    assert studies == in_order, f"docs/results.md's sections {studies} are not studies.yaml's {in_order}: run make report"
    assert len(studies) <= 10
