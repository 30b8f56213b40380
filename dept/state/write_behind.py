"""A round's state written while the reply goes out, and kept for the next round.

A source's state (φ_k, the inner AdamW moments) is several times its body in bytes: writing
and hashing it held every warm message's reply, and reading it back delayed the next. A
long-lived process (the node's warm worker) can instead hand the writing to a thread
and keep the state it wrote for the next round: :class:`WriteBehind` holds that one write
and that one value. The thread is not a daemon, so a worker that exits (idle, SIGTERM, its
SuperNode gone) finishes the write first; only a SIGKILL between the reply and the write's
end loses the round's state, and the next round then starts from the one before and says so
(:meth:`dept.state.workspace.Workspace.load_state`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class WriteBehind(Generic[T]):
    """One write at a time in a thread; the value it writes kept until taken."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure = ""
        self._writing: T | None = None
        self.kept: T | None = None
        self.lost: T | None = None  # the value of the last write that failed

    def start(self, write: Callable[[], None], value: T, name: str) -> None:
        """Wait for the write before, then run ``write`` in a thread and keep ``value``."""
        self.wait()
        self.kept = self._writing = value
        self._thread = threading.Thread(target=self._run, args=(write,), name=name)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as exc:  # said by wait(), to the call that needs the state
            log.exception("writing the state behind failed")
            self._failure = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def wait(self) -> str:
        """Wait for the write in progress; why it failed ("": it did not, or none ran). The
        value of a failed write is not kept, it never reached the disk: it is :attr:`lost`,
        for the caller to judge whether it was one it needed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failure, self._failure = self._failure, ""
        self.lost = self._writing if failure else None
        if failure:
            self.kept = None
        return failure

    def take(self) -> None:
        """Forget the kept value (its tensors are about to change in place)."""
        self.kept = None
