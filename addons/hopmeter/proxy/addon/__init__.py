"""What mitmproxy loads: hopmeter's addons, the same in a user's mitmdump or mitmweb
(`mitmdump -s "$(hopmeter --addon-path)"`) and in `hopmeter run` (`chain.default_addons`).

`meter` (HopMeter: the hooks that hand each flow to the sans-I/O core), `tap` (the stream
callables), `passage` (what mitmproxy's own features keep), `guard`, `failures` and `readiness`
(the upstream), `pairing` (a request seen at several listeners), `browser_gate` (which loads
`browser_meter` and `beacons` once `--browser` is on), `tokenizers` and `tokenizer_load`,
`outputs` and `outlets` (where a finished flow goes), `ui` (mitmweb and the console). Nothing
here changes anything process-wide.
"""
