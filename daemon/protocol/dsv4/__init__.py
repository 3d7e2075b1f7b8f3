"""DeepSeek-V4's chat format: the native encoding (encoding.py), the output parser (output.py) and the
family object the daemon asks (family.py; daemon/protocol/families.py holds the registry)."""
