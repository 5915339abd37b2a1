#!/usr/bin/env bash
# The wheels a bare GPU machine (no network; its own Python 3.12 with torch 2.11, transformers
# 5.17 and the packages of its image) lacks for the whole pipeline, `r1 run --profile ...`: the
# Prefect flow with its temporary server on SQLite, MLflow on a SQLite store, DuckDB, datasets,
# math-verify, pydantic, DeepSpeed. Which packages: constraints/gpu-kit.txt ([kit]; [left-out]
# says what is not carried and why; [machine] is the image's list). Versions: constraints/cpu.lock.
# Wheels for cp312 manylinux x86_64, in .whl/ (git-ignored), which scripts/gpu_check.sh and the
# `device` step below install with pip --no-index --no-deps --target.
#
#   bash scripts/gpu_kit.sh            build .whl/ here (network): download, DeepSpeed, strip, check
#   bash scripts/gpu_kit.sh verify     check the .whl/ there is (no network)
#   bash scripts/gpu_kit.sh device     on the GPU machine: install .whl/ into $KIT_SITE, check the
#                                      kit's requirements against the machine's versions, import
#                                      everything, and run a Prefect flow that logs to MLflow
#                                      (SQLite) and DuckDB (about half a minute)
#   bash scripts/gpu_kit.sh device --profile micro [--set ...]
#                                      the same, then `r1 run` with these arguments on the kit
#
# Left out of the kit (constraints/gpu-kit.txt [left-out]): Ray (cluster mode only, ~70 MB), trl
# (the GRPO benchmark's peer only), the dev tools, and what Prefect and MLflow declare but a run
# never imports (MLflow's server, Prefect's CLI...). Repacked wheels (RECORD rewritten to match):
# - MLflow's web UI (mlflow/server/js) and Prefect's (prefect/server/ui, ui-v2) are cut out:
#   nothing serves a UI on that machine (the temporary Prefect server runs with
#   PREFECT_UI_ENABLED=0); `mlflow ui` and `prefect server start` there would serve no pages.
# - mlflow-skinny and mlflow-tracing keep only their dist-info: mlflow's wheel holds each of
#   their files byte for byte (one `mlflow/` package), checked at each build.
# - while the total is over the budget, the largest wheel is recompressed with LZMA (duckdb's,
#   23.8 -> 15.8 MiB): a ZIP method that Python's zipfile, and so pip, unpacks (`device` checks
#   that the machine's Python has lzma).
#
# Settings: KIT_DIR (.whl), KIT_BUDGET_MIB (50: the wheels' total; the repo travels beside them
# under 64 MiB), PYTHON (the python whose pip downloads, and checks; default .venv/bin/python, else
# python3; on the GPU machine python3), DS_PYTHON (a python with torch to build DeepSpeed's wheel,
# default .venv/bin/python), KIT_SITE (device: /tmp/r1-site, as gpu_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-build}"
kit_dir="${KIT_DIR:-.whl}"
budget_mib="${KIT_BUDGET_MIB:-50}"
site="${KIT_SITE:-/tmp/r1-site}"
if [ -n "${PYTHON:-}" ]; then python="$PYTHON"
elif [ "$mode" != device ] && [ -x .venv/bin/python ]; then python=.venv/bin/python
else python=python3; fi
ds_python="${DS_PYTHON:-.venv/bin/python}"
# The UI folders cut out of the two wheels (zip path prefixes); RECORD is rewritten to match.
strip_mlflow="mlflow/server/js/"
strip_prefect="prefect/server/ui/ prefect/server/ui-v2/"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The Python half: reads the kit list and the lock, repacks wheels, checks the kit.
cat > "$work/kit.py" <<'PY'
import base64, csv, hashlib, io, os, sys, zipfile
from pathlib import Path

try:
    from packaging import tags
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
except ImportError:  # a bare interpreter: pip's own copy
    from pip._vendor.packaging import tags
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version

