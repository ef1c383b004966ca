# The kube-vgpu image: one Python install holding every entry point (vgpu-extender, vgpu, ...);
# the default entrypoint is the scheduler extender. Build: `make image` (docker build -t kube-vgpu:dev .)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY vgpu ./vgpu
COPY vgpu_cli ./vgpu_cli
COPY scheduler_extender ./scheduler_extender
COPY device_plugin ./device_plugin
COPY webhook ./webhook
# A prefix install keeps the build tools (setuptools, wheel caches) out of the final image.
RUN pip install --no-cache-dir --disable-pip-version-check --prefix=/install .

FROM python:3.11-slim
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
