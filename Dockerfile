# powerdev: the device plugin image, for linux/amd64, linux/ppc64le and linux/s390x.
#
#   docker buildx build --platform linux/amd64,linux/ppc64le,linux/s390x \
#     -t quay.io/example/powerdev:0.1.0 --push .
#
# Base: Debian 12 "bookworm" slim with CPython 3.11, the official Python image,
# which is published for all three architectures (UBI 9 Python is too, but is
# larger and needs a Red Hat registry). Pinned to an exact tag; pin a digest
# in your own build pipeline for fully reproducible images.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Dependencies first, in a layer of their own: they change less than our code.
COPY pyproject.toml README.md ./
# The stub package and its build output go again at once: a stale
# build/lib/powerdev/__init__.py would otherwise end up in the real wheel.
RUN mkdir powerdev && touch powerdev/__init__.py \
    && pip wheel --no-cache-dir --wheel-dir /wheels . \
    && rm -r /wheels/powerdev-*.whl powerdev build ./*.egg-info
COPY powerdev ./powerdev
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# libudev is what pyudev loads to read device events.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
# Runtime dependencies only (no test extras); byte-compiled now, because the
# root filesystem is read-only at run time.
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && python -m compileall -q /usr/local/lib/python3.11/site-packages/powerdev
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Runs as UID 0 with every capability dropped (see deploy/03-daemonset.yaml):
# the kubelet's device-plugins directory is root's, and root may write there
# as its owner, without CAP_DAC_OVERRIDE.
ENTRYPOINT ["powerdev", "run"]
