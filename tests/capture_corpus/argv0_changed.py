import sys
sys.argv[0] = "renamed"
print(sys.argv)
