print("x", end="")
