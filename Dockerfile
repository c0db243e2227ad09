# syntax=docker/dockerfile:1
# Multi-stage build: a static fairshard binary on a distroless, non-root base.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# REVISION: the commit `fairshard version` reports (a build context has no .git).
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/fairshard ./cmd/node \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fairshard /usr/local/bin/fairshard
# Owned by the nonroot user, so a fresh named volume mounted here is writable
# (/secrets: where compose's init service keeps the cluster secret and gossip key).
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build --chown=65532:65532 /out/data /secrets
# /data is where replicas keep their outbox files (one slot directory each).
VOLUME ["/data"]
USER nonroot:nonroot
EXPOSE 8080/tcp 7946/tcp 7946/udp
ENTRYPOINT ["/usr/local/bin/fairshard"]
CMD ["serve"]
