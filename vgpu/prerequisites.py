"""Start-up messages for a service run without what it needs (an apiserver, a file, a folder).

Each is one line, for stderr before a non-zero exit: what is missing and what to pass (flag and env), so a
person who starts a binary by hand learns the fix instead of reading a Kubernetes client traceback. Pure
string building; the services' main modules detect the condition.
"""

from __future__ import annotations


def no_kube_api(program: str, *, kubeconfig: str, reason: str, flag: str, env: str = "", alternative: str = "") -> str:
    """No Kubernetes API: the given kubeconfig cannot be loaded, or (none given) no in-cluster service account."""
    also = f", or {alternative}" if alternative else ""
    via = f" (env {env})" if env else ""
    if kubeconfig:
        return f"{program}: cannot load the kubeconfig {kubeconfig} ({reason}); pass a valid one with {flag}{via}{also}"
    return (
        f"{program}: no Kubernetes API: no kubeconfig was given and this is not a pod with a service account "
        f"({reason}); pass {flag} PATH{via}{also}"
    )


def missing_path(program: str, *, what: str, path: str, flag: str, env: str, hint: str = "") -> str:
    """A file or folder the service needs is not there."""
    tail = f"; {hint}" if hint else ""
    return f"{program}: {what} {path} does not exist; pass the right path with {flag} (env {env}){tail}"
