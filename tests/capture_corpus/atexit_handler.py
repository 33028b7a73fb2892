import atexit
atexit.register(lambda: print("atexit ran"))
print("body")
