exec("def broken(:\n    pass")
