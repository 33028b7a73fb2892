import os
print(sorted(k for k in os.environ if k.startswith(("TORCH", "KINETO", "TORCHSCOPE"))))
