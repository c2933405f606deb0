"""llama.cpp's `llama-server`, built once per machine from source that a package registry
gives, and cached: the llama.cpp tree vendored by the `llama-cpp-python` sdist (PyPI),
fetched with `pip download`, configured with CMake for a CPU-only static build of the one
target the tests run.

The cache is `${XDG_CACHE_HOME:-~/.cache}/model-group-sidecar/llama.cpp-<sdist version>/`
(`SIDECAR_ENGINE_CACHE` overrides the root); a file lock keeps parallel test processes
from building twice, and `build.json` beside the binary records how long the build took.
Without a compiler or CMake the build cannot happen (`EngineUnavailable`: the tests skip,
loudly); with them, a failing build is an error (`EngineBuildFailed`).

CMake options as llama.cpp's CMakeLists.txt and docs/build.md name them: GGML_NATIVE=OFF
(a binary that runs on any x86-64 the cache may be copied to), no tests, examples, web UI
download or OpenSSL (the engine is reached over plain loopback HTTP).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SDIST = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
CMAKE_OPTIONS = (
    # Unoptimised: the build is a third cheaper in CPU (484 against 736 s on 2 cores) and
    # the tiny model's arithmetic is no measurable part of the tests' time.
    "-DCMAKE_BUILD_TYPE=None",
    "-DCMAKE_C_FLAGS=-O0",
    "-DCMAKE_CXX_FLAGS=-O0",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # A unity build: CMake joins each target's sources into files of 16, so the headers
    # every llama.cpp source includes (nlohmann's JSON above all) are parsed once per 16.
    "-DCMAKE_UNITY_BUILD=ON",
    "-DCMAKE_UNITY_BUILD_BATCH_SIZE=16",
)
# What does not compile joined: ggml-cpu (two sources define the same static helper),
# mtmd (its helper's guard against the library's internal headers) and common/json.cpp
# (its own `ordered_json`). Set after llama.cpp's CMakeLists have made the targets, by a
# deferred call in a CMAKE_PROJECT_INCLUDE file.
UNITY_OFF_TARGETS = ("ggml-cpu", "mtmd")
UNITY_OFF_SOURCES = (("llama-common", "common/json.cpp"),)


class EngineUnavailable(RuntimeError):
    """The engine cannot be built here (no C++ compiler, no CMake, no package index)."""


class EngineBuildFailed(RuntimeError):
    """The tools are here but the build failed: a defect to look at, not a skip."""


@dataclass(frozen=True)
class BuiltEngine:
    binary: Path
    version: str
    build_seconds: float
    built_now: bool


def cache_root() -> Path:
    override = os.environ.get("SIDECAR_ENGINE_CACHE")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "model-group-sidecar"


def engine_dir(version: str = SDIST_VERSION) -> Path:
    """One folder per sdist version and set of options: a change of either builds anew."""
    options = hashlib.sha256(repr((CMAKE_OPTIONS, UNITY_OFF_TARGETS, UNITY_OFF_SOURCES))
                             .encode()).hexdigest()[:8]
    return cache_root() / f"llama.cpp-{version}-{options}"


def cached_llama_server(version: str = SDIST_VERSION) -> Path | None:
    """The binary when a finished build is cached (no lock taken: a build in progress
    writes build.json last)."""
    folder = engine_dir(version)
    binary = folder / "bin" / "llama-server"
    return binary if (folder / "build.json").exists() and binary.exists() else None


def missing_tools() -> list[str]:
    wanted = {"cmake": ("cmake",), "a C++ compiler": ("c++", "g++", "clang++"),
              "make": ("make", "ninja")}
    return [what for what, names in wanted.items()
            if not any(shutil.which(name) for name in names)]


def ensure_llama_server(version: str = SDIST_VERSION, jobs: int | None = None) -> BuiltEngine:
    """The cached binary, built first if needed (by one process; the others wait)."""
    folder = engine_dir(version)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        record = folder / "build.json"
        cached = cached_llama_server(version)
        if cached is not None:
            seconds = float(json.loads(record.read_text())["build_seconds"])
            return BuiltEngine(cached, version, seconds, built_now=False)
        binary = folder / "bin" / "llama-server"
        missing = missing_tools()
        if missing:
            raise EngineUnavailable(f"cannot build llama-server: no {', '.join(missing)} "
                                    "(.ci/services installs Debian's cmake and g++)")
        started = time.monotonic()
        _build(folder, version, binary, jobs or os.cpu_count() or 1)
        seconds = round(time.monotonic() - started, 1)
        record.write_text(json.dumps({"build_seconds": seconds, "sdist": f"{SDIST}=={version}",
                                      "cmake_options": list(CMAKE_OPTIONS),
                                      "unity_off": [*UNITY_OFF_TARGETS,
                                                    *(p for _, p in UNITY_OFF_SOURCES)],
                                      "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                time.gmtime())}) + "\n")
        return BuiltEngine(binary, version, seconds, built_now=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(folder: Path, version: str, binary: Path, jobs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="build-", dir=folder) as scratch_name:
        scratch = Path(scratch_name)
        sdist = _download(scratch, version)
        source = _unpack_vendored_tree(sdist, scratch / "src")
        build = scratch / "build"
        log = folder / "build.log"
        exceptions = scratch / "unity-exceptions.cmake"
        exceptions.write_text(unity_exceptions(source))
        _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_OPTIONS,
              f"-DCMAKE_PROJECT_INCLUDE={exceptions}"], log)
        _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], log)
        built = build / "bin" / "llama-server"
        if not built.exists():
            raise EngineBuildFailed(f"the build made no {built}; see {log}")
        binary.parent.mkdir(exist_ok=True)
        shutil.copy2(built, binary)


def unity_exceptions(source: Path) -> str:
    """CMake that takes UNITY_OFF_TARGETS and UNITY_OFF_SOURCES out of the unity build."""
    defer = "cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL"
    lines = [f"{defer} set_target_properties {' '.join(UNITY_OFF_TARGETS)} "
             "PROPERTIES UNITY_BUILD OFF)"]
    lines += [f'{defer} set_source_files_properties "{source / path}" TARGET_DIRECTORY '
              f"{target} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)"
              for target, path in UNITY_OFF_SOURCES]
    return "\n".join(lines) + "\n"


def _download(into: Path, version: str) -> Path:
    """The sdist, through pip (whatever index pip is configured with)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--quiet", "--dest", str(into), f"{SDIST}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not found:
        raise EngineUnavailable(f"pip download {SDIST}=={version} failed: "
                                f"{done.stderr.strip()[-500:]}")
    return found[0]


def _unpack_vendored_tree(sdist: Path, into: Path) -> Path:
    """Only the vendored llama.cpp tree, with tarfile's safe 'data' filter."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        archive.extractall(into, members=members, filter="data")
    (source,) = into.glob("*/vendor/llama.cpp")
    return source


def _run(command: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text()[-2000:]
        raise EngineBuildFailed(f"{command[:2]} failed ({done.returncode}); {log}:\n{tail}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """A build stopped by SIGTERM unwinds (the scratch folder and the lock are let go)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    # `python -m sidecar.devstack.engine.llama_build`: build (or find) it, say where and how long.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    engine = ensure_llama_server()
    print(f"llama-server {engine.version}: {engine.binary} "
          f"({'built now' if engine.built_now else 'cached'}, build took "
          f"{engine.build_seconds:.0f} s)")
