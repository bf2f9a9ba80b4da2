"""``moto_server``, with two costs per request that S3 does not have taken out.

The store's tables open and commit by listing a ``_delta_log/`` prefix, so the server answers
many small requests; moto spends most of its time on two things around them:

* **Finding the service.** For each request moto lists its own package directory on disk (a
  few hundred ``isdir`` calls) and tries its URL patterns, under a lock that serialises every
  request. The answer depends only on the request's host, so it is looked up once per host.
* **Listing.** moto walks (and first copies) every key of the bucket for each list, so a
  list costs O(keys in the bucket) and every table open slows down as a long run fills its
  bucket; S3 lists from an index. Here each bucket keeps its key names sorted, and a list
  with a prefix walks only the keys under it.

Everything else (the requests, the answers, conditional puts, versions) is moto's own;
:class:`devstack.s3.MotoS3` starts this module as its server::

    python -m devstack.s3_server -H 127.0.0.1 -p 5000
"""

from __future__ import annotations

import bisect
import threading
from types import SimpleNamespace
from typing import Any

from moto import backends
from moto.moto_server import werkzeug_app
from moto.s3 import models
from moto.s3.utils import _VersionedKeyStore

# One lock for every bucket's name index (a dict subclass keeps no lock of its own: moto may copy it).
_INDEX = threading.Lock()


class IndexedKeys(_VersionedKeyStore):
    """A bucket's keys (moto's versioned key store) with their names also kept sorted.

    >>> from types import SimpleNamespace
    >>> key = SimpleNamespace(dispose=lambda: None)  # a stored object, as moto's FakeKey
    >>> keys = IndexedKeys()
    >>> keys["t/_delta_log/1.json"] = key; keys["u/x"] = key; keys["t/_delta_log/0.json"] = key
    >>> [name for name, _ in keys.under("t/")]
    ['t/_delta_log/0.json', 't/_delta_log/1.json']
    >>> keys.pop("u/x"); keys.names
    ['t/_delta_log/0.json', 't/_delta_log/1.json']
    """

    @property
    def names(self) -> list[str]:
        try:
            return self.__dict__["_names"]
        except KeyError:  # made empty, or copied by moto without its index: rebuild it
            return self.__dict__.setdefault("_names", sorted(dict.keys(self)))

    def _adding(self, key: str) -> None:
        if not dict.__contains__(self, key):
            bisect.insort(self.names, key)

    def __setitem__(self, key: str, value: Any) -> Any:
        with _INDEX:
            self._adding(key)
            return super().__setitem__(key, value)

    def setlist(self, key: Any, list_: Any) -> Any:
        with _INDEX:
            self._adding(key)
            return super().setlist(key, list_)

    def pop(self, key: str) -> None:  # type: ignore[override]
        with _INDEX:
            super().pop(key)
            names = self.names
            at = bisect.bisect_left(names, key)
            if at < len(names) and names[at] == key:
                del names[at]

    def under(self, prefix: str) -> list[tuple[str, Any]]:
        """``(name, latest version)`` of the keys whose names start with ``prefix``, in name order."""
        with _INDEX:
            names = self.names
            found = []
            for at in range(bisect.bisect_left(names, prefix), len(names)):
                name = names[at]
                if not name.startswith(prefix):
                    break
                found.append((name, self[name]))
            return found


_list_objects = models.S3Backend.list_objects


def _list_objects_under(self: models.S3Backend, bucket: Any, prefix: str | None, delimiter: str | None,
                        marker: str | None, max_keys: int | None) -> Any:
    """moto's ``list_objects``, given only the keys under ``prefix`` (the only ones it keeps)."""
    if prefix and isinstance(getattr(bucket, "keys", None), IndexedKeys):
        found = bucket.keys.under(prefix)
        bucket = SimpleNamespace(keys=SimpleNamespace(items=lambda: iter(found)))
    return _list_objects(self, bucket, prefix, delimiter, marker, max_keys)


_MODULES = tuple(backends.list_of_moto_modules())
_backend_for_host = werkzeug_app.DomainDispatcherApplication.get_backend_for_host
_BACKENDS: dict[str | None, Any] = {}


def _backend_for_host_once(self: werkzeug_app.DomainDispatcherApplication, host: str | None) -> Any:
    """moto's lookup of a host's backend (its package directory, then its URL patterns), once per host."""
    if host not in _BACKENDS:
        _BACKENDS[host] = _backend_for_host(self, host)
    return _BACKENDS[host]


def install() -> None:
    """Apply both changes to moto in this process (before its server starts)."""
    models._VersionedKeyStore = IndexedKeys  # type: ignore[misc]  # what FakeBucket makes its keys from
    models.S3Backend.list_objects = _list_objects_under  # type: ignore[method-assign]
    backends.list_of_moto_modules = lambda: iter(_MODULES)
    werkzeug_app.DomainDispatcherApplication.get_backend_for_host = _backend_for_host_once  # type: ignore[method-assign]


def main() -> None:
    install()
    from moto.server import main as moto_main

    moto_main()


if __name__ == "__main__":
    main()
