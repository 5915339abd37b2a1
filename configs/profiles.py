"""Load a profile: YAML -> dict (+ dotted overrides) -> PipelineConfig, with errors by key path."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from configs.schema import PipelineConfig

PROFILES_DIR = Path(__file__).parent


class ConfigError(ValueError):
    """A profile that cannot be loaded; the message names each bad key's path and the reason."""


def profile_path(profile: str | Path) -> Path:
    """A profile name ("tiny") or a path to a YAML file."""
    path = Path(profile)
    if path.suffix in (".yaml", ".yml"):
        return path
    return PROFILES_DIR / f"{profile}.yaml"


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


MAX_NODES = 100_000  # a profile's values, aliases expanded: far above any real profile's


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (where YAML would let the
    later one win without a word); a merge (`<<: *base`) may still be overridden. Numbers are
    read as YAML 1.2 reads them: `1e3` is a number (YAML 1.1: text), `010` is ten (1.1: eight)
    and `1:30` is text (1.1: ninety)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"found the key {key!r} twice", key_node.start_mark,
                )  # fmt: skip
            seen.add(key)
        return super().construct_mapping(node, deep)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_UniqueKeyLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


def _yaml_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    return int(text[2:] if base != 10 else text, base)


_UniqueKeyLoader.add_constructor(_INT, _yaml_int)


def read_yaml(text: str, source: str) -> Any:
    """`text` as YAML, a key given twice in one mapping refused; every value its own, where the
    file shares one through an alias (`train: *t`), so that an override of one changes only it."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    return _unshared(data, source, [0])


def _unshared(value: Any, source: str, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise ConfigError(f"{source}: over {MAX_NODES} values once its aliases are expanded")
    if isinstance(value, dict):
        return {k: _unshared(v, source, count) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v, source, count) for v in value]
    return value


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Set `a.b.c=value` in nested `data`; the value is read as YAML (`3`, `0.5`, `true`, `[1]`).
    A mapping given for a section changes the keys it names (`evaluation={k: 1}` keeps the
    profile's other evaluation settings); a list or value replaces what was there."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} is not of the form key.path=value")
    dotted, raw = assignment.split("=", 1)
    keys = [key.strip() for key in dotted.split(".")]
    if not all(keys):
        raise ConfigError(f"override {assignment!r}: an empty key in {dotted.strip()!r}")
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {key} is a value, not a section")
        node = child
    value, current = read_yaml(raw, f"override {assignment!r}"), node.get(keys[-1])
    both_sections = isinstance(value, dict) and isinstance(current, dict)
    node[keys[-1]] = merged(current, value) if both_sections else value


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: {err.error_count()} invalid setting(s)"]
    for e in err.errors():
        where = ".".join(str(part) for part in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` laid over it section by section (a profile's YAML over another's):
    a mapping in both is merged, anything else (a value, a list) is replaced."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def validate(data: dict[str, Any], source: str = "config") -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_profile(
    profile: str | Path = "tiny",
    overrides: list[str] | None = None,
    cluster_address: str | None = None,
) -> PipelineConfig:
    """The profile with `cluster_address` as its `cluster.address` (when given), then the
    `overrides` on top; overrides that move `bootstrap.path` and name no `bootstrap.hub_id`
    drop the profile's hub_id, which named a download of the profile's path. A deployment that
    runs on a cluster sets the address as a parameter of its own: Prefect merges a run's
    parameters over a deployment's key by key, so a run's `overrides` would replace a list that
    held it, and add to this."""
    path = profile_path(profile)
    if not path.exists():
        raise ConfigError(f"no profile {str(profile)!r}; known: {known_profiles()} or a .yaml path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read: {err.strerror}") from None
    data = read_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: empty; a profile names its settings (see configs/tiny.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    if cluster_address:
        cluster = data.setdefault("cluster", {})
        if not isinstance(cluster, dict):
            raise ConfigError(f"{path}: cluster must be a mapping")
        cluster["address"] = cluster_address
    before = _checkpoint(data.get("bootstrap"))
    for assignment in overrides or []:
        apply_override(data, assignment)
    path_now, hub_now = _checkpoint(data.get("bootstrap"))
    if path_now != before[0] and hub_now == before[1] and hub_now is not None:
        # the profile's hub_id says what ITS path is a download of: another folder given without
        # a hub_id of its own is not that download (messages and MLflow tags would name it)
        del data["bootstrap"]["hub_id"]
    return validate(data, source=str(path))


def _checkpoint(section: Any) -> tuple[Any, Any]:
    """A checkpoint section's (path, hub_id), (None, None) where it is not a mapping."""
    if not isinstance(section, dict):
        return None, None
    return section.get("path"), section.get("hub_id")


def unset_settings(model: BaseModel, prefix: str = "") -> list[str]:
    """The dotted paths of the settings `model` took from the schema's defaults rather than from
    what it was validated from (a section left out counts once, by its own path)."""
    unset = []
    for name in type(model).model_fields:
        path = f"{prefix}{name}"
        if name not in model.model_fields_set:
            unset.append(path)
            continue
        value = getattr(model, name)
        if isinstance(value, dict):
            items = [(f"{path}.{key}.", item) for key, item in value.items()]
        elif isinstance(value, list | tuple):
            items = [(f"{path}.{index}.", item) for index, item in enumerate(value)]
        else:
            items = [(f"{path}.", value)]
        for inner, item in items:
            if isinstance(item, BaseModel):
                unset += unset_settings(item, inner)
    return unset


SHOWN_UNSET = 6  # settings named in the refusal of a partial config; the rest are counted


def flow_config(
    profile: str,
    overrides: list[str] | None,
    config: PipelineConfig | None,
    cluster_address: str | None = None,
    whole: bool = False,
) -> PipelineConfig:
    """What a flow runs on: the named profile with `overrides` (and `cluster_address`), or
    `config` where one is given (with `cluster_address` where it names no address). A `config`
    replaces the profile and its overrides entirely, so one given with overrides is refused
    (they would be dropped without a word), and, with `whole` (a deployment run, where
    `config` comes as JSON: `--params '{"config": ...}'`), one that leaves any setting out is
    refused: the schema's default would take its place, not the profile's, and
    `{"config": {"name": "x"}}` ran the whole recipe at the defaults' sizes."""
    if config is None:
        return load_profile(profile, overrides or [], cluster_address)
    if overrides:
        raise ConfigError(
            f"the parameter config replaces the profile and its overrides, and overrides "
            f"{overrides} were given too: give the settings in one of them"
        )
    if whole and (unset := unset_settings(config)):
        named = ", ".join(unset[:SHOWN_UNSET])
        more = f" and {len(unset) - SHOWN_UNSET} more" if len(unset) > SHOWN_UNSET else ""
        raise ConfigError(
            f"the parameter config leaves out {named}{more}: a config replaces the profile "
            f"whole, so each would take the schema's default, not its value in profile "
            f"{profile!r}. Change settings with --param overrides='[\"evaluation.k=2\"]', or "
            f"give every setting (r1 config --profile {profile} prints them)"
        )
    if cluster_address and config.cluster.address is None:  # the config's own address wins
        data = config.model_dump(mode="json")
        data["cluster"]["address"] = cluster_address
        return validate(data, source="the parameter config")
    return config
