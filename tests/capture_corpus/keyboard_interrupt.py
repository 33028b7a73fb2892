print("about to be interrupted", flush=True)
raise KeyboardInterrupt
