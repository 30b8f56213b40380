"""Text out of the files packages ship, as documents (id, text): one dictionary entry, one
fortune, one manual page, one HTML page, one licence, one source file. Each reader is plain
Python over the file's bytes, so the text is the same on every machine (rendering manual
pages with the local groff would not be)."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterator
from html.parser import HTMLParser

Documents = Iterator[tuple[str, str]]
Reader = Callable[[str, bytes, dict[str, bytes]], Documents]  # (path, data, package's files)

DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(number: str) -> int:
    """dictd's index numbers: big-endian base 64 in its own digits."""
    value = 0
    for digit in number:
        value = value * 64 + DICTD_DIGITS.index(digit)
    return value


def dictd(path: str, data: bytes, package: dict[str, bytes]) -> Documents:
    """Every entry of a dictd dictionary (``.dict.dz`` with its ``.index``), less its own
    ``00-database-*`` notes; an entry under several headwords once."""
    index = package[path.removesuffix(".dict.dz") + ".index"].decode()
    text = gzip.decompress(data)
    seen = set()
    for line in index.splitlines():
        word, offset, length = line.split("\t")[:3]
        span = (_b64(offset), _b64(length))
        if word.startswith("00-database") or span in seen:
            continue
        seen.add(span)
        yield f"{path}#{word}", text[span[0] : span[0] + span[1]].decode("utf-8", "replace")


def fortunes(path: str, data: bytes, package: dict[str, bytes]) -> Documents:
    """Every fortune of a fortune file (separated by lines of ``%``)."""
    for number, text in enumerate(data.decode("utf-8", "replace").split("\n%\n")):
        if text.strip():
            yield f"{path}#{number}", text.strip() + "\n"


ROFF_ESCAPE = re.compile(r"\\(f(\[[^]]*\]|\(..|.)|\(..|\[[^]]*\]|[-e&|^ ])")
ROFF_CHARACTERS = {"\\-": "-", "\\e": "\\", "\\ ": " ", "\\(em": "—", "\\(en": "–"}


def manual_page(path: str, data: bytes, package: dict[str, bytes]) -> Documents:
    """A roff manual page as running text: requests and comments dropped, the words of
    headings and font macros kept, font and character escapes removed."""
    source = gzip.decompress(data) if path.endswith(".gz") else data
    lines = []
    for line in source.decode("utf-8", "replace").splitlines():
        if line.startswith(("'\\\"", '.\\"', '\\"')):
            continue
        if line.startswith((".", "'")):
            request, _, words = line[1:].partition(" ")
            if request not in {"SH", "SS", "B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "TP"}:
                continue
            line = words.replace('"', "")
        lines.append(ROFF_ESCAPE.sub(lambda m: ROFF_CHARACTERS.get(m.group(0), ""), line))
    if len(lines) > 1:  # a page that only includes another (.so) has no text of its own
        yield path, "\n".join(lines) + "\n"


class _Text(HTMLParser):
    SKIPPED = frozenset({"script", "style", "head"})
    BLOCKS = frozenset({"p", "div", "li", "pre", "h1", "h2", "h3", "h4", "dt", "dd", "tr", "br"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.skipping += tag in self.SKIPPED
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self.skipping -= tag in self.SKIPPED

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


SPHINX_MAIN = re.compile(r'<div class="body" role="main">(.*?)<div class="sphinxsidebar"', re.S)


def html_page(path: str, data: bytes, package: dict[str, bytes]) -> Documents:
    """An HTML page's text outside scripts, styles and its head (a Sphinx page's main
    column only: not its navigation); blank runs squeezed."""
    page = data.decode("utf-8", "replace")
    main = SPHINX_MAIN.search(page)
    parser = _Text()
    parser.feed(main.group(1) if main else page)
    text = re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()
    if text:
        yield path, text + "\n"


def spdx_licences(path: str, data: bytes, package: dict[str, bytes]) -> Documents:
    """Every licence's full text of the SPDX list (``spdx-full.json``)."""
    for identifier, licence in sorted(json.loads(data).items()):
        text = licence.get("licenseText", "").strip()
        if text:
            yield f"{path}#{identifier}", text + "\n"


def source_file(path: str, data: bytes, package: dict[str, bytes]) -> Documents:
    """A source file as it is."""
    yield path, data.decode("utf-8", "replace")
