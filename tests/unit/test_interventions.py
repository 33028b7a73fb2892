"""capture/interventions.py: fixes applied to unmodified code and removed afterwards (in-process, CPU)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from torchscope.capture.interventions import ZERO_GRAD_FIX, applicable, applied
from torchscope.report.model import Fix


def test_dataloader_keywords_are_forced_and_those_needing_workers_dropped_without_them() -> None:
    data = list(range(8))
    with applied([Fix(kind="dataloader_kwarg", target="num_workers", value=2),
                  Fix(kind="dataloader_kwarg", target="persistent_workers", value=True),
                  Fix(kind="dataloader_kwarg", target="pin_memory", value=True)]):
        loader = DataLoader(data, batch_size=4)
        assert loader.num_workers == 2 and loader.persistent_workers is True
        assert loader.pin_memory is (torch.cuda.is_available())  # pinning needs an accelerator
    assert DataLoader(data).num_workers == 0  # removed afterwards
    with applied([Fix(kind="dataloader_kwarg", target="prefetch_factor", value=4)]):
        assert DataLoader(data, batch_size=4).prefetch_factor is None  # no workers: dropped, not an error


def test_optimizer_keywords_reach_the_optimizers_that_take_them() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    with applied([Fix(kind="optimizer_kwarg", target="foreach", value=True)]):
        assert torch.optim.Adam(params, foreach=False).defaults["foreach"] is True
        assert torch.optim.SGD(params, lr=0.1).defaults["foreach"] is True
    assert torch.optim.Adam(params, foreach=False).defaults["foreach"] is False
    assert "__init__" in torch.optim.Adam.__dict__  # Adam's own __init__ is back


def test_zero_grad_sets_gradients_to_none_and_flags_are_restored() -> None:
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    optimizer = torch.optim.SGD([param], lr=0.1)
    threads = torch.get_num_threads()
    with applied([Fix(kind="code_change", target=ZERO_GRAD_FIX), Fix(kind="torch_flag", target="torch.set_num_threads", value=1)]):
        optimizer.zero_grad(set_to_none=False)
        assert param.grad is None
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    param.grad = torch.ones(2)
    optimizer.zero_grad(set_to_none=False)
    assert param.grad is not None and float(param.grad.sum()) == 0.0


def test_the_scripts_own_set_num_threads_does_not_undo_the_trials_threads() -> None:
    from torch.utils.data._utils import worker
    from torchscope.capture import interventions

    interventions.sites.clear()
    threads, original = torch.get_num_threads(), torch.set_num_threads
    fix = Fix(kind="torch_flag", target="torch.set_num_threads", value=1)
    with applied([fix]):
        torch.set_num_threads(2); line = _line()  # noqa: E702  (a script that sets its own threads)
        assert torch.get_num_threads() == 1
        # torch's own calls pass: a DataLoader worker sets 1 thread from torch's worker loop.
        exec(compile("torch.set_num_threads(2)", worker.__file__, "exec"), {"torch": torch})
        assert torch.get_num_threads() == 2
    assert torch.set_num_threads is original and torch.get_num_threads() == threads
    assert interventions.sites["torch_flag:torch.set_num_threads"] == {"process-wide", f"{__file__}:{line}"}
    torch.set_num_threads(1)  # removed afterwards: the script's calls count again
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)


def test_only_fixes_that_need_no_code_edit_are_applicable() -> None:
    assert applicable(Fix(kind="dataloader_kwarg", target="num_workers", value=2))
    assert not applicable(Fix(kind="dataloader_kwarg", target="num_workers", value=None))  # to be chosen
    assert applicable(Fix(kind="code_change", target="torch.compile", value="model = torch.compile(model)"))
    assert not applicable(Fix(kind="code_change", target="CUDA graphs", value="model = torch.compile(model, mode='reduce-overhead')"))
    assert applicable(Fix(kind="torch_flag", target="torch.backends.cudnn.benchmark", value=True))
    assert not applicable(Fix(kind="env_var", target="PYTORCH_CUDA_ALLOC_CONF", value="expandable_segments:True"))


def test_each_change_records_the_users_call_site_and_alternatives_exclude_each_other() -> None:
    from torchscope.capture import interventions

    interventions.sites.clear()
    params = [torch.nn.Parameter(torch.zeros(2))]

    class MyLoader(DataLoader):  # a subclass: the site is the line that builds it, not its super().__init__
        def __init__(self, data: list[int]) -> None:
            super().__init__(data, batch_size=2)

    with applied([Fix(kind="dataloader_kwarg", target="num_workers", value=2),
                  Fix(kind="optimizer_kwarg", target="fused", value=True)]):
        MyLoader(list(range(4))); line = _line()  # noqa: E702
        optimizer = torch.optim.Adam(params, foreach=True)  # both True would raise: the user's foreach is dropped
    assert optimizer.defaults["fused"] is True and not optimizer.defaults["foreach"]
    assert interventions.sites["dataloader_kwarg:num_workers"] == {f"{__file__}:{line}"}
    assert interventions.sites["optimizer_kwarg:fused"] == {f"{__file__}:{line + 1}"}
    with applied([Fix(kind="dataloader_kwarg", target="num_workers", value=0)]):
        DataLoader(list(range(4)), num_workers=0)  # nothing changed: nothing recorded
    assert "dataloader_kwarg:num_workers" in interventions.sites and len(interventions.sites["dataloader_kwarg:num_workers"]) == 1


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def test_autocast_covers_the_outermost_module_call_only_while_applied() -> None:
    from torchscope.capture import interventions

    interventions.sites.clear()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    fix = Fix(kind="code_change", target="torch.autocast", value="bfloat16")
    assert applicable(fix)
    with applied([fix]):
        out = model(x); line = _line()  # noqa: E702
        assert out.dtype == torch.bfloat16  # the inner Linear ran under autocast too
        out.float().sum().backward()  # backward outside autocast, as the AMP recipe has it
    assert model(x).dtype == torch.float32
    assert interventions.sites["code_change:torch.autocast"] == {f"{__file__}:{line}"}


def test_channels_last_converts_a_convolutional_model_and_its_inputs_keeping_its_parameters() -> None:
    from torchscope.capture import interventions

    interventions.sites.clear()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    params = list(model.parameters())
    seen: list[bool] = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    with applied([Fix(kind="code_change", target="channels_last", value="model.to(memory_format=torch.channels_last)")]):
        model(torch.randn(2, 3, 8, 8))
    assert seen == [True] and [id(p) for p in model.parameters()] == [id(p) for p in params]  # the optimizer's parameters are still the model's
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert list(interventions.sites) == ["code_change:channels_last"]


def test_compile_time_is_the_first_calls_excess_over_the_steady_ones() -> None:
    from torchscope.capture.interventions import compile_seconds

    assert compile_seconds([5.0, 0.1, 0.1, 0.3], [2.0, 0.2, 0.2]) == 4.9 + 1.8
    assert compile_seconds([0.1, 0.2, 0.2], []) == 0.0  # nothing compiled: the first call is no slower
    assert compile_seconds([5.0], [2.0]) is None  # no steady call to hold it to


def test_cuda_only_fixes_are_applied_in_a_trial_through_a_cuda_stand_in(monkeypatch: object) -> None:
    """No CUDA here: `torch.cuda.is_available` stands in for a device. The trial's own wrapper
    (`applied_with_losses`) forces pin_memory in the script's DataLoader and sets the cuDNN and TF32
    flags for the run, and puts all back afterwards."""
    from torchscope.capture.interventions import needs_cuda
    from torchscope.capture.trial import applied_with_losses

    fixes = [Fix(kind="dataloader_kwarg", target="pin_memory", value=True),
             Fix(kind="torch_flag", target="torch.backends.cudnn.benchmark", value=True),
             Fix(kind="torch_flag", target="torch.backends.cuda.matmul.allow_tf32", value=True),
             Fix(kind="torch_flag", target="torch.backends.cudnn.allow_tf32", value=False)]
    assert all(applicable(f) and needs_cuda(f) for f in fixes)
    assert not needs_cuda(Fix(kind="dataloader_kwarg", target="num_workers", value=2))
    before = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # type: ignore[attr-defined]
    seen = []
    with applied_with_losses(fixes, []):
        loader = DataLoader(list(range(8)), batch_size=4)  # as the script would build it
        seen = [loader.pin_memory, torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32]
    assert seen == [True, True, True, False]
    assert (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert DataLoader(list(range(8))).pin_memory is False
    # A function is not a setting: the diagnosis's sync-debug diagnostic is never a trial.
    assert not applicable(Fix(kind="torch_flag", target="torch.cuda.set_sync_debug_mode", value="warn"))


def test_every_patch_comes_off_exactly_also_on_an_exception() -> None:
    """All the class patches at once (three of them stacked on nn.Module.__call__), then an error inside."""
    owners = [(DataLoader, "__init__"), (torch.optim.Optimizer, "zero_grad"), (torch.nn.Module, "__call__")]
    owners += [(cls, "__init__") for cls in vars(torch.optim).values() if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)]
    before = {(cls, name): cls.__dict__.get(name) for cls, name in owners}
    fixes = [Fix(kind="dataloader_kwarg", target="num_workers", value=0),
             Fix(kind="optimizer_kwarg", target="foreach", value=True),
             Fix(kind="code_change", target=ZERO_GRAD_FIX, value=ZERO_GRAD_FIX),
             Fix(kind="code_change", target="torch.autocast", value="bfloat16"),
             Fix(kind="code_change", target="channels_last", value="channels_last"),
             Fix(kind="code_change", target="torch.compile", value="model = torch.compile(model)")]
    try:
        with applied(fixes):
            call = torch.nn.Module.__call__
            assert call is not before[(torch.nn.Module, "__call__")] and call.__wrapped__.__wrapped__.__wrapped__ is before[(torch.nn.Module, "__call__")]
            raise KeyError("inside the trial")
    except KeyError:
        pass
    assert {(cls, name): cls.__dict__.get(name) for cls, name in owners} == before
