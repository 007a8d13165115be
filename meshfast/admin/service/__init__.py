"""Admin-plane operations: every write is one transaction that bumps the config sequence,
sends NOTIFY (delivered on commit) and appends to the audit log.

One module per resource, each with its request bodies, their validation and its operations:
users (and their primary key), keys (named keys), providers, models (and deployments), policies
(grants, policies and the kill switch) and registry (registry files); common holds the write
transaction and what they share. :class:`AdminService` is their operations together."""

from __future__ import annotations

from meshfast.admin.service.common import (
    Price,
    Rebuild,
    ServiceBase,
    Timestamp,
    Verifier,
    decode,
    label,
    parse_uuid,
    row_json,
)
from meshfast.admin.service.keys import MAX_OVERLAP_S, KeyCreate, KeyName, KeyOperations, KeyRotate
from meshfast.admin.service.models import (
    MODEL_KINDS,
    MODEL_STATUSES,
    DeploymentCreate,
    ModelCreate,
    ModelOperations,
    ModelStatusBody,
    ModelUpdate,
    decode_model_update,
)
from meshfast.admin.service.policies import AccessBody, AccessOperations, KillSwitchBody, PolicyBody
from meshfast.admin.service.providers import (
    FAMILIES,
    GenericSettings,
    ProviderCreate,
    ProviderOperations,
    check_base_url,
    provider_settings,
)
from meshfast.admin.service.registry import (
    Registry,
    RegistryApplication,
    RegistryDeployment,
    RegistryOperations,
    RegistryUser,
    parse_registry,
)
from meshfast.admin.service.users import ExpiryBody, UserCreate, UserOperations, UserUpdate


class AdminService(UserOperations, KeyOperations, ProviderOperations, ModelOperations, AccessOperations,
                   RegistryOperations):
    """Every admin-plane operation on one pool (see :class:`ServiceBase` for the write)."""


__all__ = [
    "FAMILIES", "MAX_OVERLAP_S", "MODEL_KINDS", "MODEL_STATUSES",
    "AccessBody", "AccessOperations", "AdminService", "DeploymentCreate", "ExpiryBody", "GenericSettings",
    "KeyCreate", "KeyName", "KeyOperations", "KeyRotate", "KillSwitchBody", "ModelCreate", "ModelOperations",
    "ModelStatusBody", "ModelUpdate", "PolicyBody", "Price", "ProviderCreate", "ProviderOperations", "Rebuild",
    "Registry", "RegistryApplication", "RegistryDeployment", "RegistryOperations", "RegistryUser", "ServiceBase",
    "Timestamp", "UserCreate", "UserOperations", "UserUpdate", "Verifier",
    "check_base_url", "decode", "decode_model_update", "label", "parse_registry", "parse_uuid", "provider_settings",
    "row_json",
]
