import sys

def deep(n):
    return deep(n + 1)

try:
    deep(0)
except RecursionError:
    print("recursion limit", sys.getrecursionlimit())
