# args: one --two -3 "four five"
import sys
print(sys.argv)
