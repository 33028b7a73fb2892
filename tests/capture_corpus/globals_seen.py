import sys
names = sorted(globals())
print(names)
print(__name__, __package__, __spec__, type(__builtins__).__name__, type(__loader__).__name__)
print(__file__ == sys.argv[0] or __file__.endswith(sys.argv[0].lstrip("./")))
print(__doc__)
