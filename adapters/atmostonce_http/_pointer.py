"""RFC 6901 JSON pointers (the core's ``atmostonce.pointer``, under the transport's old import path)."""

from atmostonce.pointer import MISSING, pointer_get, pointer_set, split_pointer

__all__ = ["MISSING", "pointer_get", "pointer_set", "split_pointer"]
