"""json-server for the tests: :mod:`atmostonce_http.jsonserver`, and ``profile(url, **overrides)``, the shipped
profile ``spec/platforms/json_server.toml`` with the server's port filled in."""

from atmostonce_http.jsonserver import PAGED_VERSION, JsonServer, installed, posts_by_key
from atmostonce_http.jsonserver import json_server_profile as profile

__all__ = ["PAGED_VERSION", "JsonServer", "installed", "posts_by_key", "profile"]
