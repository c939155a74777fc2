"""Download the wheels a bare GPU machine needs to run chunkstore from a checkout.

The machine has Python 3.12, torch and the packages listed in machine-packages.txt, and cannot
reach an index. This walks chunkstore's requirements (without extras) through the packages
installed here, stops at every package the machine has (its own requirements are met there), and
downloads each remaining one at the version installed here (the tested one) as a wheel for the
machine's Python and platform. The folder ends holding exactly those wheels and a manifest.json;
a wheel of another version or package is removed, since two versions of one package stop the
install there. Exit codes: 0 done, 1 a download failed or the wheels exceed --max-mib, 2 bad use.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
# manylinux tags pip must be told one by one (it matches glibc versions exactly).
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux_2_39_x86_64", "manylinux1_x86_64")


def machine_packages(path: Path) -> set[str]:
    names = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(n) for n in names if n}


def marker_environment(python_version: str) -> dict[str, str]:
    return {"python_version": python_version, "python_full_version": f"{python_version}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


# Carried although the machine has them: tiny, and the carried wheels rely on recent releases
# (pydantic on typing-extensions >= 4.14), which an older image may not have.
ALWAYS_CARRIED = frozenset({"typing-extensions"})


def needed(root: str, present: set[str], python_version: str,
           relied_on: dict[str, str] | None = None) -> dict[str, str]:
    """{name: version installed here} of every package ``root`` needs that the machine lacks
    (or that is in ALWAYS_CARRIED). ``relied_on``, when given, receives each machine package the
    carried ones require, with their version specifiers joined. Raises PackageNotFoundError when
    a needed package is not installed here."""
    env = marker_environment(python_version)
    present = set(present) - ALWAYS_CARRIED
    out: dict[str, str] = {}
    todo, seen = [root], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        if name != canonicalize_name(root):
            out[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # an extra's requirement, or one for another platform
            if canonicalize_name(req.name) not in present:
                todo.append(req.name)
            elif relied_on is not None:
                specs = [s for s in (relied_on.get(canonicalize_name(req.name)), str(req.specifier)) if s]
                relied_on[canonicalize_name(req.name)] = ",".join(dict.fromkeys(",".join(specs).split(",")))
    return out


def download(names: dict[str, str], dest: Path, python_version: str) -> None:
    args = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version, "-d", str(dest)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    subprocess.run(args + [f"{n}=={v}" for n, v in sorted(names.items())], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu/prepare.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=Path(".whl"), help="folder of the wheels (default .whl)")
    parser.add_argument("--python-version", default="3.12", help="the machine's Python, major.minor (default 3.12)")
    parser.add_argument("--machine-packages", type=Path, default=HERE / "machine-packages.txt",
                        help="what the machine has (default: machine-packages.txt beside this script)")
    parser.add_argument("--max-mib", type=float, default=48.0,
                        help="refuse wheels larger than this in all, MiB (default 48: the working tree that "
                             "travels with them is limited to 64)")
    args = parser.parse_args(argv)
    relied_on: dict[str, str] = {}
    try:
        names = needed("chunkstore", machine_packages(args.machine_packages), args.python_version, relied_on)
    except metadata.PackageNotFoundError as exc:
        print(f"prepare: {exc.args[0]} is not installed here; install the project first "
              "(pip install -e .)", file=sys.stderr)
        return 2
    args.dest.mkdir(parents=True, exist_ok=True)
    try:
        download(names, args.dest, args.python_version)
    except subprocess.CalledProcessError as exc:
        print(f"prepare: pip download failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    wheels = {}
    for path in sorted(args.dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if names.get(name) != str(version):
            path.unlink()  # left by an earlier run: another version, or a package no longer needed
        else:
            wheels[name] = {"version": str(version), "file": path.name, "size_bytes": path.stat().st_size}
    missing = sorted(set(names) - set(wheels))
    total_mib = sum(w["size_bytes"] for w in wheels.values()) / 2**20
    # What the machine must already have, and in which versions (run.sh's first step checks them there).
    manifest = {"python_version": args.python_version, "total_mib": round(total_mib, 2), "wheels": wheels,
                "relied_on": dict(sorted(relied_on.items()))}
    (args.dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"prepare: {len(wheels)} wheels, {total_mib:.1f} MiB in {args.dest}: "
          + ", ".join(f"{n}=={w['version']}" for n, w in wheels.items()))
    if missing:
        print(f"prepare: no wheel came for {', '.join(missing)}", file=sys.stderr)
        return 1
    if total_mib > args.max_mib:
        print(f"prepare: the wheels take {total_mib:.1f} MiB, over --max-mib {args.max_mib:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
