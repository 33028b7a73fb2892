"""Python frames and built-ins as a person writes them (analysis/frames.py)."""

from __future__ import annotations

import pytest

from torchscope.analysis.frames import is_library_code, is_user_frame, readable, readable_totals


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("<built-in method stack of type object at 0x7f5a36ecea40>", "torch.stack"),
        ("<built-in method add_ of Tensor object at 0x7f5a36ecea40>", "Tensor.add_"),
        ("<built-in method _record_function_enter_new of PyCapsule object at 0x7f00>", "_record_function_enter_new"),
        ("<built-in method acquire of _thread.lock object at 0x7f00>", "_thread.lock.acquire"),
        ("<built-in function len>", "len"),
        # c10d's Work.wait as the profiler names it: a method bound through pybind11, its owner pybind's record type
        ("<built-in method wait of pybind11_builtins.pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1 object at 0x7f00>",
         "wait (C++ binding)"),
        ("train.py(42): train_step", "train_step (train.py:42)"),
        ("/home/me/project/train.py(42): <module>", "<module> (train.py:42)"),
        ("torch/nn/modules/module.py(1501): _call_impl", "_call_impl (module.py:1501)"),
        ("aten::mm", "aten::mm"),
        ("nn.Module: Linear_0", "nn.Module: Linear_0"),
        ("<function f at 0x7f00>", "<function f>"),
    ],
)
def test_readable_names(raw: str, shown: str) -> None:
    assert readable(raw) == shown


def test_names_that_read_the_same_are_added() -> None:
    totals = {"<built-in method stack of type object at 0x1>": 2.0, "<built-in method stack of type object at 0x2>": 3.0, "aten::mm": 4.0}
    assert readable_totals(totals) == {"torch.stack": 5.0, "aten::mm": 4.0}
    assert list(readable_totals(totals)) == ["torch.stack", "aten::mm"]


@pytest.mark.parametrize(
    ("name", "user"),
    [
        ("train.py(42): train_step", True),
        ("/home/me/project/model.py(7): forward", True),
        ("/work/repo/torchscope/examples/demo_train.py(39): __getitem__", True),  # the demo is the user here
        ("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py(125): forward", False),
        ("torch/nn/modules/module.py(1736): _call_impl", False),  # relative to a sys.path entry
        ("/work/main/torchscope/capture/phases.py(302): backward", False),  # editable install
        ("torchscope/capture/phases.py(302): backward", False),  # PYTHONPATH checkout: relative
        ("torchscope/integrations/lightning.py(80): on_train_batch_end", False),
        ("/usr/lib/python3.11/threading.py(982): run", False),
        ("/usr/lib/python3.11/trace.py(461): runfunc", False),
        ("C:\\Python311\\Lib\\site-packages\\torch\\nn\\modules\\module.py(1736): _call_impl", False),
        ("<frozen runpy>(198): _run_module_as_main", False),
        ("<string>(1): <module>", False),
        # PyTorch's tracer cuts the sys.path entry off: the standard library and the user's script folder both
        # come bare, so a file named like a standard module is the standard library's when that defines the function
        ("contextlib.py(132): __enter__", False),
        ("json/decoder.py(332): decode", False),
        ("trace.py(3): train_step", True),  # the user's trace.py next to their entry point
        ("trace.py(6): <module>", True),
        ("profile.py(12): run_epoch", True),
        ("math.py(2): step", True),  # `math` is a C module: no Python frame can be its
        ("test.py(5): main", True),
        ("<built-in method linear of PyCapsule object at 0x7f>", False),
        ("nn.Module: Linear_0", False),
    ],
)
def test_user_frames_leave_out_libraries_torch_and_torchscopes_hooks(name: str, user: bool) -> None:
    assert is_user_frame(name) is user


def test_absolute_frames_under_this_interpreters_install_folders_are_library_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layout the patterns miss (Fedora's lib64, Windows `Lib`) is still library code when captured here."""
    from torchscope.analysis import frames

    assert frames._install_dirs()  # the real ones: this interpreter's stdlib and site-packages
    monkeypatch.setattr(frames, "_install_dirs", lambda: ("/usr/lib64/python3.11/", "C:/Python311/Lib/"))
    assert not is_user_frame("/usr/lib64/python3.11/trace.py(461): runfunc")
    assert not is_user_frame("C:\\Python311\\Lib\\trace.py(461): runfunc")
    assert is_user_frame("/home/me/project/trace.py(3): train_step")


def test_call_stack_paths_without_a_function_go_by_the_module_name() -> None:
    assert is_library_code("contextlib.py")
    assert not is_library_code("model.py")
    assert not is_library_code("aten::mm")


def test_relative_frames_of_installed_packages_are_library_code(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """PyTorch's tracer cuts the site-packages entry off (`transformers/models/...py`): a file this
    interpreter's site-packages holds at that path is a library's; a user's file is not, even in a folder
    named like an installed package, and a bare module only where the installed one defines the function."""
    from torchscope.analysis import frames

    site = tmp_path / "site-packages"
    (site / "hfpkg" / "models").mkdir(parents=True)
    (site / "hfpkg" / "models" / "bert.py").write_text("class Bert:\n    def forward(self): pass\n")
    (site / "utils").mkdir()
    (site / "sixlike.py").write_text("def get_args(): pass\n")
    for cached in (frames._site_dirs, frames._installed_names, frames._defined_in):
        cached.cache_clear()
    monkeypatch.setattr(frames, "_site_dirs", lambda: (str(site),))
    try:
        assert not is_user_frame("hfpkg/models/bert.py(2): forward")
        assert is_user_frame("hfpkg/models/mine.py(2): forward")  # not a file the package has
        assert is_user_frame("utils/data.py(3): load")  # a `utils` folder there, not this file
        assert not is_user_frame("sixlike.py(1): get_args")
        assert is_user_frame("sixlike.py(9): my_step")  # a user's file of that name: the function is theirs
        assert is_user_frame("train.py(3): main")
    finally:
        for cached in (frames._installed_names, frames._defined_in):
            cached.cache_clear()



def test_a_relative_frame_climbing_out_of_the_standard_library_is_not_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`json/../../../tmp/x.py` names a stdlib module first: looking its functions up under the standard
    library's folder must not read a file outside it (a FIFO there would block, /dev/zero fill memory)."""
    from torchscope.analysis import frames

    target = tmp_path / "planted.py"
    target.write_text("def step(): pass\n")
    climbing = "json/" + "../" * 40 + str(target).lstrip("/")
    assert frames._defined_in((frames._scheme_paths()["stdlib"],), climbing) is None
    assert is_user_frame(f"{climbing}(1): step")  # read, `step` would have made it the standard library's
    assert not is_user_frame("json/decoder.py(332): decode")  # the real module is still read
