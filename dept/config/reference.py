"""The configuration reference of ``docs/configuration.md``, generated from the schema: each
key's default and one-line doc as the code has them, so the page cannot drift from the code
(``tests/dept/config/test_config.py`` compares them).

    python -m dept.config.reference            # rewrite the table in docs/configuration.md
    python -m dept.config.reference --check    # exit 1 if the page differs from the schema
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dept.config.load import config_keys

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- the table below is generated: python -m dept.config.reference -->"
END = "<!-- end of the generated table -->"


def table() -> str:
    """Every run config key as a Markdown table row, in schema order."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{k.key}` | `{k.shown_default}` | {k.doc} |" for k in config_keys()]
    return "\n".join(rows)


def page_with_table(page: str) -> str:
    """``page`` with the text between its markers replaced by :func:`table`."""
    head, found, rest = page.partition(BEGIN)
    _, ended, tail = rest.partition(END)
    if not (found and ended):
        raise ValueError(f"{PAGE} lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dept.config.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    current = page_with_table(page)
    if args.check:
        if current != page:
            print(f"{PAGE} is out of date: python -m dept.config.reference")
            return 1
        return 0
    PAGE.write_text(current, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
