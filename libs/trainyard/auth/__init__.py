"""Verified identity and role-based authorization for the gateway: principals
and roles, the authorization table, API tokens in NATS KV, bearer JWTs."""

from trainyard.auth.authenticator import Authenticator, bearer_credential, challenge
from trainyard.auth.bootstrap import admin_token_path, ensure_admin_token, ensure_admin_token_at, read_admin_token
from trainyard.auth.oidc import JwtConfig, JwtVerifier, KeysUnavailable, jwt_config
from trainyard.auth.policy import POLICY, Action, Scope, authorize, check_grant, may_see, tenant_filter
from trainyard.auth.principal import PermissionDenied, Principal, Role, Unauthenticated
from trainyard.auth.tokens import BadTokenRequest, TokenNotFound, TokenRecord, TokenStore

__all__ = [
    "POLICY",
    "Action",
    "Authenticator",
    "BadTokenRequest",
    "JwtConfig",
    "JwtVerifier",
    "KeysUnavailable",
    "PermissionDenied",
    "Principal",
    "Role",
    "Scope",
    "TokenNotFound",
    "TokenRecord",
    "TokenStore",
    "Unauthenticated",
    "admin_token_path",
    "authorize",
    "bearer_credential",
    "challenge",
    "check_grant",
    "ensure_admin_token",
    "ensure_admin_token_at",
    "jwt_config",
    "may_see",
    "read_admin_token",
    "tenant_filter",
]
