import pytest

from fednorm.errors import UnknownNameError
from fednorm.registry import Registry, normalize_name


def make() -> Registry:
    reg: Registry = Registry("widget")

    @reg.register("alpha-one")
    def alpha_one(x=1, y=2):
        return (x, y)

    @reg.register()
    def beta(**kw):
        return kw

    return reg


def test_lookup_ignores_case_and_dash_underscore():
    reg = make()
    assert reg.get_builder("ALPHA_one") is reg.get_builder("alpha-ONE")
    assert "Alpha-One" in reg
    assert normalize_name(" Fed-Avg ") == "fed_avg"


def test_duplicate_raises_unless_forced():
    reg = make()
    with pytest.raises(ValueError, match="already registered"):
        reg.add("beta", lambda: None)
    reg.add("beta", lambda: 3, force=True)
    assert reg.get_builder("beta")() == 3


def test_unknown_name_lists_valid_and_suggests():
    reg = make()
    with pytest.raises(UnknownNameError) as info:
        reg.get_builder("alpha_on")
    msg = str(info.value)
    assert "Did you mean 'alpha_one'" in msg and "alpha_one, beta" in msg
    assert isinstance(info.value, ValueError)


def test_build_drops_none_so_defaults_survive():
    reg = make()
    assert reg.build("alpha_one", x=None, y=5) == (1, 5)


def test_list_filters_with_fnmatch():
    reg = make()
    assert reg.list() == ["alpha_one", "beta"]
    assert reg.list(include="al*") == ["alpha_one"]
    assert reg.list(exclude=["al*"]) == ["beta"]
