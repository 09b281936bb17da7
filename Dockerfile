# fedsim server / client image (CPU only). Built by docker-compose.yml; see deploy/README.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# CPU-only torch from PyTorch's CPU index first: the default index resolves to a CUDA build
# (gigabytes of libraries this image never uses).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# A C compiler for fedsim's kernels, the Gaussian noise and the per-example convolution
# gradients (fedsim/training/native.py compiles them on first use; without one the slower torch
# implementations of the same computations run).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# Dependencies change less often than the code: install them in their own layer.
COPY pyproject.toml README.md ./
COPY fedsim ./fedsim
RUN pip install .

COPY scenarios ./scenarios

# A non-root user (its uid/gid are the ones docker-compose.yml gives the secret) with its state
# and run directories in the image, so that named volumes mounted there start out owned by it.
ARG FEDSIM_UID=10001
RUN groupadd --gid "$FEDSIM_UID" fedsim \
    && useradd --uid "$FEDSIM_UID" --gid fedsim --create-home --shell /usr/sbin/nologin fedsim \
    && mkdir -p /state /runs \
    && chown fedsim:fedsim /state /runs
USER fedsim

# Data sets reach the containers through the image's own cache (~/.cache/fedsim): fetched and
# sha256-verified here, at build time, so no container needs a host path or the network for
# them. FEDSIM_DATASETS="" skips it (each container then downloads on first start).
ARG FEDSIM_DATASETS=mnist
RUN for name in $FEDSIM_DATASETS; do fedsim data fetch "$name"; done
# Build the kernels into that cache now (they are rebuilt at start-up where the host's CPU
# differs from this one's; if one cannot be built, fedsim logs it and uses torch instead).
RUN python -c "from fedsim.training.gaussian import native_kernel_available as noise; from fedsim.training.persample.direct import direct_kernel_available as conv; print('noise kernel compiled:', noise(), '- convolution kernel in use:', conv())"

CMD ["fedsim", "--help"]
