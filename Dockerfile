# attnserve image.
#   docker build -t attnserve .
#   docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 attnserve
#   docker run --rm -p 9000:9000 -p 9001:9001 -p 9002:9002 attnserve --http_port=9000 --grpc_port=9001 --metrics_port=9002
# Arguments after the image name go to attnserve (`attnserve --help`).
# That runs attnserve alone, its gRPC and HTTP ports bare: for your own
# machine. Never let untrusted clients reach a bare port (Debian's gRPC 1.51
# has no defence against HTTP/2 rapid reset, docs/security.md): on a
# network, run it as deploy/compose.yaml or deploy/k8s do, behind the front
# door this image also carries (nginx -c /etc/attnserve/front-door.conf).
# `docker stop` sends SIGTERM: the server reports NOT_SERVING, drains for
# --grace_period_ms and exits 0 (keep docker's --time above the grace period).
# buildah/podman: build with `--format docker`; their default OCI format has
# no HEALTHCHECK and drops it (with only a warning).
# deploy/container/test_image.sh builds and runs this file as it is.

FROM debian:bookworm AS build
WORKDIR /src
# Dependencies get their own layer, so a source change does not reinstall them.
COPY deploy/install_deps.sh deploy/install_deps.sh
# Packages track bookworm's security updates rather than pinned versions.
# hadolint ignore=DL3008
RUN bash deploy/install_deps.sh --build && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCHMARKS=OFF \
 && cmake --build build -j"$(nproc)" --target attnserve attnctl

FROM debian:bookworm-slim
# Only the shared libraries the binary loads (deploy/install_deps.sh --runtime).
COPY deploy/install_deps.sh /tmp/install_deps.sh
RUN bash /tmp/install_deps.sh --runtime \
 && rm -rf /var/lib/apt/lists/* /tmp/install_deps.sh \
 && useradd --uid 10001 --user-group --no-create-home \
      --shell /usr/sbin/nologin attnserve
COPY --from=build /src/build/server/attnserve /usr/local/bin/attnserve
COPY --from=build /src/build/client/attnctl /usr/local/bin/attnctl
# The example model repository (additive-attention weights, a fitted
# Nadaraya-Watson bandwidth), writable by the server so FitBandwidth can
# save into it; mount your own over /models.
COPY --chown=10001:10001 deploy/models /models
# The attnserve user, by number: Kubernetes' runAsNonRoot accepts only a
# numeric USER.
USER 10001:10001
# The front door (deploy/nginx/front-door.conf), run from this image beside
# attnserve by the Kubernetes Deployment and the Compose stack.
COPY deploy/nginx/front-door.conf /etc/attnserve/front-door.conf
# 8001: gRPC (attention.v1, health, reflection), attnserve's or the front
# door's. 8000: KServe v2 over HTTP/REST, attnserve's or the front door's.
# 8002: Prometheus /metrics. 8081, 9113: the front door's health and its
# exporter's metrics.
EXPOSE 8000 8001 8002 8081 9113
# attnctl health exits 0 only while the server reports SERVING (it reports
# NOT_SERVING while draining). It checks the port and host the server was
# started with, read from PID 1's command line (the entrypoint's attnserve,
# or its arguments behind an init such as `docker run --init`), so
# `--grpc_port=9001` is followed; 8001 when none is given.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/attnctl", "health", "--target_from_cmdline=/proc/1/cmdline", "--deadline", "2s"]
ENTRYPOINT ["/usr/local/bin/attnserve", "--model_repository=/models"]
