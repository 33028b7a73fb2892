import sys

def hook(kind, value, tb):
    print(f"custom hook: {kind.__name__}: {value}", file=sys.stderr)

sys.excepthook = hook
raise RuntimeError("handled by the hook")
