# dissem in a container: `docker build -t dissem .` (see README, "Packaging").
# Two stages: the build (Rust, all crates from crates.io; no protoc needed, the build compiles
# the .proto files with protox), then a slim runtime with the binary alone, run as a user
# that is not root, its data on a volume.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p dissem \
    && install -m 0755 target/release/dissem /usr/local/bin/dissem

FROM debian:bookworm-slim
# ca-certificates: webhooks and links over https; libvulkan1 + Mesa: the match shader on a
# GPU the container is given (`--gpu auto` falls back to the CPU without one)
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libvulkan1 mesa-vulkan-drivers \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 dissem \
    && useradd --system --uid 10001 --gid dissem --home-dir /var/lib/dissem --shell /usr/sbin/nologin dissem \
    && install -d -o dissem -g dissem -m 0750 /var/lib/dissem
COPY --from=build /usr/local/bin/dissem /usr/local/bin/dissem
USER 10001:10001
ENV DISSEM_DATA=/var/lib/dissem
VOLUME ["/var/lib/dissem"]
# 7700: the gRPC API (and the cluster's internal calls); 9100: /metrics when asked for
EXPOSE 7700 9100
ENTRYPOINT ["/usr/local/bin/dissem"]
# an embedded single-node cluster on every interface: it refuses to start without
# --auth-file (DISSEM_AUTH_FILE) or an explicit --insecure
CMD ["up", "--listen", "0.0.0.0:7700"]
