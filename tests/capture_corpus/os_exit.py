import os
print("leaving", flush=True)
os._exit(5)
