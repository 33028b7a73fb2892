import warnings
warnings.warn("careful now")
print("after")
