"""Shared fixtures."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dept.config import DeptConfig, load_config
from dept.logs import PROJECT_LOGGERS
from tests.helpers import debug_run_config, held_elsewhere
from tests.scheduling import auto_workers, give_worker_its_ports, make_scheduler

# The real answers, for the ``gpu`` tests (the others are given none: :func:`_no_cuda`).
CUDA_FUNCTIONS = {"is_available": torch.cuda.is_available, "device_count": torch.cuda.device_count}
VISIBLE = "CUDA_VISIBLE_DEVICES"
REAL_VISIBLE = os.environ.get(VISIBLE)


def pytest_configure(config: pytest.Config) -> None:
    give_worker_its_ports()
    # A suite started as a background job by a shell without job control (`bash .ci/run &`)
    # inherits SIGINT ignored, and so does every process its tests start; Python then leaves
    # it ignored, and each test's Ctrl-C of a run does nothing. A handler set here is reset
    # to the default in every process started after it, as a terminal's would be.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The longest tests first, one at a time (:mod:`tests.scheduling`)."""
    return make_scheduler(config, log)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: :func:`tests.scheduling.auto_workers`."""
    return auto_workers()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``gpu`` tests are skipped where no CUDA device is visible. Where one is, CUDA starts
    here, before :func:`_no_cuda` hides it: started, it keeps the GPUs it found."""
    if torch.cuda.is_available():
        torch.cuda.init()
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _no_cuda() -> Iterator[None]:
    """The tests run on the CPU, even on a GPU machine: ``device='auto'`` (a benchmark's, a
    CLI's or a run config's default) finds no CUDA in this process, nor in any process a
    test starts. What the tests expect of the numbers (a re-run round equal bit for bit,
    float32 throughout) is what the CPU gives; the ``gpu`` tests get CUDA back."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        patch.setattr(torch.cuda, "device_count", lambda: 0)
        patch.setenv(VISIBLE, "")
        yield


@pytest.fixture(autouse=True)
def _cuda_for_gpu_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``gpu`` test sees the GPUs, as do the processes it starts."""
    if not request.node.get_closest_marker("gpu"):
        return
    for name, real in CUDA_FUNCTIONS.items():
        monkeypatch.setattr(torch.cuda, name, real)
    if REAL_VISIBLE is None:
        monkeypatch.delenv(VISIBLE)
    else:
        monkeypatch.setenv(VISIBLE, REAL_VISIBLE)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> None:
    """Every test starts with one torch thread, whatever ran before it (``dept compare`` sets
    the cores' count): the models here are tiny, and with more threads than free cores each
    step waits on spinning threads (forward passes up to 20x slower measured on 2 busy cores)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _one_thread_in_every_process() -> Iterator[None]:
    """So does every process a test starts (a warm worker, a rank, a Ray actor): the tests
    compare the numbers of two paths bit for bit, and a process on a thread per core split
    its sums otherwise (a warm worker's bits per byte once differed from the in-process
    path's by 6e-3 on a loaded machine)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="session")
def node_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One node cache for the whole session (:func:`tests.helpers.share_cache`)."""
    return tmp_path_factory.mktemp("node-cache")


@pytest.fixture
def debug_config(tmp_path: Path) -> DeptConfig:
    return load_config(debug_run_config(tmp_path))


@pytest.fixture(autouse=True)
def _project_loggers_propagate() -> None:
    """Every test starts with the project's loggers as the core leaves them (propagating to
    the root, where ``caplog`` listens), whatever app an earlier test in this worker ran
    (:func:`dept.logs.route_to` gives them Flower's handlers and stops their propagation);
    a test that runs an app itself and reads its records takes :func:`project_log`."""
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


class ProjectLog(logging.Handler):
    """The project's records of one whole test, each once, whatever routes them (caplog's
    handler is another one per test phase, and sees them only while they propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def text(self) -> str:
        return "\n".join(record.getMessage() for record in self.records)


@pytest.fixture
def project_log(_project_loggers_propagate: None) -> Iterator[ProjectLog]:
    """The project's log records at INFO and above, even after an app routed them to
    Flower's handlers (:func:`dept.logs.route_to` stops their propagation to the root)."""
    loggers = [logging.getLogger(name) for name in PROJECT_LOGGERS]
    handler = ProjectLog()
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.fixture
def held_output(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """An output folder another living process holds, and that process's pid."""
    with held_elsewhere(tmp_path / "out") as pid:
        yield tmp_path / "out", pid
