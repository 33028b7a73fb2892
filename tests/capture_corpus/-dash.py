import sys
print("dash script", sys.argv[0])
