"""A folder of its own for the script plain mitmproxy loads (`mitmdump -s`).

mitmproxy puts a script's folder at the front of `sys.path` and leaves it there, so every module
beside the script could be imported later under a bare name in its place (a `tokenizers.py`
beside it would shadow Hugging Face's `tokenizers`). Here the script has no neighbours.
"""
