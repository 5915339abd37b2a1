"""Registered models: `models:/NAME@ALIAS` (or `NAME@ALIAS`, `models:/NAME/VERSION`) resolved in
the state folder's MLflow registry, and a version's files fetched to a local folder."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from storage.digests import tree_digest

_FORMS = (
    re.compile(r"models:/(?P<name>[^/@]+)@(?P<alias>[^/@]+)"),
    re.compile(r"(?P<name>[^/@:]+)@(?P<alias>[^/@]+)"),
    re.compile(r"models:/(?P<name>[^/@]+)/(?P<version>\d+)"),
)
_ALIAS_URI = re.compile(r"models:/(?P<name>[A-Za-z0-9][\w.\-]*)@(?P<alias>[A-Za-z0-9][\w\-]*)")


class RegistryError(LookupError):
    """A model, alias or version the registry does not have; the message names what is missing."""


class SourceRunGone(RegistryError):
    """A registered version whose MLflow run, or only its files, the store no longer holds."""


AGAIN = (
    "run the pipeline again with the same settings (r1 run) to compute that stage again and "
    "register its model anew, or point the alias at another version"
)


def source_present(source: str) -> bool:
    """Whether a version's files are where MLflow records them: a local folder (`file://`, as
    this project's store keeps them) that holds something; any other source is taken as there."""
    parsed = urlparse(source)
    if parsed.scheme != "file":
        return True
    folder = Path(unquote(parsed.path))
    return folder.is_dir() and any(folder.iterdir())


@dataclass(frozen=True)
class ModelSpec:
    """A registered model named by alias or by version."""

    name: str
    alias: str | None = None
    version: str | None = None

    @property
    def uri(self) -> str:
        if self.alias:
            return f"models:/{self.name}@{self.alias}"
        return f"models:/{self.name}/{self.version}"


@dataclass(frozen=True)
class ResolvedModel:
    spec: ModelSpec
    version: str
    run_id: str
    source: str = ""  # where the version's files are, as MLflow records it


def parse_model(text: str) -> ModelSpec:
    """`models:/NAME@ALIAS`, `NAME@ALIAS` or `models:/NAME/VERSION`."""
    for form in _FORMS:
        found = form.fullmatch(text.strip())
        if found:
            return ModelSpec(**found.groupdict())
    raise ValueError(
        f"cannot read the model {text!r}: expected models:/NAME@ALIAS, NAME@ALIAS "
        "or models:/NAME/VERSION"
    )


def resolve(client: Any, spec: ModelSpec) -> ResolvedModel:
    """The registered version `spec` names, and the stage run that logged it."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(spec.name)
    except MlflowException as err:
        known = ", ".join(m.name for m in client.search_registered_models()) or "none"
        raise RegistryError(f"no registered model {spec.name!r} (registered: {known})") from err
    if spec.alias is not None:
        aliases = registered.aliases
        if spec.alias not in aliases:
            known = ", ".join(sorted(aliases)) or "none"
            raise RegistryError(
                f"model {spec.name!r} has no alias {spec.alias!r} (aliases: {known})"
            )
        number = str(aliases[spec.alias])
    else:
        number = str(spec.version)
    try:
        version = client.get_model_version(spec.name, number)
    except MlflowException as err:
        raise RegistryError(f"model {spec.name!r} has no version {number}") from err
    if not version.run_id:
        raise RegistryError(f"{spec.uri} (version {number}) names no MLflow run")
    return ResolvedModel(spec, number, version.run_id, version.source)


def require_source_run(client: Any, model: ResolvedModel) -> None:
    """Refuse, naming what to do, a version whose MLflow run the store no longer holds: deleted
    (the MLflow UI, `mlflow runs delete`) and collected (`mlflow gc`) with its files, the
    version left registered without them; or whose files alone were deleted (`mlartifacts/`)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(model.run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise SourceRunGone(
            f"{model.spec.uri} is version {model.version}, whose MLflow run {model.run_id} is "
            f"deleted from the store with its files (mlflow gc): {AGAIN}"
        ) from None
    if not source_present(model.source):
        raise SourceRunGone(
            f"{model.spec.uri} is version {model.version}, whose files are gone from the MLflow "
            f"store ({model.source}): {AGAIN}"
        )


def download(client: Any, model: ResolvedModel, root: Path) -> Path:
    """The version's model folder under `root/NAME/vVERSION`, fetched once (a partial fetch is
    never mistaken for a finished one)."""
    dest = root / model.spec.name / f"v{model.version}"
    if dest.is_dir():
        return dest
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    fetched = Path(client.download_artifacts(model.run_id, "model", str(partial)))
    fetched.rename(dest)
    shutil.rmtree(partial, ignore_errors=True)
    return dest


@dataclass(frozen=True)
class RegisteredModel:
    """A registered model version, its files fetched into the state folder."""

    name: str
    alias: str | None
    version: str
    source_run_id: str  # the stage run that logged it
    path: Path
    digest: str  # the model's content digest, as its stage recorded it

    @property
    def uri(self) -> str:
        return ModelSpec(self.name, self.alias, None if self.alias else self.version).uri


def parse_alias_uri(uri: str) -> ModelSpec:
    """`models:/NAME@ALIAS` only (what an alias's evaluation history is kept by); anything else
    (a version number, a run URI, a path) is refused with a message saying what is expected."""
    match = _ALIAS_URI.fullmatch(uri.strip()) if isinstance(uri, str) else None
    if match is None:
        raise ValueError(
            f"model {uri!r} is not of the form models:/NAME@ALIAS (for example "
            f"models:/r1-tiny@final); a version number, run URI or path is not accepted"
        )
    return ModelSpec(match["name"], alias=match["alias"])


def fetch(client: Any, spec: ModelSpec, root: Path) -> RegisteredModel:
    """The version `spec` names, its files fetched once under `root` (shared by every flow that
    uses registered models). A clear error when the name, alias or version is unknown, or when
    the version holds no saved model."""
    resolved = resolve(client, spec)
    require_source_run(client, resolved)
    path = download(client, resolved, root)
    if not (path / "config.json").exists():
        raise RegistryError(
            f"{spec.uri} (version {resolved.version}) holds no saved model "
            f"(no config.json in {path})"
        )
    tags = client.get_run(resolved.run_id).data.tags
    digest = tags.get("model.digest") or tree_digest(path)
    return RegisteredModel(spec.name, spec.alias, resolved.version, resolved.run_id, path, digest)
