# The Magnetar image: every server role (broker, bookie, autorecovery, standalone) and the CLI.
# The Helm chart (helm/magnetar) runs it by default, with the same user and entrypoint.
#
#   docker build -t magnetar/magnetar:0.1.0.dev0 .
#   docker run --rm -p 6650:6650 magnetar/magnetar:0.1.0.dev0      # standalone, data in the container
#   docker run --rm magnetar/magnetar:0.1.0.dev0 broker --metadata etcd://etcd:2379

# -- build: a wheel of this checkout (no compiler needed: the generated gRPC code is committed)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bookie ./bookie
COPY broker ./broker
COPY metadata ./metadata
COPY proto ./proto
COPY magnetar ./magnetar
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- runtime: slim Python, the wheel and its pinned dependencies, a non-root user
FROM python:3.11-slim
ARG MAGNETAR_UID=10000
RUN groupadd --system --gid "${MAGNETAR_UID}" magnetar \
 && useradd --system --uid "${MAGNETAR_UID}" --gid magnetar --home-dir /var/lib/magnetar \
      --shell /usr/sbin/nologin magnetar \
 && mkdir -p /var/lib/magnetar /etc/magnetar \
 && chown magnetar:magnetar /var/lib/magnetar
COPY --from=build /wheels /wheels
# with the pulsar-compression extra: brokers open Pulsar producers' LZ4, ZSTD and SNAPPY batches
RUN pip install --no-cache-dir "$(ls /wheels/magnetar-*.whl)[pulsar-compression]" && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GRPC_VERBOSITY=ERROR \
    MAGNETAR_LOG_FORMAT=json
USER 10000:10000
WORKDIR /var/lib/magnetar
# broker gRPC and HTTP, bookie gRPC and HTTP
EXPOSE 6650 8080 3181 3182 8000
ENTRYPOINT ["magnetar"]
CMD ["standalone", "--bind-host", "0.0.0.0", "--data-dir", "/var/lib/magnetar/standalone"]