KIT_LIST, LOCK = Path("constraints/gpu-kit.txt"), Path("constraints/cpu.lock")
# the GPU machine: CPython 3.12.3 on x86_64 Linux (glibc of Ubuntu 24.04 at most)
TARGET_ENV = default_environment() | {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "os_name": "posix",
    "platform_system": "Linux", "platform_machine": "x86_64", "extra": "",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def die(message):
    print(f"gpu_kit: {message}", file=sys.stderr)
    sys.exit(1)


def sections():
    out, current = {"kit": [], "left-out": [], "machine": []}, None
    for line in KIT_LIST.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            current = line.strip("[]")
            continue
        for word in line.split():
            out[current].append(canonicalize_name(word))
    return out


def locked():
    pins = {}
    for line in LOCK.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = (name, version.strip())
    return pins


def plan():
    """The kit as NAME==VERSION lines; refuses a lock package that the list does not place."""
    s, pins = sections(), locked()
    kit, left, machine = set(s["kit"]), set(s["left-out"]), set(s["machine"])
    for a, b in (("kit", "left-out"), ("kit", "machine"), ("left-out", "machine")):
        both = set(s[a]) & set(s[b])
        if both:
            die(f"{KIT_LIST}: in both [{a}] and [{b}]: {sorted(both)}")
    unplaced = sorted(set(pins) - kit - left - machine)
    if unplaced:
        die(f"{LOCK} has {unplaced}, which {KIT_LIST} does not place: add each to [kit] if a run "
            "imports it on the GPU machine, else to [left-out] with the reason")
    missing = sorted(kit - set(pins))
    if missing:
        die(f"{KIT_LIST} [kit] names {missing}, which are not in {LOCK}")
    for name in s["kit"]:
        print(f"{pins[name][0]}=={pins[name][1]}")


def rewrite(path, drop, method=zipfile.ZIP_DEFLATED):
    """Write the wheel at `path` again without the files in `drop` (RECORD without their rows),
    each file compressed with `method`; its size before and after."""
    before = path.stat().st_size
    with zipfile.ZipFile(path) as src:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        tmp = path.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", method) as dst:
            for info in src.infolist():
                if info.filename in drop:
                    continue
                data = src.read(info)
                if info.filename == record:
                    rows = [r for r in csv.reader(io.StringIO(data.decode())) if r and r[0] not in drop]
                    buf = io.StringIO()
                    csv.writer(buf, lineterminator="\n").writerows(rows)
                    data = buf.getvalue().encode()
                level = 9 if method == zipfile.ZIP_DEFLATED else None
                dst.writestr(info, data, compress_type=method, compresslevel=level)
    os.replace(tmp, path)
    return before / 2**20, path.stat().st_size / 2**20


def strip(wheel, *prefixes):
    """Leave out of `wheel` the files under `prefixes` (the web UIs)."""
    path = Path(wheel)
    with zipfile.ZipFile(path) as zf:
        drop = {n for n in zf.namelist() if n.startswith(prefixes)}
    if not drop:
        die(f"{path.name}: nothing under {' '.join(prefixes)}: has the UI moved?")
    before, after = rewrite(path, drop)
    print(f"gpu_kit: {path.name}: left out {len(drop)} files under {' '.join(prefixes)} "
          f"({before:.1f} -> {after:.1f} MiB)")


def dedupe(wheel, by):
    """Leave out of `wheel` each file that the wheel `by` holds byte for byte (mlflow's wheel holds
    all of mlflow-skinny's and mlflow-tracing's files: the same `mlflow/` package); what stays
    is the dist-info, so that their versions still read as installed."""
    path = Path(wheel)
    with zipfile.ZipFile(by) as zf:
        held = {i.filename: hashlib.sha256(zf.read(i)).digest() for i in zf.infolist()}
    with zipfile.ZipFile(path) as zf:
        drop = {i.filename for i in zf.infolist() if ".dist-info/" not in i.filename
                and held.get(i.filename) == hashlib.sha256(zf.read(i)).digest()}
        kept = [n for n in zf.namelist() if ".dist-info/" not in n and n not in drop]
    before, after = rewrite(path, drop)
    print(f"gpu_kit: {path.name}: {len(drop)} files left to {Path(by).name}, {len(kept)} kept "
          f"({before:.1f} -> {after:.1f} MiB)")


def squeeze(kit_dir, budget_mib):
    """While the kit is over the budget, recompress its largest wheel with LZMA (a ZIP method
    that Python's zipfile, and so pip, reads; the files and RECORD stay as they were)."""
    wheels = sorted(Path(kit_dir).glob("*.whl"), key=lambda p: p.stat().st_size, reverse=True)
    for path in wheels:
        total = sum(p.stat().st_size for p in wheels) / 2**20
        if total <= float(budget_mib):
            return
        with zipfile.ZipFile(path) as zf:
            if all(i.compress_type == zipfile.ZIP_LZMA for i in zf.infolist()):
                continue
        before, after = rewrite(path, set(), zipfile.ZIP_LZMA)
        print(f"gpu_kit: {path.name}: recompressed with LZMA ({before:.1f} -> {after:.1f} MiB; "
              f"the kit was {total:.1f} MiB, budget {budget_mib})")


def metadata(zf):
    name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
    return zf.read(name).decode()


def requirements(meta):
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(TARGET_ENV):
                yield req


def verify(kit_dir, budget_mib):
    """One wheel for each [kit] name at the locked version, each installable on cp312 manylinux
    x86_64 and its RECORD true to its files; every requirement met by the kit, the machine, or
    left out on purpose; the total within the budget."""
    s, pins = sections(), locked()
    kit, left, machine = set(s["kit"]), set(s["left-out"]), set(s["machine"])
    supported = set(tags.cpython_tags((3, 12), platforms=PLATFORMS)) | set(
        tags.compatible_tags((3, 12), "cp312", platforms=PLATFORMS))
    wheels, errors = {}, []
    for path in sorted(Path(kit_dir).glob("*.whl")):
        name, version, _, wheel_tags = parse_wheel_filename(path.name)
        if name in wheels:
            errors.append(f"two wheels of {name}: {wheels[name].name}, {path.name}")
        wheels[name] = path
        if name not in kit:
            errors.append(f"{path.name} is not in {KIT_LIST} [kit]")
        elif version != Version(pins[name][1]):
            errors.append(f"{path.name}: the lock has {name}=={pins[name][1]}")
        if not wheel_tags & supported:
            errors.append(f"{path.name}: not for CPython 3.12 on manylinux x86_64")
    errors += [f"no wheel of {n}=={pins[n][1]}" for n in sorted(kit - set(wheels))]
    from_machine, left_out = {}, {}
    for name, path in sorted(wheels.items()):
        with zipfile.ZipFile(path) as zf:
            errors += [f"{path.name}: {e}" for e in record_errors(zf)]
            if name == "deepspeed" and any(n.endswith(".so") for n in zf.namelist()):
                errors.append(f"{path.name} holds compiled ops: build it with DS_BUILD_OPS=0")
            for req in requirements(metadata(zf)):
                dep = canonicalize_name(req.name)
                if dep in kit:
                    if dep in wheels and Version(pins[dep][1]) not in req.specifier:
                        errors.append(f"{name} needs {req}, the kit has {dep}=={pins[dep][1]}")
                elif dep in machine:
                    from_machine.setdefault(dep, []).append(f"{req.specifier or 'any'} ({name})")
                elif dep in left:
                    left_out.setdefault(dep, []).append(name)
                else:
                    errors.append(f"GAP: {name} needs {req}: neither in the kit nor on the machine")
    print("gpu_kit: declared but left out on purpose (never imported by a run): " + ", ".join(
        f"{d} ({'/'.join(sorted(set(v)))})" for d, v in sorted(left_out.items())))
    print("gpu_kit: met by the machine's packages (`device` checks the versions there): "
          + ", ".join(sorted(from_machine)))
    sizes = sorted(((p.stat().st_size, p.name) for p in wheels.values()), reverse=True)
    total = sum(size for size, _ in sizes)
    print("gpu_kit: largest wheels: " + ", ".join(f"{n} {b / 2**20:.1f} MiB" for b, n in sizes[:6]))
    print(f"gpu_kit: {len(wheels)} wheels, {total / 2**20:.1f} MiB (budget {budget_mib} MiB)")
    if total > float(budget_mib) * 2**20:
        errors.append(f"the kit is {total / 2**20:.1f} MiB, over the budget of {budget_mib} MiB "
                      "(KIT_BUDGET_MIB): the repo and .whl/ travel together under 64 MiB")
    for error in errors:
        print(f"gpu_kit: {error}", file=sys.stderr)
    if errors:
        die(f"{len(errors)} problems in {kit_dir}/")
    print(f"gpu_kit: {kit_dir}/ is complete")


def record_errors(zf):
    names = set(zf.namelist())
    record = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
    listed = {}
    for row in csv.reader(io.StringIO(zf.read(record).decode())):
        if row:
            listed[row[0]] = row[1]
    for name in sorted(names):
        if name.endswith("/") or name == record or name.endswith((".jws", ".p7s")):
            continue
        if name not in listed:
            yield f"{name} is not in RECORD"
            continue
        algo, _, want = listed[name].partition("=")
        got = base64.urlsafe_b64encode(hashlib.new(algo, zf.read(name)).digest()).rstrip(b"=")
        if got.decode() != want:
            yield f"{name}: hash differs from RECORD"
    yield from (f"RECORD names {n}, which is not in the wheel" for n in listed
                if n not in names and n != record)


def device(site):
    """On the GPU machine, the kit installed in `site`: whether the machine's versions meet the
    kit's requirements (a warning: pip would refuse, a run may not care), and whether every
    module a run imports imports (an error)."""
    from importlib import import_module, metadata as md

    s = sections()
    kit, machine = set(s["kit"]), set(s["machine"])
    conflicts, problems, absent = [], [], set()
    for dist in md.distributions(path=[site]):
        name = canonicalize_name(dist.metadata["Name"])
        for req in requirements("\n".join(f"Requires-Dist: {r}" for r in dist.requires or [])):
            dep = canonicalize_name(req.name)
            if dep in kit:
                continue
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                if dep in machine:
                    absent.add(dep)
                continue  # else left out on purpose ([left-out]; `verify` checked the list)
            if not req.specifier.contains(have, prereleases=True):
                conflicts.append(f"{name} {dist.version} needs {req}, this machine has {have}")
    # what a run imports, the lazily imported server and stores included
    modules = ["pydantic", "yaml", "duckdb", "sqlalchemy", "alembic", "aiosqlite", "asyncpg",
               "uvicorn", "fastapi", "prefect", "prefect.server.api.server",
               "prefect.server.database", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
               "mlflow.store.model_registry.sqlalchemy_store", "datasets", "math_verify",
               "deepspeed", "transformers", "torch"]
    dists = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow",
             "dateutil": "python-dateutil"}
    for module in modules:
        try:
            import_module(module)
        except Exception as error:  # noqa: BLE001
            missing = getattr(error, "name", None) or ""
            top = missing.split(".")[0]
            dist = canonicalize_name(dists.get(top, top))
            if isinstance(error, ModuleNotFoundError) and dist in machine:
                absent.add(dist)
                print(f"gpu_kit: import {module}: no {missing} here, a package of the GPU machine's")
            else:
                problems.append(f"import {module}: {type(error).__name__}: {error}")
    if absent:
        print("gpu_kit: the GPU machine's packages missing here (a gap only on that machine): "
              + ", ".join(sorted(absent)))
    for conflict in conflicts:
        print(f"gpu_kit: version: {conflict}", file=sys.stderr)
    if conflicts:
        print(f"gpu_kit: {len(conflicts)} requirements of the kit are not met by this machine's "
              "versions; where an import or the run fails on one, move that package from "
              "[machine] to [kit] in constraints/gpu-kit.txt and build again", file=sys.stderr)
    for problem in problems:
        print(f"gpu_kit: {problem}", file=sys.stderr)
    if problems:
        die(f"{len(problems)} imports fail with the kit on this machine")
    print("gpu_kit: every module a run imports imports")


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
PY

