# syntax=docker/dockerfile:1
# The sb-inbox worker image. Build: docker build -t sb-inbox .
# Dependencies are cached in BuildKit cache mounts (registry, git and target folders), so a change
# to the sources rebuilds only this crate, and the cache survives Cargo.toml edits.

# The builder only compiles; pinned by digest as the runtime image is, so a rebuild of a tag uses
# the reviewed toolchain image (the tag names the toolchain for readers and for Dependabot's
# docker updates). The digest is the one BuildKit resolved rust:1.95-bookworm to in public build
# logs (not resolvable from the development machine, which reaches no image registry); the
# infra workflow's `docker build` is where it is first pulled by this project.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS builder
WORKDIR /build
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/build/target,sharing=locked \
    cargo build --release --locked -p sb-inbox-cli --bin sb-inbox \
    && cp target/release/sb-inbox /sb-inbox

# glibc and libgcc only (rusqlite is bundled, tokio-postgres needs no OpenSSL); runs as uid 65532.
# Pinned by digest so a rebuild ships the reviewed bytes; Dependabot (docker) proposes updates.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=builder /sb-inbox /usr/local/bin/sb-inbox
ENV SB_INBOX_HEALTH_PORT=8080
# /healthz and /readyz.
EXPOSE 8080
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/sb-inbox"]
CMD ["run"]
