"""Entry for plain mitmproxy: `mitmdump -s "$(hopmeter --addon-path)" --set hopmeter_hop=edge`."""

from hopmeter.proxy.addon import script_errors
from hopmeter.proxy.addon.chain import default_addons

script_errors.install()  # a bad option said in one line, not a traceback
addons = default_addons()