kit() { "$python" "$work/kit.py" "$@"; }

# A tiny flow on Prefect's temporary server (SQLite, no UI), logging to MLflow's SQLite store and
# writing DuckDB, graded by math-verify: the run's own machinery, without torch.
smoke() {
  local home="$work/smoke"
  mkdir -p "$home"
  (cd "$home" && env -u PREFECT_API_URL PREFECT_HOME="$home/prefect" \
    PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120 \
    MLFLOW_TRACKING_URI="sqlite:///$home/mlflow.db" timeout 300 "$python" - "$home") <<'PY'
import sys

import duckdb
from math_verify import parse, verify
from mlflow import MlflowClient
from prefect import flow, task

home = sys.argv[1]


@task
def grade(answer: str) -> float:
    return float(verify(parse("$\\frac{1}{2}$"), parse(answer)))


@flow
def smoke() -> str:
    client = MlflowClient()
    run = client.create_run(client.create_experiment("gpu-kit-smoke"))
    client.log_metric(run.info.run_id, "score", grade("0.5"))
    client.set_terminated(run.info.run_id)
    with duckdb.connect(f"{home}/smoke.duckdb") as db:
        db.execute("create table t as select 42 as x")
        assert db.execute("select x from t").fetchone() == (42,)
    return run.info.run_id


run_id = smoke()
assert MlflowClient().get_run(run_id).data.metrics["score"] == 1.0
print("gpu_kit: smoke flow ran: Prefect (temporary server), MLflow (SQLite), DuckDB, math-verify")
PY
}

