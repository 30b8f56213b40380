"""The folder ``flwr run`` bundles: the app's own files, staged apart from the checkout.

``flwr run APP`` walks every file under APP before it keeps the ones the app bundle (FAB)
holds (Flower 1.42's ``collect_files`` resolves each path), so a checkout with its virtual
environment and run outputs inside (80,000 files here) cost 9-16 s of every ``dept run``
before anything started. Here the walk skips what the app's ``.gitignore`` ignores (and
``.git``), the files its ``fab-include`` patterns match (gitignore-style, as Flower reads
them) are copied to a folder of their own, and that is bundled: the same bundle.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pathspec

FAB_INCLUDE = "fab-include"  # [tool.flwr.app] key: the patterns of the files bundled
NEVER_BUNDLED = (".git/", ".flwr/", "__pycache__/")  # Flower leaves these out too


def staged_app(app: Path, into: Path) -> Path:
    """``into``, emptied and filled with the files of ``app`` its ``fab-include`` matches
    (in their folders); ``app`` itself where it has no such key (Flower then walks it)."""
    settings = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    if FAB_INCLUDE not in settings:
        return app
    wanted = pathspec.GitIgnoreSpec.from_lines(settings[FAB_INCLUDE])
    shutil.rmtree(into, ignore_errors=True)
    for relative in _kept_files(app):
        if wanted.match_file(relative):
            (into / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(app / relative, into / relative)
    return into


def _kept_files(app: Path) -> Iterator[str]:
    """The regular files under ``app`` that its ``.gitignore`` keeps (relative, POSIX),
    found without entering an ignored folder."""
    gitignore = app / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    ignored = pathspec.GitIgnoreSpec.from_lines([*NEVER_BUNDLED, *lines])
    for folder, subfolders, names in os.walk(app):
        here = Path(folder).relative_to(app)
        subfolders[:] = [d for d in subfolders if not ignored.match_file(f"{here / d}/")]
        for name in names:
            relative = (here / name).as_posix()
            path = Path(folder) / name
            if not ignored.match_file(relative) and path.is_file() and not path.is_symlink():
                yield relative
