"""data/hf_families.toml against Transformers 5.23 itself: every default parmem applies where a
config.json omits a key is the default of that family's own configuration class, and every alias
is the class's attribute_map (issue 28). Read from the installed transformers, nothing pasted."""

import dataclasses

import pytest

transformers = pytest.importorskip("transformers")

from parmem._data import load_toml  # noqa: E402

TABLE = {k: v for k, v in load_toml("hf_families.toml").items() if k != "refused"}


@pytest.mark.parametrize("family", sorted(TABLE))
def test_defaults_are_the_config_class_defaults(family):
    entry = TABLE[family]
    cls = getattr(transformers, entry["config"])
    # the declared default of each field (a class's __post_init__ may then rewrite it from
    # other keys, as Qwen's does sliding_window from use_sliding_window; hfconfig applies those
    # rules itself)
    declared = {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}
    cfg = cls()
    for k, want in entry.get("defaults", {}).items():
        got = declared[k] if k in declared else getattr(cfg, k)
        assert got == want, (family, k, got, want)
    for alias, target in entry.get("aliases", {}).items():
        assert cls.attribute_map.get(alias) == target, (family, alias)
