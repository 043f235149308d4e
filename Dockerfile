# syntax=docker/dockerfile:1
# One image for every tier: the agent, installed as a wheel into /opt/nvdaemon from the hash-locked runtime set
# (requirements/runtime.txt, `make lock`), and smartmontools. NVML (libnvidia-ml) is not in the image: the GPU tier
# dlopens it at run time from what the NVIDIA container runtime injects. No compiler or build tool in the final image.
#
#   docker build -t nvdaemon:dev .
#
# tests/deploy/test_dockerfile.py runs the build stage's RUN steps in a fresh virtual environment, so a renamed module,
# entry point or lock file breaks the suite even where no Docker engine is available.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
ENV VENV=/opt/nvdaemon \
    BUILD_VENV=/opt/build \
    WHEELHOUSE=/tmp/wheels
WORKDIR /src
COPY requirements/runtime.txt requirements/build.txt requirements/
# Build tools (setuptools, wheel) in their own venv, from hashes: nothing unpinned reaches the wheel build.
RUN python -m venv "$BUILD_VENV" \
 && "$BUILD_VENV/bin/pip" install --require-hashes --only-binary=:all: -r requirements/build.txt
# The runtime set alone, from hashes and wheels only, into a venv without pip.
RUN python -m venv --without-pip "$VENV" \
 && "$BUILD_VENV/bin/pip" --python "$VENV/bin/python" install --require-hashes --only-binary=:all: \
      -r requirements/runtime.txt
COPY pyproject.toml README.md ./
COPY nvdaemon/ nvdaemon/
# The project as a wheel; --no-index: every dependency must already be there from the lock.
RUN "$BUILD_VENV/bin/pip" wheel --no-deps --no-build-isolation --wheel-dir "$WHEELHOUSE" . \
 && "$BUILD_VENV/bin/pip" --python "$VENV/bin/python" install --no-index --find-links "$WHEELHOUSE" nvdaemon \
 && "$VENV/bin/nvdaemon" --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="nvdaemon" \
      org.opencontainers.image.description="Node hardware telemetry and events agent (core, SMART, GPU tiers)" \
      org.opencontainers.image.licenses="Apache-2.0"
# smartctl for the SMART tier; then the base image's own pip/setuptools/wheel go (no build tools at run time).
RUN apt-get update \
 && apt-get install -y --no-install-recommends smartmontools \
 && rm -rf /var/lib/apt/lists/* \
 && python -m pip uninstall --yes --quiet pip setuptools wheel
COPY --from=build /opt/nvdaemon /opt/nvdaemon
ENV PATH=/opt/nvdaemon/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root by default (the core and GPU tiers); the chart runs the SMART tier as root with SYS_RAWIO and SYS_ADMIN.
USER 65532:65532
EXPOSE 9847
ENTRYPOINT ["nvdaemon"]
CMD ["run", "--config", "/etc/nvdaemon/config.yaml"]
