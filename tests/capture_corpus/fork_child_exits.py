import os
import sys
pid = os.fork()
if pid == 0:
    print("child", flush=True)
    sys.exit(3)
_, status = os.waitpid(pid, 0)
print("parent saw", os.waitstatus_to_exitcode(status))
