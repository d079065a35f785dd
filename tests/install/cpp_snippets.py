#!/usr/bin/env python3
"""Builds and runs every ```cpp block of README.md and docs/guide/*.md against an
installed optex, as outside projects with find_package(optex).

Called by check_install.sh after it has installed the build into PREFIX:

    cpp_snippets.py --source SOURCE_DIR --prefix PREFIX --work DIR --mpi ON|OFF

The conventions (docs/guide/README.md says them to writers of the guide):

- ```cpp         a whole program: compiled, linked and run (it must finish in seconds).
                 A program that includes an MPI header (<optex/distributed/mpi_communicator.hpp>)
                 runs under `mpirun -np 2 --oversubscribe`, and only where optex was built
                 with MPI (otherwise it is reported as not built, and nothing fails).
- ```cpp gpu     a whole translation unit for the CUDA build: compiled only (an object
                 library; it may declare functions that the user's .cu files define).
- ```cmake       a complete CMakeLists.txt (with add_executable(NAME main.cpp)) right after
                 a ```cpp block is that block's build: it is used as written, with the block
                 as main.cpp. Every other block gets the default project: find_package(optex)
                 and optex::optex, plus optex::mpi when it includes an MPI header.

Blocks without a CMakeLists of their own share one project (one configure step).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MPI_HEADER = re.compile(r"#include\s*[<\"]optex/distributed/(mpi_communicator|nccl_communicator)\.hpp[>\"]")
KNOWN_CPP_MARKERS = {"", "gpu"}
MPI_ENVIRONMENT = {
    # As tests/CMakeLists.txt runs the MPI tests: root allowed (containers, CI), shared memory only.
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,vader",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}


@dataclass
class Snippet:
    origin: str  # file:line
    code: str
    marker: str
    cmake: str | None  # its own CMakeLists.txt, if one follows it

    @property
    def mpi(self) -> bool:
        return bool(MPI_HEADER.search(self.code))

    @property
    def gpu(self) -> bool:
        return self.marker == "gpu"


def documents(source: Path) -> list[Path]:
    return [source / "README.md"] + sorted((source / "docs" / "guide").glob("*.md"))


def snippets(source: Path) -> list[Snippet]:
    found: list[Snippet] = []
    for path in documents(source):
        text = path.read_text(encoding="utf-8")
        blocks = list(FENCE.finditer(text))
        for k, block in enumerate(blocks):
            language, marker = block.group(1), block.group(2).strip()
            if language != "cpp":
                continue
            origin = f"{path.relative_to(source)}:{text.count(chr(10), 0, block.start()) + 1}"
            if marker not in KNOWN_CPP_MARKERS:
                sys.exit(f"{origin}: unknown ```cpp marker '{marker}' (known: gpu)")
            cmake = None
            if k + 1 < len(blocks) and blocks[k + 1].group(1) == "cmake":
                candidate = blocks[k + 1].group(3)
                if "add_executable(" in candidate:
                    cmake = candidate
            found.append(Snippet(origin, block.group(3), marker, cmake))
    return found


def run(command: list[str], cwd: Path, what: str, env: dict[str, str] | None = None,
        timeout: int = 300) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{what} failed ({' '.join(command)}):\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}")
    return done.stdout


def configure_and_build(project: Path, prefix: Path, what: str) -> Path:
    build = project / "build"
    run(["cmake", "-S", str(project), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
         "-DCMAKE_BUILD_TYPE=Release"], project, f"{what}: configure")
    jobs = os.environ.get("OPTEX_SNIPPET_JOBS", "2")
    run(["cmake", "--build", str(build), "-j", jobs], project, f"{what}: build", timeout=600)
    return build


def execute(snippet: Snippet, program: Path, mpi_launcher: list[str]) -> None:
    workdir = program.parent
    if snippet.mpi:
        env = dict(os.environ, **MPI_ENVIRONMENT)
        out = run(mpi_launcher + [str(program)], workdir, f"{snippet.origin} (mpirun)", env=env)
    else:
        out = run([str(program)], workdir, snippet.origin)
    print(f"{snippet.origin}: ran{' on 2 ranks' if snippet.mpi else ''}: "
          f"{out.strip().splitlines()[-1] if out.strip() else '(no output)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--prefix", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--mpi", choices=["ON", "OFF"], required=True)
    args = parser.parse_args()
    found = snippets(args.source)
    if len(found) < 5:
        sys.exit(f"only {len(found)} ```cpp blocks found: is the pattern still right?")
    mpi_built = args.mpi == "ON"
    launcher = ["mpirun", "-np", "2"]
    if mpi_built:
        version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, check=False)
        if "Open MPI" in version.stdout + version.stderr or "OpenRTE" in version.stdout + version.stderr:
            launcher.append("--oversubscribe")

    shared = args.work / "shared"
    shared.mkdir(parents=True)
    lines = ["cmake_minimum_required(VERSION 3.24)", "project(optex_snippets LANGUAGES CXX)",
             "find_package(optex CONFIG REQUIRED)"]
    targets: list[tuple[Snippet, str]] = []
    own: list[tuple[Snippet, Path, str]] = []
    skipped = []
    for k, snippet in enumerate(found):
        if snippet.mpi and not mpi_built:
            skipped.append(snippet.origin)
            continue
        if snippet.cmake is not None:
            project = args.work / f"own_{k}"
            project.mkdir()
            (project / "main.cpp").write_text(snippet.code, encoding="utf-8")
            (project / "CMakeLists.txt").write_text(snippet.cmake, encoding="utf-8")
            name = re.search(r"add_executable\((\w+)", snippet.cmake).group(1)
            own.append((snippet, project, name))
            continue
        name = f"snippet_{k}"
        (shared / f"{name}.cpp").write_text(snippet.code, encoding="utf-8")
        if snippet.gpu:
            lines.append(f"add_library({name} OBJECT {name}.cpp)")
        else:
            lines.append(f"add_executable({name} {name}.cpp)")
        libraries = "optex::optex optex::mpi" if snippet.mpi else "optex::optex"
        lines.append(f"target_link_libraries({name} PRIVATE {libraries})")
        targets.append((snippet, name))
    (shared / "CMakeLists.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    build = configure_and_build(shared, args.prefix, "the snippets without a CMakeLists of their own")
    for snippet, name in targets:
        if snippet.gpu:
            print(f"{snippet.origin}: compiled (GPU: not run)")
            continue
        program = build / name
        rundir = args.work / f"run_{name}"
        rundir.mkdir()
        execute(snippet, program.rename(rundir / name), launcher)
    for snippet, project, name in own:
        own_build = configure_and_build(project, args.prefix, f"{snippet.origin} with its CMakeLists")
        execute(snippet, own_build / name, launcher)
    for origin in skipped:
        print(f"{origin}: not built (optex was built without MPI)")
    print(f"C++ snippets: {len(found) - len(skipped)} of {len(found)} built")


if __name__ == "__main__":
    main()