case "$mode" in
build)
  kit plan > "$work/plan.txt"
  echo "gpu_kit: $(wc -l < "$work/plan.txt") packages for cp312 manylinux x86_64 into $kit_dir/" >&2
  new="$work/wheels"
  mkdir -p "$new"
  platforms=()
  for n in 39 35 34 31 28 27 24 17 12 5; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
  grep -v '^deepspeed==' "$work/plan.txt" > "$work/download.txt"
  # (a local index that lacks a package says so, once for each: not an error, PyPI has it)
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$new" -r "$work/download.txt" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
  # DeepSpeed: no wheel on PyPI. A pure-Python one (ops are compiled just in time on the GPU
  # machine, which has nvcc and ninja): from pip's cache or the kit there is, else built here.
  ds="$(grep '^deepspeed==' "$work/plan.txt" | cut -d= -f3)"
  ds_wheel="deepspeed-$ds-py3-none-any.whl"
  found="$(find "${PIP_CACHE_DIR:-$HOME/.cache/pip}" "$kit_dir" -name "$ds_wheel" 2>/dev/null | head -1 || true)"
  if [ -n "$found" ]; then
    echo "gpu_kit: DeepSpeed from $found" >&2
    cp "$found" "$new/"
  else
    echo "gpu_kit: building DeepSpeed $ds without ops with $ds_python" >&2
    DS_BUILD_OPS=0 "$ds_python" -m pip wheel -q --no-deps --no-build-isolation -w "$new" "deepspeed==$ds"
  fi
  mlflow_wheel="$(ls "$new"/mlflow-[0-9]*.whl)"
  kit strip "$mlflow_wheel" $strip_mlflow
  kit strip "$(ls "$new"/prefect-[0-9]*.whl)" $strip_prefect
  kit dedupe "$(ls "$new"/mlflow_skinny-[0-9]*.whl)" "$mlflow_wheel"
  kit dedupe "$(ls "$new"/mlflow_tracing-[0-9]*.whl)" "$mlflow_wheel"
  kit squeeze "$new" "$budget_mib"
  kit verify "$new" "$budget_mib"
  rm -rf "$kit_dir"
  mkdir -p "$kit_dir"
  cp "$new"/*.whl "$kit_dir/"
  echo "gpu_kit: wrote $kit_dir/ (install: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/r1-site $kit_dir/*.whl)" >&2
  ;;
verify)
  kit plan > /dev/null
  kit verify "$kit_dir" "$budget_mib"
  ;;
device)
  "$python" -c 'import lzma' || { echo "gpu_kit: this Python has no lzma: it cannot unpack the wheels that \`build\` recompressed with LZMA" >&2; exit 1; }
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$kit_dir"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  kit device "$site"
  smoke
  if [ $# -gt 1 ]; then  # the rest is `r1 run`'s: the pipeline itself on the kit
    shift
    "$python" -m cli.main run "$@"
  fi
  ;;
*)
  echo "usage: bash scripts/gpu_kit.sh [build | verify | device [r1 run arguments]]" >&2
  exit 2
  ;;
esac
