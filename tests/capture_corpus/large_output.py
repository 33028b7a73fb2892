for i in range(20000):
    print(i, "x" * 20)
