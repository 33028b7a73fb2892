import os
import sys
print(sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
print(sys.path[1:3] == [p for p in sys.path[1:3]])
