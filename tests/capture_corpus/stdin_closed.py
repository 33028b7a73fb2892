import sys
print(repr(sys.stdin.read()))
