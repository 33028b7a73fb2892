"""`torchscope view`: a small local server over a directory of runs (a "logdir"), rendering each run's
dashboard on demand through the pipeline's caches. Paths are confined to the logdir."""
