"""Reading config.json: the file's bytes, its text, its JSON, and the
Config they make, in IBM's plugin's flat form (one resource, named on the
command line) or as a "resources" list.

Each resource's own fields are read by fields.py; the checks between
resources are overlap.py's. A missing or empty file means the defaults,
with a warning that says what they advertise.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from powerdev.config.fields import resource_fields
from powerdev.config.overlap import check_overlaps, check_spec_files
from powerdev.config.schema import (
    DEFAULT_RESOURCE_NAME,
    DEFAULT_SOCKET_NAME,
    MAX_CONFIG_BYTES,
    MAX_RESOURCES,
    Config,
    ConfigError,
    ResourceConfig,
    default_socket,
)
from powerdev.config.values import (
    cdi_name_problem,
    json_type,
    resource_name_problem,
    socket_problem,
)


def load_config(
    path: str | Path,
    *,
    resource_name: str = DEFAULT_RESOURCE_NAME,
    socket_name: str = DEFAULT_SOCKET_NAME,
) -> Config:
    """Read and parse a config file; a missing file means the defaults, as in
    IBM's plugin, and a warning that says what they mean."""
    path = Path(path)
    raw: bytes | None = None
    try:
        raw = read_config_bytes(path)
        text = decode_config(raw, str(path))
    except FileNotFoundError:
        source = f"{path} (missing: defaults)"
        config = parse_config(
            "", source=source, resource_name=resource_name, socket_name=socket_name
        )
        return replace(
            config, warnings=(_defaults_warning(f"{path} does not exist"), *config.warnings)
        )
    except IsADirectoryError:
        raise ConfigError(
            str(path), None, "is a directory", "point --config at the config.json file inside it"
        ) from None
    except OSError as err:
        raise ConfigError(
            str(path), None, f"cannot be read ({err})", "check the file and its permissions"
        ) from None
    else:
        source = str(path)
    config = parse_config(text, source=source, resource_name=resource_name, socket_name=socket_name)
    if not text.strip():
        config = replace(config, warnings=(_defaults_warning(f"{path} is empty"), *config.warnings))
    return replace(config, raw=raw)


def _defaults_warning(why: str) -> str:
    return (
        f"{why}: using the defaults, as IBM's plugin does. They advertise every block device "
        "of the host (disks, partitions, dm-*; not loop, ram or zram) except those the host "
        'mounts, swaps on or holds; write a config.json with "include-devices" to choose'
    )


def read_config_bytes(path: Path) -> bytes:
    """The file's bytes, refusing a file far larger than any config."""
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            str(path),
            None,
            f"is larger than {MAX_CONFIG_BYTES // 1024} KiB",
            "point --config at the config.json file",
        )
    return data


def decode_config(data: bytes, source: str) -> str:
    """The file's bytes as text; ConfigError (naming the file) if not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            source,
            None,
            f"is not UTF-8 text ({err.reason} at byte {err.start})",
            "save it as UTF-8 JSON",
        ) from None


def parse_config(
    text: str,
    *,
    source: str,
    resource_name: str = DEFAULT_RESOURCE_NAME,
    socket_name: str = DEFAULT_SOCKET_NAME,
) -> Config:
    """Parse config.json text. Raises ConfigError naming source, field and fix."""
    data = _json_object(text, source)
    if "resources" in data:
        return _parse_resources(data, source)
    # IBM's plugin's flat form: one resource, named on the command line
    problem = resource_name_problem(resource_name)
    if problem:
        raise ConfigError(
            "--resource-name",
            None,
            f"{resource_name!r}: {problem}",
            f"use a name such as {DEFAULT_RESOURCE_NAME}",
        )
    problem = socket_problem(socket_name)
    if problem:
        raise ConfigError(
            "--socket-name",
            None,
            f"{socket_name!r} {problem}",
            f"use a file name such as {DEFAULT_SOCKET_NAME}",
        )
    res, warnings = resource_fields(data, source, "")
    resource = ResourceConfig(name=resource_name, socket=socket_name, **res)  # type: ignore[arg-type]
    _check_cdi(resource, source, "cdi")
    return Config(source=source, resources=(resource,), warnings=warnings)


def _json_object(text: str, source: str) -> dict[str, object]:
    """The file's JSON, which must be an object; blank text is {}."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as err:
        raise ConfigError(
            source,
            None,
            f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
            "fix the JSON syntax",
        ) from None
    except RecursionError:
        raise ConfigError(
            source, None, "nests arrays or objects too deeply", "write a flat JSON object"
        ) from None
    except ValueError as err:  # a number of more digits than Python reads
        # Python's own words end "use sys.set_int_max_str_digits()", a fix for
        # a programmer: say what is wrong with the file instead.
        digits = sys.get_int_max_str_digits()
        why = f"a number has more than {digits} digits" if "digits" in str(err) else str(err)
        raise ConfigError(
            source, None, f"cannot be read as JSON ({why})", "fix the value"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            None,
            f"the top level is a JSON {json_type(data)}",
            'write an object such as {"permissions": "rw"}',
        )
    return data


