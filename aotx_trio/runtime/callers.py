"""Who calls: the caller's principal resolved to its deployment grants (the grant
file read at boot, replaced on reload), intersected with the actions the gateway
vouches for on the call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aotx_trio import errors
from aotx_trio.runtime import validate
from aotx_trio.runtime.quota import Limits
from aotx_trio.runtime.services import GrantTable
from aotx_trio.vocab import grant_mask, principal_key

MAX_CACHED_PRINCIPALS = 4096


class Callers:
    """Resolves callers against ``grants`` (assign a new table to reload it)."""

    def __init__(self, grants: GrantTable) -> None:
        self.grants = grants
        # principal name -> (device key, deployed actions) of the grant table self.grants
        self._principals: dict[str, tuple[str, frozenset[str]]] = {}
        self._principals_of: GrantTable = grants

    def caller(self, params: Mapping[str, Any]) -> tuple[int, str]:
        """(grant bitmask, principal key): the deployment grants of the principal,
        intersected with the actions the gateway vouches for on this call."""
        actions, key = self.actions(params)
        return grant_mask(list(actions)), key

    def actions(self, params: Mapping[str, Any]) -> tuple[frozenset[str], str]:
        """(actions, principal key): the principal's deployed actions that the gateway
        also vouches for on this call."""
        name, actions = validate.caller(params)
        if self._principals_of is not self.grants:   # a new grant table: forget
            self._principals, self._principals_of = {}, self.grants
        known = self._principals.get(name)
        if known is None:
            if len(self._principals) >= MAX_CACHED_PRINCIPALS:
                self._principals.clear()
            key = principal_key(name)
            known = self._principals[name] = (key, self.grants.actions_for(key))
        key, deployed = known
        return frozenset(a for a in actions if a in deployed), key

    def require_invoke(self, params: Mapping[str, Any]) -> None:
        """403 unless the caller may invoke models (``models_invoke``)."""
        actions, _ = self.actions(params)
        if "models_invoke" not in actions:
            raise errors.Forbidden("the principal lacks the models_invoke action",
                                   action="models_invoke", reason="deployment_grant")

    def quota_limits(self) -> Limits | None:
        """The grant file's quotas (None: none are set)."""
        return getattr(self.grants, "quotas", None)
