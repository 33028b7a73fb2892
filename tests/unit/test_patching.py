"""Class-attribute wrappers that come off exactly (capture/patching.py)."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import pytest

from torchscope.capture.machine import LoaderRegistry
from torchscope.capture.overhead import FetchTimer
from torchscope.capture.patching import Patch


def _tagging(tag: str, log: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, x: int) -> int:
            log.append(tag)
            return original(self, x)

        return wrapper

    return make


def _owner() -> type:
    class Base:
        def f(self, x: int) -> int:
            return x + 1

    class Owner(Base):
        def g(self, x: int) -> int:
            return x * 2

    return Owner


def test_a_wrapper_comes_off_leaving_the_original_object() -> None:
    owner, log = _owner(), []
    original = owner.__dict__["g"]
    patch = Patch(owner, "g", _tagging("a", log))
    patch.install()
    patch.install()  # twice: one wrapper
    assert owner().g(3) == 6 and log == ["a"] and patch.installed
    patch.uninstall()
    patch.uninstall()
    assert owner.__dict__["g"] is original and not patch.installed
    assert owner().g(3) == 6 and log == ["a"]


def test_an_inherited_attribute_is_deleted_again_not_copied_down() -> None:
    owner, log = _owner(), []
    patch = Patch(owner, "f", _tagging("a", log))
    patch.install()
    assert "f" in owner.__dict__ and owner().f(1) == 2 and log == ["a"]
    patch.uninstall()
    assert "f" not in owner.__dict__ and owner().f(1) == 2


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_stacked_wrappers_come_off_in_any_order(order: tuple[int, ...]) -> None:
    owner, log = _owner(), []
    original = owner.__dict__["g"]
    patches = [Patch(owner, "g", _tagging(tag, log)) for tag in "abc"]
    for patch in patches:
        patch.install()
    assert owner().g(1) == 2 and log == ["c", "b", "a"]  # the last installed is outermost
    left = list("abc")
    for index in order[:-1]:
        patches[index].uninstall()
        left.remove("abc"[index])
        log.clear()
        assert owner().g(1) == 2 and log == left[::-1]  # the others still run, in their order
    patches[order[-1]].uninstall()
    assert owner.__dict__["g"] is original


def test_a_factory_that_raises_installs_nothing() -> None:
    owner = _owner()
    original = owner.__dict__["g"]

    def broken(original: Callable[..., Any]) -> Callable[..., Any]:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        Patch(owner, "g", broken).install()
    assert owner.__dict__["g"] is original


def test_a_with_block_takes_the_wrapper_off_on_an_exception() -> None:
    owner, log = _owner(), []
    original = owner.__dict__["g"]
    with pytest.raises(ValueError), Patch(owner, "g", _tagging("a", log)):
        assert owner().g(1) == 2
        raise ValueError
    assert owner.__dict__["g"] is original and log == ["a"]


def test_a_foreign_patch_over_ours_is_left_alone_holding_ours() -> None:
    owner, log = _owner(), []
    patch = Patch(owner, "g", _tagging("a", log))
    patch.install()
    ours = owner.__dict__["g"]

    def foreign(self: Any, x: int) -> int:
        log.append("foreign")
        return ours(self, x)

    owner.g = foreign  # type: ignore[attr-defined]
    patch.uninstall()
    assert owner.__dict__["g"] is foreign  # theirs is not clobbered
    assert not patch.installed
    patch.install()  # and ours can go on again, over theirs
    log.clear()
    assert owner().g(1) == 2 and log == ["a", "foreign", "a"]
    patch.uninstall()
    assert owner.__dict__["g"] is foreign


def test_the_capture_wrappers_stack_on_dataloader_and_come_off_in_either_order() -> None:
    dataloader = pytest.importorskip("torch.utils.data.dataloader")
    iter_original = dataloader.DataLoader.__dict__["__iter__"]
    next_original = dataloader._BaseDataLoaderIter.__dict__["__next__"]
    for first_off in (0, 1):
        timers, registries = [FetchTimer(), FetchTimer()], [LoaderRegistry(), LoaderRegistry()]
        for timer, registry in zip(timers, registries):
            timer.install()
            registry.install()
        assert len(list(dataloader.DataLoader(list(range(4)), batch_size=2))) == 2
        assert all(timer.take()[0] > 0 for timer in timers)
        assert all(registry.loaders[0]["iterations"] == 1 for registry in registries)
        for index in (first_off, 1 - first_off):
            timers[index].uninstall()
            registries[index].uninstall()
        assert dataloader.DataLoader.__dict__["__iter__"] is iter_original
        assert dataloader._BaseDataLoaderIter.__dict__["__next__"] is next_original


def test_taking_off_the_outermost_makes_no_new_wrapper_below() -> None:
    owner, log, made = _owner(), [], []

    def counted(tag: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            made.append(tag)
            return _tagging(tag, log)(original)

        return make

    inner, outer = Patch(owner, "g", counted("inner")), Patch(owner, "g", counted("outer"))
    inner.install()
    outer.install()
    outer.uninstall()
    assert made == ["inner", "outer"]  # the inner wrapper kept, not remade
    outer.install()
    inner.uninstall()  # out of order: the outer one is made again, on the original
    assert made == ["inner", "outer", "outer", "outer"]
    log.clear()
    assert owner().g(1) == 2 and log == ["outer"]
    outer.uninstall()
