"""MkDocs hook: links from the docs to the repository's own files (a study's data folder under
``benchmarks/results/``, an example script, a YAML) are written as ordinary relative links from
the Markdown source, so they also work when the pages are read on a forge or in an editor:

    [its data](../../benchmarks/results/data_size/)    ![figure](../../benchmarks/results/.../x.png)

MkDocs knows only the files under ``docs/`` and would report such a link as not found. This hook
checks each one instead: a target outside ``docs/`` must exist in the repository (else a warning,
which ``mkdocs build --strict`` turns into a failure, as it does for a broken link inside
``docs/``); the file, or every file of the folder, is then published with the site under
``repo/<its path>`` (a folder gets an ``index.html`` listing its files) and the link rewritten to
that copy. Links inside ``docs/`` are left to MkDocs' own validation.
"""

from __future__ import annotations

import html
import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.repo_links")

PREFIX = "repo"  # where copies of repository files live in the site
SKIP_PARTS = {"__pycache__", ".git", ".venv", "node_modules"}
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,}).*?^\1\2[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
# [text](target) and ![alt](target), with an optional "title"; the target without spaces
LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()(<[^>]+>|[^)\s]+)((?:\s+\"[^\"]*\")?\))")

_targets: dict[str, dict[str, str]] = {}  # page src_uri -> {link as written: virtual src_uri}


class RepoFile(File):
    """A repository file published as is (a Markdown report is copied, not rendered as a page)."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def prose_segments(markdown: str):
    """(text, is_prose) pieces of ``markdown``: fenced code blocks are not prose."""
    pos = 0
    for fence in FENCE.finditer(markdown):
        yield markdown[pos : fence.start()], True
        yield fence.group(0), False
        pos = fence.end()
    yield markdown[pos:], True


def links(text: str):
    """The Markdown links and images of a prose piece, less those written inside a code span
    (a link's text may itself be code: [`path`](target))."""
    spans = [m.span() for m in CODE_SPAN.finditer(text)]
    for match in LINK.finditer(text):
        at = match.start(2)
        if not any(start <= at < end for start, end in spans):
            yield match


def outside_target(link: str, page_src: Path, docs: Path) -> Path | None:
    """The resolved path of a relative link that leaves ``docs/``; None for any other link."""
    target = link.strip("<>")
    if not target or target.startswith(("#", "/", "\\")) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return None
    resolved = (page_src.parent / path).resolve()
    return None if resolved.is_relative_to(docs) else resolved


def listing(folder: Path, repo: Path) -> str:
    """A plain index.html of a published folder: its subfolders and files, each linked."""
    rel = folder.relative_to(repo).as_posix()
    rows = [
        f'<li><a href="{html.escape(p.name)}/index.html">{html.escape(p.name)}/</a></li>'
        if p.is_dir()
        else f'<li><a href="{html.escape(p.name)}">{html.escape(p.name)}</a></li>'
        for p in sorted(folder.iterdir())
        if p.name not in SKIP_PARTS and not p.name.startswith(".")
    ]
    up = '<p><a href="../index.html">..</a></p>' if rel.count("/") else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(rel)}/</title></head>'
        f"<body><h1><code>{html.escape(rel)}/</code></h1>{up}<ul>{''.join(rows)}</ul>"
        "<p>Files of the attent repository, published with its documentation.</p></body></html>"
    )


def publish(target: Path, repo: Path, files: Files, config) -> str:
    """Add ``target`` (a file, or a folder with everything under it) to the site; its virtual
    src_uri, the one a rewritten link points at."""

    def add(file: File) -> None:
        if file.src_uri not in files.src_uris:
            files.append(file)

    rel = target.relative_to(repo).as_posix()
    if target.is_file():
        add(RepoFile.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(target)))
        return f"{PREFIX}/{rel}"
    for folder in [target, *sorted(p for p in target.rglob("*") if p.is_dir())]:
        if SKIP_PARTS & set(folder.relative_to(repo).parts):
            continue
        folder_rel = folder.relative_to(repo).as_posix()
        add(RepoFile.generated(config, f"{PREFIX}/{folder_rel}/index.html", content=listing(folder, repo)))
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                add(RepoFile.generated(config, f"{PREFIX}/{folder_rel}/{path.name}", abs_src_path=str(path)))
    return f"{PREFIX}/{rel}/index.html"


def on_files(files: Files, config, **kwargs) -> Files:
    repo = Path(config.config_file_path).resolve().parent
    docs = Path(config.docs_dir).resolve()
    _targets.clear()
    for page in files.documentation_pages():
        src = Path(page.abs_src_path).resolve()
        found = _targets.setdefault(page.src_uri, {})
        for text, prose in prose_segments(page.content_string):
            if not prose:
                continue
            for match in links(text):
                link = match.group(2)
                target = outside_target(link, src, docs)
                if target is None:
                    continue
                if not target.is_relative_to(repo) or not target.exists():
                    log.warning(
                        "Doc file '%s' links to '%s', which is not a file or folder of the repository",
                        page.src_uri,
                        link,
                    )
                    continue
                found[link] = publish(target, repo, files, config)
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    found = _targets.get(page.file.src_uri)
    if not found:
        return markdown
    base = posixpath.dirname(page.file.src_uri)

    def rewrite(text: str) -> str:
        pieces, pos = [], 0
        for match in links(text):
            link = match.group(2)
            if link in found:
                anchor = link.strip("<>").partition("#")[2]
                new = posixpath.relpath(found[link], base or ".") + (f"#{anchor}" if anchor else "")
                pieces += [text[pos : match.start(2)], new]
                pos = match.end(2)
        return "".join(pieces) + text[pos:]

    return "".join(rewrite(text) if prose else text for text, prose in prose_segments(markdown))
