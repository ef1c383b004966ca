# The kube-vgpu image: one Python install holding every entry point (vgpu-extender, vgpu, ...);
# the default entrypoint is the scheduler extender. Build: `make image` (docker build -t kube-vgpu:dev .)
#
# Supply chain: the base image is pinned by digest (tag in the comment; refresh both together, e.g. with
# `docker buildx imagetools inspect python:3.11-slim`), and the dependencies are installed from the
# hash-pinned requirements/runtime.lock (`make lock`), the project itself without resolving anything.
# tag: python:3.11-slim (the digest of its multi-platform index)
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements/runtime.lock ./requirements/
RUN pip install --no-cache-dir --disable-pip-version-check --prefix=/install --require-hashes \
      -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY vgpu ./vgpu
COPY vgpu_cli ./vgpu_cli
COPY scheduler_extender ./scheduler_extender
COPY device_plugin ./device_plugin
COPY webhook ./webhook
COPY vgpu_http ./vgpu_http
# A prefix install keeps the build tools (setuptools, wheel caches) out of the final image.
RUN pip install --no-cache-dir --disable-pip-version-check --prefix=/install --no-deps .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kube-vgpu" \
      org.opencontainers.image.description="Role-aware fractional GPUs for LLM inference on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
# Non-root, with a fixed uid so `runAsNonRoot` / `runAsUser: 10001` in deploy/ can be checked by the kubelet.
RUN groupadd --system --gid 10001 vgpu \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vgpu
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["vgpu-extender"]
CMD ["--source=kube", "--port=8443"]
