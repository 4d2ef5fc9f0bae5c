import pytest

from attnprobe.core.registry import Registry


def test_register_get_and_errors():
    reg: Registry[int] = Registry("widget")
    reg.register("a")(1)
    assert reg.get("a") == 1 and reg.names() == ["a"] and "a" in reg
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(2)
    with pytest.raises(KeyError, match="choose one of 'a'"):
        reg.get("b")
