"""Shared file-format knowledge: binary primitives and on-disk naming conventions that codecs
and layouts both use (never a codec or a layout itself)."""
