"""``--set`` paths with ``[*]`` (every item) and ``[name]`` (the named item) selectors."""

from __future__ import annotations

import pytest

from fedsim.config.loading import apply_override
from fedsim.config.overrides import ALL, Named, split_path
from fedsim.errors import ConfigError


def tree() -> dict:
    return {"clients": {"groups": [
        {"name": "phone", "noise": {"sigma": 1.0}, "batch_size": 8},
        {"name": "laptop", "noise": 1.2, "batch_size": 16},
        {"name": "server", "noise": {"sigma": 2.0}, "batch_size": 32},
    ]}}


def test_split_path_parts() -> None:
    assert split_path("clients.groups[*].noise.sigma") == ["clients", "groups", ALL, "noise",
                                                          "sigma"]
    parts = split_path("clients.groups[phone].batch_size")
    assert parts == ["clients", "groups", "phone", "batch_size"] and isinstance(parts[2], Named)
    assert split_path("clients.groups[2].count") == ["clients", "groups", 2, "count"]
    for bad in ("clients..groups", "[0]x", ".a", "a[", ""):
        with pytest.raises(ConfigError):
            split_path(bad)


def test_star_sets_every_group_and_copies_the_value() -> None:
    data = apply_override(tree(), "clients.groups[*].batch_size=64")
    assert [g["batch_size"] for g in data["clients"]["groups"]] == [64, 64, 64]
    data = apply_override(data, "clients.groups[*].network={uplink: {drop: 0.1}}")
    data = apply_override(data, "clients.groups[0].network.uplink.drop=0.5")
    # each group got its own copy: changing one leaves the others
    assert [g["network"]["uplink"]["drop"] for g in data["clients"]["groups"]] == [0.5, 0.1, 0.1]


def test_named_group() -> None:
    data = apply_override(tree(), "clients.groups[server].noise.sigma=3.5")
    assert [g["noise"] for g in data["clients"]["groups"]] == [{"sigma": 1.0}, 1.2, {"sigma": 3.5}]


def test_errors_name_the_missing_group_and_the_concrete_item() -> None:
    with pytest.raises(ConfigError, match=r"clients.groups has no group named 'tablet' "
                                          r"\(groups: phone, laptop, server\)"):
        apply_override(tree(), "clients.groups[tablet].batch_size=4")
    # a bare-number noise cannot take .sigma: the message names clients.groups[1]
    with pytest.raises(ConfigError, match=r"clients.groups\[1\].noise is 1.2, not a mapping"):
        apply_override(tree(), "clients.groups[*].noise.sigma=1.5")
    with pytest.raises(ConfigError, match="empty list"):
        apply_override({"clients": {"groups": []}}, "clients.groups[*].count=1")
    with pytest.raises(ConfigError, match="is not a list"):
        apply_override(tree(), "clients[*].count=1")
    with pytest.raises(ConfigError, match=r"out of range \(3 items\)"):
        apply_override(tree(), "clients.groups[3].count=1")


@pytest.mark.parametrize(("assignment", "message"), [
    ("clients.grups[*].noise.sigma=1.5", "clients.grups is not in the scenario - did you mean "
                                         "'groups'?"),
    ("client.groups[0].count=3", "client.groups is not in the scenario - did you mean "
                                 "'clients'?"),
    ("groups[server].count=3", "groups is not in the scenario - it belongs under 'clients'"),
    # A key the file leaves out: a list cannot be made by selecting its items.
    ("model.foo[0]=1", "model.foo is not in the scenario (an absent list is set whole: "
                       "model.foo=[...])"),
    # a review's: a key the scenario accepts was suggested as the one meant
    ("clients.groups[0].budget[*]=1", "clients.groups[0].budget is not in the scenario (an "
                                      "absent list is set whole: clients.groups[0].budget=[...])"),
])
def test_a_missing_key_before_a_selector_is_named_with_a_suggestion(
        assignment: str, message: str) -> None:
    """A stranger's typo in a --grid or --set path (clients.grups[*]) read 'clients.grups is
    not a list'. The key is now said to be absent, with the key the scenario accepts."""
    with pytest.raises(ConfigError) as raised:
        apply_override(tree(), assignment)
    assert str(raised.value).endswith(f": {message}")


def test_a_path_deeper_than_a_scenario_may_nest_is_a_clear_error() -> None:
    # issue 25 finding 9: a 50,000-part path ended in a RecursionError traceback
    from fedsim.config.limits import MAX_YAML_DEPTH
    with pytest.raises(ConfigError, match=f"at most {MAX_YAML_DEPTH} parts"):
        apply_override(tree(), ".".join(["a"] * 50_000) + "=1")
    with pytest.raises(ConfigError, match=f"at most {MAX_YAML_DEPTH} parts"):
        apply_override(tree(), "a" + "[0]" * (MAX_YAML_DEPTH + 1) + "=1")
    deepest = apply_override(None, ".".join(["a"] * MAX_YAML_DEPTH) + "=1")
    for _ in range(MAX_YAML_DEPTH - 1):
        deepest = deepest["a"]
    assert deepest == {"a": 1}
