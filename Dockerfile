# syntax=docker/dockerfile:1
# The sb-inbox worker image. Build: docker build -t sb-inbox .
# Dependencies are cached in BuildKit cache mounts (registry, git and target folders), so a change
# to the sources rebuilds only this crate, and the cache survives Cargo.toml edits.

FROM rust:1.95-bookworm AS builder
WORKDIR /build
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/build/target,sharing=locked \
    cargo build --release --locked --bin sb-inbox \
    && cp target/release/sb-inbox /sb-inbox

# glibc and libgcc only (rusqlite is bundled, tokio-postgres needs no OpenSSL); runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /sb-inbox /usr/local/bin/sb-inbox
ENV SB_INBOX_HEALTH_PORT=8080
# /healthz and /readyz.
EXPOSE 8080
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/sb-inbox"]
CMD ["run"]
