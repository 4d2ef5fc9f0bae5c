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


def test_unregister_removes_and_returns_the_entry():
    reg: Registry[int] = Registry("widget")
    reg.register("a")(1)
    assert reg.unregister("a") == 1 and "a" not in reg and len(reg) == 0
    reg.register("a")(2)  # the name is free again
    assert reg.get("a") == 2
    with pytest.raises(KeyError, match="unknown widget 'b'"):
        reg.unregister("b")
