"""`analyze(..., cluster=ADDRESS)` extracts the ranks on a Dask cluster of two workers that the test starts
itself, with a Report identical to the local process pool's; an unreachable scheduler is one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterator

import pytest

pytestmark = pytest.mark.slow  # a Dask cluster of two worker processes starts in seconds

from torchscope.errors import InputError
from torchscope.pipeline.analyze import analyze
from torchscope.report.model import encode_report

if importlib.util.find_spec("distributed") is None:
    pytest.skip("the cluster extra is not installed: pip install 'torchscope[cluster]'", allow_module_level=True)

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.fixture(scope="module")
def scheduler() -> Iterator[tuple[str, object]]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield cluster.scheduler_address, client


def test_two_workers_give_the_local_pools_report(scheduler: tuple[str, object]) -> None:
    from distributed import get_task_stream

    address, client = scheduler
    run = TRACES / "hta_two_ranks_nccl"
    with get_task_stream(client) as stream:
        on_cluster = analyze(run, cluster=address, use_cache=False)
    # At once again on the same long-lived cluster, while the scheduler may still be forgetting the first
    # analysis's data (scattering it again under the same content-hash key is a known Dask race).
    again = analyze(run, cluster=address, use_cache=False)
    local = analyze(run, jobs=2, use_cache=False)
    ran = [t for t in stream.data if str(t["key"]).startswith("_extract_or_error")]
    assert len(ran) == 2 and len({t["worker"] for t in ran}) >= 1  # one task per rank, on the test's workers
    assert on_cluster.distributed.present and len(on_cluster.distributed.ranks) == 2
    assert encode_report(on_cluster) == encode_report(local) == encode_report(again)


def test_an_unreachable_scheduler_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscope.pipeline import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(InputError, match="cannot reach the Dask scheduler"):
        analyze(TRACES / "hta_two_ranks_nccl", cluster="tcp://127.0.0.1:9")


def test_tasks_in_flight_stay_bounded_as_ranks_grow(scheduler: tuple[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks are submitted as earlier ones complete, so the cluster never holds more than a window of them
    (submitting all at once handed every rank's task to the workers: their memory grew with the rank count)."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    from torchscope.pipeline import cluster

    class MostAlive(SchedulerPlugin):  # the largest number of rank tasks the scheduler held at once
        name = "most-alive-rank-tasks"

        def __init__(self) -> None:
            self.alive: set[str] = set()
            self.most = 0

        def transition(self, key: object, start: str, finish: str, *args: object, **kwargs: object) -> None:
            if not str(key).startswith("_extract_or_error"):
                return
            (self.alive.discard if finish in ("released", "forgotten", "memory") else self.alive.add)(str(key))
            self.most = max(self.most, len(self.alive))

    address, client = scheduler
    spec = importlib.util.spec_from_file_location("ranks_scale", Path(__file__).resolve().parents[2] / "benchmarks" / "ranks_scale.py")
    assert spec is not None and spec.loader is not None
    ranks_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ranks_scale)
    ranks_scale.write_ranks(tmp_path, 12)
    monkeypatch.setattr(cluster, "IN_FLIGHT_PER_THREAD", 1)
    plugin = MostAlive()
    client.register_plugin(plugin)  # type: ignore[attr-defined]
    on_cluster = analyze(tmp_path, cluster=address, use_cache=False)
    held = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[MostAlive.name].most)  # type: ignore[attr-defined]
    assert len(on_cluster.distributed.ranks) == 12
    assert 1 <= held <= 2  # window: 1 per thread x 2 threads, out of 12 ranks
    assert encode_report(on_cluster) == encode_report(analyze(tmp_path, jobs=2, use_cache=False))
