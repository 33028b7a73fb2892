import os
import signal

def handler(signum, frame):
    print("got", signal.Signals(signum).name)

signal.signal(signal.SIGUSR1, handler)
os.kill(os.getpid(), signal.SIGUSR1)
print("done")
