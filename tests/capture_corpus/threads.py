import threading
results = []
threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sorted(results))
