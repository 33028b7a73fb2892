"""Wrappers on class attributes that come off exactly: the capture's patches of torch's own classes
(``DataLoader.__iter__``, ``_BaseDataLoaderIter.__next__``) must leave the user's process as they found it.

A :class:`Patch` is one wrapper on ``owner.attribute``. Patches on the same attribute stack in install
order; removing one, in any order, rebuilds the chain from the remembered original, and removing the last
puts back exactly what was there (the same object, or nothing when the attribute was inherited). A
wrapper factory that raises installs nothing. Only a patch made by someone else on top of ours (code that
does not use this module) stops a rebuild: that patch holds our wrapper, so ours stays in its chain and
must pass the call through once uninstalled (the factories' wrappers check their owner's flag).
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Callable, Optional

Wrapper = Callable[..., Any]
_MISSING = object()
_LOCK = threading.Lock()


class _Slot:
    """The patches on one attribute: what was there before the first, and what we last set."""

    def __init__(self, owner: Any, attribute: str) -> None:
        self.owner, self.attribute = owner, attribute
        self.original = owner.__dict__.get(attribute, _MISSING)  # _MISSING: inherited, restore by deleting
        self.base = self.original if self.original is not _MISSING else getattr(owner, attribute)
        self.layers: list[Patch] = []
        self.top: Any = self.original

    def ours(self) -> bool:
        """Whether the attribute is still what we last set (nobody patched over it)."""
        return self.owner.__dict__.get(self.attribute, _MISSING) is self.top

    def rebuild(self, layers: list[Patch]) -> None:
        """Put `layers` on the original, bottom first; all wrappers are made before anything is set, and a
        layer whose layer below is unchanged keeps its wrapper (the last off, the usual case, makes none)."""
        wrapped, built = self.base, []
        for layer in layers:
            below = wrapped
            wrapped = layer._built if layer._below is below and layer._built is not None else layer.make_wrapper(below)
            built.append((layer, below, wrapped))
        for layer, below, wrapper in built:
            layer._below, layer._built = below, wrapper
        if not layers and self.original is _MISSING:
            if self.attribute in self.owner.__dict__:
                delattr(self.owner, self.attribute)
        else:
            setattr(self.owner, self.attribute, wrapped if layers else self.original)
        self.layers, self.top = layers, (wrapped if layers else self.original)


_SLOTS: dict[tuple[int, str], _Slot] = {}


class Patch:
    """``make_wrapper(original)`` installed on ``owner.attribute`` until :meth:`uninstall` (or the end of
    a ``with`` block, also on an exception). ``make_wrapper`` is called again when a patch below ours
    comes off first, so it must only build the wrapper: state the wrapper keeps lives outside it."""

    def __init__(self, owner: Any, attribute: str, make_wrapper: Callable[[Wrapper], Wrapper]) -> None:
        self.owner, self.attribute, self.make_wrapper = owner, attribute, make_wrapper
        self._below: Any = None  # what our wrapper wraps, and the wrapper: reused while that stays
        self._built: Optional[Wrapper] = None

    @property
    def installed(self) -> bool:
        slot = _SLOTS.get((id(self.owner), self.attribute))
        return slot is not None and self in slot.layers

    def install(self) -> None:
        """Wrap the attribute (a no-op when installed). Raises what ``make_wrapper`` raises, changing nothing."""
        key = (id(self.owner), self.attribute)
        with _LOCK:
            slot = _SLOTS.get(key)
            if slot is not None and self in slot.layers:
                return
            if slot is None or not slot.ours():  # first patch, or ours are buried under someone else's
                slot = _Slot(self.owner, self.attribute)
            self._below = self._built = None
            slot.rebuild(slot.layers + [self])
            _SLOTS[key] = slot

    def uninstall(self) -> None:
        """Take this wrapper off; the others on the attribute stay, in their order."""
        key = (id(self.owner), self.attribute)
        with _LOCK:
            slot = _SLOTS.get(key)
            if slot is None or self not in slot.layers:
                return
            remaining = [layer for layer in slot.layers if layer is not self]
            if slot.ours():
                slot.rebuild(remaining)
            else:  # someone patched over ours and holds our wrapper: it stays there, passing through
                slot.layers = remaining
            if not slot.layers:
                del _SLOTS[key]

    def __enter__(self) -> Patch:
        self.install()
        return self

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.uninstall()
