"""Entry for plain mitmproxy: `mitmdump -s "$(hopmeter --addon-path)" --set hopmeter_hop=edge`."""

from hopmeter.proxy.addon.chain import default_addons

addons = default_addons()
