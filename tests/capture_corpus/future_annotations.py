from __future__ import annotations

def f(a: SomethingUndefined) -> int:
    return 1

print(f.__annotations__, f(1))
