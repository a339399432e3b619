#!/usr/bin/env python3
"""Every relative link and image path in the documentation resolves.

    links_test.py [REPO_ROOT]

Reads README.md, docs/*.md and tests/README.md. For each Markdown link or
image (`[text](target)`, `![alt](path)`, reference definitions `[x]: target`,
HTML `href=`/`src=`) whose target is not a URL (http:, https:, mailto:):
- the path, relative to the file, must exist (a file or a folder);
- a `#anchor` must name a heading of the target Markdown file (or of the
  file itself for a bare `#anchor`), slugged as GitHub slugs headings, or an
  explicit `<a id=...>`/`<a name=...>`.
Links inside code (fenced blocks and `code spans`) are not links and are
skipped. And the README is a front page: it must link every guide in docs/
and tests/README.md, so that each is one click away.

Only the standard library: runs under Debian's /usr/bin/python3. Exits 1
listing every broken link as FILE:LINE.
"""

import pathlib
import re
import sys
import unicodedata
import urllib.parse

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']""")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, code spans blanked."""
    fenced = False
    for number, line in enumerate(text.split("\n"), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        yield number, CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = []
    for ch in text:
        category = unicodedata.category(ch)
        if ch in " -_" or category[0] in "LN" or category == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path, cache={}):
    """The anchors a Markdown file defines."""
    if path not in cache:
        found = set()
        counts = {}
        fenced = False
        for line in path.read_text(encoding="utf-8").split("\n"):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            heading = HEADING.match(line)
            if heading:
                base = slug(heading.group(2))
                n = counts.get(base, 0)
                counts[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            found.update(HTML_ANCHOR.findall(line))
        cache[path] = found
    return cache[path]


def targets(text):
    """(line number, target) of every link-like reference in prose."""
    for number, line in prose_lines(text):
        for match in LINK.finditer(line):
            yield number, match.group(1)
        reference = REFERENCE.match(line)
        if reference:
            yield number, reference.group(1)
        for target in HTML.findall(line):
            yield number, target


def check_file(repo, path):
    problems = []
    links = []
    text = path.read_text(encoding="utf-8")
    for number, target in targets(text):
        where = f"{path.relative_to(repo)}:{number}"
        if not target:
            problems.append(f"{where}: an empty link target")
            continue
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        raw_path, _, anchor = target.partition("#")
        raw_path = urllib.parse.unquote(raw_path)
        resolved = (path.parent / raw_path).resolve() if raw_path else path
        links.append(resolved)
        if raw_path.startswith("/"):
            problems.append(f"{where}: '{target}' is absolute; links must be "
                            f"relative to the file")
            continue
        if not resolved.exists():
            problems.append(f"{where}: '{target}': no {resolved.relative_to(repo) if resolved.is_relative_to(repo) else resolved}")
            continue
        if anchor:
            if resolved.is_dir() or resolved.suffix.lower() != ".md":
                problems.append(f"{where}: '{target}': an anchor into a "
                                f"file that is not Markdown")
            elif urllib.parse.unquote(anchor) not in anchors(resolved):
                problems.append(f"{where}: '{target}': "
                                f"{resolved.relative_to(repo)} has no heading "
                                f"with the anchor #{anchor}")
    return problems, links


def main():
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[2]).resolve()
    readme = repo / "README.md"
    guides = sorted((repo / "docs").glob("*.md"))
    files = [readme] + guides + [repo / "tests/README.md"]
    problems = []
    checked = 0
    readme_links = set()
    for path in files:
        found, links = check_file(repo, path)
        problems += found
        checked += len(links)
        if path == readme:
            readme_links = set(links)
    for guide in guides + [repo / "tests/README.md"]:
        if guide.resolve() not in readme_links:
            problems.append(f"README.md: does not link {guide.relative_to(repo)} "
                            f"(every guide is one click from the front page)")
    for problem in problems:
        print("FAIL " + problem)
    print(f"links_test: {checked} relative links in {len(files)} files: "
          f"{'passed' if not problems else f'{len(problems)} broken'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
