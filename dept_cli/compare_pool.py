"""Running a comparison's plans, ``jobs`` at a time in worker processes, with progress."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from multiprocessing import active_children, get_context
from typing import Any

from dept_cli.compare_plan import Plan
from dept_cli.comparison_report import average_bpb

RunPlan = Callable[[Plan], dict[str, Any]]  # one plan's normalised result, or its error


def _exit_with_parent() -> None:
    """Worker initializer: stop when the comparison process is gone (killed, crashed), so no
    orphaned run keeps the CPUs busy."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(2.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the runs under way and drop the rest. Ctrl-C in a terminal reaches the workers
    too; ``kill -INT`` of this process alone does not, and leaving the pool would wait for
    every running plan to finish training."""
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in active_children():
        worker.terminate()


def run_all(plans: list[Plan], jobs: int, run: RunPlan) -> list[dict[str, Any]]:
    """Run every plan by ``run`` (a module-level function: workers are spawned), ``jobs`` at
    a time, printing progress; results in plan order."""
    results: dict[int, dict[str, Any]] = {}
    started = time.perf_counter()

    def done(i: int, result: dict[str, Any]) -> None:
        results[i] = result
        elapsed = time.perf_counter() - started
        eta = elapsed / len(results) * (len(plans) - len(results))
        outcome = result.get("error") or f"avg val bpb {average_bpb(result):.4f}"
        print(
            f"[{len(results)}/{len(plans)}] {plans[i].label}: {outcome} "
            f"({result['wall_s']:.0f} s; {elapsed / 60:.1f} min elapsed, ETA {eta / 60:.1f} min)",
            flush=True,
        )

    if jobs == 1:
        for i, plan in enumerate(plans):
            done(i, run(plan))
    else:
        with ProcessPoolExecutor(
            jobs, mp_context=get_context("spawn"), initializer=_exit_with_parent
        ) as pool:
            futures: dict[Future, int] = {pool.submit(run, p): i for i, p in enumerate(plans)}
            try:
                for future in as_completed(futures):
                    i = futures[future]
                    try:
                        done(i, future.result())
                    except Exception as exc:  # the worker itself died
                        done(i, {"error": f"{type(exc).__name__}: {exc}", "wall_s": 0.0})
            except KeyboardInterrupt:
                _stop_workers(pool)
                raise
    # From the plan, so a worker that died and returned nothing still says what it ran.
    return [
        {"method": p.method, "lr": p.lr, **p.vocabularies, **results[i]}
        for i, p in enumerate(plans)
    ]
