"""AdmissionReview v1 (admission.k8s.io/v1), typed field by field with the exact wire names.

The pod itself stays a plain JSON mapping (`object`): the core parses it, and a typed Pod model
would reject the odd-but-legal specs the webhook must answer rather than crash on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class _Wire(BaseModel):
    # Unknown fields from newer apiservers are kept, not rejected.
    model_config = ConfigDict(extra="allow")


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Wire):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Wire):
    username: str = ""
    uid: str = ""
    groups: list[str] | None = None
    extra: dict[str, list[str]] | None = None


class AdmissionRequest(_Wire):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str | None = None
    requestKind: GroupVersionKind | None = None
    requestResource: GroupVersionResource | None = None
    requestSubResource: str | None = None
    name: str = ""  # empty for generateName pods at CREATE
    namespace: str = ""
    operation: Operation
    userInfo: UserInfo = UserInfo()
    object: dict[str, Any] | None = None
    oldObject: dict[str, Any] | None = None
    dryRun: bool | None = None
    options: dict[str, Any] | None = None


class Status(BaseModel):
    """The subset of metav1.Status the apiserver relays to the client on denial."""

    code: int
    message: str
    reason: str | None = None


class AdmissionResponse(BaseModel):
    uid: str
    allowed: bool
    status: Status | None = None
    patch: str | None = None  # base64 of a JSON Patch array; always together with patchType
    patchType: Literal["JSONPatch"] | None = None
    warnings: list[str] | None = None
    auditAnnotations: dict[str, str] | None = None


class AdmissionReview(_Wire):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest | None = None
    response: AdmissionResponse | None = None
