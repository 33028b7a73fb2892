import sys
print("package main", sorted(globals()), __spec__.name, sys.argv[1:])
