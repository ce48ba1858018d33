# syntax=docker/dockerfile:1
# powerdev: the device plugin image, for linux/amd64, linux/arm64, linux/ppc64le and linux/s390x.
#
#   docker buildx build --platform linux/amd64,linux/arm64,linux/ppc64le,linux/s390x \
#     --sbom=true --provenance=mode=max -t REGISTRY/powerdev:TAG --push .
#
# (buildx needs a builder that can build for several platforms, and QEMU's
# binfmt handlers to run the other architectures' RUN steps; see
# docs/image.md. The release workflow, .github/workflows/release.yml, runs
# this build on a version tag.) Nothing below names an architecture: each
# platform's build stage installs that platform's wheels.
#
# Base: Debian 12 "bookworm" slim with CPython 3.11, the official Python image,
# which is published for all four architectures (UBI 9 Python is too, but is
# larger and needs a Red Hat registry). The tag is the minor one: it moves to
# each new 3.11 patch release and is rebuilt when Debian publishes security
# fixes, so a build today gets today's fixes (an exact tag such as 3.11.11
# is never rebuilt once 3.11.12 is out). The release workflow pins it: it
# looks up the tag's digest and builds with
#   --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest>
# so a release names the one base it was built on; do the same in your own
# pipeline for reproducible images. It already has libudev1, which pyudev
# loads: apt (Priority: required) depends on libapt-pkg6.0, which depends on
# libudev1. Where no registry can be reached, PYTHON_IMAGE names a base made
# from Debian's own packages instead (python3, python3-pip, libudev1; see
# docs/image.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Every dependency at the version pinned in constraints.txt (the build
# backend too): two builds of one tag install the same thing.
ENV PIP_CONSTRAINT=/src/constraints.txt
# Dependencies first, in a layer of their own: they change less than our code.
COPY pyproject.toml README.md constraints.txt ./
# The stub package and its build output go again at once: a stale
# build/lib/powerdev/__init__.py would otherwise end up in the real wheel.
RUN mkdir powerdev && touch powerdev/__init__.py \
    && pip wheel --no-cache-dir --wheel-dir /wheels . \
    && rm -r /wheels/powerdev-*.whl powerdev build ./*.egg-info
COPY powerdev ./powerdev
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# Runtime dependencies only (no test extras), from the build stage's wheels,
# mounted for this step only (never a layer of the image) and with no index:
# nothing is fetched here. Byte-compiled now, because the root filesystem is
# read-only at run time: the directory pip installed powerdev in, as Python
# finds it (site-packages in the official image, dist-packages on a base of
# Debian's python3); the step fails if powerdev did not install.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl \
    && dir=$(python -c 'import os, powerdev; print(os.path.dirname(powerdev.__file__))') \
    && python -m compileall -q "$dir"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Runs as UID 0 with every capability dropped (see deploy/base/03-daemonset.yaml):
# the kubelet's device-plugins directory is root's, and root may write there
# as its owner, without CAP_DAC_OVERRIDE. Port 8080: /metrics, /healthz and
# /readyz when POWERDEV_METRICS_ADDRESS is set (the DaemonSet sets :8080).
EXPOSE 8080
ENTRYPOINT ["powerdev", "run"]
