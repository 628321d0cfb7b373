"""Tests for hopmeter.proxy.runner's option handling (the runner itself runs in every
integration test)."""

from __future__ import annotations

import pytest
from mitmproxy import exceptions
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.test import taddons

from hopmeter.proxy.addon import HopMeter
from hopmeter.proxy.guard import UpstreamGuard
from hopmeter.proxy.runner import default_addons, set_options


def test_set_takes_float_options_that_mitmproxy_cannot_parse() -> None:
    """`--set hopmeter_read_timeout=1.5` sets the float; other options go through mitmproxy's
    own parser; a value that is not a number is an OptionsError naming the option."""
    meter = HopMeter()
    guard = UpstreamGuard(meter)
    with taddons.context(meter, guard, Proxyserver()) as tctx:
        set_options(tctx.options, ["hopmeter_read_timeout=1.5", "connection_strategy=lazy"])
        assert tctx.options.hopmeter_read_timeout == 1.5
        assert tctx.options.connection_strategy == "lazy"
        with pytest.raises(exceptions.OptionsError, match="hopmeter_read_timeout: 'soon' is not"):
            set_options(tctx.options, ["hopmeter_read_timeout=soon"])


def test_the_guard_runs_after_the_measuring_addon() -> None:
    """The guard reads the stream tap HopMeter installs in responseheaders: it comes after."""
    names = [type(a).__name__ for a in default_addons()]
    assert names.index("HopMeter") < names.index("UpstreamGuard")
    assert "Readiness" in names and "Drain" not in names  # the drain is `hopmeter run`'s only
