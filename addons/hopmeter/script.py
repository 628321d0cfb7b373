"""Entry for plain mitmproxy: `mitmdump -s "$(hopmeter --addon-path)" --set hopmeter_hop=edge`."""

from hopmeter.metrics_addon import make_addons

addons = make_addons()
