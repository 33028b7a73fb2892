"""Data-loading advice that fits the machine (diagnose/rules_input.py `advise` and data_loading.exposed):
cores per rank, the intra-op threads compute runs on, the loader's own num_workers, whether the loading
waits or computes, pin_memory only with a device, and __getitem__'s costly calls named from the stacks."""

from __future__ import annotations

from typing import Any

import pytest

from test_rules_support import finding, fixes, gpu, report
from torchscope.diagnose.rules_input import MAX_SUGGESTED_WORKERS, Machine, advise
from torchscope.report.measurements import DataLoader, Getitem, Measurements, ProfilerOverhead

MS = 1000.0


def _machine(**fields: Any) -> Machine:
    base: dict[str, Any] = {"cores_per_rank": 2, "threads": 2, "workers": 0, "device": False, "waiting": False}
    return Machine(**{**base, **fields})


def test_two_cores_both_computing_a_worker_only_for_a_thread_when_loading_dominates() -> None:
    # Loading 30 ms, compute 10 ms on 2 threads: one worker on one core, compute on the other (~20 ms).
    advice = advise(_machine(), data_us=30 * MS, step_us=40 * MS)
    assert (advice.workers, advice.threads) == (1, 1)
    assert advice.predicted_step_us == 30 * MS
    # Loading 10 ms, compute 30 ms: giving up a thread slows compute to ~60 ms; no worker.
    advice = advise(_machine(), data_us=10 * MS, step_us=40 * MS)
    assert advice.workers is None and "take its core from compute" in advice.reason


def test_spare_cores_bound_the_workers_and_an_equal_count_is_not_raised() -> None:
    # 8 cores, compute on 2 threads: 6 spare; loading 3x compute wants 2 * 3 = 6 workers.
    assert advise(_machine(cores_per_rank=8), data_us=30 * MS, step_us=40 * MS).workers == 6
    assert advise(_machine(cores_per_rank=4), data_us=30 * MS, step_us=40 * MS).workers == 2  # only 2 spare
    # Never "raise num_workers to N" when it already is >= N.
    kept = advise(_machine(cores_per_rank=4, workers=2), data_us=30 * MS, step_us=40 * MS)
    assert kept.workers is None and "already uses" in kept.reason
    kept = advise(_machine(cores_per_rank=4, workers=4), data_us=30 * MS, step_us=40 * MS)
    assert kept.workers is None
    # No spare core at all: said as such, not as "uses the 0 spare core(s)".
    full = advise(_machine(workers=2), data_us=30 * MS, step_us=40 * MS)
    assert full.workers is None and full.reason == (
        "no core is free beside compute's 2 intra-op thread(s) on 2 core(s), and num_workers=2 already compete with it"
    )


def test_waiting_loading_gets_workers_without_spare_cores() -> None:
    advice = advise(_machine(waiting=True), data_us=45 * MS, step_us=50 * MS)
    assert advice.workers is not None and advice.workers >= 2 and advice.threads is None


def test_a_gpu_rank_keeps_one_core_for_the_main_process() -> None:
    assert _machine(cores_per_rank=8, threads=8, device=True).spare_cores == 7
    assert _machine(cores_per_rank=8, threads=8, device=False).spare_cores == 0


def _run(environment: dict[str, Any], measurements: Measurements | None = None, **kwargs: Any) -> Any:
    rep = report(
        measurements=measurements or Measurements(dataloader=DataLoader(single_process_fetches=8)),
        breakdown={"data_loading": 0.6, "forward": 0.2, "backward": 0.2},
        phases={"data_loading": 0.6, "forward": 0.2, "backward": 0.2},
        manifest={"environment": environment},
        **kwargs,
    )
    return finding(rep, "data_loading.exposed")


TWO_CORES = {"cpu_count": 2, "local_world_size": 1, "torch_num_threads": 2}


def test_rule_on_two_cores_trades_a_thread_for_a_worker_and_says_so_in_data() -> None:
    f = _run({**TWO_CORES, "dataloaders": [{"num_workers": 0, "pin_memory": False, "iterations": 1}]})
    assert fixes(f) == {"num_workers": ("dataloader_kwarg", 1), "torch.set_num_threads": ("torch_flag", 1)}
    assert "num_workers=1" in f.recommendation and "torch.set_num_threads(1)" in f.recommendation
    assert "pin_memory" not in f.recommendation  # no accelerator: pinning does nothing
    assert "persistent_workers" not in f.recommendation  # iterated once: nothing to keep alive


def test_rule_names_the_costly_calls_of_getitem() -> None:
    getitem = Getitem(
        frames=["__getitem__ (fakedata.py:40)"],
        calls_per_step=32,
        getitem_us_per_step=5000.0,
        calls_us_per_step={"torch.manual_seed": 2150.0, "to_pil_image (functional.py:250)": 1500.0, "len": 10.0},
    )
    measurements = Measurements(dataloader=DataLoader(single_process_fetches=8), getitem=getitem)
    f = _run({**TWO_CORES, "torch_num_threads": 1}, measurements)  # 1 thread: 1 spare core
    assert "__getitem__ (fakedata.py:40): torch.manual_seed 43 %, to_pil_image (functional.py:250) 30 %" in f.recommendation
    assert "len" not in f.recommendation.split("recorded stacks")[1]  # under 5 % of __getitem__
    assert fixes(f)["Dataset.__getitem__"][0] == "code_change"


