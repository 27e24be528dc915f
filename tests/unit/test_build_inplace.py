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
    # `python -c ...` (the build's tag) or `python setup.py build_ext --inplace`
    if [ "$1" = "-c" ]; then echo py-fake; exit 0; fi
    mkdir -p build/obj python/tilecomm
    for f in $(find csrc -type f | LC_ALL=C sort); do
      o="build/obj/$(basename "$f").o"
      if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then cp "$f" "$o"; echo "compiled $f"; fi
    done
    cat build/obj/*.o > python/tilecomm/_C.so
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


def build(tree):
    env = dict(os.environ, PYTHON=str(tree / "fake-python"), MAX_JOBS="1")
    subprocess.run(["bash", "scripts/build-inplace", "build/log"], cwd=tree, env=env, check=True,
                   capture_output=True, timeout=60)
    log = (tree / "build" / "log").read_text()
    # the sources twenty seconds old and the objects ten, so that a later write or touch of a
    # source is newer than its object even where the file system keeps whole seconds
    now = time.time()
    for pattern, age in (("csrc/**/*.*", 20), ("build/obj/*.o", 10)):
        for f in tree.glob(pattern):
            os.utime(f, (now - age, now - age))
    return sorted(line.split()[1] for line in log.splitlines() if line.startswith("compiled ")), log


def extension(tree):
    return (tree / "python" / "tilecomm" / "_C.so").read_text()


def test_a_reverted_source_older_than_its_object_is_compiled(tree):
    kernel = tree / "csrc" / "cuda" / "kernel.cu"
    assert build(tree)[0] == ["csrc/cuda/kernel.cu", "csrc/engine.cpp"]
    kernel.write_text("kernel 2 (patched)\n")
    assert build(tree)[0] == ["csrc/cuda/kernel.cu"]
    # put back as a copy of the checkout would: the first content, and a time long before the build
    kernel.write_text("kernel 1\n")
    os.utime(kernel, (1_000_000_000, 1_000_000_000))
    compiled, _ = build(tree)
    assert compiled == ["csrc/cuda/kernel.cu"]
    assert extension(tree) == "engine 1\nkernel 1\n"


def test_unchanged_sources_are_not_compiled_again(tree):
    build(tree)
    (tree / "csrc" / "engine.cpp").write_text("engine 2\n")
    assert build(tree)[0] == ["csrc/engine.cpp"]
    shutil.rmtree(tree / "build" / "prebuilt")
    assert build(tree)[0] == []  # no kept build of these sources, and nothing changed since the last
    assert extension(tree) == "engine 2\nkernel 1\n"


def test_a_kept_build_of_the_same_sources_is_copied_in(tree):
    build(tree)
    compiled, log = build(tree)
    assert compiled == [] and "copied in" in log
