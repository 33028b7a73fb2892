"""Naming the statement of a recorded Python frame that made a call (analysis/source_lines.py): the
tracer records a function's first line (or the running line of a frame active when profiling started);
the source tells which line made the call, when exactly one did."""

from __future__ import annotations

import json
import os
from pathlib import Path

from torchscope.analysis.source_lines import call_line, frame_at_call, function_start, source_roots

SOURCE = '''import torch
keep = []


def step(model, x):
    y = model(x).sum()
    keep.append(torch.ones(4))
    def inner():
        return torch.zeros(2)
    return y + torch.zeros(1).sum() + inner().sum()


@staticmethod
def twice():
    a = torch.rand(2)
    b = torch.rand(2)
    return a + b


for _ in range(3):
    step(torch.nn.Identity(), torch.zeros(1))
'''
ONES = "<built-in method ones of type object at 0x7f00>"
ZEROS = "<built-in method zeros of type object at 0x7f00>"


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    return path


def test_the_line_that_calls_the_callee_replaces_the_first_line(tmp_path: Path) -> None:
    path = str(_write(tmp_path))
    assert frame_at_call(f"{path}(5): step", ONES) == f"{path}(7): step"
    assert call_line(path, 5, "step", "zeros") == 10  # inner()'s torch.zeros is inner's frame, not step's
    assert call_line(path, 8, "inner", "zeros") == 9


def test_a_frame_named_by_its_running_line_is_found_by_the_function_holding_it(tmp_path: Path) -> None:
    path = str(_write(tmp_path))
    assert frame_at_call(f"{path}(6): step", ONES) == f"{path}(7): step"


def test_decorated_functions_start_at_their_first_decorator_and_two_calls_are_not_guessed(tmp_path: Path) -> None:
    path = str(_write(tmp_path))
    rand = "<built-in method rand of type object at 0x7f00>"
    assert call_line(path, 13, "twice", "rand") is None  # called on two lines: not guessed
    assert frame_at_call(f"{path}(13): twice", rand) == f"{path}(13): twice"


def test_module_level_code_and_user_functions_as_callees(tmp_path: Path) -> None:
    path = str(_write(tmp_path))
    assert frame_at_call(f"{path}(1): <module>", f"{path}(5): step") == f"{path}(21): <module>"


def test_nothing_is_guessed_without_the_source_or_a_name(tmp_path: Path) -> None:
    path = str(_write(tmp_path))
    assert frame_at_call("elsewhere.py(5): step", ONES) == "elsewhere.py(5): step"  # no file
    assert frame_at_call(f"{path}(5): step", "nn.Module: Linear_0") == f"{path}(5): step"  # a module: any attribute
    assert frame_at_call(f"{path}(30): gone", ONES) == f"{path}(30): gone"  # the function is not there any more
    (tmp_path / "broken.py").write_text("def step(:\n")
    assert frame_at_call(f"{tmp_path / 'broken.py'}(1): step", ONES) == f"{tmp_path / 'broken.py'}(1): step"


def test_relative_frame_paths_are_found_through_the_runs_manifest(tmp_path: Path) -> None:
    code = tmp_path / "project"
    code.mkdir()
    _write(code)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema_version": 1, "command": ["train.py", "--lr", "1"], "cwd": str(code)}))
    trace = run / "host_1.pt.trace.json"
    trace.write_text("{}")
    roots = source_roots(str(trace))
    assert str(code) in roots
    assert frame_at_call("train.py(5): step", ONES, roots) == "train.py(7): step"
    assert frame_at_call("train.py(5): step", ONES, ()) == "train.py(5): step"  # a bare trace: no roots


def test_a_running_line_is_moved_to_its_functions_first_line(tmp_path: Path) -> None:
    path = str(_write(tmp_path))
    assert function_start(f"{path}(6): step") == f"{path}(5): step"
    assert function_start(f"{path}(15): twice") == f"{path}(13): twice"  # the decorator's line, as co_firstlineno
    assert function_start(f"{path}(21): <module>") == f"{path}(21): <module>"  # module code has no def
    assert function_start("missing.py(6): step") == "missing.py(6): step"


def test_a_file_edited_since_it_was_read_is_read_anew(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert call_line(str(path), 5, "step", "ones") == 7
    path.write_text(SOURCE.replace("keep = []\n", "keep = []\n\n"))  # step moves down a line (parsed trees are cached)
    assert call_line(str(path), 6, "step", "ones") == 8


def test_a_relative_frame_path_climbing_out_of_the_runs_folders_is_not_read(tmp_path: Path) -> None:
    code = tmp_path / "project"
    code.mkdir()
    _write(code)  # project/train.py: found under the root
    _write(tmp_path)  # train.py one folder up: only a crafted `../train.py` reaches it
    roots = (str(code),)
    assert frame_at_call("train.py(5): step", ONES, roots) == "train.py(7): step"
    assert frame_at_call("../train.py(5): step", ONES, roots) == "../train.py(5): step"
    assert function_start("sub/../../train.py(6): step", roots) == "sub/../../train.py(6): step"


def test_a_frame_naming_a_fifo_or_a_device_has_no_source_line_and_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "src.py"
    os.mkfifo(fifo)  # a blocking open() would wait for a writer for ever
    assert frame_at_call(f"{fifo}(5): step", ONES) == f"{fifo}(5): step"
    assert call_line(str(fifo), 5, "step", "ones") is None
    assert frame_at_call("/dev/zero(5): step", ONES) == "/dev/zero(5): step"
    fifo.unlink()
    _write(tmp_path).rename(fifo)  # a regular file at the same path is read (the FIFO's answer was not kept)
    assert frame_at_call(f"{fifo}(5): step", ONES) == f"{fifo}(7): step"
