"""Builds the JVM client library with javac and jar, and runs its JUnit 4 tests.

No Gradle or Maven here: the tests (tests/server/test_android_bridge.py) and developers call this.
``python android_bridge/build.py OUT [--test]`` compiles three source sets to Java 8
bytecode (``javac --release 8``):

* ``src/main``: the library (``OUT/edgespec-bridge.jar``), depending on ``org.json`` only;
* ``src/android``: the BatteryManager reader, compiled against the compile-only stubs in
  ``src/stubs`` (``OUT/edgespec-bridge-android.jar``, never run here);
* ``src/test``: the JUnit 4 tests, run by ``org.junit.runner.JUnitCore``.

Jars are looked up in ``EDGESPEC_JAVA_LIBS`` (a directory) and then ``/usr/share/java``
(Debian's ``junit4``, ``libhamcrest-java`` and ``libandroid-json-org-java``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VECTORS = ROOT.parent / "tests" / "vectors"
#: jar name candidates per library, in order of preference
JARS = {
    "json": ("json-android.jar",),
    "junit": ("junit4.jar", "junit.jar"),
    "hamcrest": ("hamcrest-core.jar", "hamcrest.jar", "hamcrest-all.jar"),
}
JAVAC_FLAGS = ("--release", "8", "-encoding", "UTF-8", "-Xlint:all,-serial,-options", "-Werror")


class Unavailable(Exception):
    """A JDK tool or a jar is missing (the reason says which and how to install it)."""


@dataclass(frozen=True, kw_only=True)
class Built:
    out: Path
    jar: Path
    android_jar: Path
    test_classes: Path
    jars: dict[str, Path]

    def classpath(self, *extra: Path) -> str:
        parts = [self.jar, self.test_classes, *self.jars.values(), *extra]
        return os.pathsep.join(str(p) for p in parts)


def find_tools() -> dict[str, str]:
    tools = {}
    for name in ("javac", "jar", "java"):
        found = shutil.which(name)
        if found is None:
            raise Unavailable(f"'{name}' is not on PATH (install a JDK >= 11, e.g. openjdk-17)")
        tools[name] = found
    return tools


def find_jars() -> dict[str, Path]:
    dirs = [Path(d) for d in (os.environ.get("EDGESPEC_JAVA_LIBS"), "/usr/share/java") if d]
    found = {}
    for library, names in JARS.items():
        for directory in dirs:
            hit = next((directory / n for n in names if (directory / n).is_file()), None)
            if hit is not None:
                found[library] = hit
                break
        else:
            raise Unavailable(
                f"no {library} jar ({', '.join(names)}) in {', '.join(map(str, dirs))}: "
                "apt-get install junit4 libandroid-json-org-java"
            )
    return found


def _sources(directory: Path) -> list[str]:
    return sorted(str(p) for p in directory.rglob("*.java"))


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} failed:\n{done.stdout}{done.stderr}")


def _javac(tools: dict[str, str], out: Path, classpath: list[Path], sources: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(str(p) for p in classpath)
    _run([tools["javac"], *JAVAC_FLAGS, "-d", str(out), "-cp", path, *_sources(sources)])


def build(out: Path) -> Built:
    """Compiles and packages every source set into ``out`` (replaced)."""
    tools, jars = find_tools(), find_jars()
    if out.exists():
        shutil.rmtree(out)
    classes = out / "classes"
    src = ROOT / "src"
    _javac(tools, classes / "main", [jars["json"]], src / "main" / "java")
    jar = out / "edgespec-bridge.jar"
    _run([tools["jar"], "--create", "--file", str(jar), "-C", str(classes / "main"), "."])
    stubs = classes / "stubs"
    _javac(tools, stubs, [], src / "stubs" / "java")
    _javac(tools, classes / "android", [jar, stubs, jars["json"]], src / "android" / "java")
    android_jar = out / "edgespec-bridge-android.jar"
    android = classes / "android"
    _run([tools["jar"], "--create", "--file", str(android_jar), "-C", str(android), "."])
    test_classes = classes / "test"
    test_path = [jar, jars["junit"], jars["hamcrest"], jars["json"]]
    _javac(tools, test_classes, test_path, src / "test" / "java")
    return Built(out=out, jar=jar, android_jar=android_jar, test_classes=test_classes, jars=jars)


def test_classes(built: Built) -> list[str]:
    """The JUnit classes: every ``*Test.class`` of the test source set."""
    return sorted(
        str(p.relative_to(built.test_classes).with_suffix("")).replace(os.sep, ".")
        for p in built.test_classes.rglob("*Test.class")
    )


def run_junit(
    built: Built, *, properties: dict[str, str] | None = None, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """Runs the JUnit tests in one JVM; ``properties`` become ``-Dkey=value`` (the shared
    vectors default to the checkout's ``tests/vectors``)."""
    properties = {"edgespec.vectors": str(VECTORS), **(properties or {})}
    defines = [f"-D{key}={value}" for key, value in properties.items()]
    command = [
        find_tools()["java"],
        *defines,
        "-cp",
        built.classpath(),
        "org.junit.runner.JUnitCore",
        *test_classes(built),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="build directory (replaced)")
    parser.add_argument("--test", action="store_true", help="also run the JUnit tests")
    args = parser.parse_args(argv)
    built = build(args.out)
    print(f"built {built.jar} and {built.android_jar}")
    if not args.test:
        return 0
    done = run_junit(built)
    print(done.stdout + done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
