"""IBM's plugin's config.json, parsed into frozen settings.

Pure functions only: the daemon decides when to read the file, and the
device code reads the settings. Every error names the file, the field and
the fix, because an operator reads it in `kubectl logs`.

schema.py (the settings, their defaults and bounds, ConfigError),
values.py (one value at a time: durations, permissions, names, globs),
fields.py (one resource's JSON object, field by field), parse.py (the
file, its JSON, the flat form and the "resources" list), overlap.py (the
checks between resources), watch.py (inotify on the file's directory).
Other packages import the names below from powerdev.config itself.

May import: support, devices (Go globs); nothing above.
"""

from powerdev.config.parse import decode_config, load_config, parse_config, read_config_bytes
from powerdev.config.schema import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_RESOURCE_NAME,
    DEFAULT_SOCKET_NAME,
    KNOWN_FIELDS,
    Config,
    ConfigError,
    ResourceConfig,
    cdi_spec_file,
)
from powerdev.config.values import (
    normalize_permissions,
    parse_duration,
    resource_name_problem,
    socket_path_problem,
)

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_RESOURCE_NAME",
    "DEFAULT_SOCKET_NAME",
    "KNOWN_FIELDS",
    "Config",
    "ConfigError",
    "ResourceConfig",
    "cdi_spec_file",
    "decode_config",
    "load_config",
    "normalize_permissions",
    "parse_config",
    "parse_duration",
    "read_config_bytes",
    "resource_name_problem",
    "socket_path_problem",
]
