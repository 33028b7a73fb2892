import sys
sys.exit("bye: something went wrong")
