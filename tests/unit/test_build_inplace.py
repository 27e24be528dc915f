"""scripts/build-inplace compiles a source whose content changed even when its file is older than
the object built from other content (a reverted patch, a checkout copied over the tree). The
build itself is a stand-in (PYTHON points at a script that "compiles" a source whose object is
missing or older, as ninja does), so this runs without a compiler."""
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env bash
    # `python -c ...` (the build's tag) or `python setup.py build_ext --inplace`: compiles (copies)
    # each source whose object is missing or older, fails on a source that says "error" after
    # compiling the others, and links the objects of the sources there are
    if [ "$1" = "-c" ]; then echo py-fake; exit 0; fi
    mkdir -p build/obj python/tilecomm
    failed=0 objects=()
    for f in $(find csrc -type f | LC_ALL=C sort); do
      o="build/obj/$(basename "$f").o"
      objects+=("$o")
      if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then
        if grep -q error "$f"; then echo "failed $f"; failed=1; continue; fi
        cp "$f" "$o"; echo "compiled $f"
      fi
    done
    [ "$failed" = 0 ] || exit 1
    cat "${objects[@]}" > python/tilecomm/_C.so
    echo "tilecomm build summary:"
    """)


@pytest.fixture
def tree(tmp_path):
    if shutil.which("sha1sum") is None:
        pytest.skip("sha1sum is not installed")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "build-inplace", tmp_path / "scripts")
    (tmp_path / "setup.py").write_text("# setup\n")
    (tmp_path / "csrc" / "cuda").mkdir(parents=True)
    (tmp_path / "csrc" / "cuda" / "kernel.cu").write_text("kernel 1\n")
    (tmp_path / "csrc" / "engine.cpp").write_text("engine 1\n")
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def build(tree, ok=True):
    env = dict(os.environ, PYTHON=str(tree / "fake-python"), MAX_JOBS="1")
    run = subprocess.run(["bash", "scripts/build-inplace", "build/log"], cwd=tree, env=env,
                         capture_output=True, timeout=60)
    assert (run.returncode == 0) == ok, run
    log = (tree / "build" / "log").read_text()
    # the sources twenty seconds old and the objects ten, so that a later write or touch of a
    # source is newer than its object even where the file system keeps whole seconds
    now = time.time()
    for pattern, age in (("csrc/**/*.*", 20), ("build/obj/*.o", 10)):
        for f in tree.glob(pattern):
            os.utime(f, (now - age, now - age))
    return sorted(line.split()[1] for line in log.splitlines() if line.startswith("compiled ")), log


def put_back(path, text):
    """Writes `text` with a time long before any build, as a copy of the checkout would."""
    path.write_text(text)
    os.utime(path, (1_000_000_000, 1_000_000_000))


def extension(tree):
    return (tree / "python" / "tilecomm" / "_C.so").read_text()


def test_a_reverted_source_older_than_its_object_is_compiled(tree):
    kernel = tree / "csrc" / "cuda" / "kernel.cu"
    assert build(tree)[0] == ["csrc/cuda/kernel.cu", "csrc/engine.cpp"]
    kernel.write_text("kernel 2 (patched)\n")
    assert build(tree)[0] == ["csrc/cuda/kernel.cu"]
    put_back(kernel, "kernel 1\n")
    shutil.rmtree(tree / "build" / "prebuilt")  # no kept build of these sources
    assert build(tree)[0] == ["csrc/cuda/kernel.cu"]
    assert extension(tree) == "kernel 1\nengine 1\n"


def test_a_failed_build_leaves_its_changed_sources_to_be_compiled(tree):
    kernel, engine = tree / "csrc" / "cuda" / "kernel.cu", tree / "csrc" / "engine.cpp"
    build(tree)
    kernel.write_text("kernel 2 (patched)\n")
    engine.write_text("engine error\n")
    compiled, _ = build(tree, ok=False)
    assert compiled == ["csrc/cuda/kernel.cu"]  # its object is of the patched content now
    put_back(kernel, "kernel 1\n")
    engine.write_text("engine 2\n")
    assert build(tree)[0] == ["csrc/cuda/kernel.cu", "csrc/engine.cpp"]
    assert extension(tree) == "kernel 1\nengine 2\n"


def test_a_source_back_after_a_build_without_it_is_compiled(tree):
    extra = tree / "csrc" / "extra.cpp"
    extra.write_text("extra 1\n")
    build(tree)
    extra.unlink()
    assert build(tree)[0] == []
    assert not extra.exists()  # a source gone from the tree is not made again
    put_back(extra, "extra 2\n")  # older than the object of "extra 1", which is still there
    assert build(tree)[0] == ["csrc/extra.cpp"]
    assert extension(tree) == "kernel 1\nengine 1\nextra 2\n"


def test_without_the_list_every_source_is_compiled(tree):
    build(tree)
    (tree / "build" / "sources.sha1").unlink()
    shutil.rmtree(tree / "build" / "prebuilt")
    assert build(tree)[0] == ["csrc/cuda/kernel.cu", "csrc/engine.cpp"]


def test_unchanged_sources_are_not_compiled_again(tree):
    build(tree)
    (tree / "csrc" / "engine.cpp").write_text("engine 2\n")
    assert build(tree)[0] == ["csrc/engine.cpp"]
    shutil.rmtree(tree / "build" / "prebuilt")
    assert build(tree)[0] == []  # no kept build of these sources, and nothing changed since the last
    assert extension(tree) == "kernel 1\nengine 2\n"


def test_a_kept_build_of_the_same_sources_is_copied_in(tree):
    build(tree)
    compiled, log = build(tree)
    assert compiled == [] and "copied in" in log


def test_the_four_builds_used_last_are_kept(tree):
    kernel = tree / "csrc" / "cuda" / "kernel.cu"
    build(tree)  # kernel 1
    for i in range(2, 6):
        kernel.write_text(f"kernel {i}\n")
        assert build(tree)[0] == ["csrc/cuda/kernel.cu"]
    assert len(list((tree / "build" / "prebuilt").iterdir())) == 4  # kernel 1's is gone
    for i in (5, 3, 4, 2):  # each copied in: used last in this order
        put_back(kernel, f"kernel {i}\n")
        compiled, log = build(tree)
        assert compiled == [] and "copied in" in log
        assert extension(tree) == f"kernel {i}\nengine 1\n"
    put_back(kernel, "kernel 1\n")  # not kept: compiled, and kernel 5's build, used longest ago, goes
    compiled, log = build(tree)
    assert compiled == ["csrc/cuda/kernel.cu"] and "copied in" not in log
    assert extension(tree) == "kernel 1\nengine 1\n"
    put_back(kernel, "kernel 2\n")  # built before kernel 5's, but used since
    assert "copied in" in build(tree)[1]
    put_back(kernel, "kernel 5\n")
    assert build(tree)[0] == ["csrc/cuda/kernel.cu"]
