#!/usr/bin/env python3
"""Checks the book under docs/ beyond what `mdbook build` checks (mdbook only warns about a missing
include, and not at all about a broken relative link or anchor):

- every `{{#include FILE[:FROM:TO]}}` names a file that exists;
- every page of docs/src is listed in SUMMARY.md, and every page SUMMARY.md lists exists;
- every relative link resolves, as the built book resolves it: from the page that shows it (an
  included file's links too), to a page or file inside docs/src, and its `#anchor` to a heading
  of that page;
- every message that the troubleshooting page quotes (its ```text blocks, `<...>` standing for what
  varies) is still in the code of the server, the adapter or the C shim;
- every `SALUS_` variable the adapter or the C shim reads is on the client variables page;
- every relative link of README.md names a file of the repository.

`--root DIR` checks another copy of the repository (the tests use it).

Exit status 1 with one line per problem; 0 and a summary line when the book is sound. No third-party
modules, so that it runs with any Python 3.9+ before the venv exists.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if len(sys.argv) == 3 and sys.argv[1] == "--root":
    ROOT = Path(sys.argv[2]).resolve()
SRC = ROOT / "docs" / "src"
# Where the messages the troubleshooting page quotes come from.
MESSAGE_SOURCES = ["server/src", "node/src", "supervisor/src", "sched/src", "python/src/salus", "tf_adapter/src", "k8s/src"]
TROUBLESHOOTING = SRC / "operator" / "troubleshooting.md"
CLIENT_ENV = SRC / "reference" / "client-env.md"
# Where clients read their variables (the server's are its flags, generated).
CLIENT_SOURCES = ["python/src/salus", "tf_adapter/src"]

INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def split_include(arg: str) -> tuple[str, int | None, int | None]:
    """`path:FROM:TO` (1-based lines, either side may be empty) as path, first and last line."""
    parts = arg.split(":")
    path = parts[0]
    nums = [int(p) if p.isdigit() else None for p in parts[1:3]]
    nums += [None] * (2 - len(nums))
    return path, nums[0], nums[1]


def expand(page: Path, problems: list[str], depth: int = 0) -> str:
    """The page's text with its includes expanded, as mdbook renders it."""
    text = page.read_text(encoding="utf-8")

    def include(match: re.Match) -> str:
        path, first, last = split_include(match.group(1))
        target = (page.parent / path).resolve()
        if not target.is_file():
            problems.append(f"{rel(page)}: {{{{#include {match.group(1)}}}}}: no file {rel(target)}")
            return ""
        if depth > 4:
            problems.append(f"{rel(page)}: includes nested too deep")
            return ""
        lines = expand(target, problems, depth + 1).split("\n")
        start = (first - 1) if first else 0
        end = last if last else len(lines)
        return "\n".join(lines[start:end])

    return INCLUDE.sub(include, text)


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def prose_lines(text: str):
    """Lines outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for line in text.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield re.sub(r"`[^`]*`", "``", line)


def heading_ids(text: str) -> set[str]:
    """The ids mdbook gives the page's headings (lowercase; letters, digits, `-` and `_` kept,
    spaces as `-`, the rest dropped; a repeated id gets `-1`, `-2`, ...)."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        title = re.sub(r"<[^>]+>", "", title)
        base = "".join(
            c.lower() if (c.isalnum() or c in "-_") else ("-" if c.isspace() else "")
            for c in title.replace("`", "").replace("*", "")
        )
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def summary_pages(problems: list[str]) -> set[Path]:
    summary = SRC / "SUMMARY.md"
    pages = set()
    for target in LINK.findall(summary.read_text(encoding="utf-8")):
        page = (SRC / target).resolve()
        if not page.is_file():
            problems.append(f"docs/src/SUMMARY.md: lists {target}, which does not exist")
        pages.add(page)
    return pages


def check_links(page: Path, text: str, expanded: dict[Path, str], problems: list[str]) -> int:
    count = 0
    for line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            count += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page.resolve()
            if SRC.resolve() not in dest.parents and dest != SRC.resolve():
                problems.append(f"{rel(page)}: link {target} leaves the book (docs/src): name the file in code instead")
                continue
            if not dest.exists():
                problems.append(f"{rel(page)}: link {target}: no {rel(dest)}")
                continue
            if anchor and dest.suffix == ".md":
                ids = heading_ids(expanded.get(dest) or expand(dest, []))
                if anchor not in ids:
                    problems.append(f"{rel(page)}: link {target}: no heading #{anchor} in {rel(dest)}")
    return count


def normalized_sources() -> str:
    """The message sources with string literals split over lines joined again: Rust's `\\`
    continuations and Python's adjacent (f-)string literals."""
    texts = []
    for base in MESSAGE_SOURCES:
        for path in sorted((ROOT / base).rglob("*")):
            if path.suffix == ".rs":
                texts.append(re.sub(r"\\\n\s*", "", path.read_text(encoding="utf-8")))
            elif path.suffix == ".py":
                texts.append(re.sub(r"([\"'])\s*\n\s*[fr]?\1", "", path.read_text(encoding="utf-8")))
    return "\n".join(texts)


def check_quotes(problems: list[str]) -> int:
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    blocks = re.findall(r"^```text\n(.*?)^```", text, flags=re.S | re.M)
    sources = normalized_sources()
    for block in blocks:
        for message in block.strip().split("\n"):
            for fragment in re.split(r"<[^>]*>", message):
                fragment = fragment.strip()
                if len(fragment) >= 8 and fragment not in sources:
                    problems.append(
                        f"{rel(TROUBLESHOOTING)}: the quoted message part {fragment!r} is not in "
                        f"{', '.join(MESSAGE_SOURCES)}: quote the code's current text"
                    )
    return len(blocks)


def check_client_env(problems: list[str]) -> int:
    page = CLIENT_ENV.read_text(encoding="utf-8")
    names = set()
    for base in CLIENT_SOURCES:
        for path in sorted((ROOT / base).rglob("*")):
            if path.suffix in (".py", ".rs"):
                names.update(re.findall(r"\bSALUS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    for name in sorted(names):
        if f"`{name}`" not in page:
            problems.append(f"{rel(CLIENT_ENV)}: {name} is read in {' or '.join(CLIENT_SOURCES)} but not named here")
    return len(names)


def check_readme(problems: list[str]) -> int:
    readme = ROOT / "README.md"
    count = 0
    for line in prose_lines(readme.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            count += 1
            if not (ROOT / target.partition("#")[0]).exists():
                problems.append(f"README.md: link {target}: no such file")
    return count


def main() -> int:
    problems: list[str] = []
    pages = sorted(p.resolve() for p in SRC.rglob("*.md"))
    listed = summary_pages(problems)
    for page in pages:
        if page.name != "SUMMARY.md" and page not in listed:
            problems.append(f"{rel(page)}: not listed in docs/src/SUMMARY.md (mdbook would not show it)")
    expanded = {page: expand(page, problems) for page in pages}
    links = sum(check_links(page, text, expanded, problems) for page, text in expanded.items())
    quotes = check_quotes(problems)
    variables = check_client_env(problems)
    links += check_readme(problems)
    for problem in problems:
        print(f"check_docs: {problem}")
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in docs/")
        return 1
    print(f"check_docs: {len(pages)} pages, {links} relative links (README's too), {quotes} quoted messages, "
          f"{variables} client variables: all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