def _parse_resources(data: dict[str, object], source: str) -> Config:
    """The form with several named resources: {"resources": [{...}, ...]}."""
    entries = _resource_list(data, source)
    resources: list[ResourceConfig] = []
    warnings: list[str] = []
    for i, entry in enumerate(entries):
        resource, more = _resource(entry, source, i)
        resources.append(resource)
        warnings.extend(more)
    _check_unique(resources, source)
    check_spec_files(resources, source)
    check_overlaps(resources, source)
    return Config(source=source, resources=tuple(resources), warnings=tuple(warnings))


def _resource_list(data: dict[str, object], source: str) -> list[object]:
    entries = data["resources"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            source,
            "resources",
            f"is a JSON {json_type(entries)}" if not isinstance(entries, list) else "is empty",
            'write a list of resources, such as [{"name": "power-dev-plugin/lun", ...}]',
        )
    if len(entries) > MAX_RESOURCES:
        raise ConfigError(
            source,
            "resources",
            f"lists {len(entries)} resources, more than {MAX_RESOURCES}",
            "merge resources that hand out the same devices",
        )
    stray = [k for k in data if k != "resources"]
    if stray:
        raise ConfigError(
            source,
            stray[0],
            'is beside "resources"',
            'move it into each resource of the "resources" list',
        )
    return entries


def _resource(entry: object, source: str, i: int) -> tuple[ResourceConfig, tuple[str, ...]]:
    """Entry i of the "resources" list, and the warnings about it."""
    prefix = f"resources[{i}]."
    if not isinstance(entry, dict):
        raise ConfigError(
            source,
            f"resources[{i}]",
            f"is a JSON {json_type(entry)}",
            'write each resource as an object with a "name"',
        )
    name = _entry_name(entry, source, prefix)
    socket = _entry_socket(entry, source, prefix, name)
    res, warnings = resource_fields(entry, source, prefix)
    resource = ResourceConfig(name=name, socket=socket, **res)  # type: ignore[arg-type]
    _check_cdi(resource, source, prefix + "name")
    return resource, warnings


_NAME_FIX = "name each resource as an extended resource, such as power-dev-plugin/lun"


def _entry_name(entry: dict[str, object], source: str, prefix: str) -> str:
    if "name" not in entry:
        raise ConfigError(source, prefix + "name", "is missing", _NAME_FIX)
    name = entry["name"]
    if not isinstance(name, str):
        raise ConfigError(
            source,
            prefix + "name",
            f"is a JSON {json_type(name)}",
            'write it as a string such as "power-dev-plugin/lun"',
        )
    problem = resource_name_problem(name)
    if problem:
        raise ConfigError(source, prefix + "name", f"{name!r}: {problem}", _NAME_FIX)
    return name


def _entry_socket(entry: dict[str, object], source: str, prefix: str, name: str) -> str:
    """The entry's socket file name; by default, one made of its name."""
    socket = entry.get("socket", default_socket(name))
    if not isinstance(socket, str):
        raise ConfigError(
            source,
            prefix + "socket",
            f"is a JSON {json_type(socket)}",
            'write it as a string such as "lun.sock", or leave it out',
        )
    problem = socket_problem(socket)
    if problem:
        raise ConfigError(
            source,
            prefix + "socket",
            f"{socket!r} {problem}",
            "use a file name such as lun.sock, or leave it out",
        )
    return socket


def _check_cdi(resource: ResourceConfig, source: str, where: str) -> None:
    if resource.cdi:
        problem = cdi_name_problem(resource.name)
        if problem:
            raise ConfigError(
                source,
                where,
                f"{resource.name!r}: {problem}",
                "rename the resource, or turn cdi off",
            )


def _check_unique(resources: list[ResourceConfig], source: str) -> None:
    """Each resource has its own name and its own socket."""
    for field_name in ("name", "socket"):
        seen: dict[str, int] = {}
        for i, resource in enumerate(resources):
            value = getattr(resource, field_name)
            if value in seen:
                raise ConfigError(
                    source,
                    f"resources[{i}].{field_name}",
                    f"{value!r} is also the {field_name} of resources[{seen[value]}]",
                    f"give each resource its own {field_name}",
                )
            seen[value] = i