def test_rule_pins_memory_only_with_a_device_and_not_twice() -> None:
    env = {"cpu_count": 16, "torch_num_threads": 8}
    f = _run({**env, "dataloaders": [{"num_workers": 0, "pin_memory": False}]}, device=gpu())
    assert "pin_memory" in fixes(f)
    f = _run({**env, "dataloaders": [{"num_workers": 0, "pin_memory": True}]}, device=gpu())
    assert "pin_memory" not in fixes(f)
    f = _run({**env, "dataloaders": [{"num_workers": 0, "pin_memory": False}]})
    assert "pin_memory" not in fixes(f)


def test_rule_reads_waiting_from_cpu_per_wall_unless_others_took_the_cpus() -> None:
    quiet = {**TWO_CORES, "contention": {"process_cpu_per_wall": 0.1, "other_share": 0.02}}
    f = _run(quiet)
    assert f.evidence["loading_waits"] is True and fixes(f)["num_workers"][1] >= 2
    busy = {**TWO_CORES, "contention": {"process_cpu_per_wall": 0.1, "other_share": 0.6}}
    assert _run(busy).evidence["loading_waits"] is False  # descheduled, not waiting: no claim


def test_rule_uses_the_share_without_the_profilers_overhead() -> None:
    overhead = ProfilerOverhead(
        method="fetch_clock",
        unprofiled_step_us=6000.0,
        profiled_step_us=10_000.0,
        corrected_percent={"data_loading": 30.0, "forward": 35.0, "backward": 35.0},
    )
    measurements = Measurements(dataloader=DataLoader(single_process_fetches=8), profiler_overhead=overhead)
    f = _run(TWO_CORES, measurements)
    assert f.time_share == 0.3  # not the recorded 0.6
    assert f.evidence["exposed_us_per_step"] == 1800.0  # 30 % of the unprofiled 6 ms step


def test_rule_reads_waiting_from_the_fetches_own_cpu_time_first() -> None:
    # Fetches that used a CPU 5 % of their time while the rest of the step used 1.6: the loading sleeps or
    # waits on I/O, even on a busy machine (the comparison with the rest of the step cancels the contention).
    waits = {**TWO_CORES, "step_times": {"fetch_cpu_per_wall": 0.05, "rest_cpu_per_wall": 1.6},
             "contention": {"process_cpu_per_wall": 0.9, "other_share": 0.7}}
    f = _run(waits)
    assert f.evidence["loading_waits"] is True and fixes(f)["num_workers"][1] >= 2
    computes = {**TWO_CORES, "step_times": {"fetch_cpu_per_wall": 0.6, "rest_cpu_per_wall": 0.9}}
    assert _run(computes).evidence["loading_waits"] is False


def test_a_fetch_that_kept_both_threads_busy_gets_no_worker_on_two_cores() -> None:
    # The demo's figures (2 cores, 2 intra-op threads): loading 47 ms of a 60 ms step at CPU/wall 1.99, the
    # rest at 1.96. A worker runs one intra-op thread: a batch costs it up to 47 * 1.99 = 94 ms, slower than
    # the whole step now, and no worker/thread split beats 60 ms.
    demo = _machine(fetch_cpu_per_wall=1.99, compute_cpu_per_wall=1.96)
    advice = advise(demo, data_us=47 * MS, step_us=60 * MS)
    assert advice.workers is None and advice.threads is None
    assert "take its core from compute" in advice.reason and "93.5 ms" in advice.reason
    # The same loading on one thread (CPU/wall 1): the worker fetches as fast as the main process, and one
    # worker for one of compute's threads predicts max(47, 13 * 2) = 47 ms: advised.
    single = advise(_machine(fetch_cpu_per_wall=1.0, compute_cpu_per_wall=1.96), data_us=47 * MS, step_us=60 * MS)
    assert (single.workers, single.threads) == (1, 1) and single.predicted_step_us == 47 * MS


def test_a_computing_fetch_gets_workers_only_on_cores_free_of_compute() -> None:
    # 8 cores, 2 intra-op threads: 6 free. The fetch kept 2 threads busy (94 ms a batch in a worker): the
    # 13 ms of compute needs 8 workers to keep up, 6 fit (94 / 6 = 15.7 ms; all the work, 26 + 94 ms, fits 8
    # cores in 15 ms); compute keeps its threads. On 4 cores, 3 workers and one thread for compute (26 ms)
    # beat 2 workers beside 2 threads: 94 / 3 = 31 ms against 47 ms.
    advice = advise(_machine(cores_per_rank=8, fetch_cpu_per_wall=2.0, compute_cpu_per_wall=2.0), 47 * MS, 60 * MS)
    assert (advice.workers, advice.threads) == (6, None)
    assert advice.predicted_step_us == pytest.approx(94 * MS / 6)
    advice = advise(_machine(cores_per_rank=4, fetch_cpu_per_wall=2.0, compute_cpu_per_wall=2.0), 47 * MS, 60 * MS)
    assert (advice.workers, advice.threads, advice.predicted_step_us) == (3, 1, pytest.approx(94 * MS / 3))


def test_a_sleeping_fetch_gets_more_workers_than_cores_and_says_why() -> None:
    # slow_getitem's figures: the fetches used a CPU 3 % of their time (time.sleep); 48 ms of a 50 ms step.
    sleeping = _machine(waiting=True, fetch_cpu_per_wall=0.03, compute_cpu_per_wall=1.9)
    advice = advise(sleeping, data_us=48 * MS, step_us=50 * MS)
    assert advice.workers == MAX_SUGGESTED_WORKERS and advice.threads is None
    assert "more workers than the 2 core(s)" in advice.reason and "almost no CPU" in advice.reason
    assert advice.predicted_step_us == 6 * MS  # 48 / 8 ms a batch, above the 2 ms of compute


DEMO_TIMES = {"step_times": {"fetch_cpu_per_wall": 1.99, "rest_cpu_per_wall": 1.96}}


def test_rule_gives_a_cpu_bound_fetch_on_two_cores_no_worker_but_names_getitem() -> None:
    getitem = Getitem(frames=["__getitem__ (demo_train.py:39)"], calls_per_step=32, getitem_us_per_step=40_000.0,
                      calls_us_per_step={"avg_pool2d": 22_000.0, "torch.rand": 5_600.0})
    measurements = Measurements(dataloader=DataLoader(single_process_fetches=8), getitem=getitem)
    f = _run({**TWO_CORES, **DEMO_TIMES, "dataloaders": [{"num_workers": 0, "iterations": 1}]}, measurements)
    assert "num_workers" not in fixes(f) and "torch.set_num_threads" not in fixes(f)
    assert fixes(f)["Dataset.__getitem__"][0] == "code_change"
    assert "More workers would not help: a worker would take its core from compute" in f.recommendation
    assert "avg_pool2d 55 %" in f.recommendation
    assert f.evidence["predicted_step_us"] is None


def test_rule_counts_the_cores_of_a_rank_among_the_ranks_of_its_node() -> None:
    # 16 CPUs: 8 ranks get 2 cores each, too few for a worker beside 2 intra-op threads; 2 ranks get 8.
    node = {"cpu_count": 16, "torch_num_threads": 2, **DEMO_TIMES, "dataloaders": [{"num_workers": 0, "iterations": 1}]}
    crowded = _run({**node, "local_world_size": 8})
    assert crowded.evidence["cores_per_rank"] == 2 and "num_workers" not in fixes(crowded)
    roomy = _run({**node, "local_world_size": 2})
    assert roomy.evidence["cores_per_rank"] == 8 and fixes(roomy)["num_workers"][1] >= 2
    assert "torch.set_num_threads" not in fixes(roomy)  # the workers have free cores: compute keeps its threads


def test_the_demo_hint_follows_the_finding(tmp_path: Any) -> None:
    import json

    from torchscope.cli.demo import advised_hint

    path = tmp_path / "report.json"
    fix = {"kind": "dataloader_kwarg", "target": "num_workers", "value": 1}
    threads = {"kind": "torch_flag", "target": "torch.set_num_threads", "value": 1}
    getitem = {"kind": "code_change", "target": "Dataset.__getitem__", "value": "__getitem__ (demo_train.py:39): ..."}
    path.write_text(json.dumps({"findings": [{"id": "data_loading.exposed", "fixes": [fix, threads, getitem]}]}))
    assert advised_hint(path).endswith("demo_train --num-workers 1 --threads 1`")
    path.write_text(json.dumps({"findings": [{"id": "data_loading.exposed", "fixes": [getitem]}]}))
    assert "cheaper __getitem__, not workers" in advised_hint(path)
    assert "see the report" in advised_hint(tmp_path / "missing.json")


def test_a_busy_machine_reads_the_fetch_relative_to_the_rest_of_the_step() -> None:
    # Load 10 on 2 CPUs: the fetches ran at CPU/wall 0.6 and the rest at 0.55, both descheduled alike. Read
    # as they are, the fetch would look single-threaded and a worker as fast as the main process; read
    # relative to the rest, it kept both threads busy: no worker.
    busy = {**TWO_CORES, "step_times": {"fetch_cpu_per_wall": 0.6, "rest_cpu_per_wall": 0.55},
            "contention": {"load_average_1m": 10.0}, "dataloaders": [{"num_workers": 0, "iterations": 1}]}
    assert "num_workers" not in fixes(_run(busy))
    quiet = {**busy, "contention": {"load_average_1m": 1.2}}  # as recorded: a fetch on one thread of two
    assert fixes(_run(quiet))["num_workers"][1] == 1
